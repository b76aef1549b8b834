"""A zoo folder's report: the sweep report's pieces (crossbert_eval.report), parameterised by model instead of checkpoint.

Rows join the models on (weights fingerprint, pooling): one model entered twice with two poolings gives two
points. checkpoints.jsonl holds one row per model, in the sweep's columns (crossbert_eval.zoo.ZooModelRecord):
the family as `objective` (the line of the size plots) and the display name as `size`; the tables show them
as `family` and `model`. Every plot colours by family (family_palette).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from crossbert_model.utils import atomic_write_text, provenance

from crossbert_model.readers import read_jsonl, read_text

from ..results import ResultsStore
from ..folder_layout import ZooDir
from .loading import GEOMETRY_PROBE, ReportError, headline_split, load_baselines, read_result_rows, result_frame
from .markdown import (
    averages_sentence,
    baselines_section,
    centring_section,
    duplicates_warning,
    markdown_table,
    page_ending,
    plot_section,
    render_html,
    with_baseline_rows,
)
from .noise import band_caption, comparisons, methods_paragraph, noise_paragraph, seed_bands, verdict_lines, verdict_summary
from .plots import (
    MIN_SCORE_SPAN,
    OBJECTIVE_COLORS,
    Plot,
    baseline_levels,
    check_plot_names,
    color_for,
    draw_levels,
    error_bars,
    figure_legend,
    floor_span,
    label_points,
    legend_of,
    log_x_axis,
    panel_grid,
    score_levels,
    plot_geometry_depth,
    plot_geometry_size,
    pyplot,
    save_figure,
    size_points,
)
from .staging import staged_report, write_table
from .tables import (
    averaged_tasks,
    baseline_rows,
    geometry_seed_table,
    layer_best,
    redundant_averages,
    summarise,
    uninformative_tasks,
)
from .vocabulary import axis_label, panel_title

log = logging.getLogger("crossbert.zoo")

# One seed per model: only depth is tested, so the line for an empty comparison table says what a zoo would need.
NO_ZOO_COMPARISONS = "No comparisons: a zoo needs a layer-0 and a last-layer score."


def is_zoo(root: str | os.PathLike) -> bool:
    return ZooDir(root).config.is_file()  # the zoo's resolved config: what makes a folder a zoo


def load_models(root: Path) -> pd.DataFrame:
    models = pd.DataFrame(read_jsonl(ZooDir(root).models))
    return models.drop_duplicates("run", keep="last") if len(models) else models


def _join(root: Path, rows: list[dict], geometry: bool) -> pd.DataFrame:
    models = load_models(root)
    results = pd.DataFrame(rows)
    if models.empty or results.empty or "probe" not in results.columns:
        return pd.DataFrame()
    results = results[(results["probe"] == GEOMETRY_PROBE) == geometry]
    results = result_frame(results)
    if results.empty:
        return pd.DataFrame()
    out = results.merge(models, on=["model_fingerprint", "pooling"], how="inner")
    out["is_final"] = True
    out["is_last_layer"] = out["layer"] == out["layers"]
    return out


def zoo_scores(root: Path, rows: list[dict] | None = None) -> pd.DataFrame:
    """Every probe / mteb row joined with its zoo model(s); `score` in points, with the bootstrap interval."""
    scores = _join(Path(root), read_result_rows(Path(root)) if rows is None else rows, geometry=False)
    if scores.empty:
        return scores
    scores["score"] = 100 * scores["value"]
    for end in ("low", "high"):
        scores[f"score_ci_{end}"] = 100 * pd.to_numeric(scores.get(f"ci_{end}", np.nan), errors="coerce")
    return scores


def zoo_geometry(root: Path, rows: list[dict] | None = None) -> pd.DataFrame:
    geo = _join(Path(root), read_result_rows(Path(root)) if rows is None else rows, geometry=True)
    if geo.empty:
        return geo
    geo["score"] = geo["value"]
    return headline_split(geo)


MODEL_COLUMNS = [
    "objective",
    "size",
    "checkpoint",
    "model_kind",
    "pooling",
    "pooling_source",
    "layers",
    "hidden_size",
    "params_total",
    "params_embedding",
    "params_non_embedding",
]
DISPLAY = {"objective": "family", "size": "model"}


def models_table(root: Path) -> pd.DataFrame:
    models = load_models(root)
    if models.empty:
        return models
    table = models[[c for c in MODEL_COLUMNS if c in models.columns]].sort_values(["objective", "params_non_embedding"])
    return table.rename(columns=DISPLAY)


def zoo_summary(scores: pd.DataFrame, left_out: Collection[str] = ()) -> pd.DataFrame:
    """Per model: last-layer main score of every task x probe, and the GLUE / mteb averages (without the `left_out` tasks)."""
    summary = summarise(scores, left_out)
    if summary.empty:
        return summary
    cols = [c for c in summary.columns if c.startswith(("glue_", "mteb_")) or ":" in c]
    return summary[["objective", "size", "params_non_embedding", *cols]].rename(columns=DISPLAY)


def last_vs_best(scores: pd.DataFrame) -> pd.DataFrame:
    table = layer_best(scores)
    if table.empty:
        return table
    table = table.drop(columns=[c for c in ("last_layer_std", "best_std", "seeds") if c in table.columns])
    table["last_minus_best"] = table["last_layer"] - table["best"]
    return table.rename(columns=DISPLAY)


def zoo_geometry_table(geo: pd.DataFrame) -> pd.DataFrame:
    """Last layer: each geometry metric per model (one seed: no spread columns)."""
    table = geometry_seed_table(geo)
    if table.empty:
        return table
    return table.drop(columns=["std", "seeds"]).rename(columns={**DISPLAY, "mean": "value"})


# A name may hold spaces; plots.panel_grid splits its legend labels "family name" at the last space.
_NBSP = "\u00a0"


def _plot_names(df: pd.DataFrame) -> pd.DataFrame:
    return df.assign(size=df["size"].astype(str).str.replace(" ", _NBSP)) if len(df) else df


def family_palette(families) -> dict[str, str]:
    """One colour per family (tab10 without its grey; tab20 past nine families), over the objectives' colours:
    the zoo's plots colour by family, and a family named like an objective is drawn in the family's colour."""
    import matplotlib

    tab10 = matplotlib.colormaps["tab10"].colors
    palette = [c for c in tab10 if c != tab10[7]]  # grey is the colour of a line the palette does not name
    families = sorted(set(families))
    if len(families) > len(palette):
        palette = list(matplotlib.colormaps["tab20"].colors)
    own = {family: matplotlib.colors.to_hex(palette[i % len(palette)]) for i, family in enumerate(families)}
    return {**OBJECTIVE_COLORS, **own}


def plot_zoo_collapse(
    scores: pd.DataFrame, out: Path, colors: Mapping[str, str], baselines: pd.DataFrame | None = None
) -> list[Plot]:
    """One panel per (task, probe): score against non-embedding parameters (log), one line per family; the
    last layer solid (with its bootstrap interval), the best layer of each model dashed."""
    plt = pyplot()
    main = headline_split(scores[scores["is_main"]]) if len(scores) else scores
    if main.empty:
        return []
    panels = sorted(main.groupby(["task", "probe"]).groups)
    cols = min(3, len(panels))
    rows = int(np.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.8 * cols, 3.6 * rows + 0.8), squeeze=False, layout="constrained")
    drawn: set[str] = set()
    for ax, (task, probe) in zip(axes.flat, panels):
        sub = main[(main["task"] == task) & (main["probe"] == probe)]
        points = []  # each model's name beside its last-layer point, written once the axis is final
        for family, fam in sub.groupby("objective"):
            color = color_for(family, colors)
            last = seed_bands(fam[fam["is_last_layer"]], ["params_non_embedding", "size"]).sort_values("params_non_embedding")
            per_layer = seed_bands(fam, ["params_non_embedding", "size", "layer"])
            best = per_layer.loc[per_layer.groupby("size")["mean"].idxmax()].sort_values("params_non_embedding")
            drawn |= set(last["band"])
            ax.errorbar(
                last["params_non_embedding"],
                last["mean"],
                yerr=error_bars(last),
                marker="o",
                ms=4,
                capsize=2,
                color=color,
                label=f"{family}: last layer",
            )
            ax.plot(
                best["params_non_embedding"],
                best["mean"],
                ls="--",
                marker="x",
                ms=4,
                color=color,
                alpha=0.7,
                label=f"{family}: best layer",
            )
            points += size_points(last, "params_non_embedding", "mean")
        if baselines is not None and not baselines.empty:
            draw_levels(ax, baseline_levels(baselines, task, probe))
        log_x_axis(ax)
        ax.margins(x=0.1, y=0.12)
        floor_span(ax)
        label_points(ax, points)
        ax.set_title(panel_title(task, probe, sub["metric"].iloc[0]), fontsize=10)
        ax.set_xlabel(axis_label("params_non_embedding"))
        ax.set_ylabel(axis_label("score"))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    legend = legend_of(axes.flat)
    names = sorted(
        legend, key=lambda name: (name.rsplit(": ", 1)[0], name.endswith("best layer"))
    )  # a family's two lines together
    figure_legend(fig, {name: legend[name] for name in names})
    caption = band_caption(drawn) + "; dashed: each model's best layer (chosen on the reported split)"
    fig.suptitle(f"Frozen probe score vs model size, one line per family (last layer solid, best layer dashed)\n{caption}")
    return save_figure(fig, out, "collapse", caption)


def plot_zoo_layerwise(
    scores: pd.DataFrame, out: Path, colors: Mapping[str, str], baselines: pd.DataFrame | None = None
) -> list[Plot]:
    main = headline_split(scores[scores["is_main"]]) if len(scores) else scores
    return panel_grid(
        _plot_names(main),
        "relative_depth",
        axis_label("relative_depth"),
        "Layer-wise frozen probe score by relative depth (colour: family)",
        out,
        "layerwise",
        colors=colors,
        levels=score_levels(main, baselines),
        min_span=MIN_SCORE_SPAN,
    )


# Each plot of a zoo report by name, with the function that draws it.
ZOO_PLOTS = {
    "collapse": lambda d: plot_zoo_collapse(d.scores, d.out, d.colors, d.baselines),
    "layerwise": lambda d: plot_zoo_layerwise(d.scores, d.out, d.colors, d.baselines),
    "geometry_depth": lambda d: plot_geometry_depth(_plot_names(d.geo), d.out, d.colors),
    "geometry_size": lambda d: plot_geometry_size(d.geo, d.out, d.colors),
}


def build_zoo_report(root: str | os.PathLike, plots: Collection[str] | None = None) -> Path | None:
    """Tables, plots, report.md and report.html of a zoo folder; None (nothing written) without scores yet.
    `plots`: the names (ZOO_PLOTS) of the plots to draw and show; None, the default and what the zoo and
    `crossbert report` do, draws every one. Tables and the page's text do not depend on it."""
    root = Path(root)
    check_plot_names(plots, ZOO_PLOTS)
    if not is_zoo(root):
        raise ReportError(f"{root}: not a zoo folder (no {ZooDir(root).config.name})")
    rows = read_result_rows(root)
    scores = zoo_scores(root, rows)
    if scores.empty:
        log.info("zoo report: no scores yet under %s", root)
        return None
    geo = zoo_geometry(root, rows)
    baselines = load_baselines(root)
    uninformative = uninformative_tasks(scores, baselines)
    tables = {
        "models": models_table(root),
        "scores": scores,
        "summary": zoo_summary(scores, uninformative),
        "last_vs_best": last_vs_best(scores),
        "baselines": baselines,
        "comparisons": comparisons(
            scores, None, ResultsStore(ZooDir(root).results).load_predictions
        ),  # depth only: one seed per model
        "geometry": zoo_geometry_table(geo),
    }
    with staged_report(ZooDir(root)) as stage:  # every file whole, or the previous report untouched (staging)
        _write_zoo_report(root, stage, rows, scores, geo, baselines, uninformative, tables, plots)
    return ZooDir(root).report


def _write_zoo_report(
    root: Path,
    stage: ZooDir,
    rows: list[dict],
    scores: pd.DataFrame,
    geo: pd.DataFrame,
    baselines: pd.DataFrame,
    uninformative: dict,
    tables: dict,
    plots: Collection[str] | None,
) -> None:
    """The tables, plots and pages of the zoo `root`, written into `stage`, the folder staged_report moves into place."""
    for name, df in tables.items():
        write_table(df, stage.tables, name)
    data = SimpleNamespace(
        scores=scores, geo=geo, colors=family_palette(scores["objective"]), baselines=baselines, out=stage.plots
    )
    drawn = [plot for name, draw in ZOO_PLOTS.items() if plots is None or name in plots for plot in draw(data)]
    summary_columns = [c for c in summarise(scores, uninformative).columns if c.startswith(("glue_", "mteb_")) or ":" in c]
    tables["baseline_rows"] = baseline_rows(summary_columns, baselines, averaged_tasks(scores, uninformative)).rename(
        columns=DISPLAY
    )
    tables["uninformative"] = uninformative
    tables["averaged"] = averaged_tasks(scores, uninformative)
    tables["redundant"] = redundant_averages(tables["averaged"])
    md = render_zoo_markdown(root, tables, drawn, duplicates_warning(rows))
    atomic_write_text(stage.report, md)
    atomic_write_text(stage.report_html, render_html(md, title="zoo report"))


def render_zoo_markdown(root: Path, tables: dict, plots: list[Plot], warning: str | None) -> str:
    config_file = ZooDir(root).config
    config = read_text(config_file, "the zoo's config") if config_file.exists() else ""
    models, summary = tables["models"].copy(), tables["summary"].copy()
    for df in (models, summary):
        for col in ("params_total", "params_embedding", "params_non_embedding"):
            if col in df:
                df[col] = df[col].map(lambda n: f"{int(n):,}" if pd.notna(n) else "")
    geometry = tables["geometry"]
    parts = [
        f"# Zoo report: {root.name}",
        "",
        *([f"**{warning}**", ""] if warning else []),
        "## Verdict",
        "",
        *verdict_lines(verdict_summary(tables["comparisons"], None)),
        "- Models are not tested against each other: one seed each, so seed variance is unmeasured.",
        "",
        "Frozen encoders probed with the sweep's machinery; scores are points (x100) of each task's main metric.",
        "",
        "## Plots",
        "",
        *plot_section(plots),
        "## Models",
        "",
        "Scores are on each task's reported split (GLUE dev, SentEval / mteb test). `family` is the zoo's label (the line in the size plots); parameters are "
        "counted from the loaded model: the non-embedding count (the x axis) excludes the embedding tables and a BERT pooler, "
        "which computes none of the probed hidden states; `params_total` is everything the checkpoint holds.",
        "",
        markdown_table(models),
        "",
        "`pooling_source`: `user` = set on the zoo entry; `sentence-transformers:...` = the model's own Pooling config; "
        "`default` = mean (no sentence-transformers config).",
        "",
        *baselines_section(tables.get("baselines", pd.DataFrame()), tables.get("uninformative", {})),
        "## Last layer, per model",
        "",
        markdown_table(
            with_baseline_rows(summary, tables.get("baseline_rows", pd.DataFrame())).drop(
                columns=tables.get("redundant", []), errors="ignore"
            )
        ),
        "",
        averages_sentence(tables.get("averaged", {}), tables.get("redundant", [])),
        "",
        "## Last layer vs best layer",
        "",
        "The best layer is chosen on the reported split itself (an oracle: an upper bound on what a layer choice can give).",
        "",
        markdown_table(tables["last_vs_best"]),
        "",
        "## Which differences are beyond noise",
        "",
        "One seed per model: each model's layer 0 against its last layer, per task and probe; models are not tested against "
        "each other (one seed each: seed variance unmeasured).",
        "",
        methods_paragraph(tables["comparisons"]),
        "",
        noise_paragraph(tables["comparisons"], NO_ZOO_COMPARISONS),
        "",
        *(
            [
                "## Representation geometry (last layer)",
                "",
                *centring_section(geometry, "value"),
                markdown_table(geometry, floatfmt="{:.4f}"),
                "",
            ]
            if len(geometry)
            else []
        ),
        *page_ending(
            root,
            config,
            provenance(),
            "Tables: `tables/models.csv`, `tables/scores.csv` (every score row joined with its model), `tables/summary.csv`, "
            "`tables/last_vs_best.csv`, `tables/comparisons.csv`, `tables/geometry.csv` (also as parquet).",
        ),
    ]
    return "\n".join(parts) + "\n"
