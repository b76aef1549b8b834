"""The corpus pipeline: tokenization speed on 1 worker vs every core, and the data loader's share of a step.

    python bench/data_pipeline.py [--workers 1 2] [--rounds 2] [--presets tiny mini] [--out runs/bench]

(a) Tokenization (`crossbert_model.data.token_cache.tokenize_corpus`) of the real default corpus, into a fresh token
    folder in a temporary directory each time, with 1 worker process (in this process, one thread) and with
    every core, interleaved round by round (1 N 1 N ...); the ratio is the median of per-round ratios. Each
    round also checks that every worker count wrote the same token stream. Reported per worker count:
      tokens/s           corpus tokens written per second of wall time
      CPU s              CPU seconds of this process + its worker processes (the work, whatever the load);
                         main CPU s: this process's own (reading, splitting, writing)
      idle-bound ratio   1-worker CPU seconds / the least wall time N workers' CPU seconds allow on this
                         machine's cores (see `least_wall`): the ratio idle cores would give
    plus the main process reading alone (decompression, cutting blocks): the rate no worker count exceeds.
(b) The loader's share of a training step: the trainer's batch preparation (EpochSampler.indices +
    PackedSequences.get + crossbert_model.objectives.pretraining_batch, as `Trainer.global_batch`) against
    the whole step (that + forward + backward + gradient clipping + AdamW), per preset and objective, at
    seq 128 batch 32 on `--device` (cuda: the batch is copied to the GPU in the preparation, and the
    step synchronises before its clock stops). get ms: PackedSequences.get alone; batch ms: the whole
    preparation; loader share: batch ms / step ms, in percent.
(c) The loader's capacity: batch preparation alone (no model) at larger batches, in sequences/s, on one
    torch thread and on all, to set beside an accelerator's step rate.

The machine's load average is recorded before and after: on a busy machine (a training job beside it)
the wall-clock ratio of (a) understates what idle cores give; the idle-bound ratio hardly depends on it.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import logging
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from _common import contender_config, markdown, setup, with_every_objective, write  # noqa: E402  (puts the repository on sys.path)

from crossbert_model.data.corpus import corpus_blocks  # noqa: E402
from crossbert_model.data.sequences import EpochSampler, load_tokens  # noqa: E402
from crossbert_model.data.token_cache import tokenize_corpus, tokenizer_workers  # noqa: E402
from crossbert_model.data.tokenizer import prepare_tokenizer  # noqa: E402
from crossbert_model.data_args import DataArgs  # noqa: E402
from crossbert_model.objectives import pretraining_batch, pretraining_model_for  # noqa: E402
from crossbert_model.train import step_generator  # noqa: E402

# name -> model section (ModelArgs fields)
OBJECTIVES = with_every_objective(
    {
        "flat_mlm": {"objective": "mlm", "mask_ratio": 0.15},
        "crossbert_r50": {"objective": "crossbert", "mask_ratio": 0.5, "complementary_masking": True},
    }
)


def cpu_seconds() -> tuple[float, float]:
    """(this process, its finished children): user + system CPU seconds."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def tokenize_once(data_args: DataArgs, tokenizer, workers: int, scratch: Path) -> dict:
    cache = Path(tempfile.mkdtemp(prefix=f"tokens-{workers}w-", dir=scratch))
    own0, kids0 = cpu_seconds()
    start = time.perf_counter()
    token_dir = tokenize_corpus(dataclasses.replace(data_args, cache_dir=str(cache), num_workers=workers), tokenizer)
    wall = time.perf_counter() - start
    own1, kids1 = cpu_seconds()  # the pool has exited: its workers' CPU time is in RUSAGE_CHILDREN
    data = load_tokens(token_dir, tokenizer, 128)
    tokens = len(data.train.tokens) + len(data.val.tokens)
    return {
        "wall": wall,
        "main_cpu": own1 - own0,
        "worker_cpu": kids1 - kids0,
        "tokens": tokens,
        "stream": stream_digest(data),
        "token_dir": token_dir,
    }


def least_wall(run: dict, workers: int, cores: int) -> float:
    """The least wall time this run's CPU seconds allow on idle cores: neither the main process, nor the
    workers (their CPU seconds spread over `workers`), nor all of it spread over the cores can go faster."""
    if workers == 1:
        return run["main_cpu"]
    return max(run["main_cpu"], run["worker_cpu"] / workers, (run["main_cpu"] + run["worker_cpu"]) / cores)


def stream_digest(data) -> str:
    h = hashlib.sha256()
    for split in (data.train, data.val):
        for part in split.tokens.parts:
            h.update(np.asarray(part).tobytes())
        h.update(b"|")
    return h.hexdigest()[:16]


def read_only_seconds(data_args: DataArgs) -> float:
    """The main process's own share: decompress and cut the corpus into blocks, encode nothing."""
    start = time.perf_counter()
    for _ in corpus_blocks(data_args):
        pass
    return time.perf_counter() - start


def bench_tokenization(args, data_args: DataArgs, tokenizer, scratch: Path) -> tuple[list[dict], dict, Path]:
    runs = {w: [] for w in args.workers}
    for r in range(args.rounds):
        digests = set()
        for w in args.workers:
            result = tokenize_once(data_args, tokenizer, w, scratch)
            runs[w].append(result)
            digests.add(result["stream"])
            rate = result["tokens"] / result["wall"]
            logging.info("round %d: %d worker(s): %.2f s, %.0f tokens/s", r + 1, w, result["wall"], rate)
        if len(digests) != 1:
            raise SystemExit(f"round {r + 1}: the worker counts wrote different token streams: {digests}")
    base = 1
    read_s = read_only_seconds(data_args)
    tokens = runs[base][0]["tokens"]
    cores = len(os.sched_getaffinity(0))
    cpu_base = statistics.median(x["main_cpu"] + x["worker_cpu"] for x in runs[base])
    rows = []
    for w in args.workers:
        rs = runs[w]
        rows.append(
            {
                "workers": w,
                "seconds": statistics.median(x["wall"] for x in rs),
                "tokens_per_s": statistics.median(x["tokens"] / x["wall"] for x in rs),
                "x_vs_1_worker": statistics.median(b["wall"] / x["wall"] for b, x in zip(runs[base], rs)),
                "cpu_s": statistics.median(x["main_cpu"] + x["worker_cpu"] for x in rs),
                "main_cpu_s": statistics.median(x["main_cpu"] for x in rs),
                "idle_bound_x": cpu_base / statistics.median(least_wall(x, w, cores) for x in rs),
            }
        )
    reader = {"seconds": read_s, "tokens_per_s": tokens / read_s, "tokens": tokens}
    return rows, reader, runs[base][-1]["token_dir"]


def bench_loader_share(args, data) -> list[dict]:
    device = torch.device(args.device)
    sampler = EpochSampler(len(data.train), 0)
    rows = []
    for preset in args.presets:
        for name, spec in OBJECTIVES.items():
            torch.manual_seed(0)
            config = contender_config(preset, spec, args.seq_len, data.tokenizer)
            model = pretraining_model_for(config).to(device).train()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            get_s, prep_s, step_s = [], [], []
            for step in range(args.warmup + args.steps):
                sync(device)
                t0 = time.perf_counter()
                ids = data.train.get(sampler.indices(step, args.batch_size))
                t1 = time.perf_counter()
                batch = pretraining_batch(ids, torch.ones_like(ids), config, step_generator(0, step))
                batch = {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
                t2 = time.perf_counter()
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                    loss = model(**batch).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                sync(device)
                t3 = time.perf_counter()
                if step >= args.warmup:
                    get_s.append(t1 - t0)
                    prep_s.append(t2 - t0)
                    step_s.append(t3 - t0)
            prep, step_med = statistics.median(prep_s), statistics.median(step_s)
            rows.append(
                {
                    "preset": preset,
                    "objective": name,
                    "device": device.type,
                    "batch": args.batch_size,
                    "seq_len": args.seq_len,
                    "get_ms": 1e3 * statistics.median(get_s),
                    "batch_ms": 1e3 * prep,
                    "step_ms": 1e3 * step_med,
                    "loader_share_pct": 100 * prep / step_med,
                }
            )
            logging.info("%s %s: batch %.2f ms of a %.1f ms step", preset, name, 1e3 * prep, 1e3 * step_med)
    return rows


def bench_loader_capacity(args, data) -> list[dict]:
    """Batch preparation alone (no model): the sequences per second the loader can deliver, on one
    torch thread (as a background preparer beside the step would run) and on all of them."""
    sampler = EpochSampler(len(data.train), 0)
    all_threads, rows = torch.get_num_threads(), []
    for threads in sorted({1, all_threads}):
        torch.set_num_threads(threads)
        for name, spec in OBJECTIVES.items():
            config = contender_config("tiny", spec, args.seq_len, data.tokenizer)
            for batch_size in args.capacity_batch_sizes:
                s = statistics.median(prepare_seconds(data, sampler, config, batch_size, args))
                rows.append(
                    {
                        "objective": name,
                        "threads": threads,
                        "batch": batch_size,
                        "batch_ms": 1e3 * s,
                        "sequences_per_s": batch_size / s,
                    }
                )
    torch.set_num_threads(all_threads)
    return rows


def prepare_seconds(data, sampler, config, batch_size: int, args) -> list[float]:
    seconds = []
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        ids = data.train.get(sampler.indices(step, batch_size))
        pretraining_batch(ids, torch.ones_like(ids), config, step_generator(0, step))
        if step >= args.warmup:
            seconds.append(time.perf_counter() - t0)
    return seconds


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default="${data_root}/wikipedia_en_2015")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--workers", type=int, nargs="+", default=None, help="worker counts to compare with 1 (default: every core)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--presets", nargs="+", default=["tiny", "mini"])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=10, help="timed training steps per preset and objective")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--capacity-batch-sizes", type=int, nargs="+", default=[32, 256], help="(c): batch preparation alone")
    p.add_argument("--loader-only", action="store_true", help="only (b) and (c): tokenize once, on every core, untimed")
    p.add_argument("--cache-dir", default="runs/cache", help="where the tokenizer is found (token folders go to a temp dir)")
    p.add_argument("--out", default="runs/bench")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    setup()
    data_args = DataArgs(corpus=args.corpus, vocab_size=args.vocab_size, cache_dir=args.cache_dir)
    args.workers = sorted({1, *(args.workers or [tokenizer_workers(data_args)])})  # 1: the baseline of every ratio
    load_before = os.getloadavg()
    tokenizer = prepare_tokenizer(data_args)
    notes = [f"load average before: {load_before[0]:.2f} (1 min), {load_before[1]:.2f} (5 min) on {os.cpu_count()} cores"]
    with tempfile.TemporaryDirectory(prefix="bench-data-pipeline-") as scratch:
        if args.loader_only:
            token_rows, reader = [], None
            token_dir = tokenize_once(data_args, tokenizer, max(args.workers), Path(scratch))["token_dir"]
        else:
            token_rows, reader, token_dir = bench_tokenization(args, data_args, tokenizer, Path(scratch))
        data = load_tokens(token_dir, tokenizer, args.seq_len)
        share_rows = bench_loader_share(args, data)
        capacity_rows = bench_loader_capacity(args, data)
        del data  # its memory maps point into the scratch folder
    load_after = os.getloadavg()
    notes.append(f"load average after: {load_after[0]:.2f} (1 min), {load_after[1]:.2f} (5 min)")
    if reader:
        notes.append(
            f"main process reading alone (decompress + cut blocks): {reader['seconds']:.2f} s, "
            f"{reader['tokens_per_s']:,.0f} corpus tokens/s: the ceiling of any worker count"
        )
    table = "\n\n".join(
        t
        for t in (
            markdown(token_rows, ["workers", "seconds", "tokens_per_s", "x_vs_1_worker", "cpu_s", "main_cpu_s", "idle_bound_x"])
            if token_rows
            else "",
            markdown(share_rows, ["preset", "objective", "device", "get_ms", "batch_ms", "step_ms", "loader_share_pct"]),
            markdown(capacity_rows, ["objective", "threads", "batch", "batch_ms", "sequences_per_s"]),
            "\n".join(f"- {n}" for n in notes),
        )
        if t
    )
    write(
        args.out,
        "data_pipeline",
        token_rows + share_rows + capacity_rows,
        table,
        reader=reader,
        notes=notes,
        args=vars(args),
        load_average={"before": load_before, "after": load_after},
    )


if __name__ == "__main__":
    main()
