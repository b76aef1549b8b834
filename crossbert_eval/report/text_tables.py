"""The plain-text tables the probe, geometry and mteb commands print when they finish (the report pages are
crossbert_eval.report.sweep_report / zoo_report)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from ..results import probe_variant
from ..tasks import all_tasks

if TYPE_CHECKING:  # the plan's type only: mteb_runner imports mteb, which a table does not need
    from ..mteb_benchmark import BenchmarkPlan


def probe_text_table(df: pd.DataFrame) -> str:
    """Main metric per task x probe, one column per layer, in points (x100), each score with the 95% bootstrap
    interval its row stores (ci_low, ci_high): `84.52 [82.1, 86.8]`."""
    if df is None or not len(df):
        return "(no results)"
    main = df[df["is_main"]].copy()
    for column in ("ci_low", "ci_high"):
        if column not in main:
            main[column] = float("nan")
    main["probe"] = [probe_variant(p, t) for p, t in zip(main["probe"], main.get("feature_transform", [None] * len(main)))]
    index = ["task", "split", "probe", "metric"]
    cells = main.groupby([*index, "layer"])[["value", "ci_low", "ci_high"]].mean()
    text = pd.Series([_score_cell(*(100 * v for v in row)) for row in cells.itertuples(index=False)], index=cells.index)
    table = text.unstack("layer", fill_value="")
    table.columns = [f"L{int(c)}" for c in table.columns]
    return table.to_string() + "\n(points x100; [95% bootstrap interval over evaluation examples])"


def _score_cell(score: float, low: float, high: float) -> str:
    return f"{score:.2f}" if pd.isna(low) or pd.isna(high) else f"{score:.2f} [{low:.1f}, {high:.1f}]"


def geometry_text_table(df: pd.DataFrame) -> str:
    """One row per task x split x pooling x metric, one column per layer."""
    if df is None or not len(df):
        return "(no results)"
    table = df.pivot_table(index=["task", "split", "pooling", "metric"], columns="layer", values="value", aggfunc="mean")
    table.columns = [f"L{int(c)}" for c in table.columns]
    return table.round(4).to_string()


def published_score(task: str, model: str, split: str) -> float | None:
    """The published score a task file records for this model (`reference_scores`), if any."""
    local = all_tasks().get(task)
    value = ((local.reference_scores if local else {}) or {}).get(model, {}).get(split)
    return float(value) if isinstance(value, (int, float)) else None


DATA_FLAGS = {"mteb": "", "differs": "differs", "variant": "VARIANT"}  # a task's data against MTEB's, as the table marks it


def _published_setting(protocol, layer, num_layers) -> bool:
    """Whether a row is the model's published setting (mteb_runner: its last layer with its own pooling)."""
    flag = protocol.get("published_setting") if isinstance(protocol, dict) else None
    return bool(flag) if flag is not None else layer == num_layers


def mteb_text_table(rows: list[dict], plan: BenchmarkPlan | None = None, wall_s: float | None = None) -> str:
    """Scores beside the published ones, with the layer, max length and time of each task and how its data stands
    to MTEB's; means over what ran (for a benchmark: labelled with its coverage, never as its score), per layer
    when several ran. A published score is the model's own setting (its last layer with its own pooling): it is
    compared with that layer only; other layers show '-' there, and a line says why."""
    if not rows:
        return "(no results)"
    df = pd.DataFrame(rows)
    for column, default in (("eval_time_s", None), ("protocol", None)):
        if column not in df:
            df[column] = default
    df["data"] = [(p or {}).get("data", "mteb") if isinstance(p, dict) else "mteb" for p in df["protocol"]]
    df["as_published"] = [_published_setting(p, layer, n) for p, layer, n in zip(df["protocol"], df["layer"], df["num_layers"])]
    main = df[df["is_main"]]
    # A task's score: its main metric per split and layer, averaged over subsets.
    keys = ["model", "task_type", "task", "split", "metric", "layer"]
    per_task = (
        main.groupby(keys, as_index=False, sort=False)
        .agg(
            value=("value", "mean"),
            max_length=("max_length", "first"),
            eval_time_s=("eval_time_s", "first"),
            data=("data", "first"),
            as_published=("as_published", "first"),
            pooling=("pooling", "first"),
            num_layers=("num_layers", "first"),
        )
        .sort_values(["model", "task_type", "task", "split", "metric", "layer"], kind="stable")
    )
    per_task["published"] = [published_score(r.task, r.model, r.split) for r in per_task.itertuples()]
    layers = sorted(per_task["layer"].unique())
    lines = []
    if plan is not None:
        lines += [f"{plan.name} on local data: {plan.coverage_line()}", ""]
    lines.append(f"{'type':18} {'task':40} {'split':10} {'metric':15} {'layer':>5} {'score':>6} {'publ.':>6} {'diff':>6} "
                 f"{'max_len':>7} {'time_s':>7}  data")  # fmt: skip
    withheld, seen = False, set()
    for r in per_task.itertuples():
        ref = r.published
        if ref is None or pd.isna(ref):
            published = diff = ""
        elif r.as_published:
            published, diff = f"{100 * ref:6.2f}", f"{100 * (r.value - ref):+6.2f}"
        else:
            published = diff = "-"
            withheld = True
        # per task and layer: on its first line
        time_s = "" if (r.task, r.layer) in seen or pd.isna(r.eval_time_s) else f"{r.eval_time_s:7.1f}"
        seen.add((r.task, r.layer))
        lines.append(f"{r.task_type:18} {r.task:40} {r.split:10} {r.metric[:15]:15} {r.layer:>5} {100 * r.value:6.2f} "
                     f"{published:>6} {diff:>6} {r.max_length:>7} {time_s:>7}  {DATA_FLAGS[r.data]}")  # fmt: skip
    if withheld:
        row = per_task[~per_task["as_published"]].iloc[0]
        lines.append(
            f"publ./diff '-': a published score is {row.model} at its last layer ({row.num_layers}) with its own "
            "pooling, so it is compared with that setting only"
        )
    headline = per_task.groupby(["task", "layer"]).tail(1).copy()  # the last split in sort order (test after validation)
    scope = f" that ran (of {plan.size}; NOT a {plan.name} score)" if plan is not None else ""
    lines.append("")
    if len(layers) == 1:
        by_type = headline.groupby("task_type")["value"].mean()
        for task_type, value in by_type.items():
            lines.append(f"mean {task_type:18} {100 * value:6.2f}  ({(headline['task_type'] == task_type).sum()} task(s))")
        lines.append(f"mean over the {len(by_type)} task types{scope}: {100 * by_type.mean():6.2f}")
        lines.append(f"mean over the {len(headline)} tasks{scope}: {100 * headline['value'].mean():6.2f}")
    else:
        lines += _mteb_layer_means(headline, layers, scope)
    # published means: over the rows of the published setting (one layer ran: that layer, if it is the published one)
    base = headline if len(layers) == 1 else headline[headline["as_published"]]
    at = f" (layer {base['layer'].iloc[0]}, the published setting)" if len(layers) > 1 and len(base) else ""
    comparable = bool(len(base)) and base["as_published"].all()
    if comparable and base["published"].notna().all():
        lines.append(f"published mean over the same {len(base)} tasks{at}: {100 * base['published'].mean():6.2f}")
    exact = base[base["data"] == "mteb"]
    if len(exact) < len(base) and len(exact):
        known = comparable and exact["published"].notna().all()
        published = f" (published {100 * exact['published'].mean():6.2f})" if known else ""
        lines.append(f"mean over the {len(exact)} tasks with MTEB's data{at}: {100 * exact['value'].mean():6.2f}{published}")
    flagged = headline[headline["data"] != "mteb"].drop_duplicates("task")
    for r in flagged.itertuples():
        task = all_tasks().get(r.task)
        lines.append(f"{DATA_FLAGS[r.data]:7} {r.task}: {task.mteb.data_differs if task and task.mteb else ''}")
    if wall_s is not None:  # each (task, layer) row set carries the encoding its layer's wrapper did
        encode = df.drop_duplicates(["task", "layer"])["encode_s"].dropna().sum() if "encode_s" in df else 0.0
        lines.append(f"wall time {wall_s:.0f} s (encoding {encode:.0f} s)")
    if plan is not None:
        lines += ["", plan.report()]
    return "\n".join(lines)


def _mteb_layer_means(headline: pd.DataFrame, layers: list[int], scope: str) -> list[str]:
    """The means of a run over several layers: one column per layer (task types, then every task type and task)."""
    # dropna=False: a layer whose scores are all undefined (CLS pooling at layer 0: one vector for every text) keeps its column
    by_type = headline.pivot_table(index="task_type", columns="layer", values="value", aggfunc="mean", dropna=False)
    counts = headline.drop_duplicates("task").groupby("task_type")["task"].count()
    label = lambda text: f"{text:40}"  # noqa: E731
    lines = [label("mean per layer") + "".join(f"{'L' + str(layer):>8}" for layer in layers)]
    for task_type, values in by_type.iterrows():
        lines.append(label(f"{task_type} ({counts[task_type]} task(s))") + "".join(f"{100 * values[l]:8.2f}" for l in layers))
    lines.append(label(f"over the {len(by_type)} task types") + "".join(f"{100 * by_type[l].mean():8.2f}" for l in layers))
    per_layer = headline.groupby("layer")["value"].mean()
    lines.append(label(f"over the {headline['task'].nunique()} tasks") + "".join(f"{100 * per_layer[l]:8.2f}" for l in layers))
    if scope:
        lines.append(f"(means over the tasks{scope})")
    return lines
