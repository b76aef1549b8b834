"""Sweep aggregation (pandas), the representation-collapse plots (matplotlib) and the report page.

Everything here is rebuilt from the files a sweep writes, so it can be re-run at any time:
    checkpoints.jsonl   one row per probed checkpoint: objective, size, step, params, tokens, FLOPs, val loss
    results/results.jsonl   every probe / mteb score row
Outputs: tables/{scores,summary,summary_by_size}.{csv,parquet}, plots/*.{png,svg}, report.md, report.html.
"""

from __future__ import annotations

import html
import json
import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd

from crossbert_model.errors import CrossbertError
from crossbert_model.utils import atomic_write_text, provenance, read_jsonl

from .results import RESULTS_FILE, duplicate_units, normalise_row

log = logging.getLogger(__name__)

GLUE_PROBES = ("linear", "knn")


class ReportError(CrossbertError, ValueError):
    """The report was asked of something that is not a sweep folder."""


def _results_path(root: Path) -> Path:
    return root / "results" / RESULTS_FILE


def result_rows(root: Path) -> list[dict]:
    """The sweep's score rows in today's shape (old rows: `versions` -> `packages`, string layers -> int)."""
    return [normalise_row(r) for r in read_jsonl(_results_path(root))]


def load_scores(root: Path, rows: list[dict] | None = None) -> pd.DataFrame:
    checkpoints = pd.DataFrame(read_jsonl(root / "checkpoints.jsonl"))
    results = pd.DataFrame(result_rows(root) if rows is None else rows)
    if checkpoints.empty or results.empty:
        return pd.DataFrame()
    keep = ["model_fingerprint", "task", "family", "split", "probe", "layer", "relative_depth", "pooling", "metric", "value", "is_main"]
    results = results[[c for c in keep if c in results.columns]]
    layer = pd.to_numeric(results["layer"], errors="coerce")  # an int end to end: tables sort 2 < 10, L6 not L6.0
    results = results[layer.notna()].assign(layer=layer.dropna().astype(int))
    scores = results.merge(checkpoints.drop_duplicates("model_fingerprint"), on="model_fingerprint", how="inner")
    scores["is_final"] = scores["step"] == scores["total_steps"]
    scores["is_last_layer"] = scores["layer"] == scores["layers"]
    scores["score"] = 100 * scores["value"]
    return scores


def _headline_split(df: pd.DataFrame) -> pd.DataFrame:
    """One split per task: the last in sort order (test after validation) - what tables report."""
    last = df.groupby("task")["split"].transform("max")
    return df[df["split"] == last]


def summarise(scores: pd.DataFrame) -> pd.DataFrame:
    """Per checkpoint (last layer, main metrics): GLUE linear / kNN averages, MTEB averages by type."""
    main = _headline_split(scores[scores["is_main"] & scores["is_last_layer"]])
    ids = ["objective", "size", "seed", "step", "total_steps", "is_final", "params_non_embedding", "corpus_tokens", "train_flops", "val_loss"]
    parts = []
    for probe in GLUE_PROBES:
        sub = main[(main["probe"] == probe) & (main["family"] == "glue")]
        if len(sub):
            parts.append(sub.groupby(ids, dropna=False)["score"].mean().rename(f"glue_{probe}"))
    mteb = main[main["probe"] == "mteb"]
    if len(mteb):
        for family, sub in mteb.groupby("family"):
            parts.append(sub.groupby(ids, dropna=False)["score"].mean().rename(f"mteb_{family.split(':', 1)[1].lower()}"))
        parts.append(mteb.groupby(ids, dropna=False)["score"].mean().rename("mteb_avg"))
    for (task, probe), sub in main.groupby(["task", "probe"]):
        parts.append(sub.groupby(ids, dropna=False)["score"].mean().rename(f"{task}:{probe}"))
    if not parts:
        return pd.DataFrame()
    return pd.concat(parts, axis=1).reset_index().sort_values(["objective", "params_non_embedding", "step"])


def by_size(summary: pd.DataFrame) -> pd.DataFrame:
    """Final checkpoints, mean and std over seeds."""
    final = summary[summary["is_final"]]
    metrics = [c for c in final.columns if c.startswith(("glue_", "mteb_")) or ":" in c or c == "val_loss"]
    grouped = final.groupby(["objective", "size", "params_non_embedding", "train_flops"], dropna=False)[metrics]
    out = grouped.mean().join(grouped.std().add_suffix("_std")).join(grouped.size().rename("seeds"))
    return out.reset_index().sort_values(["objective", "params_non_embedding"])


# ------------------------------------------------------------------------------------------------
# Plots
# ------------------------------------------------------------------------------------------------

COLORS = {"mlm": "#d62728", "crossbert": "#1f77b4", "crossbert_nocms": "#2ca02c"}


def _color(objective: str) -> str:
    return COLORS.get(objective, "#7f7f7f")


def _save(fig, out: Path, name: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in ("png", "svg"):
        path = out / f"{name}.{ext}"
        fig.savefig(path, dpi=130, bbox_inches="tight")
        paths.append(path)
    _pyplot().close(fig)
    return paths


def _lines(ax, table: pd.DataFrame, x: str, y: str, label_fmt="{objective}") -> None:
    for objective, sub in table.groupby("objective"):
        sub = sub.sort_values(x)
        err = sub.get(f"{y}_std")
        has_err = err is not None and err.notna().any()
        ax.errorbar(sub[x], sub[y], yerr=err if has_err else None, marker="o", capsize=3, color=_color(objective), label=label_fmt.format(objective=objective))
        for _, row in sub.iterrows():
            ax.annotate(row["size"], (row[x], row[y]), textcoords="offset points", xytext=(4, 4), fontsize=7, color="#555")
    ax.margins(x=0.08, y=0.12)  # room for the size labels inside the frame


def _log_x(ax) -> None:
    """Log x axis (call after plotting), labelled at 1 and 3 x 10^k when it spans under 3 decades, so a
    short axis still gets several labels; minor-tick labels (2x10^12, 3x10^12, ...) would overlap."""
    from matplotlib.ticker import LogFormatterSciNotation, LogLocator, NullFormatter

    ax.set_xscale("log")
    low, high = ax.get_xlim()
    if math.log10(high / low) < 3:
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 3.0)))
        ax.xaxis.set_major_formatter(LogFormatterSciNotation(labelOnlyBase=False))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def plot_collapse(sizes: pd.DataFrame, out: Path) -> list[Path]:
    plt = _pyplot()

    columns = [c for c in ("glue_linear", "glue_knn", "mteb_avg") if c in sizes.columns]
    if not columns:
        return []
    titles = {"glue_linear": "linear probe (GLUE avg)", "glue_knn": "kNN probe (GLUE avg)", "mteb_avg": "MTEB average"}
    fig, axes = plt.subplots(2, len(columns), figsize=(4.6 * len(columns), 7.5), squeeze=False, layout="constrained")
    for j, col in enumerate(columns):
        for i, (x, xlabel) in enumerate((("params_non_embedding", "encoder parameters, non-embedding (count, log)"),
                                         ("train_flops", "training compute (FLOPs, log)"))):  # fmt: skip
            ax = axes[i, j]
            _lines(ax, sizes, x, col)
            _log_x(ax)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"{titles[col]} (score, %)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        axes[0, j].set_title(f"frozen {titles[col]}")
    fig.suptitle("Representation scaling: frozen probe score vs model size and training compute (last layer, final checkpoint)")
    return _save(fig, out, "collapse")


def plot_loss_vs_probe(sizes: pd.DataFrame, out: Path) -> list[Path]:
    plt = _pyplot()
    probe_col = next((c for c in ("glue_linear", "mteb_avg", "glue_knn") if c in sizes.columns), None)
    if probe_col is None or "val_loss" not in sizes.columns:
        return []
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4.2), layout="constrained")
    _lines(a, sizes, "params_non_embedding", "val_loss")
    _log_x(a)
    a.set_xlabel("encoder parameters, non-embedding (count, log)")
    a.set_ylabel("validation masked-token loss (nats)")
    a.set_title("pre-training loss (MLM: 15% of tokens; CrossBERT: r of tokens,\nnot comparable across objectives)", fontsize=9)
    a.grid(alpha=0.3)
    a.legend(fontsize=8)
    _lines(b, sizes, "params_non_embedding", probe_col)
    _log_x(b)
    b.set_xlabel("encoder parameters, non-embedding (count, log)")
    b.set_ylabel(f"{probe_col} (score, %)")
    b.set_title("frozen probe score", fontsize=9)
    b.grid(alpha=0.3)
    b.legend(fontsize=8)
    fig.suptitle("Better pre-training loss, better frozen features?")
    return _save(fig, out, "loss_vs_probe")


SIZE_STYLES = [(":", "v"), ("--", "s"), ("-", "o"), ("-.", "D"), ("-", "^"), ("--", "P")]  # smallest first


def _panel_grid(df: pd.DataFrame, x: str, xlabel: str, title: str, out: Path, name: str) -> list[Path]:
    """One panel per (task, probe); a line per (objective, size): colour = objective, line style and
    marker = size (one legend for the figure); error bars = std over seeds when there are several."""
    plt = _pyplot()
    panels = sorted(df.groupby(["task", "probe"]).groups)
    if not panels or df[x].nunique() < 2:
        return []
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows + 0.6), squeeze=False, layout="constrained")
    sizes = list(dict.fromkeys(df.sort_values("params_non_embedding")["size"]))
    for ax, (task, probe) in zip(axes.flat, panels):
        sub = df[(df["task"] == task) & (df["probe"] == probe)]
        for (objective, size), line in sub.groupby(["objective", "size"]):
            line = line.groupby(x)["score"].agg(["mean", "std"]).reset_index()
            err = line["std"] if line["std"].notna().any() else None
            style, marker = SIZE_STYLES[sizes.index(size) % len(SIZE_STYLES)]
            ax.errorbar(line[x], line["mean"], yerr=err, ls=style, marker=marker, ms=4, capsize=2, color=_color(objective),
                        label=f"{objective} {size}")  # fmt: skip
        ax.set_title(f"{task} - {probe} ({sub['metric'].iloc[0]})", fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("score (%)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    legend = {}
    for ax in axes.flat:
        legend.update(zip(*reversed(ax.get_legend_handles_labels())))
    labels = sorted(legend, key=lambda label: (label.rsplit(" ", 1)[0], sizes.index(label.rsplit(" ", 1)[1])))
    fig.legend([legend[label] for label in labels], labels, loc="outside lower center", ncol=min(len(labels), 6), fontsize=8)
    fig.suptitle(title)
    return _save(fig, out, name)


def plot_layerwise(scores: pd.DataFrame, out: Path) -> list[Path]:
    final = _headline_split(scores[scores["is_main"] & scores["is_final"]])
    return _panel_grid(final, "relative_depth", "relative depth (layer / layers; 0 = embeddings)",
                       "Layer-wise frozen probe score (final checkpoints)", out, "layerwise")  # fmt: skip


def plot_training(scores: pd.DataFrame, out: Path) -> list[Path]:
    last = _headline_split(scores[scores["is_main"] & scores["is_last_layer"]])
    return _panel_grid(last, "corpus_tokens", "training tokens (corpus tokens read)",
                       "Frozen probe score along training (last layer)", out, "training")  # fmt: skip


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------


def _markdown_table(df: pd.DataFrame, floatfmt: str = "{:.2f}") -> str:
    if df.empty:
        return "(no rows)"
    cols = list(df.columns)
    lines = ["| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    for _, row in df.iterrows():
        cells = []
        for c in cols:
            v = row[c]
            if isinstance(v, float):
                cells.append("" if np.isnan(v) else (f"{v:.3g}" if abs(v) >= 1e5 else floatfmt.format(v)))
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def build_report(root: Path) -> Path | None:
    """Tables, plots, report.md and report.html of a sweep folder; returns report.md's path, or None
    (nothing written) while the sweep has no scores yet. Not a sweep folder: ReportError."""
    root = Path(root)
    if not (_results_path(root).is_file() or (root / "sweep.yaml").is_file()):
        raise ReportError(f"{root}: not a sweep folder (no results/{RESULTS_FILE} or sweep.yaml)")
    rows = result_rows(root)
    scores = load_scores(root, rows)
    if scores.empty:
        log.info("report: no scores yet under %s", root)
        return None
    tables = root / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    summary = summarise(scores)
    sizes = by_size(summary)
    for name, df in (("scores", scores), ("summary", summary), ("summary_by_size", sizes)):
        df.to_csv(tables / f"{name}.csv", index=False)
        df.to_parquet(tables / f"{name}.parquet", index=False)
    plots_dir = root / "plots"
    plots = plot_collapse(sizes, plots_dir) + plot_loss_vs_probe(sizes, plots_dir) + plot_layerwise(scores, plots_dir) + plot_training(scores, plots_dir)
    md = render_markdown(root, sizes, summary, scores, [p for p in plots if p.suffix == ".png"], duplicates_warning(rows))
    atomic_write_text(root / "report.md", md)
    atomic_write_text(root / "report.html", render_html(md))
    return root / "report.md"


def duplicates_warning(rows: list[dict]) -> str | None:
    """One line naming the units written more than once (two runs computed them), or None."""
    dups = duplicate_units(rows)
    if not dups:
        return None
    extra = sum(n - 1 for n in dups.values())
    shown = ", ".join(f"{u} ({n}x)" for u, n in sorted(dups.items())[:10]) + (", ..." if len(dups) > 10 else "")
    line = (
        f"WARNING: {len(dups)} unit(s) are in results/{RESULTS_FILE} more than once "
        f"({extra} extra copies; averaged in the tables): {shown}"
    )
    log.warning("%s", line)
    return line


def render_markdown(
    root: Path, sizes: pd.DataFrame, summary: pd.DataFrame, scores: pd.DataFrame, plots: list[Path], warning: str | None = None
) -> str:
    prov = provenance()  # of the report build; each row carries its own (git_revision, packages)
    sweep_yaml = (root / "sweep.yaml").read_text() if (root / "sweep.yaml").exists() else ""
    score_cols = [c for c in sizes.columns if (c.startswith(("glue_", "mteb_")) or ":" in c) and not c.endswith("_std")]
    shown = sizes[["objective", "size", "params_non_embedding", "train_flops", "val_loss", *score_cols, "seeds"]]
    layer_best = (
        _headline_split(scores[scores["is_main"] & scores["is_final"]])
        .groupby(["objective", "size", "task", "probe"], as_index=False)
        .apply(lambda g: pd.Series({"last_layer": g.loc[g["layer"].idxmax(), "score"], "best_layer": g.loc[g["score"].idxmax(), "layer"], "best": g["score"].max()}), include_groups=False)
    )
    if len(layer_best):
        layer_best["best_layer"] = layer_best["best_layer"].astype(int)
    parts = [
        f"# Sweep report: {root.name}",
        "",
        *([f"**{warning}**", ""] if warning else []),
        "Scores are points (x100) of each task's main metric, frozen encoder, mean pooling; last layer unless said.",
        "`glue_*` averages the GLUE tasks probed; `mteb_*` averages mteb's main scores (by task type, and overall).",
        "Validation loss is the masked-token cross-entropy of each objective (MLM at 15%, CrossBERT at its mask ratio): "
        "it ranks sizes within an objective, not objectives against each other.",
        "",
        "## Final checkpoints by size",
        "",
        _markdown_table(shown),
        "",
        "## Last layer vs best layer (final checkpoints)",
        "",
        _markdown_table(layer_best),
        "",
        "## Plots",
        "",
        *[f"![{p.stem}](plots/{p.name})\n" for p in plots],
        "## Every checkpoint",
        "",
        _markdown_table(summary.drop(columns=["total_steps"], errors="ignore")),
        "",
        "## Where the time went (wall seconds per stage)",
        "",
        _timing_table(root),
        "",
        "## Configuration",
        "",
        "```yaml",
        sweep_yaml.rstrip(),
        "```",
        "",
        "## Provenance",
        "",
        "```json",
        json.dumps(prov, indent=2),
        "```",
        "",
        "Tables: `tables/scores.csv` (every score row joined with its checkpoint), `tables/summary.csv`, "
        "`tables/summary_by_size.csv` (also as parquet).",
    ]
    return "\n".join(parts) + "\n"


def _timing_table(root: Path) -> str:
    timings = pd.DataFrame(read_jsonl(root / "timings.jsonl"))
    if timings.empty:
        return "(no timings)"
    table = timings.pivot_table(index="run", columns="stage", values="seconds", aggfunc="sum").fillna(0.0)
    table["total"] = table.sum(axis=1)
    table.loc["all runs"] = table.sum()
    return _markdown_table(table.reset_index(), floatfmt="{:.0f}")


def render_html(markdown: str) -> str:
    """A dependency-free rendering of the report's Markdown subset (headings, tables, images, code)."""
    out, in_code, in_table = [], False, False
    for line in markdown.splitlines():
        if line.startswith("```"):
            out.append("</pre>" if in_code else "<pre>")
            in_code = not in_code
            continue
        if in_code:
            out.append(html.escape(line))
            continue
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if set("".join(cells)) <= {"-"}:
                continue
            if not in_table:
                out.append("<table>")
                in_table = True
                out.append("<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in cells) + "</tr>")
            else:
                out.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
            continue
        if in_table:
            out.append("</table>")
            in_table = False
        if line.startswith("!["):
            alt, src = line[2:].split("](", 1)
            out.append(f'<p><img src="{html.escape(src.rstrip(")"))}" alt="{html.escape(alt)}" style="max-width:100%"></p>')
        elif line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{html.escape(line.lstrip('#').strip())}</h{level}>")
        elif line.strip():
            out.append(f"<p>{html.escape(line)}</p>")
    if in_table:
        out.append("</table>")
    style = "body{font-family:sans-serif;max-width:1200px;margin:2em auto}table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}pre{background:#f6f6f6;padding:8px;overflow:auto}"
    return f"<!doctype html><html><head><meta charset='utf-8'><title>sweep report</title><style>{style}</style></head><body>\n" + "\n".join(out) + "\n</body></html>\n"
