"""Rendering a report: Markdown tables and sections shared by the sweep and zoo reports, and the HTML page."""

from __future__ import annotations

import html
import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from crossbert_model.utils import read_jsonl

from ..results import RESULTS_FILE, duplicate_units
from .plots import Plot
from .tables import centring_table

log = logging.getLogger("crossbert_eval.report")


def markdown_table(df: pd.DataFrame, floatfmt: str = "{:.2f}") -> str:
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
    return ["Raw and mean-centred features side by side (seed means): uncentred, a mean direction shared by every "
            "example is one large singular value that dominates RankMe and the dataset entropy; centred, they measure "
            "how the examples differ from one another.", "", markdown_table(table, floatfmt="{:.4f}"), "", "Every metric:", ""]


def timing_table(root: Path) -> str:
    timings = pd.DataFrame(read_jsonl(root / "timings.jsonl"))
    if timings.empty:
        return "(no timings)"
    table = timings.pivot_table(index="run", columns="stage", values="seconds", aggfunc="sum").fillna(0.0)
    table["total"] = table.sum(axis=1)
    table.loc["all runs"] = table.sum()
    return markdown_table(table.reset_index(), floatfmt="{:.0f}")


def page_ending(root: Path, config_yaml: str, provenance: dict, tables_line: str) -> list[str]:
    """The last sections of a report page, the same for a sweep and a zoo: where the time went, the
    configuration, the provenance, and a line naming the tables written."""
    return ["## Where the time went (wall seconds per stage)", "", timing_table(root), "",
            "## Configuration", "", "```yaml", config_yaml.rstrip(), "```", "",
            "## Provenance", "", "```json", json.dumps(provenance, indent=2), "```", "", tables_line]  # fmt: skip


def render_html(markdown: str, title: str = "sweep report") -> str:
    """A dependency-free rendering of the report's Markdown subset (headings, tables, images, code), as a page named `title`."""
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
    return f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{style}</style></head><body>\n" + "\n".join(out) + "\n</body></html>\n"
