"""The report's plots. Each plot function takes the frame it draws, the folder it writes to and the colours of its lines
(`colors`: line key -> colour, OBJECTIVE_COLORS by default), and returns the Plot records it saved, each with its caption."""

from __future__ import annotations

import io
import contextlib
import contextvars
import math
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pandas as pd

from crossbert_model.errors import naming_written_file
from crossbert_model.shared_loss import SHARED_LOSS_R50
from crossbert_model.plateau import unigram_entropy_key_for

from .loading import headline_split
from .noise import band_caption, seed_bands, size_bands
from .tables import TRAINING_AXES, baseline_label, baselines_beside, column_probe, loss_curves, several_checkpoints
from .vocabulary import SCORE_UNIT, average_title, axis_label, label, panel_title

# Reds for flat MLM, blue / green for CrossBERT with / without CMS (the objective names of configs/sweep/*.yaml).
OBJECTIVE_COLORS: Mapping[str, str] = MappingProxyType(
    {
        "mlm": "#d62728",
        "mlm15": "#d62728",
        "mlm50_pure": "#ff7f0e",
        "crossbert": "#1f77b4",
        "crossbert_cms": "#1f77b4",
        "crossbert_nocms": "#2ca02c",
    }
)
UNLISTED_COLOR = "#7f7f7f"  # grey: a line whose key the palette does not name


def check_plot_names(names, known) -> None:
    """A report asked for plots by name (None: all): every name must be one it draws."""
    unknown = sorted(set(names or ()) - set(known))
    if unknown:
        raise ValueError(f"unknown plot(s) {unknown}; known: {list(known)}")


def color_for(key: str, colors: Mapping[str, str] = OBJECTIVE_COLORS) -> str:
    return colors.get(key, UNLISTED_COLOR)


@dataclass(frozen=True)
class Plot:
    """One saved figure: its name, its files and the caption that says what its error bars are."""

    name: str
    png: Path
    svg: Path
    caption: str = ""


def error_bars(bands: pd.DataFrame):
    """matplotlib's asymmetric yerr, or None when no line has a spread."""
    if not len(bands) or (bands["band"] == "none").all():
        return None
    # clipped at 0: matplotlib refuses negative bars (a bootstrap interval need not straddle a seed mean)
    return np.clip(np.vstack([bands["err_low"].fillna(0).to_numpy(), bands["err_high"].fillna(0).to_numpy()]), 0, None)


# A line every figure saved inside `figure_notice(text)` carries at its top, in red: what the report's verdict withholds,
# so a figure copied out of the report still says that its lines are not evidence.
_NOTICE: contextvars.ContextVar[str | None] = contextvars.ContextVar("figure_notice", default=None)


@contextlib.contextmanager
def figure_notice(text: str | None):
    token = _NOTICE.set(text)
    try:
        yield
    finally:
        _NOTICE.reset(token)


def save_figure(fig, out: Path, name: str, caption: str = "") -> list[Plot]:
    """Write `fig` as out/name.png and .svg and close it; a list, so plot functions add up their plots."""
    notice = _NOTICE.get()
    if notice:
        width = max(40, int(fig.get_figwidth() * 11))  # characters a line at 11 pt holds across the figure
        fig.text(
            0.5, 1.0, textwrap.fill(notice, width), ha="center", va="bottom", color="#b00000", fontsize=11, fontweight="bold"
        )
    out.mkdir(parents=True, exist_ok=True)
    paths = {ext: out / f"{name}.{ext}" for ext in ("png", "svg")}
    try:
        box = laid_out(fig)
        with naming_written_file(paths["png"]):  # matplotlib's and PIL's failed writes name no file
            write_png(fig, paths["png"], box)
        with naming_written_file(paths["svg"]):
            fig.savefig(paths["svg"], bbox_inches=box)
    finally:
        pyplot().close(fig)
    return [Plot(name, paths["png"], paths["svg"], caption)]


def laid_out(fig):
    """Lay `fig` out once and keep that layout: its tight bounding box (inches, padded as savefig pads it). Each
    savefig with bbox_inches="tight" would lay the figure out and measure it again (a fifth of the time a figure took)."""
    import matplotlib

    fig.draw_without_rendering()
    box = fig.get_tightbbox().padded(matplotlib.rcParams["savefig.pad_inches"])
    fig.set_layout_engine("none")  # the positions just computed stay
    return box


def write_png(fig, path: Path, box) -> None:
    """The figure as a 256-colour PNG: a plot's flat colours and anti-aliased lines survive the palette, and the file
    is about a third of a true-colour one (committed reports are data kept small; the SVG beside it is exact)."""
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=130, bbox_inches=box)
    image = Image.open(buffer).convert("RGB")
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, format="PNG", optimize=True)


def _lines(ax, table: pd.DataFrame, x: str, y: str, colors: Mapping[str, str]) -> set[str]:
    """One line per objective with its seed error bars; returns the kinds of bar drawn (for the caption)."""
    bands = set()
    for objective, sub in table.groupby("objective"):
        sub = size_bands(sub.sort_values(x), y)
        bands |= set(sub["band"])
        ax.errorbar(
            sub[x], sub[y], yerr=error_bars(sub), marker="o", capsize=3, color=color_for(objective, colors), label=objective
        )
    ax.margins(x=0.08, y=0.12)  # room for the size labels inside the frame
    return bands


POINT_LABEL_FONT = 9  # the name beside a point (a size, a model), in points: readable next to 10-point axis labels
LABEL_GAP = 1.3  # lines of POINT_LABEL_FONT between two labels that would otherwise overlap


def label_points(ax, points) -> None:
    """Write each (x, y, text) beside its point at POINT_LABEL_FONT: right of it, or left in the axis's right quarter
    (the frame's edge); a label that would cover another one (close on the page in both directions) moves up past
    it. Call once the axis's scale and limits are final (after log_x_axis): it measures distances on the page."""
    fig = ax.figure
    box = ax.get_position()  # before the layout's titles, labels and legend take their room: shrunk on purpose, as a
    # smaller axes on the page only finds more collisions and leaves wider gaps between the labels it moves
    shrink = 0.7
    width, height = (shrink * box.width * fig.get_figwidth() * 72, shrink * box.height * fig.get_figheight() * 72)  # in points
    to_axes = ax.transData + ax.transAxes.inverted()
    placed: list[tuple[float, float, float]] = []  # left, right, height on the page of each label written
    for x, y, text in sorted((p for p in points if pd.notna(p[0]) and pd.notna(p[1])), key=lambda p: p[1]):
        ax_x, ax_y = to_axes.transform((x, y))
        left = ax_x > 0.75
        span = 0.6 * POINT_LABEL_FONT * len(str(text))
        start = ax_x * width + (-5 - span if left else 5)
        level = ax_y * height
        for l0, r0, y0 in sorted(placed, key=lambda b: b[2]):
            if start < r0 and l0 < start + span and abs(level - y0) < LABEL_GAP * POINT_LABEL_FONT:
                level = y0 + LABEL_GAP * POINT_LABEL_FONT
        placed.append((start, start + span, level))
        ax.annotate(
            str(text),
            (x, y),
            textcoords="offset points",
            xytext=(-5 if left else 5, level - ax_y * height),
            va="center",
            ha="right" if left else "left",
            fontsize=POINT_LABEL_FONT,
            color="#333",
            bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.75},
        )


def size_points(table: pd.DataFrame, x: str, y: str) -> list[tuple]:
    """(x, y, size) of every row: the points _lines draws, named by their size."""
    return list(zip(table[x], table[y], table["size"])) if y in table else []


LEGEND_FONT = 10  # legends at the size of the axis labels: readable, not a strip of small print


def figure_legend(fig, handles_by_label: dict, title: str | None = None) -> None:
    """One legend for the whole figure, below the panels, at LEGEND_FONT, in as many columns as its longest entry
    leaves room for (a long name gets a line of its own, never squeezes the panels), handles long enough to show a
    line style."""
    longest = max((len(name) for name in handles_by_label), default=1)
    ncol = max(1, min(len(handles_by_label), 6, 110 // (longest + 8)))
    fig.legend(
        list(handles_by_label.values()),
        list(handles_by_label),
        loc="outside lower center",
        ncol=ncol,
        fontsize=LEGEND_FONT,
        handlelength=3.2,
        title=title,
        title_fontsize=LEGEND_FONT,
        frameon=False,
    )


def legend_of(axes) -> dict:
    """label -> handle over every panel of a figure, each label once."""
    legend: dict = {}
    for ax in axes:
        legend.update(zip(*reversed(ax.get_legend_handles_labels())))
    return legend


def log_x_axis(ax) -> None:
    """Log x axis (call after plotting), labelled at 1 and 3 x 10^k when it spans under 3 decades, so a
    short axis still gets several labels; minor-tick labels (2x10^12, 3x10^12, ...) would overlap."""
    from matplotlib.ticker import LogFormatterSciNotation, LogLocator, NullFormatter

    ax.set_xscale("log")
    low, high = ax.get_xlim()
    if math.log10(high / low) < 3:
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 3.0)))
        ax.xaxis.set_major_formatter(LogFormatterSciNotation(labelOnlyBase=False))
    ax.xaxis.set_minor_formatter(NullFormatter())


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def plot_collapse(
    sizes: pd.DataFrame,
    out: Path,
    colors: Mapping[str, str] = OBJECTIVE_COLORS,
    averaged: Mapping[str, list[str]] | None = None,
    baselines: pd.DataFrame | None = None,
) -> list[Plot]:
    """Score against size and against compute, a column of panels per score; `averaged` (tables.averaged_tasks): the
    tasks behind each average column, so a panel is titled by what it holds."""
    plt = pyplot()
    columns = [c for c in ("glue_linear", "glue_knn", "mteb_avg") if c in sizes.columns]
    if not columns:
        return []
    fig, axes = plt.subplots(2, len(columns), figsize=(4.8 * len(columns), 8), squeeze=False, layout="constrained")
    bands = set()
    for j, col in enumerate(columns):
        title = average_title(col, list((averaged or {}).get(col, [])))
        for i, x in enumerate(("params_non_embedding", "train_flops")):
            ax = axes[i, j]
            bands |= _lines(ax, sizes, x, col, colors)
            if baselines is not None and not baselines.empty:
                draw_levels(ax, average_levels(baselines, list((averaged or {}).get(col, [])), column_probe(col)))
            floor_span(ax)
            log_x_axis(ax)
            label_points(ax, size_points(sizes, x, col))
            ax.set_xlabel(axis_label(x))
            ax.set_ylabel(axis_label("score"))  # the panel's title names the score
            ax.grid(alpha=0.3)
        axes[0, j].set_title(title)
    figure_legend(fig, legend_of(axes.flat), title="objective")
    caption = band_caption(bands)
    fig.suptitle(
        f"Representation scaling: frozen probe score vs model size and training compute (last layer, final checkpoint)\n{caption}"
    )
    return save_figure(fig, out, "collapse", caption)


# The probe whose curve a task's collapse panel draws: the first of these the task was scored with.
COLLAPSE_PROBES = ("linear", "cosine", "knn")


def plot_collapse_layers(
    best_layers: pd.DataFrame,
    sizes: pd.DataFrame,
    out: Path,
    colors: Mapping[str, str] = OBJECTIVE_COLORS,
    baselines: pd.DataFrame | None = None,
) -> list[Plot]:
    """The paper's Figure 1 view: per task, each objective's last-layer score (solid) and best-layer score (dashed)
    against non-embedding parameters, error bars the std over seeds; a last layer that falls away from the best as size
    grows is collapse (the gap is tested in the report's comparisons)."""
    if best_layers.empty or sizes.empty or "params_non_embedding" not in sizes:
        return []
    params = sizes[["objective", "size", "params_non_embedding"]].drop_duplicates()
    table = best_layers.merge(params, on=["objective", "size"])
    panels = []
    for task, rows in table.groupby("task", sort=True):
        probe = next((p for p in COLLAPSE_PROBES if p in set(rows["probe"])), sorted(rows["probe"])[0])
        panels.append((task, probe, rows[rows["probe"] == probe]))
    if not panels or table["params_non_embedding"].nunique() < 2:
        return []  # one size: nothing to draw against size
    plt = pyplot()
    ncol = min(len(panels), 4)
    nrow = math.ceil(len(panels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.6 * ncol, 3.8 * nrow), squeeze=False, layout="constrained")
    for ax, (task, probe, rows) in zip(axes.flat, panels):
        for objective, sub in rows.groupby("objective"):
            sub = sub.sort_values("params_non_embedding")
            for column, style, what in (("last_layer", "-", "last layer"), ("best", "--", "best layer")):
                std = sub[f"{column}_std"] if f"{column}_std" in sub else None
                ax.errorbar(
                    sub["params_non_embedding"],
                    sub[column],
                    yerr=None if std is None else std.fillna(0),
                    marker="o",
                    capsize=3,
                    linestyle=style,
                    color=color_for(objective, colors),
                    label=f"{objective}, {what}",
                )
        if baselines is not None and not baselines.empty:
            draw_levels(ax, baseline_levels(baselines, task, probe))
        floor_span(ax)
        log_x_axis(ax)
        ax.set_title(panel_title(task, probe))
        ax.set_xlabel(axis_label("params_non_embedding"))
        ax.set_ylabel(axis_label("score"))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    figure_legend(fig, legend_of(axes.flat))
    caption = "error bars: std over seeds (none with one seed); best layer chosen on the seed mean"
    fig.suptitle(f"Collapse view: last-layer (solid) and best-layer (dashed) frozen score against size\n{caption}")
    return save_figure(fig, out, "collapse_layers", caption)


PLATEAU_LABEL = "unigram entropy (plateau)"


def plateau_levels(
    checkpoints: pd.DataFrame, loss: str, colors: Mapping[str, str] = OBJECTIVE_COLORS
) -> list[tuple[float, str, str]]:
    """The horizontal line(s) a plot of `loss` draws at the unigram entropy of its targets
    (crossbert_model.plateau; each run's own tokenizer and targets): one black line where every
    objective's runs agree to 0.005 nats, else one per objective in its colour (mean over its runs)."""
    col = unigram_entropy_key_for(loss)
    if checkpoints.empty or col not in checkpoints.columns:
        return []
    values = checkpoints.dropna(subset=[col]).groupby("objective")[col].mean()
    if values.empty:
        return []
    if values.max() - values.min() < 0.005:
        return [(float(values.mean()), PLATEAU_LABEL, "black")]
    return [(float(v), f"{PLATEAU_LABEL}, {objective}", color_for(objective, colors)) for objective, v in values.items()]


def draw_levels(ax, levels: list[tuple[float, str, str]]) -> None:
    """Horizontal reference lines, dash-dot-dot: a style no size's line has (SIZE_STYLES)."""
    for y, name, color in levels:
        ax.axhline(y, color=color, ls=(0, (6, 2, 1, 2, 1, 2)), lw=1.2, label=name)


BASELINE_COLORS = {"chance": "#9e9e9e", "majority": "#000000", "tfidf": "#8c564b"}
# A score panel spans at least this many points, its baselines included: noise of a point or two must not fill the frame.
MIN_SCORE_SPAN = 10.0


def baseline_levels(baselines: pd.DataFrame, task: str, probe: str) -> list[tuple[float, str, str]]:
    """The horizontal lines of a (task, probe) score panel: its baselines (tables.baselines_beside), in points."""
    rows = baselines_beside(baselines, task, probe)
    return [
        (float(r.score), baseline_label(r.baseline, r.probe), BASELINE_COLORS.get(r.baseline, UNLISTED_COLOR))
        for r in rows.itertuples()
    ]


def average_levels(baselines: pd.DataFrame, tasks: list[str], probe: str) -> list[tuple[float, str, str]]:
    """The baselines of an average panel: each baseline's mean over the averaged tasks, where every one of them has it."""
    per_task = [{name: (y, color) for y, name, color in baseline_levels(baselines, t, probe)} for t in tasks]
    if not per_task:
        return []
    shared = [name for name in per_task[0] if all(name in p for p in per_task)]
    return [(float(np.mean([p[name][0] for p in per_task])), name, per_task[0][name][1]) for name in shared]


def floor_span(ax, span: float = MIN_SCORE_SPAN) -> None:
    """Widen the y axis to at least `span` around what it shows, so that a spread of a point is drawn as one."""
    low, high = ax.get_ylim()
    if high - low < span:
        middle = (low + high) / 2
        ax.set_ylim(middle - span / 2, middle + span / 2)


def plot_loss_vs_probe(
    summary: pd.DataFrame,
    out: Path,
    checkpoints: pd.DataFrame | None = None,
    colors: Mapping[str, str] = OBJECTIVE_COLORS,
    averaged: Mapping[str, list[str]] | None = None,
) -> list[Plot]:
    """Pre-training loss (x) against frozen probe score (y), one point per run (final checkpoint, last layer;
    `summary`: tables.summarise), colour = objective, marker = size. Objectives are put side by side by the
    shared-protocol loss (the same masks, pure [MASK] for MLM, visible-only encoder for CrossBERT); each
    objective's native validation loss is a different task and is used only where a sweep predates the shared
    loss. A vertical line marks the unigram entropy of the same targets (from `checkpoints`), the plateau."""
    plt = pyplot()
    from matplotlib.lines import Line2D

    final = summary[summary["is_final"]] if len(summary) else summary
    probe_col = next((c for c in ("glue_linear", "mteb_avg", "glue_knn") if c in final.columns and final[c].notna().any()), None)
    loss_col = next((c for c in (SHARED_LOSS_R50, "val_loss") if c in final.columns and final[c].notna().any()), None)
    if probe_col is None or loss_col is None:
        return []
    runs = final.dropna(subset=[probe_col, loss_col])
    sizes = list(dict.fromkeys(runs.sort_values("params_non_embedding")["size"]))
    fig, ax = plt.subplots(figsize=(8.5, 5.2), layout="constrained")
    for (objective, size), points in runs.groupby(["objective", "size"]):
        marker = SIZE_STYLES[sizes.index(size) % len(SIZE_STYLES)][1]
        ax.scatter(
            points[loss_col],
            points[probe_col],
            s=46,
            marker=marker,
            color=color_for(objective, colors),
            edgecolor="black",
            linewidth=0.4,
        )
    for level, name, color in plateau_levels(checkpoints if checkpoints is not None else pd.DataFrame(), loss_col, colors):
        ax.axvline(level, color=color, ls=(0, (6, 2, 1, 2, 1, 2)), lw=1.2, label=name)
    title = average_title(probe_col, list((averaged or {}).get(probe_col, [])))
    ax.set_xlabel(
        axis_label(loss_col) + ("; lower is better" if loss_col == SHARED_LOSS_R50 else "; not comparable across objectives")
    )
    ax.set_ylabel(f"{title} ({SCORE_UNIT})")
    ax.grid(alpha=0.3)
    legend = {
        objective: Line2D([], [], ls="", marker="o", ms=8, color=color_for(objective, colors))
        for objective in sorted(runs["objective"].unique())
    }
    legend |= {
        size: Line2D([], [], ls="", marker=SIZE_STYLES[i % len(SIZE_STYLES)][1], ms=8, color="#555")
        for i, size in enumerate(sizes)
    }
    legend |= legend_of([ax])
    ax.legend(
        list(legend.values()),
        list(legend),
        fontsize=LEGEND_FONT,
        loc="center left",
        bbox_to_anchor=(1.01, 0.5),
        frameon=False,
        title="colour: objective\nmarker: size",
        title_fontsize=LEGEND_FONT,
    )
    caption = f"one point per run ({len(runs)} runs; final checkpoint, last layer); no error bars: each point is one run"
    fig.suptitle(f"Better pre-training loss, better frozen features?\n{label(loss_col)} against {title}")
    return save_figure(fig, out, "loss_vs_probe", caption)


SIZE_STYLES = [(":", "v"), ("--", "s"), ("-", "o"), ("-.", "D"), ("-", "^"), ("--", "P")]  # smallest first


def panel_grid(
    df: pd.DataFrame,
    x: str,
    xlabel: str,
    title: str,
    out: Path,
    name: str,
    panel: tuple = ("task", "probe"),
    ylabel: str | None = None,
    log_x: bool = False,
    levels: dict | None = None,
    colors: Mapping[str, str] = OBJECTIVE_COLORS,
    min_span: float | None = None,
) -> list[Plot]:
    """One panel per (task, probe); a line per (objective, size): colour = objective, line style and
    marker = size (one legend for the figure); error bars by the rule of seed_bands, named in the title.
    `levels`: {panel key: [(y, label, colour)]}, horizontal reference lines (plateau_levels, baseline_levels); `min_span`:
    the least height of a panel's y axis (floor_span)."""
    plt = pyplot()
    if df.empty:
        return []
    panels = sorted(df.groupby(list(panel)).groups)
    if not panels or df[x].nunique() < 2:
        return []
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows + 0.6), squeeze=False, layout="constrained")
    sizes = list(dict.fromkeys(df.sort_values("params_non_embedding")["size"]))
    drawn = set()
    for ax, (first, second) in zip(axes.flat, panels):
        sub = df[(df[panel[0]] == first) & (df[panel[1]] == second)]
        for (objective, size), line in sub.groupby(["objective", "size"]):
            line = seed_bands(line, [x])
            drawn |= set(line["band"])
            style, marker = SIZE_STYLES[sizes.index(size) % len(SIZE_STYLES)]
            ax.errorbar(
                line[x],
                line["mean"],
                yerr=error_bars(line),
                ls=style,
                marker=marker,
                ms=4,
                capsize=2,
                color=color_for(objective, colors),
                label=f"{objective} {size}",
            )
        draw_levels(ax, (levels or {}).get((first, second), []))
        if min_span:
            floor_span(ax, min_span)
        if log_x:
            log_x_axis(ax)
        ax.set_title(_panel_name(panel, first, second, sub), fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel or axis_label(second if panel[1] == "metric" else "score"))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    legend = legend_of(axes.flat)
    runs = [name for name in legend if name.rsplit(" ", 1)[-1] in sizes]  # "objective size"; reference lines last
    names = sorted(runs, key=lambda name: (name.rsplit(" ", 1)[0], sizes.index(name.rsplit(" ", 1)[1])))
    names += [name for name in legend if name not in runs]
    figure_legend(fig, {name: legend[name] for name in names})
    caption = band_caption(drawn)
    fig.suptitle(f"{title}\n{caption}")
    return save_figure(fig, out, name, caption)


def _panel_name(panel: tuple, first, second, rows: pd.DataFrame) -> str:
    """A panel's title in the report's vocabulary: "SST-2, kNN probe (accuracy)", "SST-2: rankme", a loss by its name."""
    if panel == ("task", "probe"):
        return panel_title(first, second, rows["metric"].iloc[0] if "metric" in rows else None)
    if panel[0] == "loss":
        return f"{label(first)}\n({second})"
    return f"{first}: {label(second)}"


def score_levels(scores: pd.DataFrame, baselines: pd.DataFrame | None) -> dict:
    """{(task, probe): baseline lines} of every score panel."""
    if baselines is None or baselines.empty or scores.empty:
        return {}
    return {
        (task, probe): baseline_levels(baselines, task, probe)
        for task, probe in scores[["task", "probe"]].drop_duplicates().itertuples(index=False)
    }


def plot_layerwise(
    scores: pd.DataFrame, out: Path, colors: Mapping[str, str] = OBJECTIVE_COLORS, baselines: pd.DataFrame | None = None
) -> list[Plot]:
    final = headline_split(scores[scores["is_main"] & scores["is_final"]])
    return panel_grid(
        final,
        "relative_depth",
        axis_label("relative_depth"),
        "Layer-wise frozen probe score (final checkpoints)",
        out,
        "layerwise",
        colors=colors,
        levels=score_levels(final, baselines),
        min_span=MIN_SCORE_SPAN,
    )


def plot_training(
    scores: pd.DataFrame, out: Path, colors: Mapping[str, str] = OBJECTIVE_COLORS, baselines: pd.DataFrame | None = None
) -> list[Plot]:
    last = headline_split(scores[scores["is_main"] & scores["is_last_layer"]])
    if not several_checkpoints(last):
        return []
    plots = []
    for x, (suffix, log_x) in TRAINING_AXES.items():
        plots += panel_grid(
            last,
            x,
            axis_label(x),
            "Frozen probe score along training (last layer)",
            out,
            f"training{suffix}",
            log_x=log_x,
            colors=colors,
            levels=score_levels(last, baselines),
            min_span=MIN_SCORE_SPAN,
        )
    return plots


def plot_losses(checkpoints: pd.DataFrame, out: Path, colors: Mapping[str, str] = OBJECTIVE_COLORS) -> list[Plot]:
    """Native and shared-protocol masked-token losses against tokens and against FLOPs, each panel with
    the unigram entropy of its targets (the plateau) as a horizontal line."""
    curves = loss_curves(checkpoints)
    if not several_checkpoints(curves):
        return []
    panels = curves[["loss", "protocol"]].drop_duplicates().itertuples(index=False)
    levels = {(loss, protocol): plateau_levels(checkpoints, loss, colors) for loss, protocol in panels}
    plots = []
    for x, (suffix, log_x) in TRAINING_AXES.items():
        plots += panel_grid(
            curves,
            x,
            axis_label(x),
            "Masked-token loss along training (compare objectives by the shared protocol)",
            out,
            f"losses{suffix}",
            panel=("loss", "protocol"),
            ylabel="cross-entropy (nats)",
            log_x=log_x,
            levels=levels,
            colors=colors,
        )
    return plots


def plot_geometry_training(geo: pd.DataFrame, out: Path, colors: Mapping[str, str] = OBJECTIVE_COLORS) -> list[Plot]:
    """Each geometry metric of the last layer along training, against tokens and against FLOPs."""
    last = geo[geo["is_last_layer"]] if len(geo) else geo
    if not several_checkpoints(last):
        return []
    plots = []
    for x, (suffix, log_x) in TRAINING_AXES.items():
        plots += panel_grid(
            last,
            x,
            axis_label(x),
            "Last-layer representation geometry along training",
            out,
            f"geometry_training{suffix}",
            panel=("task", "metric"),
            log_x=log_x,
            colors=colors,
        )
    return plots


def plot_geometry_depth(geo: pd.DataFrame, out: Path, colors: Mapping[str, str] = OBJECTIVE_COLORS) -> list[Plot]:
    """Each geometry metric against relative depth, a line per (objective, size), final checkpoints."""
    final = geo[geo["is_final"]] if len(geo) else geo
    return panel_grid(
        final,
        "relative_depth",
        axis_label("relative_depth"),
        "Representation geometry by layer (final checkpoints)",
        out,
        "geometry_depth",
        panel=("task", "metric"),
        colors=colors,
    )


def plot_geometry_size(geo: pd.DataFrame, out: Path, colors: Mapping[str, str] = OBJECTIVE_COLORS) -> list[Plot]:
    """The last layer's geometry metric against model size, a line per objective, final checkpoints."""
    plt = pyplot()
    last = geo[geo["is_final"] & geo["is_last_layer"]] if len(geo) else geo
    if last.empty or last["params_non_embedding"].nunique() < 2:
        return []
    panels = sorted(last.groupby(["task", "metric"]).groups)
    cols = min(4, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows + 1.0), squeeze=False, layout="constrained")
    drawn = set()
    for ax, (task, metric) in zip(axes.flat, panels):
        sub = last[(last["task"] == task) & (last["metric"] == metric)]
        for objective, line in sub.groupby("objective"):
            line = seed_bands(line, ["params_non_embedding"])
            drawn |= set(line["band"])
            ax.errorbar(
                line["params_non_embedding"],
                line["mean"],
                yerr=error_bars(line),
                marker="o",
                capsize=3,
                color=color_for(objective, colors),
                label=objective,
            )
        log_x_axis(ax)
        ax.set_title(f"{task}: {label(metric)}", fontsize=10)
        ax.set_xlabel(axis_label("params_non_embedding"))
        ax.set_ylabel(axis_label(metric))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    figure_legend(fig, legend_of(axes.flat), title="objective")
    caption = band_caption(drawn)
    fig.suptitle(f"Last-layer representation geometry vs model size (final checkpoints)\n{caption}")
    return save_figure(fig, out, "geometry_size", caption)
