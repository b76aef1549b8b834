"""Does a rerun of the main job reproduce the committed reference? For every score of the rerun's final
checkpoints (main metric, every task, probe and layer) the difference from the committed run of the same name,
against the committed seed spread (std over the 3 seeds) of that objective, size, task, probe and layer.

    python experiments/cpu_small/reproduce_check.py RERUN_SWEEP_DIR [--reference results/cpu_small]

The rerun needs its own tables (`crossbert report RERUN_SWEEP_DIR`). Prints a markdown summary per run and the
worst cases; exit status 1 when any score lies more than 2 seed standard deviations from its committed value.
"""

import argparse
import sys
from pathlib import Path

import pandas as pd

KEYS = ["objective", "size", "task", "probe", "layer"]


def final_scores(sweep: Path) -> pd.DataFrame:
    plain = sweep / "tables" / "scores.csv"  # a sweep folder's; a committed reference keeps it as scores.csv.xz
    scores = pd.read_csv(plain if plain.is_file() else plain.with_name("scores.csv.xz"))
    return scores[scores["is_final"] & scores["is_main"]][["run", "seed", *KEYS, "score"]]


def deviations(rerun: pd.DataFrame, reference: pd.DataFrame) -> pd.DataFrame:
    spread = reference.groupby(KEYS)["score"].std().rename("seed_std").reset_index()
    same_run = reference.rename(columns={"score": "reference"})[["run", *KEYS, "reference"]]
    out = rerun.merge(same_run, on=["run", *KEYS]).merge(spread, on=KEYS)
    out["difference"] = out["score"] - out["reference"]
    out["in_seed_stds"] = out["difference"].abs() / out["seed_std"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rerun", type=Path)
    parser.add_argument("--reference", type=Path, default=Path(__file__).resolve().parents[2] / "results" / "cpu_small")
    args = parser.parse_args()
    table = deviations(final_scores(args.rerun), final_scores(args.reference))
    print(
        "| run | scores | identical | max abs difference (points) | median in seed stds | max in seed stds | beyond 2 seed stds |"
    )
    print("|---|---|---|---|---|---|---|")
    for run, rows in table.groupby("run"):
        print(
            f"| {run} | {len(rows)} | {int((rows['difference'].abs() < 1e-9).sum())} | {rows['difference'].abs().max():.2f} | "
            f"{rows['in_seed_stds'].median():.2f} | {rows['in_seed_stds'].max():.2f} | {int((rows['in_seed_stds'] > 2).sum())} |"
        )
    columns = ["run", "task", "probe", "layer", "reference", "score", "difference", "seed_std", "in_seed_stds"]
    print("\nLargest differences against the seed spread:\n")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for _, row in table.sort_values("in_seed_stds", ascending=False).head(8).iterrows():
        print("| " + " | ".join(f"{row[c]:.2f}" if isinstance(row[c], float) else str(row[c]) for c in columns) + " |")
    return int(bool((table["in_seed_stds"] > 2).any()))


if __name__ == "__main__":
    sys.exit(main())
