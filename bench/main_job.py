"""End to end: wall time of the README's main job (the CPU sweep), per stage.

    python bench/main_job.py                               # run the main job into a fresh folder, then summarise
    python bench/main_job.py --summarise runs/sweeps/cpu_small --wall-seconds 1500 [--workers 2]

The main job runs as `make demo` runs it: --workers processes that claim runs from one sweep, each on its share of
the cores. The sweep records every stage it runs in `timings.jsonl` (train, probe, mteb; per run and checkpoint).
This sums them per stage and per run, each stage as a share of the worker time (wall x workers); the rest
(start-up, a worker waiting for the last run of the other, the report's plots) is "other".
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from _common import markdown, setup, write

from crossbert_model.utils import core_share  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def run_main_job(config: str, out_dir: Path, workers: int) -> float:
    """The wall time of `workers` sweep processes from the first start to the last exit (started 5 s apart, as the
    Makefile's sweep_workers starts them)."""
    if out_dir.exists():
        sys.exit(f"{out_dir} exists: the main job would resume there and time nothing; pass a fresh --run-dir")
    threads = core_share(workers)
    cmd = [
        sys.executable,
        "-m",
        "crossbert_eval.cli",
        "sweep",
        config,
        f"out_dir={out_dir}",
        f"train.data.cache_dir={out_dir}/cache",
        f"train.num_threads={threads}",
    ]
    print(f"running {workers} x:", " ".join(cmd), flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    processes = []
    for i in range(workers):
        processes.append(subprocess.Popen(cmd, cwd=REPO, env=env))
        if i < workers - 1:
            time.sleep(5)
    if any(process.wait() != 0 for process in processes):
        sys.exit("a worker of the main job failed: its log is above")
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/sweep/cpu_small.yaml")
    p.add_argument("--run-dir", default="runs/bench/main_job")
    p.add_argument("--summarise", type=Path, help="an existing sweep folder: summarise its timings, run nothing")
    p.add_argument("--wall-seconds", type=float, help="with --summarise: the measured wall time of that run")
    p.add_argument("--workers", type=int, default=2, help="sweep processes, as `make demo` (WORKERS) starts them")
    p.add_argument("--out", default="runs/bench")
    args = p.parse_args()
    if args.workers < 1:
        p.error(f"--workers: expected a positive integer, got {args.workers}")
    setup()
    import pandas as pd

    from crossbert_eval.folder_layout import SweepDir
    from crossbert_model.readers import read_jsonl

    if args.summarise:
        root, wall = args.summarise, args.wall_seconds
    else:
        wall = run_main_job(args.config, Path(args.run_dir), args.workers)
        root = Path(args.run_dir) / Path(args.config).stem
    timings = pd.DataFrame(read_jsonl(SweepDir(root).timings))
    if timings.empty:
        sys.exit(f"{SweepDir(root).timings}: no stage timings (is this a sweep folder?)")
    per_stage = timings.groupby("stage")["seconds"].agg(["sum", "count"])
    total = float(per_stage["sum"].sum())
    worker_seconds = wall * args.workers if wall else None
    rows = [
        {
            "stage": s,
            "units": int(r["count"]),
            "seconds": float(r["sum"]),
            "share_of_worker_time": float(r["sum"]) / worker_seconds if wall else None,
        }
        for s, r in per_stage.sort_values("sum", ascending=False).iterrows()
    ]
    if wall:
        rows.append(
            {
                "stage": "other (start-up, waiting, plots)",
                "units": "",
                "seconds": worker_seconds - total,
                "share_of_worker_time": (worker_seconds - total) / worker_seconds,
            }
        )
        rows.append(
            {"stage": f"worker time (wall x {args.workers})", "units": "", "seconds": worker_seconds, "share_of_worker_time": 1.0}
        )
    per_run = timings.pivot_table(index="run", columns="stage", values="seconds", aggfunc="sum").fillna(0.0)
    per_run["total"] = per_run.sum(axis=1)
    run_rows = [{"run": run, **{k: float(v) for k, v in r.items()}} for run, r in per_run.iterrows()]
    table = markdown(rows, ["stage", "units", "seconds", "share_of_worker_time"])
    table += "\n\n" + markdown(run_rows, ["run", *[c for c in per_run.columns]])
    write(args.out, "main_job", rows, table, per_run=run_rows, sweep=str(root), wall_seconds=wall, workers=args.workers)


if __name__ == "__main__":
    main()
