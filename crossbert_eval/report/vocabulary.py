"""The report's words: one home for the human name of every column, probe and axis, used by every plot (axis labels,
panel titles, legends) and every table header of the report pages, so one score is never named two ways.

    label("glue_linear")                  -> "GLUE average, linear probe"
    axis_label("glue_linear")             -> "GLUE average, linear probe (points)"
    panel_title("SST-2", "knn", "accuracy") -> "SST-2, kNN probe (accuracy)"
    average_title("mteb_avg", ["STSBenchmark"]) -> "STSBenchmark (MTEB)": a panel is titled by what it holds
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# Every score the report shows is in points: 100 x the task's main metric.
SCORE_UNIT = "points"
LOSS_UNIT = "nats"
ENTROPY_UNIT = "nats"  # the geometry's entropies, like the losses, are natural-log

PROBE_LABELS: Mapping[str, str] = MappingProxyType(
    {
        "linear": "linear probe",
        "knn": "kNN probe",
        "mteb": "MTEB",
        "cosine": "cosine similarity",
    }
)

# Column name -> (human name, unit or None). Columns absent here are shown by their own name (label()).
COLUMNS: Mapping[str, tuple[str, str | None]] = MappingProxyType(
    {
        "glue_linear": ("GLUE average, linear probe", SCORE_UNIT),
        "glue_knn": ("GLUE average, kNN probe", SCORE_UNIT),
        "mteb_avg": ("MTEB average", SCORE_UNIT),
        "mteb_sts": ("MTEB STS average", SCORE_UNIT),
        "mteb_classification": ("MTEB classification average", SCORE_UNIT),
        "mteb_clustering": ("MTEB clustering average", SCORE_UNIT),
        "mteb_retrieval": ("MTEB retrieval average", SCORE_UNIT),
        "score": ("score", SCORE_UNIT),
        "val_loss": ("native validation loss (each objective's own task)", LOSS_UNIT),
        "shared_loss_r15": ("shared-protocol loss, r = 0.15", LOSS_UNIT),
        "shared_loss_r50": ("shared-protocol loss, r = 0.5", LOSS_UNIT),
        "params_non_embedding": ("non-embedding parameters", "log"),
        "train_flops": ("training compute", "FLOPs, log"),
        "corpus_tokens": ("training tokens", "corpus tokens read"),
        "relative_depth": ("relative depth", "layer / layers; 0 = embeddings"),
        "layer": ("layer", "0 = embeddings"),
        "objective": ("objective", None),
        "size": ("size", None),
        "seeds": ("seeds", None),
        # the comparison table (noise.COMPARISON_COLUMNS): its sides in the order of the row's label, "first - second"
        "first_mean": ("first: mean", SCORE_UNIT),
        "second_mean": ("second: mean", SCORE_UNIT),
        "first_seeds": ("first: seeds", None),
        "second_seeds": ("second: seeds", None),
        "diff": ("first - second", SCORE_UNIT),
        # representation geometry (crossbert_eval.geometry.METRICS)
        "effective_rank": ("effective rank (RankMe)", None),
        "effective_rank_centred": ("effective rank, centred features", None),
        "anisotropy": ("anisotropy (mean cosine between examples)", None),
        "uniformity": ("uniformity (t = 2; lower: more spread)", None),
        "dataset_entropy": ("dataset entropy", ENTROPY_UNIT),
        "dataset_entropy_centred": ("dataset entropy, centred features", ENTROPY_UNIT),
        "dataset_entropy_normalised": ("dataset entropy / log min(n, d)", None),
    }
)


def label(column: str) -> str:
    """The human name of a column; `task:probe` columns become "task, probe name"; unknown ones keep their name."""
    if column in COLUMNS:
        return COLUMNS[column][0]
    if column.endswith("_std") and column.removesuffix("_std") in COLUMNS:
        return f"{label(column.removesuffix('_std'))}, std over seeds"
    if ":" in column:
        task, probe = column.split(":", 1)
        return f"{task}, {probe_label(probe)}"
    return column


def axis_label(column: str) -> str:
    """An axis label: the column's name with its unit ("GLUE average, linear probe (score, points)")."""
    unit = COLUMNS[column][1] if column in COLUMNS else (SCORE_UNIT if ":" in column else None)
    return f"{label(column)} ({unit})" if unit else label(column)


def probe_label(probe: str) -> str:
    """`knn` -> "kNN probe"; a transformed variant keeps its suffix (`knn (centred)` -> "kNN probe (centred)")."""
    base, _, rest = probe.partition(" ")
    return f"{PROBE_LABELS.get(base, base)}{' ' + rest if rest else ''}"


def panel_title(task: str, probe: str, metric: str | None = None) -> str:
    """A (task, probe) panel: "SST-2, kNN probe (accuracy)"."""
    return f"{task}, {probe_label(probe)}" + (f" ({metric})" if metric else "")


def average_title(column: str, tasks: list[str]) -> str:
    """A panel of an average column, titled by what it holds: one task is named as itself, several are counted."""
    if len(tasks) == 1:
        source = (
            "MTEB" if column.startswith("mteb_") else probe_label(column.split("_", 1)[1]) if column.startswith("glue_") else ""
        )
        return f"{tasks[0]} ({source})" if source else tasks[0]
    return f"{label(column)} over {len(tasks)} tasks" if tasks else label(column)


def header_labels(columns) -> dict[str, str]:
    """The table headers of a report page: column -> human name (what markdown_table prints)."""
    return {c: label(str(c)) for c in columns}
