"""The one prepared GPU check: is the training path fast and correct before days of GPU time go into it?

    PYTHONPATH=. python3 bench/gpu_check.py --corpus PATH/wiki_000.jsonl.xz --out results/gpu/h200  # one GPU, ~6 min
    python bench/gpu_check.py --smoke --out runs/bench/gpu_check_cpu                               # CPU, tiny shapes

Only torch, transformers and numpy are needed (nothing else need be installed on the machine with the GPU).
Time on a GPU machine may be short, so the script is built not to lose its answer:

  * every measurement is one row, appended to `gpu_check.jsonl` (flushed and synced) and printed as one
    flushed line the moment it is measured; a row that raises is recorded as an error row and the
    script goes on; a SIGTERM or SIGINT (`timeout`) still writes the table of the rows so far;
  * sections run in the order of their value: base-shape eager rows; the short training runs, feature
    extraction and the trainer's own loop; base compiled; large eager; large compiled last;
  * a row starts only if the time it is predicted to take fits `--budget-s` (a compiled row is
    predicted by the first measured compile time); rows that do not fit are written as skipped;
  * dynamo is reset between rows and compiled rows are static-shaped (`dynamic=False`).

What it measures:

  * the bf16 matmul peak: 8192^3 products on random data, CUDA events, median of 50 after a second of
    warm-up (`crossbert_model.hardware.matmul_flops`); MFU against it and against the datasheet's
    dense bf16 peak (989.4 TFLOP/s for H100/H200 SXM, the figure papers use);
  * per shape (base, large: BERT's) and contender (flat MLM 30%, CrossBERT r=0.5 with and without CMS,
    r=0.75 with CMS, Hugging Face BertForMaskedLM of the same shape at 30%), eager and compiled: step
    time from CUDA events (median and p90), sequence tokens/s (every CMS view counts as a sequence) and
    corpus tokens/s, MFU, peak memory, compile seconds, the first step's loss (same weights, same batch:
    compiled must match eager), which SDPA kernel ran, whether a step synchronises with the host
    (`torch.cuda.set_sync_debug_mode`), and the top kernels by device time for flat MLM and CrossBERT;
  * the trainer's own path: `Trainer.host_batches` (prepared two steps ahead on pinned memory) into
    `Trainer.train_step`, timed per step, beside the host's time to build one batch, so a host
    bottleneck shows;
  * a 300-step run of each objective from scratch on the local corpus, loss falling;
  * frozen feature extraction sentences/s; GPU clocks, temperature and power before and after.

Goals, judged for eager and for compiled rows, each against the baseline it names: flat
MLM MFU >= 40% of the datasheet peak at base; flat MLM >= 1.3x HF BertForMaskedLM (same mode);
CrossBERT r=0.5 CMS >= 1.5x flat MLM in sequence tokens/s (its corpus-token ratio beside it).

On a machine with a GPU that has no copy of the data root, copy a corpus file beside the checkout first:
    mkdir -p runs/gpu_corpus && cp ../shared/data/wikipedia_en_2015/wiki_000.jsonl.xz runs/gpu_corpus/
    PYTHONUNBUFFERED=1 PYTHONPATH=. timeout -s TERM 450 python3 bench/gpu_check.py \
        --corpus runs/gpu_corpus/wiki_000.jsonl.xz --out OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from _common import TokenIds, contender_config, hf_bert_of_shape, markdown, setup, with_every_objective  # noqa: E402  (puts the repository on sys.path)

from crossbert_model.data.corpus import iter_documents  # noqa: E402
from crossbert_model.data.sequences import PackedSequences  # noqa: E402
from crossbert_model.data.tokenizer import load_tokenizer, special_token_config  # noqa: E402
from crossbert_model.data_args import DataArgs  # noqa: E402
from crossbert_model.hardware import matmul_flops  # noqa: E402
from crossbert_model.objectives import num_views, pretraining_batch, pretraining_model_for, training_flops_per_token  # noqa: E402
from crossbert_model.train import Trainer, make_optimizer, pinned, step_generator, to_device  # noqa: E402
from crossbert_model.train_config import ModelArgs, OptimArgs, TrainConfig  # noqa: E402
from crossbert_model.utils import PROJECT_ROOT, atomic_write_json, atomic_write_text, data_root, provenance  # noqa: E402

log = logging.getLogger("gpu_check")

# The tokenizer of the committed reference run: a fixed vocabulary, so the GPU machine needs no training.
TOKENIZER = PROJECT_ROOT / "results" / "cpu_small" / "tokenizer"

# name -> model section (ModelArgs fields); "hf": Hugging Face's BERT at the shape, masked as a flat MLM
CONTENDERS = with_every_objective(
    {
        "hf_bert_mlm30": {"objective": "hf", "mask_ratio": 0.30},
        "flat_mlm30": {"objective": "mlm", "mask_ratio": 0.30},  # ModernBERT's ratio, as configs/sweep/gpu_base.yaml
        "crossbert_r50_cms": {"objective": "crossbert", "mask_ratio": 0.5, "complementary_masking": True},
        "crossbert_r50_nocms": {"objective": "crossbert", "mask_ratio": 0.5, "complementary_masking": False},
        "crossbert_r75_cms": {"objective": "crossbert", "mask_ratio": 0.75, "complementary_masking": True},
    }
)
# (preset, batch, seq_len) of the throughput measurement; vocabulary 30,522 as BERT's.
SHAPES = {"base": ("base", 64, 512), "large": ("large", 32, 512)}
SMOKE_SHAPES = {
    "tiny": ("tiny", 8, 128),
    "nano": ("nano", 8, 64),
}  # --smoke measures tiny; nano: the test's, a quarter of the work
BERT_VOCAB = 30522
# NVIDIA's H100 / H200 SXM datasheets: 989.4 TFLOP/s dense bf16 (1,979 with sparsity); the MFU papers quote.
DATASHEET_BF16_FLOPS = {"H100": 989.4e12, "H200": 989.4e12}
# The goals, each with the baseline it is judged against.
GOAL_MFU, GOAL_VS_HF, GOAL_CROSSBERT = 0.40, 1.3, 1.5
# Predicted seconds of a row before one like it was measured: a compile of a BERT-sized model takes
# about a minute (estimated 45-120 s), an eager row a few seconds.
FIRST_COMPILE_GUESS_S, FIRST_EAGER_GUESS_S = 90.0, 20.0
TOP_KERNELS = 8


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_compiler() -> None:
    """Forget every compiled graph and its guards, so the next model compiles from a clean slate instead of
    recompiling with automatically dynamic shapes (the second model of one class would)."""
    torch.compiler.reset()


# ---------------------------------------------------------------------------------------------------
# Rows: written the moment they are measured, never lost to a later failure
# ---------------------------------------------------------------------------------------------------


class RowLog:
    """Appends each row to a JSONL file (flushed and synced) and prints a one-line summary at once."""

    def __init__(self, path: Path, began: float):
        self.path, self.began, self.rows = path, began, []
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "a", encoding="utf-8")

    def clock(self) -> float:
        return time.perf_counter() - self.began

    def add(self, section: str, row: dict) -> dict:
        row = {"section": section, **row, "at_s": round(self.clock(), 1)}
        self.rows.append(row)
        self.file.write(json.dumps(row, default=str) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())
        print(summary_line(row), flush=True)
        return row

    def close(self) -> None:
        self.file.close()


def summary_line(row: dict) -> str:
    keys = ("shape", "contender", "mode", "name")
    head = " ".join(str(row[k]) for k in keys if row.get(k) is not None)
    if "error" in row:
        return f"[{row['at_s']:6.1f}s] {row['section']} {head}: ERROR {row['error']}"
    if "skipped" in row:
        return f"[{row['at_s']:6.1f}s] {row['section']} {head}: skipped ({row['skipped']})"
    shown = (
        "step_ms_median",
        "sequence_tokens_per_s",
        "corpus_tokens_per_s",
        "mfu",
        "mfu_datasheet",
        "compile_s",
        "loss_first",
        "loss_last",
        "sentences_per_s",
        "host_ms_per_batch",
        "peak_tflops",
        "clocks",
    )
    parts = [f"{k}={format_value(row[k])}" for k in shown if row.get(k) is not None]
    return f"[{row['at_s']:6.1f}s] {row['section']} {head}: " + " ".join(parts)


def format_value(v) -> str:
    if isinstance(v, float):
        return f"{v:.1%}" if abs(v) < 1 and v > 0 else f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)


def guarded(rows: RowLog, section: str, key: dict, measure) -> dict:
    """Run `measure()` (a dict of figures) as one row; an exception becomes an error row and the script goes on."""
    try:
        return rows.add(section, {**key, **measure()})
    except Exception as e:  # noqa: BLE001 - every failure is recorded, none stops the run
        detail = traceback.format_exc(limit=-3).strip().splitlines()
        return rows.add(
            section,
            {
                **key,
                "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
                "traceback_tail": detail[-6:],
            },
        )
    finally:
        reset_compiler()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class Budget:
    """Predicts a row's cost from the rows measured so far; a row that would overrun is skipped.

    A kind is (shape, mode). Unseen kinds: a compiled row is predicted at twice the slowest compiled row
    seen (a larger model compiles longer), else FIRST_COMPILE_GUESS_S; an eager row at three times the
    slowest eager row (the next shape is about three times the work), else FIRST_EAGER_GUESS_S."""

    def __init__(self, rows: RowLog, budget_s: float):
        self.rows, self.budget_s = rows, budget_s
        self.seen: dict[tuple[str, str], float] = {}

    def predict(self, shape: str, mode: str) -> float:
        if (shape, mode) in self.seen:
            return self.seen[shape, mode]
        alike = [s for (_, m), s in self.seen.items() if m == mode]
        if mode == "compiled":
            return 2 * max(alike) if alike else FIRST_COMPILE_GUESS_S
        return 3 * max(alike) if alike else FIRST_EAGER_GUESS_S

    def fits(self, shape: str, mode: str) -> bool:
        return self.rows.clock() + self.predict(shape, mode) <= self.budget_s

    def skipped(self, shape: str, mode: str) -> dict:
        return {
            "skipped": f"predicted {self.predict(shape, mode):.0f} s from {self.rows.clock():.0f} s would pass --budget-s {self.budget_s:.0f}"
        }

    def record(self, shape: str, mode: str, seconds: float) -> None:
        self.seen[shape, mode] = max(self.seen.get((shape, mode), 0.0), seconds)  # the slowest seen: a safe prediction


# ---------------------------------------------------------------------------------------------------
# One contender: an objective at a shape, trained by the trainer's own step pieces
# ---------------------------------------------------------------------------------------------------


def corpus_slice(path: Path, tokenizer, tokens: int) -> np.ndarray:
    """The first `tokens` tokens of a corpus file (documents separated by [SEP], as the trainer's stream)."""
    ids: list[int] = []
    for text in iter_documents(str(path)):
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.sep_token_id])
        if len(ids) >= tokens:
            break
    return np.asarray(ids, dtype=np.int64)


class Contender:
    def __init__(
        self, name: str, preset: str, seq_len: int, tokens: dict, device, compiled: bool, lr: float = 1e-4, fail: bool = False
    ):
        torch.manual_seed(0)  # eager and compiled rows start from the same weights
        spec = CONTENDERS[name]
        self.name, self.hf, self.device, self.fail = name, spec["objective"] == "hf", device, fail
        # bf16 autocast on a GPU (the regime measured); fp32 on a CPU, where bf16 may be emulated (~100x slower).
        self.amp = torch.bfloat16 if device.type == "cuda" else None
        section = {**spec, "objective": "mlm"} if self.hf else spec
        self.config = contender_config(preset, section, seq_len, TokenIds(**tokens))
        model = hf_bert_of_shape(self.config) if self.hf else pretraining_model_for(self.config)
        self.model = model.to(device).train()
        self.optimizer = make_optimizer(self.model, OptimArgs(lr=lr, weight_decay=0.01), device)
        self.forward = torch.compile(self.model, dynamic=False) if compiled else self.model
        self.flops_per_token = training_flops_per_token(self.config, seq_len)
        self.views = num_views(self.config)

    def batch(self, ids: torch.Tensor, step: int) -> dict:
        batch = pretraining_batch(ids, torch.ones_like(ids), self.config, step_generator(0, step))
        if self.hf:  # BERT takes the corrupted ids and -100 labels; it computes logits everywhere
            batch = {k: batch[k] for k in ("input_ids", "labels")}
        return pinned(batch) if self.device.type == "cuda" else batch

    def step(self, batch: dict) -> torch.Tensor:
        if self.fail:  # --fail: the error path, tested on a CPU
            raise RuntimeError(f"injected failure in {self.name}")
        part = to_device(batch, self.device)
        with torch.autocast(self.device.type, dtype=self.amp or torch.float32, enabled=self.amp is not None):
            out = self.forward(**part)
        loss = out.loss if self.hf else out.loss_sum / out.num_predicted
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()


def timed_steps(step, batches: list, device) -> list[float]:
    """Seconds of each step: CUDA events around it on a GPU (no host wait between steps), the host clock on a CPU."""
    if device.type != "cuda":
        times = []
        for batch in batches:
            start = time.perf_counter()
            step(batch)
            times.append(time.perf_counter() - start)
        return times
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in batches]
    for (start, end), batch in zip(events, batches):
        start.record()
        step(batch)
        end.record()
    torch.cuda.synchronize(device)
    return [start.elapsed_time(end) / 1e3 for start, end in events]


def step_statistics(seconds: list[float], batch_tokens: int, views: int, flops_per_token: float, peaks: dict) -> dict:
    median = float(np.median(seconds))
    corpus_tps = batch_tokens / median
    out = {
        "step_ms_median": 1e3 * median,
        "step_ms_p90": 1e3 * float(np.percentile(seconds, 90)),
        "corpus_tokens_per_s": corpus_tps,
        "sequence_tokens_per_s": corpus_tps * views,
        "mfu": corpus_tps * flops_per_token / peaks["measured"],
    }
    if peaks.get("datasheet"):
        out["mfu_datasheet"] = corpus_tps * flops_per_token / peaks["datasheet"]
    return out


def profile_step(contender: Contender, batch: dict, top: int) -> dict:
    """One profiled step: which SDPA implementation ran and (optionally) the top kernels by device time."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if contender.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        contender.step(batch)
        sync(contender.device)
    events = prof.key_averages()
    names = {e.key for e in events}
    ops = sorted(n.removeprefix("aten::_scaled_dot_product_") for n in names if n.startswith("aten::_scaled_dot_product_"))
    if contender.device.type == "cuda":
        kernels = {"flash" for n in names if "flash" in n.lower()} | {
            "mem-efficient" for n in names if "fmha" in n.lower() or "efficient" in n.lower()
        }
        ops += sorted(f"kernel:{k}" for k in kernels)
    out = {"sdpa": ", ".join(ops) or "none seen"}
    if top:
        out["top_kernels"] = top_kernels(events, contender.device, top)
    return out


def top_kernels(events, device, top: int) -> list[dict]:
    def device_us(e) -> float:  # the attribute's name changed across torch versions
        return float(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0) or 0.0)

    if device.type == "cuda":
        kernels = [
            e for e in events if device_us(e) > 0 and not e.key.startswith(("aten::", "autograd::", "Optimizer.", "ProfilerStep"))
        ]
        total = sum(device_us(e) for e in kernels) or 1.0
        ranked = sorted(kernels, key=device_us, reverse=True)[:top]
        return [{"kernel": e.key[:90], "ms": device_us(e) / 1e3, "share": device_us(e) / total} for e in ranked]
    ops = [e for e in events if e.key.startswith("aten::")]
    total = sum(e.self_cpu_time_total for e in ops) or 1.0
    ranked = sorted(ops, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return [{"kernel": e.key, "ms": e.self_cpu_time_total / 1e3, "share": e.self_cpu_time_total / total} for e in ranked]


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


def throughput_row(
    args,
    name: str,
    shape_name: str,
    shape: tuple,
    sequences: PackedSequences,
    tokens: dict,
    device,
    peaks: dict,
    compiled: bool,
    budget: Budget,
) -> dict:
    preset, batch_size, seq_len = shape
    began = time.perf_counter()
    c = Contender(name, preset, seq_len, tokens, device, compiled, fail=name in args.fail)
    index = np.arange(batch_size)
    batches = [c.batch(sequences.get((index + i * batch_size) % len(sequences)), i) for i in range(args.warmup + args.steps)]
    first = time.perf_counter()
    loss_first = float(c.step(batches[0]))  # compiles here when compiled; the same batch and weights in both modes
    first_step_s = time.perf_counter() - first
    for batch in batches[1 : args.warmup]:
        c.step(batch)
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = timed_steps(c.step, batches[args.warmup :], device)
    row = {
        "views": c.views,
        "batch": batch_size,
        "seq_len": seq_len,
        "loss_first": loss_first,
        **step_statistics(seconds, batch_size * seq_len, c.views, c.flops_per_token, peaks),
    }
    if compiled:
        row["compile_s"] = first_step_s - row["step_ms_median"] / 1e3
    row["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    if not compiled:
        probe = c.batch(sequences.get(index), 10_000)
        row.update(profile_step(c, probe, TOP_KERNELS if name in ("flat_mlm30", "crossbert_r50_cms") else 0))
        row["host_syncs"] = "n/a (HF model)" if c.hf else host_syncs(c, probe)
    del c, batches
    row["wall_s"] = time.perf_counter() - began
    budget.record(shape_name, "compiled" if compiled else "eager", row["wall_s"])
    return row


def throughput_section(args, rows: RowLog, budget: Budget, shape_name: str, mode: str, data: dict) -> None:
    shape = data["shapes"][shape_name]
    compiled = mode == "compiled"
    names = [n for n in args.contenders if not compiled or n in args.compile]
    for name in names:
        key = {"shape": shape_name, "preset": shape[0], "contender": name, "mode": mode}
        if not budget.fits(shape_name, mode):
            rows.add("throughput", {**key, **budget.skipped(shape_name, mode)})
            continue
        log.info("%s %s %s", shape_name, name, mode)
        guarded(
            rows,
            "throughput",
            key,
            lambda: throughput_row(
                args,
                name,
                shape_name,
                shape,
                data["sequences"][shape_name],
                data["bert_ids"],
                data["device"],
                data["peaks"],
                compiled,
                budget,
            ),
        )


# ---------------------------------------------------------------------------------------------------
# Short runs, feature extraction, the trainer's own loop
# ---------------------------------------------------------------------------------------------------


def short_run_row(args, name: str, sequences: PackedSequences, tokens: dict, device) -> dict:
    """`--run-steps` steps from scratch: the loss must fall (mean of the first tenth against the last tenth)."""
    preset, batch_size, seq_len = args.run_shape
    began = time.perf_counter()
    c = Contender(name, preset, seq_len, tokens, device, compiled=False, lr=args.run_lr, fail=name in args.fail)
    losses = []
    for step in range(args.run_steps):
        ids = sequences.get((np.arange(batch_size) + step * batch_size) % len(sequences))
        losses.append(c.step(c.batch(ids, step)))
    losses = torch.stack(losses).float().cpu().numpy()  # one read, at the end
    tenth = max(1, args.run_steps // 10)
    first, last = float(losses[:tenth].mean()), float(losses[-tenth:].mean())
    return {
        "preset": preset,
        "steps": args.run_steps,
        "batch": batch_size,
        "seq_len": seq_len,
        "loss_first": first,
        "loss_last": last,
        "loss_falls": bool(last < first - 0.1),
        "finite": bool(np.isfinite(losses).all()),
        "wall_s": time.perf_counter() - began,
        "epochs_of_slice": args.run_steps * batch_size / len(sequences),
    }


def feature_extraction_row(args, tokenizer, texts: list[str], device) -> dict:
    """Frozen encoder (bf16 autocast on a GPU, fp32 on a CPU), mean pooling over the real tokens of padded sentence batches."""
    preset = args.run_shape[0]
    config = contender_config(preset, {"objective": "crossbert"}, 128, tokenizer)
    encoder = pretraining_model_for(config).encoder.to(device).eval()
    texts = (texts * math.ceil(args.sentences / max(1, len(texts))))[: args.sentences]
    batches = [
        tokenizer(texts[i : i + 256], padding=True, truncation=True, max_length=128, return_tensors="pt")
        for i in range(0, len(texts), 256)
    ]
    batches = [pinned(dict(b)) if device.type == "cuda" else dict(b) for b in batches]

    def run_all():
        with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            for b in batches:
                b = to_device(b, device)
                hidden = encoder(b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
                mask = b["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                (hidden * mask).sum(1) / mask.sum(1)
        sync(device)

    run_all()  # warm-up
    start = time.perf_counter()
    run_all()
    seconds = time.perf_counter() - start
    return {"preset": preset, "sentences": len(texts), "sentences_per_s": len(texts) / seconds, "max_length": 128, "batch": 256}


def trainer_loop_row(args, name: str, corpus: Path, device, peaks: dict, workdir: Path) -> dict:
    """The real trainer: `Trainer.host_batches` (masks and packing on the host, two steps ahead, pinned) into
    `Trainer.train_step` (read=False, as between logging points). Step times from CUDA events, the loop's
    wall time per step, and the host's time to build one batch: when the host is slower than the device
    the loop's time per step follows the host's, not the device's."""
    preset, batch_size, seq_len = args.loop_shape
    spec = {k: v for k, v in CONTENDERS[name].items() if k != "objective"}
    steps = args.warmup + args.steps
    cfg = TrainConfig(
        name=f"loop_{name}",
        out_dir=str(workdir),
        seed=0,
        steps=steps,
        batch_size=batch_size,
        log_every=steps,
        eval_every=0,
        eval_sequences=0,
        checkpoint_every=0,
        checkpoint_steps=[],
        dtype="bf16" if device.type == "cuda" else "fp32",
        peak_flops=peaks["measured"],
        model=ModelArgs(preset=preset, objective=CONTENDERS[name]["objective"], **spec),
        data=DataArgs(
            corpus=str(corpus),
            tokenizer=str(args.tokenizer),
            seq_len=seq_len,
            max_documents=args.loop_documents,
            cache_dir=str(workdir / "cache"),
            num_workers=1,
        ),  # no fork after CUDA is up
        optim=OptimArgs(warmup_steps=1),
    )
    trainer = Trainer(cfg)
    began = time.perf_counter()
    for step in range(3):
        trainer.host_batch(step)
    host_s = (time.perf_counter() - began) / 3
    events = (
        [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
        if device.type == "cuda"
        else []
    )
    walls = []
    start_wall = None
    for step, batch in zip(range(steps), trainer.host_batches(0)):
        if step == args.warmup:
            sync(device)
            start_wall = time.perf_counter()
        if events:
            events[step][0].record()
        trainer.train_step(step, batch, read=False)
        if events:
            events[step][1].record()
        walls.append(time.perf_counter())
    sync(device)
    loop_s = (time.perf_counter() - start_wall) / args.steps
    views = num_views(trainer.model_config)
    if events:
        seconds = [s.elapsed_time(e) / 1e3 for s, e in events[args.warmup :]]
    else:
        seconds = list(np.diff([start_wall] + walls[args.warmup :]))
    row = {
        "preset": preset,
        "batch": batch_size,
        "seq_len": seq_len,
        "vocab": trainer.model_config.vocab_size,
        "views": views,
        "host_ms_per_batch": 1e3 * host_s,
        "loop_ms_per_step": 1e3 * loop_s,
        **step_statistics(seconds, batch_size * seq_len, views, trainer.flops_per_token, peaks),
    }
    row["host_bound"] = bool(row["loop_ms_per_step"] > 1.1 * row["step_ms_median"])
    del trainer
    return row


# ---------------------------------------------------------------------------------------------------
# Environment, goals, report
# ---------------------------------------------------------------------------------------------------


def gpu_state(device) -> dict:
    """SM / memory clocks, temperature and power from nvidia-smi (never changed, only read)."""
    if device.type != "cuda":
        return {"clocks": "n/a (cpu)"}
    query = "clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw,utilization.gpu"
    done = subprocess.run(
        ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
    )
    return {"clocks": done.stdout.strip() or done.stderr.strip()[:200], "query": query}


def datasheet_peak(device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for chip, flops in DATASHEET_BF16_FLOPS.items() if chip in name), None)


def goals(rows: list[dict]) -> list[str]:
    """The three goals at the base shape (or the first measured shape), for eager and for compiled rows."""
    measured = [r for r in rows if r["section"] == "throughput" and "step_ms_median" in r]
    if not measured:
        return ["no throughput row measured"]
    shape = "base" if any(r["shape"] == "base" for r in measured) else measured[0]["shape"]
    at = {(r["mode"], r["contender"]): r for r in measured if r["shape"] == shape}
    lines = []
    for mode in ("eager", "compiled"):
        flat, hf, cms = at.get((mode, "flat_mlm30")), at.get((mode, "hf_bert_mlm30")), at.get((mode, "crossbert_r50_cms"))
        hf_eager = at.get(("eager", "hf_bert_mlm30"))
        if flat:
            mfu = flat.get("mfu_datasheet", flat["mfu"])
            against = (
                f"the datasheet's peak ({flat['mfu']:.1%} of the measured one)"
                if "mfu_datasheet" in flat
                else "the measured peak"
            )
            lines.append(
                f"{mode}: flat MLM MFU at {shape}: {mfu:.1%} of {against} (goal >= {GOAL_MFU:.0%}): {verdict(mfu >= GOAL_MFU)}"
            )
        for base, base_mode in ((hf, mode), (hf_eager if mode == "compiled" else None, "eager")):
            if flat and base:
                x = flat["sequence_tokens_per_s"] / base["sequence_tokens_per_s"]
                lines.append(
                    f"{mode}: flat MLM vs {base_mode} HF BertForMaskedLM at {shape}: {x:.2f}x (goal >= {GOAL_VS_HF}x): {verdict(x >= GOAL_VS_HF)}"
                )
        if flat and cms:
            x = cms["sequence_tokens_per_s"] / flat["sequence_tokens_per_s"]
            xc = cms["corpus_tokens_per_s"] / flat["corpus_tokens_per_s"]
            lines.append(
                f"{mode}: CrossBERT r=0.5 CMS vs {mode} flat MLM at {shape}: {x:.2f}x sequence tokens/s (goal >= {GOAL_CROSSBERT}x): "
                f"{verdict(x >= GOAL_CROSSBERT)}; {xc:.2f}x corpus tokens/s"
            )
    for name in CONTENDERS:
        eager, compiled = at.get(("eager", name)), at.get(("compiled", name))
        if eager and compiled:
            lines.append(
                f"{name}: first-step loss eager {eager['loss_first']:.4f}, compiled {compiled['loss_first']:.4f} "
                f"(|diff| {abs(eager['loss_first'] - compiled['loss_first']):.2e}); compiled {compiled['sequence_tokens_per_s'] / eager['sequence_tokens_per_s']:.2f}x eager"
            )
    return lines


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def report(rows: list[dict], meta: dict) -> str:
    section = lambda name: [r for r in rows if r["section"] == name]  # noqa: E731
    throughput_cols = [
        "shape",
        "contender",
        "mode",
        "views",
        "step_ms_median",
        "step_ms_p90",
        "sequence_tokens_per_s",
        "corpus_tokens_per_s",
        "mfu",
        "mfu_datasheet",
        "peak_memory_gib",
        "compile_s",
        "loss_first",
        "sdpa",
        "host_syncs",
        "skipped",
        "error",
    ]
    pct = lambda r: {**r, **{k: f"{r[k]:.1%}" for k in ("mfu", "mfu_datasheet") if isinstance(r.get(k), float)}}  # noqa: E731
    parts = [f"# GPU check on {meta['device_name']} ({meta['elapsed_s']:.0f} s)", ""]
    for r in section("peak"):
        parts.append(
            f"matmul peak ({meta['precision']}): {r.get('peak_tflops', float('nan')):.1f} TFLOP/s measured "
            f"({r.get('method', '')}); datasheet {r.get('datasheet_tflops') or 'n/a'} TFLOP/s"
        )
    for r in section("gpu_state"):
        parts.append(f"GPU state {r.get('name')}: {r.get('clocks')} ({r.get('query', '')})")
    parts += [
        "",
        f"## Training throughput ({meta['precision']})",
        markdown([pct(r) for r in section("throughput")], throughput_cols),
        "",
        "## Goals",
        *[f"* {g}" for g in goals(rows)],
    ]
    for r in section("throughput"):
        if r.get("top_kernels"):
            parts += [
                "",
                f"### Top kernels: {r['shape']} {r['contender']} eager",
                markdown(r["top_kernels"], ["kernel", "ms", "share"]),
            ]
    parts += [
        "",
        "## The trainer's own loop (host batches prepared ahead, real train_step)",
        markdown(
            [pct(r) for r in section("trainer_loop")],
            [
                "contender",
                "preset",
                "batch",
                "seq_len",
                "vocab",
                "host_ms_per_batch",
                "loop_ms_per_step",
                "step_ms_median",
                "step_ms_p90",
                "sequence_tokens_per_s",
                "mfu",
                "host_bound",
                "skipped",
                "error",
            ],
        ),
        "",
        "## Short runs from scratch (loss must fall)",
        markdown(
            section("short_run"),
            [
                "contender",
                "preset",
                "steps",
                "batch",
                "seq_len",
                "loss_first",
                "loss_last",
                "loss_falls",
                "finite",
                "wall_s",
                "skipped",
                "error",
            ],
        ),
        "",
        "## Frozen feature extraction",
        markdown(section("features"), ["preset", "sentences", "sentences_per_s", "max_length", "batch", "skipped", "error"]),
    ]
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="CPU-sized: tiny shape, few steps (the test; seconds)")
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
    p.add_argument("--loop-contenders", nargs="*", default=["flat_mlm30", "crossbert_r50_cms"])
    p.add_argument("--sentences", type=int, default=8192)
    p.add_argument("--budget-s", type=float, default=360.0, help="a row starts only if its predicted end is within this")
    p.add_argument(
        "--fail",
        nargs="*",
        default=[],
        help="contender names whose every step raises, in every section they run in (tests the error path)",
    )
    p.add_argument("--out", default="runs/bench/gpu_check")
    p.add_argument("--device", default=None)
    args = p.parse_args(argv)
    if args.smoke:
        args.shapes = args.shapes or ["tiny"]
        args.compile = [] if args.compile is None else args.compile
        # The test's few steps; the committed CPU run (results/gpu/cpu_smoke) passes --warmup 8 --steps 40,
        # because a CMS step takes several steps to settle on a CPU.
        args.warmup = 1 if args.warmup is None else args.warmup
        args.steps = 2 if args.steps is None else args.steps
        args.run_steps, args.sentences = min(args.run_steps, 30), min(args.sentences, 256)
        args.run_shape, args.run_lr = ("nano", 8, 64), 2e-3
        args.loop_shape, args.loop_documents = ("nano", 8, 64), 200
    else:
        args.shapes = args.shapes or list(SHAPES)
        args.warmup = 5 if args.warmup is None else args.warmup
        args.steps = 20 if args.steps is None else args.steps
        # Compilation costs about a minute a model: measured where the goals are, not everywhere.
        args.compile = ["flat_mlm30", "crossbert_r50_cms"] if args.compile is None else args.compile
        args.run_shape = ("base", 32, 128)
        args.loop_shape, args.loop_documents = ("base", 64, 512), 4000
    if args.warmup < 1 or args.steps < 1:
        p.error(
            f"expected --warmup >= 1 (the first step is the compile and loss probe) and --steps >= 1, got {args.warmup} and {args.steps}"
        )
    return args


def prepare(args, device: torch.device) -> dict:
    tokenizer = load_tokenizer(args.tokenizer)
    tokenizer_ids = special_token_config(tokenizer)
    corpus = Path(args.corpus) if args.corpus else data_root() / "wikipedia_en_2015"
    shapes = {s: (SHAPES | SMOKE_SHAPES)[s] for s in args.shapes}
    largest = max(batch * seq_len for _, batch, seq_len in shapes.values())
    need = max(largest * (args.warmup + args.steps), args.run_shape[1] * args.run_shape[2] * args.run_steps // 4, 200_000)
    stream = corpus_slice(corpus, tokenizer, need)
    docs = [d for _, d in zip(range(50), iter_documents(str(corpus)))]
    log.info("device %s; corpus slice %s tokens of %s", device, f"{len(stream):,}", corpus)
    cls, sep = tokenizer_ids["cls_token_id"], tokenizer_ids["sep_token_id"]
    return {
        "device": device,
        "tokenizer": tokenizer,
        "tokenizer_ids": tokenizer_ids,
        "corpus": corpus,
        "shapes": shapes,
        "stream": stream,
        "texts": sentences_of(docs, 2048),
        "sequences": {name: PackedSequences(stream, seq_len, cls, sep) for name, (_, _, seq_len) in shapes.items()},
        "run_sequences": PackedSequences(stream, args.run_shape[2], cls, sep),
        # BERT's vocabulary for the throughput rows (the head's cost is part of the comparison)
        "bert_ids": dict(tokenizer_ids, vocab_size=BERT_VOCAB if not args.smoke else tokenizer_ids["vocab_size"]),
    }


def sentences_of(stream_docs: list[str], limit: int) -> list[str]:
    out = []
    for doc in stream_docs:
        out.extend(s.strip() + "." for s in doc.split(". ") if len(s.split()) >= 4)
        if len(out) >= limit:
            break
    return out[:limit]


def measure_peak(device) -> dict:
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    measured = matmul_flops(str(device), dtype)
    datasheet = datasheet_peak(device)
    method = "8192^3 random, CUDA events, median of 50 after 1 s warm-up" if device.type == "cuda" else "2048^3, best of 5"
    return {
        "peak_tflops": measured / 1e12,
        "datasheet_tflops": datasheet / 1e12 if datasheet else None,
        "method": method,
        "peaks": {"measured": measured, "datasheet": datasheet},
    }


def run_plan(args, rows: RowLog, meta: dict) -> None:
    budget = Budget(rows, args.budget_s)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    guarded(rows, "gpu_state", {"name": "before"}, lambda: gpu_state(device))
    data = prepare(args, device)
    peak = guarded(rows, "peak", {"name": "matmul"}, lambda: measure_peak(device))
    data["peaks"] = peak.get("peaks") or {"measured": float("nan"), "datasheet": None}
    meta.update(
        device=str(device),
        device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        precision="bf16 autocast" if device.type == "cuda" else "fp32",
        corpus=str(data["corpus"]),
        corpus_slice_tokens=int(len(data["stream"])),
    )
    first, *rest = list(data["shapes"])
    throughput_section(args, rows, budget, first, "eager", data)
    sections = [
        ("short_run", name, lambda name=name: short_run_row(args, name, data["run_sequences"], data["tokenizer_ids"], device))
        for name in args.run_objectives
    ]
    sections.append(("features", "encoder", lambda: feature_extraction_row(args, data["tokenizer"], data["texts"], device)))
    with tempfile.TemporaryDirectory(prefix="gpu_check_loop_") as workdir:
        sections += [
            (
                "trainer_loop",
                name,
                lambda name=name: trainer_loop_row(args, name, data["corpus"], device, data["peaks"], Path(workdir)),
            )
            for name in args.loop_contenders
        ]
        for section, name, measure in sections:
            key = {"contender" if section != "features" else "name": name}
            if not budget.fits(section, "eager"):
                rows.add(section, {**key, **budget.skipped(section, "eager")})
                continue
            began = time.perf_counter()
            guarded(rows, section, key, measure)
            budget.record(section, "eager", time.perf_counter() - began)
    throughput_section(args, rows, budget, first, "compiled", data)
    for shape in rest:
        throughput_section(args, rows, budget, shape, "eager", data)
        throughput_section(args, rows, budget, shape, "compiled", data)
    guarded(rows, "gpu_state", {"name": "after"}, lambda: gpu_state(device))


def write_outputs(out: Path, rows: RowLog, meta: dict) -> dict:
    meta["elapsed_s"] = rows.clock()
    meta.setdefault("device_name", "unknown")
    meta.setdefault("precision", "unknown")
    table = report(rows.rows, meta)
    result = {**meta, "rows": rows.rows, "goals": goals(rows.rows), **provenance()}
    atomic_write_json(out / "gpu_check.json", result)
    atomic_write_text(out / "gpu_check.md", table + "\n")
    print(table, flush=True)
    print(f"wrote {out / 'gpu_check.jsonl'}, {out / 'gpu_check.json'}, {out / 'gpu_check.md'}", flush=True)
    return result


def stop_on_signal(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stdout)
    setup()
    out = Path(args.out)
    rows = RowLog(out / "gpu_check.jsonl", time.perf_counter())
    meta = {"torch": torch.__version__, "args": {k: v for k, v in vars(args).items()}}
    previous = signal.signal(signal.SIGTERM, stop_on_signal)
    try:
        run_plan(args, rows, meta)
    except KeyboardInterrupt as e:  # `timeout` or Ctrl-C: what was measured is kept and tabulated
        rows.add("stopped", {"name": str(e) or "interrupted"})
    finally:
        signal.signal(signal.SIGTERM, previous)
        result = write_outputs(out, rows, meta)
        rows.close()
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
