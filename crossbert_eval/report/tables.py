"""The report's tables, each a function of the frames crossbert_eval.report.loading builds: per checkpoint, per size,
the unigram plateau, last vs best layer, geometry, and sample efficiency."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import pandas as pd

from crossbert_model.plateau import off_plateau, plateau_margin, unigram_entropy_key
from crossbert_model.reliance import carries_context, order_blind_share
from crossbert_model.shared_loss import SHARED_LOSS_R50, protocol_key

from .loading import LOSS_COLUMNS, headline_split
from .noise import collapse_gaps, failing_runs, not_comparable, seed_bands


GLUE_PROBES = ("linear", "knn")


def _score_columns(scores: pd.DataFrame, left_out: Collection[str] = ()):
    """(column, rows) of each score column of the summary: the GLUE averages per probe, the MTEB averages (per task
    type and overall) and one column per task x probe; rows: the last layer's main-metric rows it averages. Tasks in
    `left_out` (uninformative_tasks) keep their own columns but stay out of the averages."""
    main = headline_split(scores[scores["is_main"] & scores["is_last_layer"]])
    averaged = main[~main["task"].isin(list(left_out))]
    for probe in GLUE_PROBES:
        sub = averaged[(averaged["probe"] == probe) & (averaged["family"] == "glue")]
        if len(sub):
            yield f"glue_{probe}", sub
    mteb = main[main["probe"] == "mteb"]
    if len(mteb):
        for family, sub in mteb.groupby("family"):
            yield f"mteb_{family.split(':', 1)[1].lower()}", sub
        yield "mteb_avg", mteb
    for (task, probe), sub in main.groupby(["task", "probe"]):
        yield f"{task}:{probe}", sub


def summarise(scores: pd.DataFrame, left_out: Collection[str] = ()) -> pd.DataFrame:
    """Per checkpoint (last layer, main metrics): GLUE linear / kNN averages (without the `left_out` tasks), MTEB averages
    by type."""
    ids = [
        "objective",
        "size",
        "seed",
        "step",
        "total_steps",
        "is_final",
        "params_non_embedding",
        "corpus_tokens",
        "train_flops",
        *[c for c in LOSS_COLUMNS if c in scores.columns],
    ]
    parts = [sub.groupby(ids, dropna=False)["score"].mean().rename(column) for column, sub in _score_columns(scores, left_out)]
    if not parts:
        return pd.DataFrame()
    return pd.concat(parts, axis=1).reset_index().sort_values(["objective", "params_non_embedding", "step"])


def averaged_tasks(scores: pd.DataFrame, left_out: Collection[str] = ()) -> dict[str, list[str]]:
    """The tasks behind each score column of summarise (`mteb_avg` -> ["STSBenchmark"]): what a panel of it holds."""
    return {column: sorted(sub["task"].unique()) for column, sub in _score_columns(scores, left_out)}


def redundant_averages(averaged: dict[str, list[str]]) -> list[str]:
    """Average columns a table need not show: one that averages a single task (that task's own column holds the same
    numbers) and an overall average equal to the one task type it covers (`mteb_avg` beside `mteb_sts` alone)."""
    redundant = [column for column, tasks in averaged.items() if ":" not in column and len(tasks) == 1]
    types = [c for c in averaged if c.startswith("mteb_") and c != "mteb_avg"]
    if "mteb_avg" in averaged and len(types) == 1:
        redundant.append("mteb_avg")
    return sorted(set(redundant))


# How each baseline (crossbert_eval.baselines) is named in tables and legends; `{probe}`: the probe it was fitted with.
BASELINE_LABELS = {"chance": "chance", "majority": "majority class", "tfidf": "TF-IDF + {probe} probe"}
GUESSING_BASELINES = ("chance", "majority")  # stand beside every probe of a task; the others beside their own probe only
# The fitted baseline a probe's scores are read against, where it is not the probe's own: mteb's STS score is a cosine
# of the two sentences' vectors, its classification a logistic regression.
FITTED_BESIDE = {"mteb": ("cosine", "linear")}


def column_probe(column: str) -> str:
    """The probe of a summary column: "SST-2:linear" -> linear, "glue_knn" -> knn, "mteb_sts" / "mteb_avg" -> mteb."""
    if ":" in column:
        return column.split(":", 1)[1]
    return "mteb" if column.startswith("mteb_") else column.split("_", 1)[-1]


def stands_beside(baseline: str, baseline_probe: str, probe: str) -> bool:
    """Whether a baseline row (its name, the probe it was fitted with) is read beside scores of `probe`."""
    return baseline in GUESSING_BASELINES or baseline_probe in FITTED_BESIDE.get(probe, (probe,))


def baseline_label(baseline: str, probe: str) -> str:
    return BASELINE_LABELS.get(baseline, baseline).format(probe=probe)


def baselines_beside(baselines: pd.DataFrame, task: str, probe: str) -> pd.DataFrame:
    """The baseline rows a (task, probe) score is read against: chance and majority class whatever the probe, a fitted
    baseline where it used the same probe (`knn (centred)` is read against nothing fitted: no TF-IDF kNN is computed)."""
    if baselines.empty:
        return baselines
    rows = baselines[baselines["task"] == task]
    return rows[[stands_beside(b, p, probe) for b, p in zip(rows["baseline"], rows["probe"])]]


def uninformative_tasks(scores: pd.DataFrame, baselines: pd.DataFrame) -> dict[str, str]:
    """Tasks on which the majority class matches every model: no (objective, size)'s best layer (seed mean, final
    checkpoints, any probe) clears the top of the majority baseline's 95% interval. Task -> the line that says so.
    Such a task separates nothing here: it keeps its columns, but averages leave it out."""
    if baselines.empty or scores.empty:
        return {}
    final = headline_split(scores[scores["is_main"] & scores["is_final"]])
    out = {}
    for task, rows in final.groupby("task"):
        majority = baselines[(baselines["task"] == task) & (baselines["baseline"] == "majority")]
        if majority.empty:
            continue
        best = rows.groupby(["objective", "size", "probe", "layer"])["score"].mean().max()
        top = float(majority["score_ci_high"].iloc[0])
        if best <= top:
            out[task] = (
                f"{task}: always answering the majority class scores {majority['score'].iloc[0]:.1f} "
                f"(95% interval up to {top:.1f}); the best model layer scores {best:.1f}: it separates nothing here"
            )
    return out


def baseline_rows(columns: list[str], baselines: pd.DataFrame, averaged: dict[str, list[str]]) -> pd.DataFrame:
    """Rows to show under the models of a summary table: one per baseline, its score in each `columns` entry it stands
    beside ("TASK:probe" columns; an average column when every task it averages has that baseline)."""
    if baselines.empty:
        return pd.DataFrame()
    out = []
    names = baselines[["baseline", "probe"]].drop_duplicates()
    for baseline, probe in names.itertuples(index=False):
        row = {"objective": "baseline", "size": baseline_label(baseline, probe)}
        for column in columns:
            tasks = [column.split(":", 1)[0]] if ":" in column else averaged.get(column, [])
            col_probe = column_probe(column)
            values = [_baseline_score(baselines, t, col_probe, baseline, probe) for t in tasks]
            if tasks and all(v is not None for v in values):
                row[column] = float(np.mean(values))
        if len(row) > 2:
            out.append(row)
    return pd.DataFrame(out)


def _baseline_score(baselines: pd.DataFrame, task: str, column_probe: str, baseline: str, probe: str) -> float | None:
    if not stands_beside(baseline, probe, column_probe):
        return None
    hit = baselines[(baselines["task"] == task) & (baselines["baseline"] == baseline) & (baselines["probe"] == probe)]
    return float(hit["score"].iloc[0]) if len(hit) else None


def by_size(summary: pd.DataFrame) -> pd.DataFrame:
    """Final checkpoints, mean and std over seeds."""
    final = summary[summary["is_final"]]
    metrics = [c for c in final.columns if c.startswith(("glue_", "mteb_")) or ":" in c or c in LOSS_COLUMNS]
    grouped = final.groupby(["objective", "size", "params_non_embedding", "train_flops"], dropna=False)[metrics]
    out = (
        grouped.mean()
        .join(grouped.std().add_suffix("_std"))
        .join(grouped.min().add_suffix("_min"))
        .join(grouped.max().add_suffix("_max"))
        .join(grouped.size().rename("seeds"))
    )
    # copy() first: the joins leave the wide frame in one block per column, and reset_index's insert (and
    # every later assign) would then warn (pandas' PerformanceWarning)
    return out.copy().reset_index().sort_values(["objective", "params_non_embedding"])


def _number(value) -> float:
    return float(value) if value is not None and pd.notna(value) else np.nan


def _yes_no(value: bool | None) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


def plateau_table(checkpoints: pd.DataFrame) -> pd.DataFrame:
    """Per run (final checkpoint): the rules a run passes before it is compared. The shared-protocol loss at its
    own training ratio against the unigram entropy of the same targets, the margin between them, and whether
    the run is off the plateau (crossbert_model.plateau.off_plateau: at least PLATEAU_MARGIN below); the share
    of that margin the order-blind encoder loses and whether the encoder carries context (crossbert_model.reliance,
    the encoder rule). 'unknown' where a number was not recorded."""
    if checkpoints.empty or "run" not in checkpoints.columns:
        return pd.DataFrame()
    final = checkpoints[checkpoints["step"] == checkpoints["total_steps"]].drop_duplicates("run", keep="last")
    rows = []
    order = [c for c in ("objective", "params_non_embedding", "seed") if c in final.columns]
    for _, r in final.sort_values(order).iterrows():
        ratio = _number(r.get("mask_ratio"))
        known = not np.isnan(ratio)
        loss = _number(r.get(protocol_key("shared_loss", ratio))) if known else np.nan
        entropy = _number(r.get(unigram_entropy_key(ratio))) if known else np.nan
        off = off_plateau(loss, entropy)
        reliance = [_number(r.get(k)) for k in ("reliance_loss", "reliance_loss_order_blind", "reliance_unigram_entropy")]
        rows.append(
            {
                "run": r["run"],
                "objective": r["objective"],
                "size": r["size"],
                "seed": r["seed"],
                "own_ratio": ratio,
                "own_ratio_shared_loss": loss,
                "unigram_entropy": entropy,
                "margin": plateau_margin(loss, entropy),
                "off_plateau": _yes_no(off),
                "order_blind_share": order_blind_share(*reliance) if not np.isnan(reliance).any() else np.nan,
                "encoder_carries_context": _yes_no(carries_context(*reliance)),
            }
        )
    return pd.DataFrame(rows)


RELIANCE_COLUMNS = ("reliance_loss", "reliance_loss_order_blind", "reliance_loss_bypassed", "reliance_unigram_entropy")
LAYER_RELIANCE = {
    "identity_share": "identity_share",
    "swap_pooled": "swap_pooled_change",
    "swap_neighbour": "swap_neighbour_change",
}


def encoder_reliance_table(checkpoints: pd.DataFrame) -> pd.DataFrame:
    """Per run (the checkpoint its reliance was measured on): the shared-protocol loss at its own ratio with the
    encoder as trained, order-blind and bypassed, against the unigram entropy; the share of the margin the
    order-blind encoder loses; the encoder rule's answer (crossbert_model.reliance)."""
    if checkpoints.empty or "reliance_loss" not in checkpoints.columns:
        return pd.DataFrame()
    measured = checkpoints.dropna(subset=["reliance_loss"]).drop_duplicates("run", keep="last")
    rows = []
    for _, r in measured.sort_values([c for c in ("objective", "params_non_embedding", "seed") if c in measured]).iterrows():
        loss, blind, bypassed, entropy = (_number(r.get(c)) for c in RELIANCE_COLUMNS)
        rows.append(
            {
                "run": r["run"],
                "objective": r["objective"],
                "size": r["size"],
                "seed": r["seed"],
                "step": r["step"],
                "loss": loss,
                "loss_order_blind": blind,
                "loss_bypassed": bypassed,
                "unigram_entropy": entropy,
                "margin": entropy - loss,
                "order_blind_share": order_blind_share(loss, blind, entropy),
                "bypassed_share": order_blind_share(loss, bypassed, entropy),
                "encoder_carries_context": _yes_no(carries_context(loss, blind, entropy)),
            }
        )
    return pd.DataFrame(rows)


def encoder_layers_table(checkpoints: pd.DataFrame) -> pd.DataFrame:
    """Per run and layer: the share of the states' variance token identity explains, and how far a sequence's pooled
    state and its other tokens' states move when two adjacent tokens swap (crossbert_model.reliance.layer_reliance)."""
    if checkpoints.empty or "reliance_loss" not in checkpoints.columns:
        return pd.DataFrame()
    measured = checkpoints.dropna(subset=["reliance_loss"]).drop_duplicates("run", keep="last")
    rows = []
    for _, r in measured.iterrows():
        layer = 0
        while f"identity_share_l{layer}" in r and pd.notna(r[f"identity_share_l{layer}"]):
            rows.append(
                {
                    "run": r["run"],
                    "objective": r["objective"],
                    "size": r["size"],
                    "seed": r["seed"],
                    "layer": layer,
                    **{name: _number(r.get(f"{key}_l{layer}")) for key, name in LAYER_RELIANCE.items()},
                }
            )
            layer += 1
    return pd.DataFrame(rows)


# The two x axes of every along-training plot: sample efficiency (corpus tokens) and compute (FLOPs), each with the
# suffix of its plot's file and whether its axis is logarithmic (their names: vocabulary.axis_label).
TRAINING_AXES = {
    "corpus_tokens": ("", False),
    "train_flops": ("_flops", True),
}


def several_checkpoints(df: pd.DataFrame) -> bool:
    """Whether some run has two or more checkpoints: a curve to draw against tokens or FLOPs, a budget to interpolate."""
    return len(df) > 0 and df.groupby(["objective", "size", "seed"])["step"].nunique().max() >= 2


# What the report says instead of a sample-efficiency table when no run has a curve to interpolate on.
ONE_CHECKPOINT_LINE = (
    "Sample efficiency (corpus tokens each objective needs to reach another's loss) needs several checkpoints "
    "per run, to interpolate between; these runs have one each (the sweep config's `checkpoint_fractions` lists the steps kept)."
)


def loss_curves(checkpoints: pd.DataFrame) -> pd.DataFrame:
    """checkpoints.jsonl in long form, one row per (checkpoint, loss): native and shared-protocol losses."""
    if checkpoints.empty:
        return pd.DataFrame()
    present = [c for c in LOSS_COLUMNS if c in checkpoints.columns]
    ids = ["objective", "size", "seed", "step", "params_non_embedding", *TRAINING_AXES]
    long = checkpoints.drop_duplicates(["run", "step"]).melt(id_vars=ids, value_vars=present, var_name="loss", value_name="score")
    long = long.dropna(subset=["score"]).assign(
        protocol=lambda d: np.where(d["loss"] == "val_loss", "native (not comparable across objectives)", "shared protocol")
    )
    return long


def _budget_to_reach(curve: pd.DataFrame, x: str, target: float) -> tuple[float, str]:
    """(x, note): the x (tokens or FLOPs) at which a loss curve first reaches `target`, interpolated linearly
    in log x between the two checkpoints around it. Never extrapolated: NaN with the note "below the first
    checkpoint" (reached before it: less than its x) or "not reached" (more than the last x)."""
    curve = curve.sort_values(x)
    xs, ys = curve[x].to_numpy(float), curve["score"].to_numpy(float)
    if ys[0] <= target:
        return (float(xs[0]), "") if ys[0] == target else (np.nan, "below the first checkpoint")
    for x0, y0, x1, y1 in zip(xs, ys, xs[1:], ys[1:]):
        if y1 <= target < y0:
            t = (y0 - target) / (y0 - y1)
            return float(np.exp(np.log(x0) + t * (np.log(x1) - np.log(x0)))), ""
    return np.nan, "not reached"


def sample_efficiency(
    checkpoints: pd.DataFrame,
    loss: str = SHARED_LOSS_R50,
    plateau: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """How many corpus tokens (and FLOPs) each objective needs to reach each reference objective's
    shared-protocol loss at the reference's final checkpoint, per size, on seed-mean curves. ratio > 1:
    the objective needs that many times the reference's tokens (the paper's "2x sample efficiency" of CMS
    is tokens_ratio = 2 for CrossBERT without CMS against CrossBERT with it). A pair with a run on the
    unigram plateau (`plateau`: plateau_table) says so in `note`."""
    curves = loss_curves(checkpoints)
    if curves.empty or loss not in set(curves["loss"]) or not several_checkpoints(curves):
        return pd.DataFrame()
    curves = curves[curves["loss"] == loss]
    mean = curves.groupby(["objective", "size", "step", *TRAINING_AXES], as_index=False)["score"].mean()
    rows = []
    for size, by_size in mean.groupby("size"):
        objectives = sorted(by_size["objective"].unique())
        for reference in objectives:
            ref = by_size[by_size["objective"] == reference].sort_values("corpus_tokens").iloc[-1]
            for other in objectives:
                if other == reference:
                    continue
                curve = by_size[by_size["objective"] == other]
                need = {x: _budget_to_reach(curve, x, ref["score"]) for x in TRAINING_AXES}
                failing = failing_runs(plateau, size, [reference, other])
                note = "; ".join(n for n in (need["corpus_tokens"][1], not_comparable(failing) if failing else "") if n)
                rows.append(
                    {
                        "size": size,
                        "reference": reference,
                        "objective": other,
                        "loss": loss,
                        "target": ref["score"],
                        "reference_tokens": ref["corpus_tokens"],
                        "tokens_needed": need["corpus_tokens"][0],
                        "tokens_ratio": need["corpus_tokens"][0] / ref["corpus_tokens"],
                        "flops_ratio": need["train_flops"][0] / ref["train_flops"],
                        "note": note,
                    }
                )
    return pd.DataFrame(rows)


def geometry_seed_table(geo: pd.DataFrame) -> pd.DataFrame:
    """Final checkpoints, last layer: each metric's mean, std over seeds and the number of seeds."""
    last = geo[geo["is_final"] & geo["is_last_layer"]] if len(geo) else geo
    if last.empty:
        return pd.DataFrame()
    bands = seed_bands(last, ["objective", "size", "params_non_embedding", "task", "metric"], value="value")
    bands = bands.sort_values(["task", "metric", "objective", "params_non_embedding"])
    return bands[["task", "metric", "objective", "size", "mean", "std", "seeds"]]


CENTRED = "_centred"  # the suffix of geometry's metrics on mean-centred features


def centring_table(geometry: pd.DataFrame, value: str = "mean") -> pd.DataFrame:
    """Each metric that has a centred variant (RankMe, dataset entropy) next to it, from a geometry table (`value`:
    its column of values): one row per task and model, raw and centred side by side."""
    centred = sorted({m for m in geometry["metric"] if m.endswith(CENTRED)}) if len(geometry) else []
    if not centred:
        return pd.DataFrame()
    metrics = [m for c in centred for m in (c.removesuffix(CENTRED), c)]
    index = [c for c in geometry.columns if c not in ("metric", value, "std", "seeds")]
    wide = geometry[geometry["metric"].isin(metrics)].pivot_table(index=index, columns="metric", values=value)
    return wide[[m for m in metrics if m in wide.columns]].reset_index().rename_axis(columns=None)


def layer_best(scores: pd.DataFrame) -> pd.DataFrame:
    """Per (objective, size, task, probe): the last layer's and the best layer's score, each the mean over
    seeds (the best layer is chosen on that mean), with the std over seeds and the number of seeds, and the collapse
    gap (best minus last, per seed: noise.collapse_gaps) as mean and std over seeds."""
    final = headline_split(scores[scores["is_main"] & scores["is_final"]])
    if final.empty:
        return pd.DataFrame()
    bands = seed_bands(final, ["objective", "params_non_embedding", "size", "task", "probe", "layer"])

    def pick(g: pd.DataFrame) -> pd.Series:
        last, best = g.loc[g["layer"].idxmax()], g.loc[g["mean"].idxmax()]
        return pd.Series(
            {
                "last_layer": last["mean"],
                "last_layer_std": last["std"],
                "best_layer": int(best["layer"]),
                "best": best["mean"],
                "best_std": best["std"],
                "seeds": int(last["seeds"]),
            }
        )

    keys = ["objective", "params_non_embedding", "size", "task", "probe"]
    out = bands.groupby(keys).apply(pick, include_groups=False).reset_index()
    gaps = collapse_gaps(final).groupby(keys)["score"].agg(gap="mean", gap_std="std").reset_index()
    out = out.merge(gaps, on=keys, how="left")
    return out.drop(columns="params_non_embedding").astype({"best_layer": int, "seeds": int})
