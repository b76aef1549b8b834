"""The decisive comparison's tables, in Markdown, from a report folder's tables/:

    python experiments/cpu_offplateau/decisive_table.py results/cpu_offplateau > results/cpu_offplateau/decisive.md

Scores: mean +- std over seeds (n), main metric x 100, layer 0 and the last layer. Comparisons: the report's own
rows (tables/comparisons.csv: Welch's t-test over seeds, Benjamini-Hochberg over the whole report), nothing
recomputed here. Geometry: the report's seed means of the last layer.
"""

import sys
from pathlib import Path

import pandas as pd

from crossbert_eval.report.noise import read_comparisons

ROWS = [  # (task, probe, what it reads)
    ("STSBenchmark", "mteb", "mteb STSBenchmark test, cosine Spearman"),
    ("STS-B", "cosine", "STS-B validation, cosine Pearson, raw"),
    ("STS-B", "cosine (centred)", "... centred"),
    ("STS-B", "cosine (whitened)", "... whitened"),
    ("STS-B", "knn", "STS-B validation, kNN Pearson, raw"),
    ("STS-B", "knn (centred)", "... centred"),
    ("STS-B", "knn (whitened)", "... whitened"),
    ("STS-B", "linear", "STS-B validation, linear Pearson"),
    ("BigramShift", "linear", "BigramShift, linear accuracy"),
    ("CoordinationInversion", "linear", "CoordinationInversion, linear accuracy"),
    ("SST-2", "linear", "SST-2 validation, linear accuracy"),
]
GEOMETRY = ["effective_rank", "effective_rank_centred", "dataset_entropy", "dataset_entropy_centred", "anisotropy"]


def mean_std(values: pd.Series) -> str:
    if values.empty:
        return "-"
    std = f" +- {values.std():.1f}" if len(values) > 1 else ""
    return f"{values.mean():.1f}{std} ({len(values)})"


def score_table(scores: pd.DataFrame, objectives: list[str]) -> list[str]:
    main = scores[scores["is_main"] & scores["is_final"]]
    last = int(main["layer"].max())
    lines = [
        "| score | " + " | ".join(f"{o} L0 | {o} L{last}" for o in objectives) + " |",
        "|---|" + "---|---|" * len(objectives),
    ]
    for task, probe, label in ROWS:
        cells = []
        for objective in objectives:
            sub = main[(main["task"] == task) & (main["probe"] == probe) & (main["objective"] == objective)]
            cells += [mean_std(sub[sub["layer"] == layer]["score"]) for layer in (0, last)]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def comparison_table(comparisons: pd.DataFrame, comparison: str) -> list[str]:
    rows = comparisons[comparisons["comparison"] == comparison]
    first, second = comparison.split(" - ", 1)  # the label's sides, in its order (noise.SIDES)
    lines = [
        f"| task | probe | {first} | {second} | {first} - {second} | Welch p | BH-adjusted p | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for task, probe, _ in ROWS:
        for r in rows[(rows["task"] == task) & (rows["probe"] == probe)].itertuples():
            p = "-" if pd.isna(r.p_value) else f"{r.p_value:.3g}"
            adjusted = "-" if pd.isna(r.p_adjusted) else f"{r.p_adjusted:.3g}"
            means = f"{r.first_mean:.1f} | {r.second_mean:.1f} | {r.diff:+.1f}"
            lines.append(f"| {task} | {probe} | {means} | {p} | {adjusted} | {r.verdict} |")
    return lines


def geometry_table(geometry: pd.DataFrame, objectives: list[str]) -> list[str]:
    lines = ["| task | metric (last layer) | " + " | ".join(objectives) + " |", "|---|---|" + "---|" * len(objectives)]
    for (task, metric), sub in geometry[geometry["metric"].isin(GEOMETRY)].groupby(["task", "metric"]):
        cells = []
        for objective in objectives:
            row = sub[sub["objective"] == objective]
            if row.empty:
                cells.append("-")
                continue
            r = row.iloc[0]
            cells.append(f"{r['mean']:.2f}" + ("" if pd.isna(r["std"]) else f" +- {r['std']:.2f}") + f" ({int(r['seeds'])})")
        lines.append(f"| {task} | {metric} | " + " | ".join(cells) + " |")
    return lines


def main(folder: Path) -> None:
    tables = folder / "tables"
    plain = tables / "scores.csv"  # a report folder's; a committed reference keeps it as scores.csv.xz
    scores = pd.read_csv(plain if plain.is_file() else plain.with_name("scores.csv.xz"))
    objectives = sorted(scores["objective"].unique(), key=lambda o: (o != "mlm", o))
    comparisons = read_comparisons(tables / "comparisons.csv")  # old tables' a/b columns read as first/second
    out = ["## Scores", "", *score_table(scores, objectives), ""]
    for comparison in sorted(c for c in comparisons["comparison"].unique() if " - mlm" in c):
        out += [f"## {comparison} (last layer)", "", *comparison_table(comparisons, comparison), ""]
    out += ["## Geometry", "", *geometry_table(pd.read_csv(tables / "geometry.csv"), objectives)]
    print("\n".join(out))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
