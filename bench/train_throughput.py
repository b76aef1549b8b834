"""Training throughput, side by side in one run, as ratios against named baselines.

    python bench/train_throughput.py [--presets tiny mini small] [--dtypes fp32 bf16] [--out runs/bench]

For each size preset, every contender trains on the SAME real Wikipedia batches (seq 128) with AdamW:
  hf_bert_mlm      Hugging Face BertForMaskedLM of the same shape (sdpa attention, no dropout)
  flat_mlm         our flat MLM, 15% masking (logits only at the masked positions)
  crossbert_r50    CrossBERT r=0.5, CMS on (K=2 views per sequence)  | _nocms: one random mask
  crossbert_r75    CrossBERT r=0.75, CMS on (K=4)                   | _nocms: one random mask
Rounds are interleaved (A B C ... A B C ...) and each ratio is the median of per-round ratios, because
this machine is shared and noisy. Reported per contender:
  sequence tokens/s  masked sequences x seq_len per second, every CMS view counted as one sequence
                     (the paper's throughput unit: a view is one masked training sample)
  corpus tokens/s    distinct corpus tokens consumed per second (a CMS step reads each sequence once)
  predicted tokens/s tokens whose identity the loss asks for, per second
  MFU                model FLOPs (crossbert_model.objectives.training_flops_per_token) / measured matmul peak
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from _common import contender_config, hf_bert_of_shape, setup, with_every_objective  # noqa: E402  (puts the repository on sys.path)

from crossbert_model.data.sequences import EpochSampler, prepare_data  # noqa: E402
from crossbert_model.data_args import DataArgs  # noqa: E402
from crossbert_model.hardware import bf16_speedup, matmul_flops  # noqa: E402
from crossbert_model.masking import num_targets  # noqa: E402
from crossbert_model.objectives import num_views, pretraining_batch, pretraining_model_for, training_flops_per_token  # noqa: E402
from crossbert_model.train import step_generator  # noqa: E402
from crossbert_model.utils import atomic_write_json, provenance  # noqa: E402

# name -> model section (ModelArgs fields); "hf": Hugging Face's BERT at the shape, masked as flat_mlm
CONTENDERS = with_every_objective(
    {
        "hf_bert_mlm": {"objective": "hf"},
        "flat_mlm": {"objective": "mlm", "mask_ratio": 0.15},
        "crossbert_r50": {"objective": "crossbert", "mask_ratio": 0.5, "complementary_masking": True},
        "crossbert_r50_nocms": {"objective": "crossbert", "mask_ratio": 0.5, "complementary_masking": False},
        "crossbert_r75": {"objective": "crossbert", "mask_ratio": 0.75, "complementary_masking": True},
        "crossbert_r75_nocms": {"objective": "crossbert", "mask_ratio": 0.75, "complementary_masking": False},
    }
)


class Contender:
    def __init__(self, name: str, spec: dict, preset: str, tokenizer, seq_len: int):
        torch.manual_seed(0)
        self.name = name
        if spec["objective"] == "hf":
            self.config = contender_config(preset, {"objective": "mlm", "mask_ratio": 0.15}, seq_len, tokenizer)
            self.model = hf_bert_of_shape(self.config)
            self.hf = True
        else:
            self.config = contender_config(preset, spec, seq_len, tokenizer)
            self.model = pretraining_model_for(self.config)
            self.hf = False
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.views = num_views(self.config)
        self.flops_per_token = training_flops_per_token(self.config, seq_len)
        self.times: list[float] = []

    def step(self, ids: torch.Tensor, generator, amp: torch.dtype | None) -> None:  # generator: masking.RowRandom
        batch = pretraining_batch(ids, torch.ones_like(ids), self.config, generator)
        with torch.autocast("cpu", dtype=amp or torch.float32, enabled=amp is not None):
            if self.hf:
                loss = self.model(
                    input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]
                ).loss
            else:
                loss = self.model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.targets = num_targets(batch)


def bench_preset(preset, data, args, amp, peak) -> list[dict]:
    contenders = [Contender(n, CONTENDERS[n], preset, data.tokenizer, args.seq_len) for n in args.contenders]
    sampler = EpochSampler(len(data.train), 0)
    step = 0
    for c in contenders:  # warm-up: allocator, oneDNN primitive caches
        for _ in range(args.warmup):
            c.step(data.train.get(sampler.indices(step, args.batch_size)), step_generator(0, step), amp)
    per_round: list[dict[str, float]] = []
    for r in range(args.rounds):
        seconds = {}
        for c in contenders:
            start = time.perf_counter()
            for i in range(args.steps):
                step += 1
                c.step(data.train.get(sampler.indices(step, args.batch_size)), step_generator(0, step), amp)
            seconds[c.name] = (time.perf_counter() - start) / args.steps
        per_round.append(seconds)
        logging.info(
            "%s %s round %d/%d: %s",
            preset,
            args_dtype(amp),
            r + 1,
            args.rounds,
            ", ".join(f"{n} {s:.3f}s/step" for n, s in seconds.items()),
        )
    rows = []
    baseline_mlm = "flat_mlm" if "flat_mlm" in args.contenders else None
    for c in contenders:
        s = statistics.median(rd[c.name] for rd in per_round)
        corpus_tps = args.batch_size * args.seq_len / s
        row = {
            "preset": preset,
            "dtype": args_dtype(amp),
            "contender": c.name,
            "objective": "hf_mlm" if c.hf else c.config.objective,
            "mask_ratio": c.config.mask_ratio,
            "views": c.views,
            "params": sum(p.numel() for p in c.model.parameters()),
            "seconds_per_step": s,
            "sequence_tokens_per_s": corpus_tps * c.views,
            "corpus_tokens_per_s": corpus_tps,
            "predicted_tokens_per_s": c.targets / s,
            "mfu": corpus_tps * c.flops_per_token / peak,
        }
        for base in ("hf_bert_mlm", baseline_mlm):
            if base and base in args.contenders and base != c.name:
                # median over rounds of (this contender's sequence tokens/s) / (baseline's)
                ratios = [(rd[base] / rd[c.name]) * c.views / _views(contenders, base) for rd in per_round]
                row[f"x_vs_{base}"] = statistics.median(ratios)
        rows.append(row)
    return rows


def _views(contenders, name) -> int:
    return next(c.views for c in contenders if c.name == name)


def args_dtype(amp) -> str:
    return "bf16" if amp is torch.bfloat16 else "fp32"


def print_table(rows: list[dict]) -> str:
    head = "| preset | dtype | contender | views | seq tok/s | corpus tok/s | predicted tok/s | MFU | vs HF BertForMaskedLM | vs our flat MLM |"
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        lines.append(
            f"| {r['preset']} | {r['dtype']} | {r['contender']} | {r['views']} | {r['sequence_tokens_per_s']:,.0f} | "
            f"{r['corpus_tokens_per_s']:,.0f} | {r['predicted_tokens_per_s']:,.0f} | {r['mfu']:.1%} | "
            f"{_fmt(r.get('x_vs_hf_bert_mlm'))} | {_fmt(r.get('x_vs_flat_mlm'))} |"
        )
    return "\n".join(lines)


def _fmt(x) -> str:
    return f"{x:.2f}x" if x is not None else "-"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", nargs="+", default=["tiny", "mini", "small"])
    p.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=list(CONTENDERS))
    p.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--force-bf16", action="store_true", help="measure bf16 even where the CPU only emulates it")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=4, help="timed steps per contender per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--cache-dir", default="runs/cache")
    p.add_argument("--out", default="runs/bench")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    setup()
    if args.threads:
        torch.set_num_threads(args.threads)
    data = prepare_data(DataArgs(seq_len=args.seq_len, cache_dir=args.cache_dir))
    speedup = bf16_speedup("cpu")
    rows, notes = [], []
    for dtype in args.dtypes:
        amp = torch.bfloat16 if dtype == "bf16" else None
        if amp and speedup < 1.0 and not args.force_bf16:
            notes.append(
                f"bf16 skipped: this CPU emulates bf16 (matmul at {speedup:.3f}x fp32 speed); --force-bf16 measures it anyway"
            )
            continue
        peak = matmul_flops("cpu", "bfloat16" if amp else "float32")
        notes.append(f"{dtype} matmul peak (2048^3, best of 5): {peak / 1e9:.1f} GFLOP/s")
        for preset in args.presets:
            rows.extend(bench_preset(preset, data, args, amp, peak))
    table = print_table(rows)
    print(table)
    for n in notes:
        print("-", n)
    out = Path(args.out)
    result = {"rows": rows, "notes": notes, "args": vars(args), "bf16_speedup": speedup, **provenance()}
    atomic_write_json(out / "train_throughput.json", result)
    (out / "train_throughput.md").write_text(table + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n")
    print(f"wrote {out / 'train_throughput.json'}")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
