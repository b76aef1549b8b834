"""The report's plots. Each plot function takes the frame it draws, the folder it writes to and the colours of its lines
(`colors`: line key -> colour, OBJECTIVE_COLORS by default), and returns the Plot records it saved, each with its caption."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pandas as pd

from crossbert_model.shared_loss import SHARED_LOSS_R50
from crossbert_model.plateau import unigram_entropy_key_for

from .loading import headline_split
from .noise import band_caption, seed_bands, size_bands
from .tables import TRAINING_AXES, loss_curves

# Reds for flat MLM, blue / green for CrossBERT with / without CMS (the objective names of configs/sweep/*.yaml).
OBJECTIVE_COLORS: Mapping[str, str] = MappingProxyType({
    "mlm": "#d62728", "mlm15": "#d62728", "mlm50_pure": "#ff7f0e", "crossbert": "#1f77b4", "crossbert_cms": "#1f77b4",
    "crossbert_nocms": "#2ca02c",
})  # fmt: skip
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


def save_figure(fig, out: Path, name: str, caption: str = "") -> list[Plot]:
    """Write `fig` as out/name.png and .svg and close it; a list, so plot functions add up their plots."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {ext: out / f"{name}.{ext}" for ext in ("png", "svg")}
    for path in paths.values():
        fig.savefig(path, dpi=130, bbox_inches="tight")
    pyplot().close(fig)
    return [Plot(name, paths["png"], paths["svg"], caption)]


def _lines(ax, table: pd.DataFrame, x: str, y: str, colors: Mapping[str, str]) -> set[str]:
    """One line per objective with its seed error bars; returns the kinds of bar drawn (for the caption)."""
    bands = set()
    for objective, sub in table.groupby("objective"):
        sub = size_bands(sub.sort_values(x), y)
        bands |= set(sub["band"])
        ax.errorbar(sub[x], sub[y], yerr=error_bars(sub), marker="o", capsize=3, color=color_for(objective, colors), label=objective)
        for _, row in sub.iterrows():
            ax.annotate(row["size"], (row[x], row[y]), textcoords="offset points", xytext=(4, 4), fontsize=7, color="#555")
    ax.margins(x=0.08, y=0.12)  # room for the size labels inside the frame
    return bands


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


def plot_collapse(sizes: pd.DataFrame, out: Path, colors: Mapping[str, str] = OBJECTIVE_COLORS) -> list[Plot]:
    plt = pyplot()

    columns = [c for c in ("glue_linear", "glue_knn", "mteb_avg") if c in sizes.columns]
    if not columns:
        return []
    titles = {"glue_linear": "linear probe (GLUE avg)", "glue_knn": "kNN probe (GLUE avg)", "mteb_avg": "MTEB average"}
    fig, axes = plt.subplots(2, len(columns), figsize=(4.6 * len(columns), 7.5), squeeze=False, layout="constrained")
    bands = set()
    for j, col in enumerate(columns):
        for i, (x, xlabel) in enumerate((("params_non_embedding", "encoder parameters, non-embedding (count, log)"),
                                         ("train_flops", "training compute (FLOPs, log)"))):  # fmt: skip
            ax = axes[i, j]
            bands |= _lines(ax, sizes, x, col, colors)
            log_x_axis(ax)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"{titles[col]} (score, %)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        axes[0, j].set_title(f"frozen {titles[col]}")
    caption = band_caption(bands)
    fig.suptitle(f"Representation scaling: frozen probe score vs model size and training compute (last layer, final checkpoint)\n{caption}")
    return save_figure(fig, out, "collapse", caption)


PLATEAU_LABEL = "unigram entropy (plateau)"


def plateau_levels(checkpoints: pd.DataFrame, loss: str, colors: Mapping[str, str] = OBJECTIVE_COLORS) -> list[tuple[float, str, str]]:
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


def _draw_levels(ax, levels: list[tuple[float, str, str]]) -> None:
    """Horizontal reference lines, dash-dot-dot: a style no size's line has (SIZE_STYLES)."""
    for y, label, color in levels:
        ax.axhline(y, color=color, ls=(0, (6, 2, 1, 2, 1, 2)), lw=1.2, label=label)


def plot_loss_vs_probe(sizes: pd.DataFrame, out: Path, checkpoints: pd.DataFrame | None = None, colors: Mapping[str, str] = OBJECTIVE_COLORS,
                       ) -> list[Plot]:  # fmt: skip
    """Loss against probe score. Objectives are put side by side by the shared-protocol loss (the same
    masks, pure [MASK] for MLM, visible-only encoder for CrossBERT); each objective's native validation
    loss is a different task and is used only where a sweep predates the shared loss. The loss panel
    draws the unigram entropy of the same targets (from `checkpoints`), the plateau."""
    plt = pyplot()
    probe_col = next((c for c in ("glue_linear", "mteb_avg", "glue_knn") if c in sizes.columns), None)
    loss_col = next((c for c in (SHARED_LOSS_R50, "val_loss") if c in sizes.columns and sizes[c].notna().any()), None)
    if probe_col is None or loss_col is None:
        return []
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4.2), layout="constrained")
    bands = _lines(a, sizes, "params_non_embedding", loss_col, colors)
    _draw_levels(a, plateau_levels(checkpoints if checkpoints is not None else pd.DataFrame(), loss_col, colors))
    log_x_axis(a)
    a.set_xlabel("encoder parameters, non-embedding (count, log)")
    a.set_ylabel("masked-token loss (nats)")
    if loss_col == SHARED_LOSS_R50:
        a.set_title("shared-protocol loss, r = 0.5 (the same masks for both objectives:\ncomparable across objectives)", fontsize=9)
    else:
        a.set_title("native validation loss (MLM: 15% of tokens; CrossBERT: r of tokens,\nnot comparable across objectives)", fontsize=9)
    a.grid(alpha=0.3)
    a.legend(fontsize=8)
    bands |= _lines(b, sizes, "params_non_embedding", probe_col, colors)
    log_x_axis(b)
    b.set_xlabel("encoder parameters, non-embedding (count, log)")
    b.set_ylabel(f"{probe_col} (score, %)")
    b.set_title("frozen probe score", fontsize=9)
    b.grid(alpha=0.3)
    b.legend(fontsize=8)
    caption = band_caption(bands)
    fig.suptitle(f"Better pre-training loss, better frozen features?\n{caption}")
    return save_figure(fig, out, "loss_vs_probe", caption)


SIZE_STYLES = [(":", "v"), ("--", "s"), ("-", "o"), ("-.", "D"), ("-", "^"), ("--", "P")]  # smallest first


def panel_grid(
    df: pd.DataFrame, x: str, xlabel: str, title: str, out: Path, name: str, panel: tuple = ("task", "probe"), ylabel: str = "score (%)",
    log_x: bool = False, levels: dict | None = None, colors: Mapping[str, str] = OBJECTIVE_COLORS,
) -> list[Plot]:  # fmt: skip
    """One panel per (task, probe); a line per (objective, size): colour = objective, line style and
    marker = size (one legend for the figure); error bars by the rule of seed_bands, named in the title.
    `levels`: {panel key: [(y, label, colour)]}, horizontal reference lines (plateau_levels)."""
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
            ax.errorbar(line[x], line["mean"], yerr=error_bars(line), ls=style, marker=marker, ms=4, capsize=2, color=color_for(objective, colors),
                        label=f"{objective} {size}")  # fmt: skip
        _draw_levels(ax, (levels or {}).get((first, second), []))
        if log_x:
            log_x_axis(ax)
        what = f" ({sub['metric'].iloc[0]})" if panel[1] != "metric" and "metric" in sub else ""
        ax.set_title(f"{first} - {second}{what}", fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    legend = {}
    for ax in axes.flat:
        legend.update(zip(*reversed(ax.get_legend_handles_labels())))
    runs = [label for label in legend if label.rsplit(" ", 1)[-1] in sizes]  # "objective size"; reference lines last
    labels = sorted(runs, key=lambda label: (label.rsplit(" ", 1)[0], sizes.index(label.rsplit(" ", 1)[1])))
    labels += [label for label in legend if label not in runs]
    fig.legend([legend[label] for label in labels], labels, loc="outside lower center", ncol=min(len(labels), 6), fontsize=8)
    caption = band_caption(drawn)
    fig.suptitle(f"{title}\n{caption}")
    return save_figure(fig, out, name, caption)


def plot_layerwise(scores: pd.DataFrame, out: Path, colors: Mapping[str, str] = OBJECTIVE_COLORS) -> list[Plot]:
    final = headline_split(scores[scores["is_main"] & scores["is_final"]])
    return panel_grid(final, "relative_depth", "relative depth (layer / layers; 0 = embeddings)",
                       "Layer-wise frozen probe score (final checkpoints)", out, "layerwise", colors=colors)  # fmt: skip


def _along_training(df: pd.DataFrame) -> bool:
    """Whether some run has two or more checkpoints: a curve to draw against tokens or FLOPs."""
    return len(df) > 0 and df.groupby(["objective", "size", "seed"])["step"].nunique().max() >= 2


def plot_training(scores: pd.DataFrame, out: Path, colors: Mapping[str, str] = OBJECTIVE_COLORS) -> list[Plot]:
    last = headline_split(scores[scores["is_main"] & scores["is_last_layer"]])
    if not _along_training(last):
        return []
    plots = []
    for x, (xlabel, suffix, log_x) in TRAINING_AXES.items():
        plots += panel_grid(last, x, xlabel, "Frozen probe score along training (last layer)", out, f"training{suffix}", log_x=log_x,
                            colors=colors)  # fmt: skip
    return plots


def plot_losses(checkpoints: pd.DataFrame, out: Path, colors: Mapping[str, str] = OBJECTIVE_COLORS) -> list[Plot]:
    """Native and shared-protocol masked-token losses against tokens and against FLOPs, each panel with
    the unigram entropy of its targets (the plateau) as a horizontal line."""
    curves = loss_curves(checkpoints)
    if not _along_training(curves):
        return []
    panels = curves[["loss", "protocol"]].drop_duplicates().itertuples(index=False)
    levels = {(loss, protocol): plateau_levels(checkpoints, loss, colors) for loss, protocol in panels}
    plots = []
    for x, (xlabel, suffix, log_x) in TRAINING_AXES.items():
        plots += panel_grid(curves, x, xlabel, "Masked-token loss along training (compare objectives by the shared protocol)", out,
                             f"losses{suffix}", panel=("loss", "protocol"), ylabel="cross-entropy (nats)", log_x=log_x,
                            levels=levels, colors=colors)  # fmt: skip
    return plots


def plot_geometry_training(geo: pd.DataFrame, out: Path, colors: Mapping[str, str] = OBJECTIVE_COLORS) -> list[Plot]:
    """Each geometry metric of the last layer along training, against tokens and against FLOPs."""
    last = geo[geo["is_last_layer"]] if len(geo) else geo
    if not _along_training(last):
        return []
    plots = []
    for x, (xlabel, suffix, log_x) in TRAINING_AXES.items():
        plots += panel_grid(last, x, xlabel, "Last-layer representation geometry along training", out, f"geometry_training{suffix}",
                             panel=("task", "metric"), ylabel="metric value", log_x=log_x, colors=colors)  # fmt: skip
    return plots


def plot_geometry_depth(geo: pd.DataFrame, out: Path, colors: Mapping[str, str] = OBJECTIVE_COLORS) -> list[Plot]:
    """Each geometry metric against relative depth, a line per (objective, size), final checkpoints."""
    final = geo[geo["is_final"]] if len(geo) else geo
    return panel_grid(final, "relative_depth", "relative depth (layer / layers; 0 = embeddings)",
                       "Representation geometry by layer (final checkpoints)", out, "geometry_depth",
                       panel=("task", "metric"), ylabel="metric value", colors=colors)  # fmt: skip


def plot_geometry_size(geo: pd.DataFrame, out: Path, colors: Mapping[str, str] = OBJECTIVE_COLORS) -> list[Plot]:
    """The last layer's geometry metric against model size, a line per objective, final checkpoints."""
    plt = pyplot()
    last = geo[geo["is_final"] & geo["is_last_layer"]] if len(geo) else geo
    if last.empty or last["params_non_embedding"].nunique() < 2:
        return []
    panels = sorted(last.groupby(["task", "metric"]).groups)
    cols = min(5, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.8 * cols, 3.2 * rows + 0.6), squeeze=False, layout="constrained")
    drawn = set()
    for ax, (task, metric) in zip(axes.flat, panels):
        sub = last[(last["task"] == task) & (last["metric"] == metric)]
        for objective, line in sub.groupby("objective"):
            line = seed_bands(line, ["params_non_embedding"])
            drawn |= set(line["band"])
            ax.errorbar(line["params_non_embedding"], line["mean"], yerr=error_bars(line), marker="o", capsize=3, color=color_for(objective, colors), label=objective)
        log_x_axis(ax)
        ax.set_title(f"{task} - {metric}", fontsize=9)
        ax.set_xlabel("non-embedding parameters (log)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    caption = band_caption(drawn)
    fig.suptitle(f"Last-layer representation geometry vs model size (final checkpoints)\n{caption}")
    return save_figure(fig, out, "geometry_size", caption)


