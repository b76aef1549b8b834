"""The one prepared GPU check: is the training path fast and correct before days of GPU time go into it?

    PYTHONPATH=. python3 bench/gpu_check.py --corpus PATH/wiki_000.jsonl.xz --out results/gpu   # one GPU, < 8 min
    python bench/gpu_check.py --smoke --out runs/bench/gpu_check_cpu                          # CPU, tiny shapes, < 1 min

Only torch, transformers and numpy are needed (what the lent GPU machine has; nothing is installed
there). It measures, in one run, and prints one table plus `gpu_check.json`:

  * the bf16 matmul peak of the device (the MFU denominator);
  * per shape (base, large: BERT's) and contender (flat MLM 30%, CrossBERT r=0.5 with and without
    CMS, r=0.75 with CMS, Hugging Face BertForMaskedLM of the same shape at 30%): sequence tokens/s
    (every CMS view counts as a sequence), corpus tokens/s, MFU, peak memory, eager and compiled;
    which SDPA kernel ran; whether one of our steps synchronises with the host
    (`torch.cuda.set_sync_debug_mode`);
  * a 300-step run of each objective at base shape on a slice of the local corpus, loss falling;
  * frozen feature extraction sentences/s at base shape.

Every contender trains on the same real batches with the trainer's own step pieces (host-prepared,
pinned batches; fused AdamW; bf16 autocast). Sections that would push the run past `--budget-s` are
skipped and named as skipped, never silently dropped. On the device machine (no shared data there)
carry a corpus file, e.g. `mkdir -p runs/gpu_corpus && cp ../shared/data/wikipedia_en_2015/wiki_000.jsonl.xz
runs/gpu_corpus/` then `run(command="PYTHONPATH=. python3 bench/gpu_check.py --corpus
runs/gpu_corpus/wiki_000.jsonl.xz --out $OUT", carry=["runs/gpu_corpus"])`.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from _common import hf_bert_of_shape, markdown, setup  # noqa: E402  (puts the repository on sys.path)

from crossbert_model.config import config_from_preset, training_flops_per_token  # noqa: E402
from crossbert_model.data import PackedSequences, iter_documents, load_tokenizer, special_token_config  # noqa: E402
from crossbert_model.hardware import matmul_flops  # noqa: E402
from crossbert_model.masking import pretraining_batch  # noqa: E402
from crossbert_model.model import pretraining_model_for  # noqa: E402
from crossbert_model.train import OptimArgs, make_optimizer, pinned, step_generator, to_device  # noqa: E402
from crossbert_model.utils import PROJECT_ROOT, atomic_write_json, atomic_write_text, data_root, provenance  # noqa: E402

log = logging.getLogger("gpu_check")

# The tokenizer of the committed reference run: a fixed vocabulary, so the GPU machine needs no training.
TOKENIZER = PROJECT_ROOT / "results" / "cpu_small" / "tokenizer"

CONTENDERS = {
    "hf_bert_mlm30": {"objective": "hf", "mask_ratio": 0.30},
    "flat_mlm30": {"objective": "mlm", "mask_ratio": 0.30},  # ModernBERT's ratio, as configs/sweep/gpu_base.yaml
    "crossbert_r50_cms": {"objective": "crossbert", "mask_ratio": 0.5, "complementary_masking": True},
    "crossbert_r50_nocms": {"objective": "crossbert", "mask_ratio": 0.5, "complementary_masking": False},
    "crossbert_r75_cms": {"objective": "crossbert", "mask_ratio": 0.75, "complementary_masking": True},
}
# (preset, batch, seq_len) of the throughput measurement; vocabulary 30,522 as BERT's.
SHAPES = {"base": ("base", 64, 512), "large": ("large", 32, 512)}
SMOKE_SHAPES = {"tiny": ("tiny", 8, 128)}
BERT_VOCAB = 30522
# Goals of issue 13, checked in the table's notes.
GOAL_MFU, GOAL_VS_HF, GOAL_CROSSBERT = 0.40, 1.3, 1.5


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def corpus_slice(path: Path, tokenizer, tokens: int) -> np.ndarray:
    """The first `tokens` tokens of a corpus file (documents separated by [SEP], as the trainer's stream)."""
    ids: list[int] = []
    for text in iter_documents(str(path)):
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.sep_token_id])
        if len(ids) >= tokens:
            break
    return np.asarray(ids, dtype=np.int64)


class Contender:
    """One objective at one shape, trained by the trainer's own step pieces."""

    def __init__(self, name: str, spec: dict, preset: str, seq_len: int, tokens: dict, device, compiled: bool, lr: float = 1e-4):
        torch.manual_seed(0)
        self.name, self.hf, self.device = name, spec["objective"] == "hf", device
        # bf16 autocast on a GPU (the regime measured); fp32 on a CPU, where bf16 may be emulated (~100x slower).
        self.amp = torch.bfloat16 if device.type == "cuda" else None
        objective = "mlm" if self.hf else spec["objective"]
        options = {k: v for k, v in spec.items() if k != "objective"}
        self.config = config_from_preset(preset, objective=objective, max_position_embeddings=seq_len, **options, **tokens)
        model = hf_bert_of_shape(self.config) if self.hf else pretraining_model_for(self.config)
        self.model = model.to(device).train()
        self.optimizer = make_optimizer(self.model, OptimArgs(lr=lr, weight_decay=0.01), device)
        self.forward = torch.compile(self.model) if compiled else self.model
        self.flops_per_token = training_flops_per_token(self.config, seq_len)
        self.views = self.config.num_views

    def batch(self, ids: torch.Tensor, step: int) -> dict:
        batch = pretraining_batch(ids, torch.ones_like(ids), self.config, step_generator(0, step))
        if self.hf:  # BERT takes the corrupted ids and -100 labels; it computes logits everywhere
            batch = {k: batch[k] for k in ("input_ids", "labels")}
        return pinned(batch) if self.device.type == "cuda" else batch

    def step(self, batch: dict) -> torch.Tensor:
        part = to_device(batch, self.device)
        with torch.autocast(self.device.type, dtype=self.amp or torch.float32, enabled=self.amp is not None):
            out = self.forward(**part)
        loss = out.loss if self.hf else out.loss_sum / out.num_predicted
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def release(self) -> None:
        del self.model, self.optimizer, self.forward
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def sdpa_kernels(contender: Contender, batch: dict) -> str:
    """The scaled-dot-product-attention implementations one step dispatched to (profiler op names)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if contender.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        contender.step(batch)
        sync(contender.device)
    names = {e.key for e in prof.key_averages()}
    ops = sorted(n.removeprefix("aten::_scaled_dot_product_") for n in names if n.startswith("aten::_scaled_dot_product_"))
    if contender.device.type == "cuda":
        kernels = {"flash" for n in names if "flash" in n.lower()} | {"mem-efficient" for n in names if "fmha" in n.lower() or "efficient" in n.lower()}
        ops += sorted(f"kernel:{k}" for k in kernels)
    return ", ".join(ops) or "none seen"


def host_syncs(contender: Contender, batch: dict) -> str:
    """'none' when a step runs under torch.cuda.set_sync_debug_mode('error'), else the first sync."""
    if contender.device.type != "cuda":
        return "n/a (cpu)"
    torch.cuda.set_sync_debug_mode("error")
    try:
        contender.step(batch)
        return "none"
    except RuntimeError as e:
        return str(e).splitlines()[0][:120]
    finally:
        torch.cuda.set_sync_debug_mode("default")
        sync(contender.device)


def throughput(contender: Contender, sequences: PackedSequences, batch_size: int, warmup: int, steps: int) -> dict:
    index = np.arange(batch_size)
    batches = [contender.batch(sequences.get((index + i * batch_size) % len(sequences)), i) for i in range(warmup + steps)]
    for batch in batches[:warmup]:
        contender.step(batch)
    sync(contender.device)
    if contender.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(contender.device)
    start = time.perf_counter()
    for batch in batches[warmup:]:
        contender.step(batch)
    sync(contender.device)
    seconds = (time.perf_counter() - start) / steps
    corpus_tps = batch_size * sequences.seq_len / seconds
    memory = torch.cuda.max_memory_allocated(contender.device) / 2**30 if contender.device.type == "cuda" else None
    return {"seconds_per_step": seconds, "corpus_tokens_per_s": corpus_tps, "sequence_tokens_per_s": corpus_tps * contender.views,
            "peak_memory_gib": memory}  # fmt: skip


def measure_shapes(args, shapes: dict, tokenizer_ids: dict, stream: np.ndarray, device, peak: float, clock) -> list[dict]:
    rows = []
    for shape, (preset, batch_size, seq_len) in shapes.items():
        sequences = PackedSequences(stream, seq_len, tokenizer_ids["cls_token_id"], tokenizer_ids["sep_token_id"])
        for name in args.contenders:
            for compiled in (False, True):
                if compiled and name not in args.compile:
                    continue
                row = {"shape": shape, "preset": preset, "batch": batch_size, "seq_len": seq_len, "contender": name,
                       "mode": "compiled" if compiled else "eager"}  # fmt: skip
                if clock() > args.budget_s:
                    rows.append({**row, "skipped": f"time budget {args.budget_s:.0f} s spent"})
                    continue
                log.info("%s %s %s", shape, name, row["mode"])
                c = Contender(name, CONTENDERS[name], preset, seq_len, tokenizer_ids, device, compiled)
                row["views"] = c.views
                warmup = args.warmup + (2 if compiled else 0)  # compilation happens in the first steps
                start = time.perf_counter()
                row.update(throughput(c, sequences, batch_size, warmup, args.steps))
                row["wall_s"] = time.perf_counter() - start
                row["mfu"] = row["corpus_tokens_per_s"] * c.flops_per_token / peak
                if not compiled:
                    probe = c.batch(sequences.get(np.arange(batch_size)), 10_000)
                    row["sdpa"] = sdpa_kernels(c, probe)
                    row["host_syncs"] = "n/a (HF model)" if c.hf else host_syncs(c, probe)
                c.release()
                rows.append(row)
    add_ratios(rows)
    return rows


def add_ratios(rows: list[dict]) -> None:
    """Sequence tokens/s against HF BERT and against our flat MLM, same shape and mode."""
    by_key = {(r["shape"], r["mode"], r["contender"]): r for r in rows if "skipped" not in r}
    for (shape, mode, _), r in by_key.items():
        for base, column in (("hf_bert_mlm30", "x_vs_hf"), ("flat_mlm30", "x_vs_flat_mlm")):
            ref = by_key.get((shape, mode, base)) or by_key.get((shape, "eager", base))
            if ref is not None and ref is not r:
                r[column] = r["sequence_tokens_per_s"] / ref["sequence_tokens_per_s"]
        eager = by_key.get((shape, "eager", r["contender"]))
        if mode == "compiled" and eager is not None:
            r["x_compiled_vs_eager"] = r["sequence_tokens_per_s"] / eager["sequence_tokens_per_s"]


def short_runs(args, tokenizer_ids: dict, stream: np.ndarray, device, clock) -> list[dict]:
    """`--run-steps` steps of each objective from scratch: the loss must fall (mean of the first tenth
    of the steps against the last tenth)."""
    preset, batch_size, seq_len = args.run_shape
    sequences = PackedSequences(stream, seq_len, tokenizer_ids["cls_token_id"], tokenizer_ids["sep_token_id"])
    rows = []
    for name in args.run_objectives:
        row = {"contender": name, "preset": preset, "steps": args.run_steps, "batch": batch_size, "seq_len": seq_len}
        if clock() > args.budget_s:
            rows.append({**row, "skipped": f"time budget {args.budget_s:.0f} s spent"})
            continue
        log.info("%d-step run: %s %s", args.run_steps, preset, name)
        c = Contender(name, CONTENDERS[name], preset, seq_len, tokenizer_ids, device, compiled=False, lr=args.run_lr)
        losses, start = [], time.perf_counter()
        for step in range(args.run_steps):
            ids = sequences.get((np.arange(batch_size) + step * batch_size) % len(sequences))
            losses.append(c.step(c.batch(ids, step)))
        losses = torch.stack(losses).float().cpu().numpy()  # one read, at the end
        tenth = max(1, args.run_steps // 10)
        first, last = float(losses[:tenth].mean()), float(losses[-tenth:].mean())
        row.update({"loss_first": first, "loss_last": last, "loss_falls": bool(last < first - 0.1),
                    "finite": bool(np.isfinite(losses).all()), "wall_s": time.perf_counter() - start,
                    "epochs_of_slice": args.run_steps * batch_size / len(sequences)})  # fmt: skip
        c.release()
        rows.append(row)
    return rows


def feature_extraction(args, tokenizer, stream_texts: list[str], device) -> dict:
    """Frozen encoder (bf16 autocast on a GPU, fp32 on a CPU), mean pooling over the real tokens of padded sentence batches."""
    preset = args.run_shape[0]
    config = config_from_preset(preset, objective="crossbert", **special_token_config(tokenizer))
    encoder = pretraining_model_for(config).encoder.to(device).eval()
    texts = (stream_texts * math.ceil(args.sentences / max(1, len(stream_texts))))[: args.sentences]
    batches = [tokenizer(texts[i : i + 256], padding=True, truncation=True, max_length=128, return_tensors="pt")
               for i in range(0, len(texts), 256)]  # fmt: skip
    batches = [pinned(dict(b)) if device.type == "cuda" else dict(b) for b in batches]

    def run_all():
        pooled = []
        with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            for b in batches:
                b = to_device(b, device)
                hidden = encoder(b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
                mask = b["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled.append((hidden * mask).sum(1) / mask.sum(1))
        sync(device)
        return pooled

    run_all()  # warm-up
    start = time.perf_counter()
    run_all()
    seconds = time.perf_counter() - start
    return {"preset": preset, "sentences": len(texts), "sentences_per_s": len(texts) / seconds, "max_length": 128, "batch": 256}


def sentences_of(stream_docs: list[str], limit: int) -> list[str]:
    out = []
    for doc in stream_docs:
        out.extend(s.strip() + "." for s in doc.split(". ") if len(s.split()) >= 4)
        if len(out) >= limit:
            break
    return out[:limit]


def goals(rows: list[dict], peak: float) -> list[str]:
    """Issue 13's goals, each checked on the eager base-shape rows (or the first shape measured)."""
    measured = [r for r in rows if "skipped" not in r and r["mode"] == "eager"]
    if not measured:
        return ["no throughput row measured"]
    shape = "base" if any(r["shape"] == "base" for r in measured) else measured[0]["shape"]
    at = {r["contender"]: r for r in measured if r["shape"] == shape}
    lines = []
    if "flat_mlm30" in at:
        mfu = at["flat_mlm30"]["mfu"]
        lines.append(f"flat MLM MFU at {shape}: {mfu:.1%} of the measured matmul peak (goal >= {GOAL_MFU:.0%}): {'met' if mfu >= GOAL_MFU else 'NOT met'}")
        if "x_vs_hf" in at["flat_mlm30"]:
            x = at["flat_mlm30"]["x_vs_hf"]
            lines.append(f"flat MLM vs HF BertForMaskedLM at {shape}: {x:.2f}x (goal >= {GOAL_VS_HF}x): {'met' if x >= GOAL_VS_HF else 'NOT met'}")
    if "crossbert_r50_cms" in at and "x_vs_flat_mlm" in at["crossbert_r50_cms"]:
        x = at["crossbert_r50_cms"]["x_vs_flat_mlm"]
        lines.append(f"CrossBERT r=0.5 CMS vs flat MLM sequence tokens/s at {shape}: {x:.2f}x (goal >= {GOAL_CROSSBERT}x): {'met' if x >= GOAL_CROSSBERT else 'NOT met'}")
    return lines


def report(result: dict) -> str:
    columns = ["shape", "contender", "mode", "views", "sequence_tokens_per_s", "corpus_tokens_per_s", "mfu", "peak_memory_gib",
               "x_vs_hf", "x_vs_flat_mlm", "x_compiled_vs_eager", "sdpa", "host_syncs", "skipped"]  # fmt: skip
    rows = [{**r, "mfu": f"{r['mfu']:.1%}" if "mfu" in r else None} for r in result["throughput"]]
    parts = [
        f"# GPU check on {result['device_name']} ({result['elapsed_s']:.0f} s)",
        f"matmul peak ({result['precision']}): {result['peak_flops'] / 1e12:.2f} TFLOP/s (8192^3 on CUDA, 2048^3 on CPU; best of 5)",
        "", f"## Training throughput ({result['precision']})", markdown(rows, columns), "", "## Goals", *[f"* {g}" for g in result["goals"]],
        "", "## Short runs from scratch (loss must fall)",
        markdown(result["short_runs"], ["contender", "preset", "steps", "batch", "seq_len", "loss_first", "loss_last", "loss_falls", "finite", "wall_s", "skipped"]),
        "", "## Frozen feature extraction", markdown([result["feature_extraction"]], list(result["feature_extraction"])),
    ]  # fmt: skip
    return "\n".join(parts)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="CPU-sized: tiny shape, few steps (the test; under a minute)")
    p.add_argument("--corpus", default=None, help="corpus file or folder (default: the data root's wikipedia_en_2015)")
    p.add_argument("--tokenizer", default=str(TOKENIZER))
    p.add_argument("--shapes", nargs="+", default=None, choices=list(SHAPES) + list(SMOKE_SHAPES))
    p.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=list(CONTENDERS))
    p.add_argument("--compile", nargs="*", default=None, choices=list(CONTENDERS), help="contenders also measured compiled")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps per contender (default 5; --smoke 1)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per contender (default 20; --smoke 2)")
    p.add_argument("--run-steps", type=int, default=300)
    p.add_argument("--run-objectives", nargs="+", default=["flat_mlm30", "crossbert_r50_cms", "crossbert_r50_nocms"])
    p.add_argument("--run-lr", type=float, default=5e-4)
    p.add_argument("--sentences", type=int, default=8192)
    p.add_argument("--budget-s", type=float, default=420.0, help="skip (and name) sections that would start after this")
    p.add_argument("--out", default="runs/bench/gpu_check")
    p.add_argument("--device", default=None)
    args = p.parse_args(argv)
    if args.smoke:
        args.shapes = args.shapes or list(SMOKE_SHAPES)
        args.compile = [] if args.compile is None else args.compile
        # The test's few steps; the committed CPU run (results/gpu/cpu_smoke) passes --warmup 8 --steps 40,
        # because a CMS step takes several steps to settle on a CPU.
        args.warmup = 1 if args.warmup is None else args.warmup
        args.steps = 2 if args.steps is None else args.steps
        args.run_steps, args.sentences = min(args.run_steps, 30), min(args.sentences, 256)
        args.run_shape, args.run_lr = ("nano", 8, 64), 2e-3
    else:
        args.shapes = args.shapes or list(SHAPES)
        args.warmup = 5 if args.warmup is None else args.warmup
        args.steps = 20 if args.steps is None else args.steps
        # Compilation costs about a minute a model: measured where the goals are, not everywhere.
        args.compile = ["flat_mlm30", "crossbert_r50_cms"] if args.compile is None else args.compile
        args.run_shape = ("base", 32, 128)
    if args.warmup < 0 or args.steps < 1:
        p.error(f"expected --warmup >= 0 and --steps >= 1, got {args.warmup} and {args.steps}")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    setup()
    began = time.perf_counter()
    clock = lambda: time.perf_counter() - began  # noqa: E731
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    tokenizer = load_tokenizer(args.tokenizer)
    tokenizer_ids = special_token_config(tokenizer)
    corpus = Path(args.corpus) if args.corpus else data_root() / "wikipedia_en_2015"
    shapes = {s: (SHAPES | SMOKE_SHAPES)[s] for s in args.shapes}
    largest = max(batch * seq_len for _, batch, seq_len in shapes.values())
    need = max(largest * (args.warmup + args.steps), args.run_shape[1] * args.run_shape[2] * args.run_steps // 4, 200_000)
    stream = corpus_slice(corpus, tokenizer, need)
    docs = [d for _, d in zip(range(50), iter_documents(str(corpus)))]
    log.info("device %s; corpus slice %s tokens of %s", device, f"{len(stream):,}", corpus)

    peak = matmul_flops(str(device), "bfloat16" if device.type == "cuda" else "float32")
    bert_ids = dict(tokenizer_ids, vocab_size=BERT_VOCAB if not args.smoke else tokenizer_ids["vocab_size"])
    rows = measure_shapes(args, shapes, bert_ids, stream, device, peak, clock)
    runs = short_runs(args, tokenizer_ids, stream, device, clock)
    features = feature_extraction(args, tokenizer, sentences_of(docs, 2048), device) if clock() < args.budget_s else {"skipped": "time budget spent"}
    result = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "precision": "bf16 autocast" if device.type == "cuda" else "fp32",
        "peak_flops": peak,
        "throughput": rows,
        "goals": goals(rows, peak),
        "short_runs": runs,
        "feature_extraction": features,
        "corpus": str(corpus),
        "corpus_slice_tokens": int(len(stream)),
        "args": {k: v for k, v in vars(args).items()},
        "elapsed_s": clock(),
        **provenance(),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "gpu_check.json", result)
    table = report(result)
    atomic_write_text(out / "gpu_check.md", table + "\n")
    print(table)
    print(f"wrote {out / 'gpu_check.json'}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
