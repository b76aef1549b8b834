"""End to end: wall time of the README's main job (the CPU sweep), per stage.

    python bench/main_job.py                               # run the main job into a fresh folder, then summarise
    python bench/main_job.py --summarise runs/sweeps/cpu_small [--wall-seconds 2700]

The sweep records every stage it runs in `timings.jsonl` (train, probe, mteb; per run and checkpoint).
This sums them per stage and per run, with each stage's share of the measured wall time; the rest
(start-up, tokenizer training is inside the first `train`, report and plots) is "other".
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from _common import markdown, setup, write

REPO = Path(__file__).resolve().parent.parent


def run_main_job(config: str, out_dir: Path) -> float:
    if out_dir.exists():
        sys.exit(f"{out_dir} exists: the main job would resume there and time nothing; pass a fresh --run-dir")
    cmd = [
        sys.executable,
        "-m",
        "crossbert_eval.cli",
        "sweep",
        config,
        f"out_dir={out_dir}",
        f"train.data.cache_dir={out_dir}/cache",
    ]
    print("running:", " ".join(cmd), flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=REPO)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/sweep/cpu_small.yaml")
    p.add_argument("--run-dir", default="runs/bench/main_job")
    p.add_argument("--summarise", type=Path, help="an existing sweep folder: summarise its timings, run nothing")
    p.add_argument("--wall-seconds", type=float, help="with --summarise: the measured wall time of that run")
    p.add_argument("--out", default="runs/bench")
    args = p.parse_args()
    setup()
    import pandas as pd

    from crossbert_eval.folder_layout import SweepDir
    from crossbert_model.readers import read_jsonl

    if args.summarise:
        root, wall = args.summarise, args.wall_seconds
    else:
        wall = run_main_job(args.config, Path(args.run_dir))
        root = Path(args.run_dir) / Path(args.config).stem
    timings = pd.DataFrame(read_jsonl(SweepDir(root).timings))
    if timings.empty:
        sys.exit(f"{SweepDir(root).timings}: no stage timings (is this a sweep folder?)")
    per_stage = timings.groupby("stage")["seconds"].agg(["sum", "count"])
    total = float(per_stage["sum"].sum())
    rows = [
        {
            "stage": s,
            "units": int(r["count"]),
            "seconds": float(r["sum"]),
            "share_of_wall": float(r["sum"]) / wall if wall else None,
        }
        for s, r in per_stage.sort_values("sum", ascending=False).iterrows()
    ]
    if wall:
        rows.append(
            {
                "stage": "other (start-up, report, plots)",
                "units": "",
                "seconds": wall - total,
                "share_of_wall": (wall - total) / wall,
            }
        )
        rows.append({"stage": "wall", "units": "", "seconds": wall, "share_of_wall": 1.0})
    per_run = timings.pivot_table(index="run", columns="stage", values="seconds", aggfunc="sum").fillna(0.0)
    per_run["total"] = per_run.sum(axis=1)
    run_rows = [{"run": run, **{k: float(v) for k, v in r.items()}} for run, r in per_run.iterrows()]
    table = markdown(rows, ["stage", "units", "seconds", "share_of_wall"])
    table += "\n\n" + markdown(run_rows, ["run", *[c for c in per_run.columns]])
    write(args.out, "main_job", rows, table, per_run=run_rows, sweep=str(root), wall_seconds=wall)


if __name__ == "__main__":
    main()
