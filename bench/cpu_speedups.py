"""What makes the main job's training step faster on this CPU: fp32 vs bf16 autocast vs torch.compile.

    python bench/cpu_speedups.py [--presets tiny] [--objectives mlm crossbert] [--rounds 5] [--out runs/bench]

For each (preset, objective) three contenders train the SAME model copy on the SAME real Wikipedia batches
(seq 128, batch 32, AdamW), interleaved round by round (A B C A B C ...) on this shared machine:
  eager_fp32      the reference
  eager_bf16      bf16 autocast (what `dtype: auto` picks where a bf16 matmul measures faster)
  compiled_bf16   torch.compile(model, dynamic=True) under bf16 autocast; its one-off compile time is
                  reported apart, with the training steps it takes to pay it back. Inductor compiles
                  in worker processes that compete with the timed steps on a 2-core machine: time the
                  eager contenders alone with `--contenders eager_bf16`.
Ratios are medians over rounds of (eager_fp32 seconds / contender seconds): > 1 is faster. The main job
adopts a contender only where it is measured faster here, and the result rows never depend on the choice
of contender beyond the documented precision (fp32 features for every probe).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import torch

from _common import contender_config, interleaved, markdown, median_ratio, setup, write

from crossbert_model.data.sequences import EpochSampler, prepare_data  # noqa: E402
from crossbert_model.data_args import DataArgs  # noqa: E402
from crossbert_model.hardware import bf16_speedup  # noqa: E402
from crossbert_model.objectives import objective_names, pretraining_batch, pretraining_model_for  # noqa: E402
from crossbert_model.train import step_generator  # noqa: E402


class Stepper:
    """One model + optimizer that trains a step on a batch, in a given precision, eager or compiled."""

    def __init__(self, config, amp: torch.dtype | None, compiled: bool):
        torch.manual_seed(0)
        self.config, self.amp = config, amp
        self.model = pretraining_model_for(config).train()
        self.forward = torch.compile(self.model, dynamic=True) if compiled else self.model
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)

    def step(self, ids: torch.Tensor, generator) -> None:  # generator: masking.RowRandom
        batch = pretraining_batch(ids, torch.ones_like(ids), self.config, generator)
        with torch.autocast("cpu", dtype=self.amp or torch.float32, enabled=self.amp is not None):
            loss = self.forward(**batch).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def bench(preset: str, objective: str, data, args) -> list[dict]:
    config = contender_config(
        preset, {"objective": objective}, args.seq_len, data.tokenizer
    )  # at the objective's default mask ratio
    recipes = {"eager_fp32": (None, False), "eager_bf16": (torch.bfloat16, False), "compiled_bf16": (torch.bfloat16, True)}
    contenders = {name: Stepper(config, *recipes[name]) for name in ["eager_fp32", *args.contenders]}
    sampler = EpochSampler(len(data.train), 0)
    counter = iter(range(10**9))

    def batch():
        step = next(counter)
        return data.train.get(sampler.indices(step, args.batch_size)), step_generator(0, step)

    warmup = {}
    for name, c in contenders.items():  # the first steps include compilation (and recompiles for new shapes)
        start = time.perf_counter()
        for _ in range(args.warmup):
            c.step(*batch())
        warmup[name] = time.perf_counter() - start

    def timed_steps(c):
        return lambda: [c.step(*batch()) for _ in range(args.steps)]

    times = interleaved({n: timed_steps(c) for n, c in contenders.items()}, args.rounds)
    rows = []
    for name in contenders:
        per_step = statistics.median(times[name]) / args.steps
        row = {
            "preset": preset,
            "objective": objective,
            "contender": name,
            "seconds_per_step": per_step,
            "corpus_tokens_per_s": args.batch_size * args.seq_len / per_step,
            "x_vs_eager_fp32": median_ratio(times, "eager_fp32", name),
            "warmup_s": warmup[name],
        }
        rows.append(row)
    by_name = {r["contender"]: r for r in rows}
    if {"eager_bf16", "compiled_bf16"} <= set(by_name):
        eager, compiled = by_name["eager_bf16"], by_name["compiled_bf16"]
        overhead = compiled["warmup_s"] - args.warmup * compiled["seconds_per_step"]
        saved = eager["seconds_per_step"] - compiled["seconds_per_step"]
        compiled["compile_s"] = overhead
        compiled["steps_to_pay_back"] = overhead / saved if saved > 0 else float("inf")
    logging.info("%s %s: %s", preset, objective, ", ".join(f"{r['contender']} x{r['x_vs_eager_fp32']:.2f}" for r in rows))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", nargs="+", default=["tiny"])
    p.add_argument("--objectives", nargs="+", default=list(objective_names()), choices=objective_names())
    p.add_argument(
        "--contenders",
        nargs="+",
        default=["eager_bf16", "compiled_bf16"],
        choices=["eager_bf16", "compiled_bf16"],
        help="against eager_fp32 (always run)",
    )
    p.add_argument("--corpus", default="${data_root}/wikipedia_en_2015")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default="runs/bench")
    args = p.parse_args()
    setup()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    data = prepare_data(DataArgs(corpus=args.corpus, seq_len=args.seq_len))
    rows = [row for preset in args.presets for objective in args.objectives for row in bench(preset, objective, data, args)]
    cols = [
        "preset",
        "objective",
        "contender",
        "seconds_per_step",
        "corpus_tokens_per_s",
        "x_vs_eager_fp32",
        "warmup_s",
        "compile_s",
        "steps_to_pay_back",
    ]
    write(
        args.out,
        "cpu_speedups",
        rows,
        markdown(rows, cols),
        bf16_matmul_speedup=bf16_speedup("cpu"),
        threads=torch.get_num_threads(),
    )


if __name__ == "__main__":
    main()
