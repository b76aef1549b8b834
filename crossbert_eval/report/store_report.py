"""The report of any results store: each model's layer-wise curves with their confidence intervals, and a table of
scores by layer; `crossbert report PATH` on the `--results` folder of a `crossbert probe` (or geometry / mteb) run.

No sweep or zoo config is needed: a line is a model (its `model` name, with the pooling and feature transform when a
store holds several), read from the rows alone. The error bars are those of every report (noise.seed_bands): with one
seed, each row's bootstrap interval over evaluation examples (`ci_low` / `ci_high`); over seeds, their spread.

build_report(PATH) picks the report a folder gets: a zoo's, a sweep's, or this one.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

from crossbert_model.utils import atomic_write_text, provenance

from crossbert_model.readers import read_jsonl

from ..results import RESULTS_FILE, normalise_row, probe_variant
from ..folder_layout import EvaluationFolder, SweepDir
from .loading import GEOMETRY_PROBE, ReportError, headline_split
from .markdown import duplicates_warning, markdown_table, plot_section, render_html
from .noise import band_caption, seed_bands
from .plots import Plot, error_bars, figure_legend, legend_of, pyplot, save_figure
from .staging import staged_report, write_table
from .vocabulary import axis_label, panel_title

log = logging.getLogger("crossbert_eval.report")

STORE_TABLE = "layers"  # tables/layers.csv: one row per (model, task, probe, layer), with the interval


def store_rows_file(root: Path) -> Path | None:
    """The store's rows: PATH/results.jsonl (a `--results` folder) or PATH/results/results.jsonl (a run's folder)."""
    for path in (root / RESULTS_FILE, EvaluationFolder(root).results / RESULTS_FILE):
        if path.is_file():
            return path
    return None


def _line_names(rows: pd.DataFrame) -> pd.Series:
    """Each row's line: the model, with its pooling where the store holds several (a feature transform is in the probe's
    name, results.probe_variant: its own panel)."""
    name = rows["model"].astype(str)
    if "pooling" in rows and rows["pooling"].nunique() > 1:
        name = name + " [" + rows["pooling"].astype(str) + " pooling]"
    return name


def store_scores(rows: list[dict]) -> pd.DataFrame:
    """The main-metric score rows of a store (geometry rows left out), in points with their interval, one line name each."""
    df = pd.DataFrame(rows)
    if df.empty or not {"model", "task", "probe", "layer", "value", "is_main"} <= set(df.columns):
        return pd.DataFrame()
    df = df[(df["probe"] != GEOMETRY_PROBE) & df["is_main"].fillna(False).astype(bool)].copy()
    df["layer"] = pd.to_numeric(df["layer"], errors="coerce")
    df = df[df["layer"].notna()]
    if df.empty:
        return df
    transforms = df["feature_transform"] if "feature_transform" in df else pd.Series([None] * len(df), index=df.index)
    df["probe"] = [probe_variant(p, t) for p, t in zip(df["probe"], transforms)]
    df["layer"] = df["layer"].astype(int)
    df["seed"] = df["seed"].fillna(0) if "seed" in df else 0
    df["score"] = 100 * pd.to_numeric(df["value"], errors="coerce")
    for end in ("low", "high"):  # mteb rows have no interval: NaN, no error bar
        df[f"score_ci_{end}"] = 100 * pd.to_numeric(df[f"ci_{end}"], errors="coerce") if f"ci_{end}" in df else np.nan
    df["line"] = _line_names(df)
    return headline_split(df)


def layer_table(scores: pd.DataFrame) -> pd.DataFrame:
    """Per (line, task, probe, layer): the score (mean over seeds and subsets) and the interval its error bar draws."""
    if scores.empty:
        return pd.DataFrame()
    bands = seed_bands(scores, ["line", "task", "probe", "metric", "split", "layer", "relative_depth"])
    bands["ci_low"] = bands["mean"] - bands["err_low"]
    bands["ci_high"] = bands["mean"] + bands["err_high"]
    out = bands.rename(columns={"line": "model", "mean": "score"})
    return out[
        ["model", "task", "probe", "metric", "split", "layer", "relative_depth", "score", "ci_low", "ci_high", "band", "seeds"]
    ]


def plot_model_layers(table: pd.DataFrame, out: Path) -> list[Plot]:
    """One panel per (task, probe), one line per model: score against layer (against relative depth when the models
    differ in depth), error bars from the table's interval. Nothing when no model has two layers of one task."""
    plt = pyplot()
    curves = table.groupby(["model", "task", "probe"]).filter(lambda g: g["layer"].nunique() >= 2) if len(table) else table
    if curves.empty:
        return []
    x = "layer" if curves.groupby("model")["layer"].max().nunique() == 1 else "relative_depth"
    panels = sorted(curves.groupby(["task", "probe"]).groups)
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.8 * cols, 3.6 * rows + 0.9), squeeze=False, layout="constrained")
    models = sorted(curves["model"].unique())
    palette = _model_colors(models)
    # each model's points nudged sideways by a few percent of a step, so overlapping intervals stay apart
    step = float(np.diff(np.sort(curves[x].unique())).min())  # two layers at least: the curves' filter
    nudge = {m: (i - (len(models) - 1) / 2) * min(0.06, 0.3 / len(models)) * step for i, m in enumerate(models)}
    for ax, (task, probe) in zip(axes.flat, panels):
        sub = curves[(curves["task"] == task) & (curves["probe"] == probe)]
        for model, line in sub.groupby("model"):
            line = line.sort_values(x)
            bars = line.assign(err_low=line["score"] - line["ci_low"], err_high=line["ci_high"] - line["score"])
            ax.errorbar(
                line[x] + nudge[model],
                line["score"],
                yerr=error_bars(bars),
                marker="o",
                ms=4,
                capsize=3,
                color=palette[model],
                label=model,
            )
        ax.set_title(panel_title(task, probe, sub["metric"].iloc[0]), fontsize=10)
        ax.set_xlabel(axis_label(x))
        ax.set_ylabel(axis_label("score"))
        if x == "layer":
            ax.set_xticks(sorted(sub["layer"].unique()))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    figure_legend(fig, legend_of(axes.flat), title="model")
    caption = band_caption(set(curves["band"]))
    fig.suptitle(f"Layer-wise frozen probe score, one line per model\n{caption}")
    return save_figure(fig, out, "layers", caption)


def _model_colors(models: list[str]) -> dict[str, str]:
    import matplotlib

    palette = matplotlib.colormaps["tab10"].colors
    return {m: matplotlib.colors.to_hex(palette[i % len(palette)]) for i, m in enumerate(models)}


def _wide(table: pd.DataFrame) -> pd.DataFrame:
    """The page's table: a row per (model, task, probe), a column per layer, cells "score [low, high]"."""
    cells = [
        f"{s:.2f}" + (f" [{lo:.2f}, {hi:.2f}]" if b != "none" else "")
        for s, lo, hi, b in zip(table["score"], table["ci_low"], table["ci_high"], table["band"])
    ]
    wide = table.assign(cell=cells, L=[f"L{int(v)}" for v in table["layer"]])
    wide = wide.pivot_table(index=["model", "task", "probe", "metric"], columns="L", values="cell", aggfunc="first")
    order = sorted(wide.columns, key=lambda c: int(c[1:]))
    return wide[order].reset_index().rename_axis(columns=None).fillna("")


def build_store_report(root: str | os.PathLike) -> Path | None:
    """Plots, tables/layers.csv, report.md and report.html of any results store; None (nothing written) when it holds
    no score rows. No results.jsonl: ReportError."""
    root = Path(root)
    path = store_rows_file(root)
    if path is None:
        raise ReportError(
            f"{root}: no {RESULTS_FILE} (expected {root / RESULTS_FILE} or {EvaluationFolder(root).results / RESULTS_FILE}); "
            "give the results store of a probe run (its folder of results.jsonl), a sweep or a zoo folder"
        )
    rows = [normalise_row(r) for r in read_jsonl(path)]
    table = layer_table(store_scores(rows))
    if table.empty:
        log.info("report: no score rows in %s", path)
        return None
    with staged_report(EvaluationFolder(root)) as stage:  # every file whole, or the previous report untouched (staging)
        write_table(table, stage.tables, STORE_TABLE, parquet=False)
        plots = plot_model_layers(table, stage.plots)
        md = render_store_markdown(root, path, table, plots, duplicates_warning(rows))
        atomic_write_text(stage.report, md)
        atomic_write_text(stage.report_html, render_html(md, title=f"results report: {root.name}"))
    return EvaluationFolder(root).report


def render_store_markdown(root: Path, path: Path, table: pd.DataFrame, plots: list[Plot], warning: str | None) -> str:
    import json

    models = ", ".join(f"`{m}`" for m in sorted(table["model"].unique()))
    no_curve = ["No layer-wise curve: each model was scored at one layer per task (probe with `--layers all` for curves).", ""]
    parts = [
        f"# Results report: {root.name}",
        "",
        *([f"**{warning}**", ""] if warning else []),
        f"Scores are points (x100) of each task's main metric, read from `{path.relative_to(root)}`; models: {models}.",
        "",
        "## Plots",
        "",
        *(plot_section(plots) if plots else no_curve),
        "## Scores by layer",
        "",
        "Each cell: the score [its interval] (the error bar of the plot: with one seed the bootstrap 95% interval over "
        "evaluation examples; with several seeds their spread); mteb rows carry no interval.",
        "",
        markdown_table(_wide(table)),
        "",
        "## Provenance",
        "",
        "```json",
        json.dumps(provenance(), indent=2),
        "```",
        "",
        f"Table: `tables/{STORE_TABLE}.csv` (one row per model, task, probe and layer, with `ci_low` / `ci_high` and what they are in `band`).",
    ]
    return "\n".join(parts) + "\n"


def build_report(root: str | os.PathLike) -> Path | None:
    """The report a folder gets (what `crossbert report PATH` runs): a zoo's (zoo.yaml), a sweep's (sweep.yaml or
    checkpoints.jsonl), else any results store's layer-wise curves."""
    from .sweep_report import build_sweep_report
    from .zoo_report import build_zoo_report, is_zoo

    root = Path(root)
    if not root.is_dir():
        raise ReportError(f"{root}: no such folder")
    if is_zoo(root):
        return build_zoo_report(root)
    if SweepDir(root).config.is_file() or SweepDir(root).models.is_file():
        return build_sweep_report(root)
    return build_store_report(root)
