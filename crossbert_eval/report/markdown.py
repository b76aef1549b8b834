"""Rendering a report: Markdown tables and sections shared by the sweep and zoo reports, and the HTML page."""

from __future__ import annotations

import html
import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from crossbert_model.readers import read_jsonl

from ..baselines import CHANCE_DRAWS
from ..folder_layout import EvaluationFolder
from ..results import RESULTS_FILE, duplicate_units
from .plots import Plot
from .tables import baseline_label, centring_table
from .vocabulary import header_labels, label

log = logging.getLogger("crossbert_eval.report")


def markdown_table(df: pd.DataFrame, floatfmt: str = "{:.2f}") -> str:
    """A Markdown table headed by the report's vocabulary (vocabulary.label). A column `x` with a neighbour `x_std`
    becomes one column of "mean ± std" cells (just the mean where the std is empty: one seed), so tables stay narrow."""
    if df.empty:
        return "(no rows)"
    cols = [c for c in df.columns if not (str(c).endswith("_std") and str(c).removesuffix("_std") in df.columns)]
    headers = header_labels(cols)
    lines = ["| " + " | ".join(_cell(headers[c]) for c in cols) + " |", "|" + "---|" * len(cols)]
    for _, row in df.iterrows():
        cells = []
        for c in cols:
            text = _number_text(row[c], floatfmt)
            std = row.get(f"{c}_std") if f"{c}_std" in df.columns else None
            if text and isinstance(std, float) and not np.isnan(std):
                text = f"{text} ± {_number_text(std, floatfmt)}"
            cells.append(_cell(text))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _number_text(value, floatfmt: str) -> str:
    if isinstance(value, float):
        return "" if np.isnan(value) else (f"{value:.3g}" if abs(value) >= 1e5 else floatfmt.format(value))
    return str(value)


def _cell(text: str) -> str:
    """A cell's text made safe for a Markdown table: a `|` would end the cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


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


def plot_section(plots: list[Plot]) -> list[str]:
    """Each plot as an image with its caption (what its error bars are)."""
    return [f"![{p.name}](plots/{p.png.name})\n\n*{p.name}: {p.caption}*\n" for p in plots]


def centring_section(geometry: pd.DataFrame, value: str = "mean") -> list[str]:
    """The report's lines for centring_table: raw and centred RankMe and dataset entropy side by side (none for rows
    computed before the centred metrics existed)."""
    table = centring_table(geometry, value)
    if table.empty:
        return []
    return [
        "Raw and mean-centred features side by side (seed means): uncentred, a mean direction shared by every "
        "example is one large singular value that dominates RankMe and the dataset entropy; centred, they measure "
        "how the examples differ from one another.",
        "",
        markdown_table(table, floatfmt="{:.4f}"),
        "",
        "Every metric:",
        "",
    ]


def timing_table(root: Path) -> str:
    timings = pd.DataFrame(read_jsonl(EvaluationFolder(root).timings))
    if timings.empty:
        return "(no timings)"
    table = timings.pivot_table(index="run", columns="stage", values="seconds", aggfunc="sum").fillna(0.0)
    table["total"] = table.sum(axis=1)
    table.loc["all runs"] = table.sum()
    return markdown_table(table.reset_index(), floatfmt="{:.0f}")


def page_ending(root: Path, config_yaml: str, provenance: dict, tables_line: str) -> list[str]:
    """The last sections of a report page, the same for a sweep and a zoo: where the time went, the
    configuration, the provenance, and a line naming the tables written."""
    return [
        "## Where the time went (wall seconds per stage)",
        "",
        timing_table(root),
        "",
        "## Configuration",
        "",
        "```yaml",
        config_yaml.rstrip(),
        "```",
        "",
        "## Provenance",
        "",
        "```json",
        json.dumps(provenance, indent=2),
        "```",
        "",
        tables_line,
    ]


# The page's look: text at a readable width, plots as wide as the page, every table inside a wrapper that scrolls
# sideways on its own (the page never does), headers that stay visible while a long table scrolls.
PAGE_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1200px;margin:1.5em auto;padding:0 1em;line-height:1.45;color:#222}
h1{margin-top:0}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
img{max-width:100%;height:auto;display:block;margin:.5em auto}
.table-wrap{overflow-x:auto;max-width:100%;margin:.6em 0;border:1px solid #e3e3e3}
table{border-collapse:collapse;font-size:12.5px;font-variant-numeric:tabular-nums}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:right;white-space:nowrap}
th{background:#f4f4f4;white-space:normal;min-width:4em;vertical-align:bottom}
td:first-child,th:first-child{text-align:left}
code{background:#f3f3f3;padding:0 .25em;border-radius:3px}
pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:12px}
"""


def _markdown_parser():
    """CommonMark with tables (markdown-it-py), raw HTML off: a report's text is escaped, never run as markup."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    md.add_render_rule("table_open", lambda self, tokens, idx, options, env: '<div class="table-wrap"><table>\n')
    md.add_render_rule("table_close", lambda self, tokens, idx, options, env: "</table></div>\n")
    return md


def render_html(markdown: str, title: str = "sweep report") -> str:
    """The report's Markdown as an HTML page named `title` (markdown-it-py: CommonMark and tables)."""
    body = _markdown_parser().render(markdown)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><meta name='viewport' content='width=device-width'>"
        f"<title>{html.escape(title)}</title><style>{PAGE_STYLE}</style></head><body>\n{body}</body></html>\n"
    )


def with_baseline_rows(shown: pd.DataFrame, baseline_rows: pd.DataFrame) -> pd.DataFrame:
    """A summary table with the baselines' rows under its models (`objective` = baseline), in the columns they stand beside."""
    if baseline_rows.empty:
        return shown
    return pd.concat([shown, baseline_rows[[c for c in baseline_rows.columns if c in shown.columns]]], ignore_index=True)


def baselines_section(baselines: pd.DataFrame, uninformative: dict[str, str]) -> list[str]:
    """What each task's scores are read against (crossbert_eval.baselines), and which tasks separate nothing here."""
    if baselines.empty:
        return ["## Baselines", "", "None computed for this folder (`crossbert baselines FOLDER` adds them).", ""]
    table = baselines.assign(baseline=[baseline_label(b, p) for b, p in zip(baselines["baseline"], baselines["probe"])])
    table = table[["task", "split", "metric", "baseline", "score", "score_ci_low", "score_ci_high", "n_train", "n_eval"]]
    lines = [
        "## Baselines",
        "",
        "What needs no encoder, on the probes' own splits (crossbert_eval/baselines.py): chance (uniform guesses; interval: "
        f"the central 95% of {CHANCE_DRAWS} draws), the majority class of the training split, and TF-IDF word uni- and bigrams with "
        "the same linear probe (and, on STS, their cosine); intervals of the last two: the bootstrap over evaluation "
        "examples. They are drawn as horizontal lines on the score plots and listed under the models in the tables.",
        "",
        markdown_table(table),
        "",
    ]
    if uninformative:
        lines += ["**Uninformative here, left out of every average:** " + "; ".join(uninformative.values()) + ".", ""]
    return lines


def averages_sentence(averaged: dict[str, list[str]], redundant: list[str]) -> str:
    """What each average column of a table averages, by name; the columns left out as redundant said once."""
    shown = [f"{label(c)}: {', '.join(tasks)}" for c, tasks in averaged.items() if ":" not in c and c not in redundant]
    parts = [f"Averages (last layer, main metric) over: {'; '.join(shown)}." if shown else "No average over several tasks."]
    if redundant:
        parts.append(f"Not shown: {', '.join(label(c) for c in redundant)} (each equals a column shown).")
    return " ".join(parts)
