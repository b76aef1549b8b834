"""The fused, chunked vocabulary head against full logits (the named baseline), one training step of each objective.

    python bench/vocab_head.py [--presets tiny mini] [--dtypes fp32 bf16] [--chunk-rows 1024] [--rounds 5] [--out runs/bench]

A CrossBERT r = 0.5 CMS step predicts every token of its batch (32 x 128 = 4,096 rows); flat MLM predicts 15%.
Each (preset, objective, dtype) runs `full` (model.vocab_chunk_rows = null: the (rows, vocab) logits exist) and
`chunked` (model.vocab_chunk_rows = --chunk-rows) in alternating child processes, one per round, so each child's
peak resident memory (ru_maxrss) is its own. Reported: median step time (forward + backward + AdamW) and the
median peak memory of each, and their ratios (chunked / full). Random token ids: the costs do not depend on them.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import contender_config, setup  # noqa: E402  (puts the repository on sys.path)

from crossbert_model.utils import atomic_write_json, provenance  # noqa: E402

OBJECTIVES = {
    "flat_mlm": {"objective": "mlm", "mask_ratio": 0.15},
    "crossbert_r50": {"objective": "crossbert", "mask_ratio": 0.5, "complementary_masking": True},
}


def child(preset: str, objective: str, dtype: str, chunk_rows: int | None, steps: int, vocab: int) -> dict:
    """One contender in this process: `steps` timed training steps after two warm-up steps."""
    import torch

    from crossbert_model.masking import RowRandom
    from crossbert_model.objectives import pretraining_batch, pretraining_model_for

    setup()
    torch.manual_seed(0)
    config = contender_config(preset, {**OBJECTIVES[objective], "vocab_chunk_rows": chunk_rows}, 128, vocab_size=vocab)
    model = pretraining_model_for(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(5, vocab, (32, 128), generator=torch.Generator().manual_seed(0))
    batch = pretraining_batch(ids, torch.ones_like(ids), config, RowRandom(0))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16")
    times = []
    for step in range(steps + 2):
        started = time.perf_counter()
        with autocast:
            out = model(**batch)
        out.loss_sum.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= 2:
            times.append(time.perf_counter() - started)
    return {"step_s": statistics.median(times), "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["tiny", "mini"])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--chunk-rows", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per child")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--out", default="runs/bench")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(**json.loads(args.child))))
        return
    rows = []
    for preset in args.presets:
        for objective in OBJECTIVES:
            for dtype in args.dtypes:
                runs: dict[str, list[dict]] = {"full": [], "chunked": []}
                for _ in range(args.rounds):  # interleaved: full, chunked, full, chunked, ...
                    for name, chunk in (("full", None), ("chunked", args.chunk_rows)):
                        spec = {
                            "preset": preset,
                            "objective": objective,
                            "dtype": dtype,
                            "chunk_rows": chunk,
                            "steps": args.steps,
                            "vocab": args.vocab,
                        }
                        out = subprocess.run(
                            [sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True, check=True
                        )
                        runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
                med = {
                    name: {k: statistics.median(r[k] for r in rs) for k in ("step_s", "peak_rss_mib")}
                    for name, rs in runs.items()
                }
                row = {
                    "preset": preset,
                    "objective": objective,
                    "dtype": dtype,
                    "chunk_rows": args.chunk_rows,
                    "full_step_s": med["full"]["step_s"],
                    "chunked_step_s": med["chunked"]["step_s"],
                    "step_ratio": med["chunked"]["step_s"] / med["full"]["step_s"],
                    "full_peak_mib": med["full"]["peak_rss_mib"],
                    "chunked_peak_mib": med["chunked"]["peak_rss_mib"],
                    "peak_ratio": med["chunked"]["peak_rss_mib"] / med["full"]["peak_rss_mib"],
                }
                rows.append(row)
                print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    atomic_write_json(
        Path(args.out) / "vocab_head.json", {"rows": rows, "rounds": args.rounds, "steps": args.steps, **provenance()}
    )


if __name__ == "__main__":
    main()
