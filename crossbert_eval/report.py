"""Sweep aggregation (pandas), the representation-collapse plots (matplotlib) and the report page.

Everything here is rebuilt from the files a sweep writes, so it can be re-run at any time:
    checkpoints.jsonl   one row per probed checkpoint: objective, size, step, params, tokens, FLOPs, val loss
    results/results.jsonl   every probe / mteb score row
    unigram_entropies.jsonl   (optional) unigram entropies of runs trained before they were recorded
Outputs: tables/{scores,summary,summary_by_size,plateau,comparisons,geometry,sample_efficiency}.{csv,parquet},
plots/*.{png,svg}, report.md, report.html. Every plot draws error bars over seeds (the rule: seed_bands) and says
which in its title and caption; `comparisons` tests which differences the report makes are beyond noise (the test,
alpha and correction: crossbert_eval.stats), and gives no verdict where a run is still on the unigram plateau
(crossbert_model.plateau): `plateau` says which.
"""

from __future__ import annotations

import html
import json
import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd

from crossbert_model.args import read_yaml
from crossbert_model.errors import CrossbertError
from crossbert_model.plateau import PLATEAU_MARGIN, off_plateau, plateau_margin, unigram_entropy_key, unigram_entropy_key_for
from crossbert_model.shared_loss import SHARED_LOSS_KEYS, SHARED_LOSS_R50, protocol_key
from crossbert_model.utils import atomic_write_text, provenance, read_jsonl

from . import stats as S
from .results import RESULTS_FILE, ResultsStore, duplicate_units, normalise_row, probe_variant

log = logging.getLogger(__name__)

GLUE_PROBES = ("linear", "knn")
GEOMETRY_PROBE = "geometry"  # crossbert_eval.geometry_runner.PROBE_NAME, without importing the encoders


class ReportError(CrossbertError, ValueError):
    """The report was asked of something that is not a sweep folder."""


# Loss columns of checkpoints.jsonl, native first; shared-protocol ones exist for checkpoints trained since they did.
LOSS_COLUMNS = ("val_loss", *SHARED_LOSS_KEYS.values())
# Unigram entropies and own mask ratios of runs trained before the trainer recorded them, one row per run
# (crossbert_eval.sweep.fill_unigram_entropies, `crossbert plateau SWEEP_DIR`): they fill checkpoints.jsonl's gaps.
UNIGRAM_FILE = "unigram_entropies.jsonl"

def _results_path(root: Path) -> Path:
    return root / "results" / RESULTS_FILE


def result_rows(root: Path) -> list[dict]:
    """The sweep's score rows in today's shape (old rows: `versions` -> `packages`, string layers -> int)."""
    return [normalise_row(r) for r in read_jsonl(_results_path(root))]


def load_checkpoints(root: Path) -> pd.DataFrame:
    """checkpoints.jsonl of a sweep: one row per probed checkpoint (tokens, FLOPs, losses, params), with
    the own mask ratio and unigram entropies of older runs filled in from UNIGRAM_FILE where it exists."""
    checkpoints = pd.DataFrame(read_jsonl(root / "checkpoints.jsonl"))
    return fill_by_run(checkpoints, pd.DataFrame(read_jsonl(root / UNIGRAM_FILE)))


def fill_by_run(checkpoints: pd.DataFrame, filled: pd.DataFrame) -> pd.DataFrame:
    """The missing `mask_ratio` and `unigram_entropy_*` values of `checkpoints`, from `filled`'s row of the same run."""
    if checkpoints.empty or filled.empty:
        return checkpoints
    by_run = filled.drop_duplicates("run", keep="last").set_index("run")
    out = checkpoints.copy()
    for col in [c for c in by_run.columns if c == "mask_ratio" or c.startswith("unigram_entropy")]:
        values = pd.to_numeric(out["run"].map(by_run[col]), errors="coerce")
        out[col] = pd.to_numeric(out[col], errors="coerce").fillna(values) if col in out else values
    return out


def sweep_config(root: Path) -> dict:
    """The sweep's sweep.yaml as a mapping ({} where there is none)."""
    return read_yaml(root / "sweep.yaml") if (root / "sweep.yaml").is_file() else {}


def reference_objective(sweep: dict) -> str | None:
    """The objective every other is compared with: the sweep config's `reference_objective`, else the first
    objective it lists (None: no sweep config, no objective comparisons)."""
    objectives = sweep.get("objectives") or []
    return sweep.get("reference_objective") or (objectives[0]["name"] if objectives else None)


def with_probe_variants(results: pd.DataFrame) -> pd.DataFrame:
    """`probe` named with its feature transform (results.probe_variant: `knn`, `knn (centred)`), so every table
    keeps the raw and the transformed scores of one probe apart, side by side."""
    if "feature_transform" not in results.columns:
        return results
    probes = [probe_variant(p, t) for p, t in zip(results["probe"], results["feature_transform"])]
    return results.assign(probe=probes).drop(columns="feature_transform")


def load_scores(root: Path, rows: list[dict] | None = None) -> pd.DataFrame:
    checkpoints = load_checkpoints(root)
    results = pd.DataFrame(result_rows(root) if rows is None else rows)
    if checkpoints.empty or results.empty:
        return pd.DataFrame()
    if "probe" in results.columns:  # geometry rows are not scores: load_geometry reads them
        results = results[results["probe"] != GEOMETRY_PROBE]
    keep = ["model_fingerprint", "task", "family", "split", "probe", "feature_transform", "layer", "relative_depth", "pooling",
            "metric", "value", "is_main", "ci_low", "ci_high", "unit"]  # fmt: skip
    results = with_probe_variants(results[[c for c in keep if c in results.columns]])
    if results.empty:
        return pd.DataFrame()
    layer = pd.to_numeric(results["layer"], errors="coerce")  # an int end to end: tables sort 2 < 10, L6 not L6.0
    results = results[layer.notna()].assign(layer=layer.dropna().astype(int))
    scores = results.merge(checkpoints.drop_duplicates("model_fingerprint"), on="model_fingerprint", how="inner")
    scores["is_final"] = scores["step"] == scores["total_steps"]
    scores["is_last_layer"] = scores["layer"] == scores["layers"]
    scores["score"] = 100 * scores["value"]
    for end in ("low", "high"):  # the bootstrap interval over evaluation examples, in points (mteb rows: none)
        scores[f"score_ci_{end}"] = 100 * pd.to_numeric(scores.get(f"ci_{end}", np.nan), errors="coerce")
    return scores


def load_geometry(root: Path, rows: list[dict] | None = None) -> pd.DataFrame:
    """Geometry rows (probe="geometry") joined with their checkpoints; `score` is the raw metric value."""
    checkpoints = load_checkpoints(root)
    results = pd.DataFrame(result_rows(root) if rows is None else rows)
    if checkpoints.empty or results.empty or "probe" not in results.columns:
        return pd.DataFrame()
    keep = ["model_fingerprint", "task", "split", "probe", "layer", "relative_depth", "pooling", "metric", "value", "n_eval"]
    results = results[results["probe"] == GEOMETRY_PROBE]
    results = results[[c for c in keep if c in results.columns]]
    if results.empty:
        return pd.DataFrame()
    results = results.assign(layer=pd.to_numeric(results["layer"]).astype(int))
    geo = results.merge(checkpoints.drop_duplicates("model_fingerprint"), on="model_fingerprint", how="inner")
    geo["is_final"] = geo["step"] == geo["total_steps"]
    geo["is_last_layer"] = geo["layer"] == geo["layers"]
    geo["score"] = geo["value"]
    return _headline_split(geo)


def _headline_split(df: pd.DataFrame) -> pd.DataFrame:
    """One split per task: the last in sort order (test after validation) - what tables report."""
    last = df.groupby("task")["split"].transform("max")
    return df[df["split"] == last]


def summarise(scores: pd.DataFrame) -> pd.DataFrame:
    """Per checkpoint (last layer, main metrics): GLUE linear / kNN averages, MTEB averages by type."""
    main = _headline_split(scores[scores["is_main"] & scores["is_last_layer"]])
    ids = ["objective", "size", "seed", "step", "total_steps", "is_final", "params_non_embedding", "corpus_tokens", "train_flops",
           *[c for c in LOSS_COLUMNS if c in scores.columns]]  # fmt: skip
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
    metrics = [c for c in final.columns if c.startswith(("glue_", "mteb_")) or ":" in c or c in LOSS_COLUMNS]
    grouped = final.groupby(["objective", "size", "params_non_embedding", "train_flops"], dropna=False)[metrics]
    out = (grouped.mean().join(grouped.std().add_suffix("_std")).join(grouped.min().add_suffix("_min"))
           .join(grouped.max().add_suffix("_max")).join(grouped.size().rename("seeds")))  # fmt: skip
    return out.reset_index().sort_values(["objective", "params_non_embedding"])


def _number(value) -> float:
    return float(value) if value is not None and pd.notna(value) else np.nan


def plateau_table(checkpoints: pd.DataFrame) -> pd.DataFrame:
    """Per run (final checkpoint): the shared-protocol loss at its own training ratio against the unigram
    entropy of the same targets, the margin between them, and whether the run is off the plateau
    (crossbert_model.plateau.off_plateau: at least PLATEAU_MARGIN below); 'unknown' for a run that recorded
    no entropy or no loss at its own ratio."""
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
        rows.append({"run": r["run"], "objective": r["objective"], "size": r["size"], "seed": r["seed"], "own_ratio": ratio,
                     "own_ratio_shared_loss": loss, "unigram_entropy": entropy, "margin": plateau_margin(loss, entropy),
                     "off_plateau": "unknown" if off is None else ("yes" if off else "no")})  # fmt: skip
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------
# Uncertainty: error bars over seeds (descriptive), and tests of the report's comparisons (crossbert_eval.stats)
# ------------------------------------------------------------------------------------------------
# Error bars describe the spread; they are not a test. One rule, named here once:
#   3 or more seeds: mean +- std over seeds (ddof=1);
#   2 seeds: min-max (a std of two values is their half-difference times sqrt(2): too optimistic);
#   1 seed: the row's bootstrap interval (probes.BOOTSTRAP_CI over evaluation examples), when it has one.
# Which differences are beyond noise is a test with a stated error rate (stats: Welch over seeds, the paired
# bootstrap for two scores of one model with one seed, Benjamini-Hochberg across the report): comparisons().
MIN_SEEDS_FOR_STD = 3
BANDS = {"std": "mean ± std over seeds", "min-max": "min–max over 2 seeds", "bootstrap": "bootstrap 95% interval (1 seed)",
         "none": "no noise estimate (1 seed, no interval)"}  # fmt: skip


def seed_bands(df: pd.DataFrame, by: list[str], value: str = "score") -> pd.DataFrame:
    """One row per group of `by`, over its seeds: mean, std, min, max, seeds, and the error bar the plots
    draw (err_low / err_high below / above the mean) with its kind in `band` (a key of BANDS)."""
    if df.empty:
        return pd.DataFrame(columns=[*by, "mean", "std", "min", "max", "seeds", "err_low", "err_high", "band"])
    ci = [c for c in (f"{value}_ci_low", f"{value}_ci_high") if c in df.columns]
    per_seed = df.groupby([*by, "seed"], dropna=False)[[value, *ci]].mean().reset_index()
    g = per_seed.groupby(by, dropna=False)
    out = g[value].agg(["mean", "std", "min", "max"]).join(g.size().rename("seeds"))
    if ci:
        out = out.join(g[ci].mean().set_axis(["ci_low", "ci_high"], axis=1))
    out = out.reset_index()
    out["band"] = [_band(n, row) for n, (_, row) in zip(out["seeds"], out.iterrows())]
    low = {"std": out["mean"] - out["std"], "min-max": out["min"], "bootstrap": out.get("ci_low", out["mean"]), "none": out["mean"]}
    high = {"std": out["mean"] + out["std"], "min-max": out["max"], "bootstrap": out.get("ci_high", out["mean"]), "none": out["mean"]}
    out["err_low"] = [out["mean"][i] - low[b][i] for i, b in enumerate(out["band"])]
    out["err_high"] = [high[b][i] - out["mean"][i] for i, b in enumerate(out["band"])]
    return out


def _band(seeds: int, row: pd.Series) -> str:
    if seeds >= MIN_SEEDS_FOR_STD:
        return "std"
    if seeds == 2:
        return "min-max"
    has_ci = pd.notna(row.get("ci_low")) and pd.notna(row.get("ci_high"))
    return "bootstrap" if has_ci else "none"


def band_caption(bands) -> str:
    """What the error bars of a figure are, from the bands of the lines it draws."""
    kinds = [b for b in BANDS if b in set(bands)]
    return "error bars: " + ("; ".join(BANDS[k] for k in kinds) if kinds else "none")


def _yerr(bands: pd.DataFrame):
    """matplotlib's asymmetric yerr, or None when no line has a spread."""
    if not len(bands) or (bands["band"] == "none").all():
        return None
    # clipped at 0: matplotlib refuses negative bars (a bootstrap interval need not straddle a seed mean)
    return np.clip(np.vstack([bands["err_low"].fillna(0).to_numpy(), bands["err_high"].fillna(0).to_numpy()]), 0, None)


# Why a comparison has no test (its `noise` column; `test` says "none").
UNTESTED = {
    "models": "untested: one seed per model (seed variance unmeasured)",
    "predictions": "untested: one seed, no kept predictions for the paired bootstrap",
    "mixed": "untested: a side with one seed",
    "constant": "untested: neither side varies over seeds",
}


def _pair_values(rows: pd.DataFrame, keys: list[str], side_col: str, a, b) -> pd.DataFrame:
    """One row per key present on both sides: a_values / b_values, the per-seed scores of each side."""
    per_seed = rows.groupby([*keys, side_col, "seed"], dropna=False)["score"].mean().reset_index()
    sides = per_seed.groupby([*keys, side_col], dropna=False)["score"].agg(list).rename("values").reset_index()
    left = sides[sides[side_col] == a].drop(columns=side_col).set_index(keys).add_prefix("a_")
    right = sides[sides[side_col] == b].drop(columns=side_col).set_index(keys).add_prefix("b_")
    return left.join(right, how="inner").reset_index()


def _with_units(pairs: pd.DataFrame, rows: pd.DataFrame, keys: list[str], side_col: str, a, b) -> pd.DataFrame:
    """a_unit / b_unit / metric: the one result row behind each side of a pair, where it is one row (one
    seed, one pooling); what a paired comparison needs."""
    if "unit" not in rows.columns or pairs.empty:
        return pairs
    groups = rows.groupby([*keys, side_col], dropna=False)
    single = groups[["unit", "metric"]].first()[groups.size() == 1]
    out = pairs.copy()
    for side, value in (("a", a), ("b", b)):
        found = [single.loc[k] if k in single.index else None for k in (tuple(r[keys]) + (value,) for _, r in pairs.iterrows())]
        out[f"{side}_unit"] = [f["unit"] if f is not None else None for f in found]
        if side == "a":  # both sides: the same task and probe, so the same main metric
            out["metric"] = [f["metric"] if f is not None else None for f in found]
    return out


def _seed_test(a: list, b: list) -> dict:
    """Welch's test over seeds (stats.welch) where both sides have two or more seeds; else why there is none."""
    if min(len(a), len(b)) < 2:
        return {"test": "none", "noise": UNTESTED["mixed" if max(len(a), len(b)) > 1 else "models"]}
    w = S.welch(a, b)
    if np.isnan(w.p):
        return {"test": "none", "noise": UNTESTED["constant"]}
    return {"test": f"{S.WELCH} ({len(a)} vs {len(b)})", "noise": S.SEED_NOISE, "p_value": float(w.p),
            "diff_ci_low": float(w.ci_low), "diff_ci_high": float(w.ci_high)}  # fmt: skip


def seed_tests(pairs: pd.DataFrame) -> pd.DataFrame:
    """Each pair's means, spreads and seeds, its difference (b - a) and its test over seeds."""
    out = pairs.copy()
    for side in ("a", "b"):
        values = out[f"{side}_values"]
        out[f"{side}_mean"] = [float(np.mean(v)) for v in values]
        out[f"{side}_std"] = [float(np.std(v, ddof=1)) if len(v) > 1 else np.nan for v in values]
        out[f"{side}_seeds"] = [len(v) for v in values]
    out["diff"] = out["b_mean"] - out["a_mean"]
    tests = pd.DataFrame([_seed_test(a, b) for a, b in zip(out["a_values"], out["b_values"])], index=out.index)
    return out.join(tests.reindex(columns=["test", "noise", "p_value", "diff_ci_low", "diff_ci_high"]))


def paired_tests(table: pd.DataFrame, predictions) -> pd.DataFrame:
    """Test each pair of two 1-seed scores of the same pre-trained model (`within_model`) by the paired bootstrap
    of the difference over its evaluation examples (probes.bootstrap_diff; in points): evaluation noise only.
    `predictions(unit)` -> (labels, predictions) or None. Two different models with one seed each stay untested."""
    out = table.copy()
    one_seed = (out["a_seeds"] == 1) & (out["b_seeds"] == 1) & out["within_model"]
    out.loc[one_seed, "noise"] = UNTESTED["predictions"]
    if predictions is None or "a_unit" not in out.columns:
        return out
    from .probes import bootstrap_diff  # here: probes imports FAISS and scikit-learn, which a report rarely needs

    for i, row in out[one_seed].iterrows():
        a, b = (predictions(u) if pd.notna(u) else None for u in (row["a_unit"], row["b_unit"]))
        if a is None or b is None or not np.array_equal(a[0], b[0]):
            continue
        d = bootstrap_diff(row["metric"], a[0], a[1], b[1])
        out.loc[i, ["diff_ci_low", "diff_ci_high", "p_value"]] = 100 * d.low, 100 * d.high, d.p
        out.loc[i, ["test", "noise"]] = S.PAIRED, S.EVALUATION_NOISE
    return out


def family_verdicts(table: pd.DataFrame) -> pd.DataFrame:
    """The report's correction (stats.adjusted) over its family: every comparison with a p-value that the plateau
    rule did not withhold. Beyond noise when the adjusted p-value is at most stats.ALPHA; no p-value: unknown."""
    out = table.copy()
    withheld = out["verdict"].fillna("").str.startswith("not comparable")
    out["p_adjusted"] = S.adjusted(out["p_value"].where(~withheld).to_numpy(float))
    called = np.where(S.beyond_noise(out["p_adjusted"]), "beyond noise", "within noise")
    out["verdict"] = np.where(withheld, out["verdict"], np.where(out["p_adjusted"].isna(), "unknown", called))
    return out


COMPARISON_COLUMNS = ["comparison", "objective", "size", "task", "probe", "a_mean", "b_mean", "diff", "diff_ci_low", "diff_ci_high",
                      "a_std", "b_std", "a_seeds", "b_seeds", "test", "noise", "p_value", "p_adjusted", "verdict"]  # fmt: skip


def comparisons(scores: pd.DataFrame, reference: str | None = None, predictions=None, plateau: pd.DataFrame | None = None,
                ) -> pd.DataFrame:  # fmt: skip
    """The comparisons the report makes, each with its test and verdict:
    * objectives at each size: the `reference` objective (reference_objective: the sweep config's) vs every
      other objective, per task and probe (final checkpoints, last layer, main metric); none without a reference;
    * depth per run: layer 0 (embeddings) vs the last layer, per objective, size, task and probe.
    Tests: Welch over seeds, or for two 1-seed scores of one model the paired bootstrap over evaluation examples
    (`predictions`: ResultsStore.load_predictions); then the report's correction over every tested comparison
    (family_verdicts). `plateau` (plateau_table) withholds the verdict of every comparison that involves a run on the
    plateau, and those are left out of the correction's family."""
    final = _headline_split(scores[scores["is_main"] & scores["is_final"]])
    if final.empty:
        return pd.DataFrame(columns=COMPARISON_COLUMNS)
    parts = []
    by_objective = final[final["is_last_layer"]]
    keys = ["size", "params_non_embedding", "task", "probe"]
    for other in sorted(set(by_objective["objective"]) - {reference}) if reference in set(by_objective["objective"]) else []:
        pairs = _with_units(_pair_values(by_objective, keys, "objective", reference, other), by_objective, keys, "objective", reference, other)
        if len(pairs):
            parts.append(pairs.assign(comparison=f"{other} - {reference}", a=reference, b=other, within_model=False))
    ends = final[final["layer"].eq(0) | final["is_last_layer"]].assign(end=lambda d: np.where(d["layer"].eq(0), "layer 0", "last layer"))
    keys = ["objective", "size", "params_non_embedding", "task", "probe"]
    pairs = _with_units(_pair_values(ends, keys, "end", "layer 0", "last layer"), ends, keys, "end", "layer 0", "last layer")
    if len(pairs):
        parts.append(pairs.assign(comparison="last layer - layer 0", a="layer 0", b="last layer", within_model=True))
    if not parts:
        return pd.DataFrame(columns=COMPARISON_COLUMNS)
    out = paired_tests(seed_tests(pd.concat(parts, ignore_index=True)), predictions)
    out["objective"] = out["objective"].fillna("") if "objective" in out else ""
    out = family_verdicts(plateau_verdicts(out.assign(verdict=""), plateau))
    out = out.sort_values(["comparison", "params_non_embedding", "objective", "task", "probe"])
    return out[COMPARISON_COLUMNS]


def plateau_runs(plateau: pd.DataFrame | None, size, objectives) -> list[str]:
    """The runs of `objectives` at `size` (every seed) that are still on the unigram plateau."""
    if plateau is None or plateau.empty:
        return []
    on = plateau[(plateau["off_plateau"] == "no") & (plateau["size"] == size) & plateau["objective"].isin(list(objectives))]
    return sorted(on["run"])


def not_comparable(runs: list[str]) -> str:
    return f"not comparable: {', '.join(runs)} on the unigram plateau"


def plateau_verdicts(table: pd.DataFrame, plateau: pd.DataFrame | None) -> pd.DataFrame:
    """A comparison that involves a run on the unigram plateau (any seed of either side: both objectives
    of an objective comparison, the objective of a depth comparison) gets no verdict but
    'not comparable: <runs> on the unigram plateau' (issue 20). The numbers stay."""
    if plateau is None or plateau.empty:
        return table
    out = table.copy()
    for i, row in out.iterrows():
        runs = plateau_runs(plateau, row["size"], [row["objective"]] if row["objective"] else [row["a"], row["b"]])
        if runs:
            out.loc[i, "verdict"] = not_comparable(runs)
    return out


def _named(row: pd.Series) -> str:
    evaluation_only = " [evaluation noise only]" if row["noise"] == S.EVALUATION_NOISE else ""
    who = (row["objective"] + " ") if row["objective"] else ""
    return f"{who}{row['size']} {row['task']}:{row['probe']} ({row['diff']:+.2f}, adjusted p {row['p_adjusted']:.2g}){evaluation_only}"


def noise_paragraph(table: pd.DataFrame) -> str:
    """The generated summary above the comparison table: how many differences are beyond noise, and which."""
    if table.empty:
        return "No comparisons: a sweep needs two objectives at one size, or a layer-0 and a last-layer score."
    lines = []
    for comparison, sub in table.groupby("comparison", sort=False):
        counts = sub["verdict"].value_counts()
        withheld = int(sub["verdict"].str.startswith("not comparable").sum())
        named = ", ".join(_named(r) for _, r in sub[sub["verdict"] == "beyond noise"].iterrows())
        lines.append(
            f"- **{comparison}**: {counts.get('beyond noise', 0)} of {len(sub)} differences are beyond noise"
            f" ({counts.get('within noise', 0)} within it, {counts.get('unknown', 0)} untested"
            + (f", {withheld} not comparable: a run on the unigram plateau" if withheld else "") + ")"
            + (f": {named}." if named else ".")
        )
    return "\n".join(lines)


def methods_paragraph(table: pd.DataFrame) -> str:
    """How the report decides (crossbert_eval.stats): the tests, alpha, the correction and its family, and the power."""
    family = int(table["p_adjusted"].notna().sum()) if len(table) else 0
    text = (
        f"**Method.** With two or more seeds per side: {S.WELCH}, two-sided, unequal variances ({S.SEED_NOISE}; "
        f"`diff_ci_low` / `diff_ci_high`: its uncorrected {1 - S.ALPHA:.0%} interval of the difference). With one seed: two "
        f"scores of the same pre-trained model on one evaluation set (layer 0 and the last layer) by the {S.PAIRED}, labelled "
        f"`{S.EVALUATION_NOISE}`; two different models with one seed each are not tested. Multiple comparisons: "
        f"{S.CORRECTION} over the {family} tested comparisons of this report (those withheld by the unigram-plateau rule are "
        f"left out), false-discovery rate {S.ALPHA:g}: a difference is beyond noise when its adjusted p-value (`p_adjusted`) "
        f"is at most {S.ALPHA:g}. When no difference is real this bounds the chance of any false call at {S.ALPHA:g} "
        "(tests/test_stats.py measures it over simulated reports)."
    )
    seeds = sorted({int(min(a, b)) for a, b, t in zip(table["a_seeds"], table["b_seeds"], table["test"]) if str(t).startswith(S.WELCH)}
                   ) if len(table) else []  # fmt: skip
    return f"{text} {power_sentence(sorted({S.POWER_SEEDS, *seeds}), family)}" if seeds else text


def power_sentence(seeds: list[int], family: int) -> str:
    """The simulated power (stats.power) of a true difference of stats.POWER_EFFECT_SD seed standard deviations."""
    cases = []
    for n in seeds:
        power = S.power(seeds=n, family=family)
        case = f"with {n} seeds per side it is called in {power.alone:.1%} of tests at {S.ALPHA:g} uncorrected"
        if power.family > 1:  # a family of one (or none tested) has nothing to correct for
            case += f", and in {power.in_family:.1%} as the one real difference among {power.family} comparisons after {S.CORRECTION}"
        cases.append(case)
    return f"Power (simulated, normal seed scores), a true difference of {S.POWER_EFFECT_SD:g} standard deviations: {'; '.join(cases)}."


# ------------------------------------------------------------------------------------------------
# Plots
# ------------------------------------------------------------------------------------------------

# Reds for flat MLM, blue / green for CrossBERT with / without CMS (the objective names of configs/sweep/*.yaml).
COLORS = {"mlm": "#d62728", "mlm15": "#d62728", "mlm50_pure": "#ff7f0e", "crossbert": "#1f77b4", "crossbert_cms": "#1f77b4",
          "crossbert_nocms": "#2ca02c"}  # fmt: skip


def _color(objective: str) -> str:
    return COLORS.get(objective, "#7f7f7f")


CAPTIONS: dict[str, str] = {}  # plot name -> what its error bars are, for the report's caption (last build)


def _save(fig, out: Path, name: str, caption: str = "") -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    CAPTIONS[name] = caption
    paths = []
    for ext in ("png", "svg"):
        path = out / f"{name}.{ext}"
        fig.savefig(path, dpi=130, bbox_inches="tight")
        paths.append(path)
    _pyplot().close(fig)
    return paths


def size_bands(table: pd.DataFrame, y: str) -> pd.DataFrame:
    """The error bars of a by_size column, by the rule of seed_bands: std (3+ seeds), min-max (2), none (1)."""
    band = np.where(table["seeds"] >= MIN_SEEDS_FOR_STD, "std", np.where(table["seeds"] == 2, "min-max", "none"))
    std, low, high = (table.get(f"{y}_{k}", pd.Series(np.nan, index=table.index)) for k in ("std", "min", "max"))
    # one assign: the by_size table is wide (a column per task and probe), and adding columns one at a time
    # fragments it (pandas' PerformanceWarning on every plot)
    return table.assign(
        mean=table[y], band=band,
        err_low=np.where(band == "std", std, np.where(band == "min-max", table[y] - low, 0.0)),
        err_high=np.where(band == "std", std, np.where(band == "min-max", high - table[y], 0.0)),
    )  # fmt: skip


def _lines(ax, table: pd.DataFrame, x: str, y: str, label_fmt="{objective}") -> set[str]:
    """One line per objective with its seed error bars; returns the kinds of bar drawn (for the caption)."""
    bands = set()
    for objective, sub in table.groupby("objective"):
        sub = size_bands(sub.sort_values(x), y)
        bands |= set(sub["band"])
        ax.errorbar(sub[x], sub[y], yerr=_yerr(sub), marker="o", capsize=3, color=_color(objective), label=label_fmt.format(objective=objective))
        for _, row in sub.iterrows():
            ax.annotate(row["size"], (row[x], row[y]), textcoords="offset points", xytext=(4, 4), fontsize=7, color="#555")
    ax.margins(x=0.08, y=0.12)  # room for the size labels inside the frame
    return bands


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
    bands = set()
    for j, col in enumerate(columns):
        for i, (x, xlabel) in enumerate((("params_non_embedding", "encoder parameters, non-embedding (count, log)"),
                                         ("train_flops", "training compute (FLOPs, log)"))):  # fmt: skip
            ax = axes[i, j]
            bands |= _lines(ax, sizes, x, col)
            _log_x(ax)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"{titles[col]} (score, %)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        axes[0, j].set_title(f"frozen {titles[col]}")
    caption = band_caption(bands)
    fig.suptitle(f"Representation scaling: frozen probe score vs model size and training compute (last layer, final checkpoint)\n{caption}")
    return _save(fig, out, "collapse", caption)


PLATEAU_LABEL = "unigram entropy (plateau)"


def plateau_levels(checkpoints: pd.DataFrame, loss: str) -> list[tuple[float, str, str]]:
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
    return [(float(v), f"{PLATEAU_LABEL}, {objective}", _color(objective)) for objective, v in values.items()]


def _draw_levels(ax, levels: list[tuple[float, str, str]]) -> None:
    """Horizontal reference lines, dash-dot-dot: a style no size's line has (SIZE_STYLES)."""
    for y, label, color in levels:
        ax.axhline(y, color=color, ls=(0, (6, 2, 1, 2, 1, 2)), lw=1.2, label=label)


def plot_loss_vs_probe(sizes: pd.DataFrame, out: Path, checkpoints: pd.DataFrame | None = None) -> list[Path]:
    """Loss against probe score. Objectives are put side by side by the shared-protocol loss (the same
    masks, pure [MASK] for MLM, visible-only encoder for CrossBERT); each objective's native validation
    loss is a different task and is used only where a sweep predates the shared loss. The loss panel
    draws the unigram entropy of the same targets (from `checkpoints`), the plateau."""
    plt = _pyplot()
    probe_col = next((c for c in ("glue_linear", "mteb_avg", "glue_knn") if c in sizes.columns), None)
    loss_col = next((c for c in (SHARED_LOSS_R50, "val_loss") if c in sizes.columns and sizes[c].notna().any()), None)
    if probe_col is None or loss_col is None:
        return []
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4.2), layout="constrained")
    bands = _lines(a, sizes, "params_non_embedding", loss_col)
    _draw_levels(a, plateau_levels(checkpoints if checkpoints is not None else pd.DataFrame(), loss_col))
    _log_x(a)
    a.set_xlabel("encoder parameters, non-embedding (count, log)")
    a.set_ylabel("masked-token loss (nats)")
    if loss_col == SHARED_LOSS_R50:
        a.set_title("shared-protocol loss, r = 0.5 (the same masks for both objectives:\ncomparable across objectives)", fontsize=9)
    else:
        a.set_title("native validation loss (MLM: 15% of tokens; CrossBERT: r of tokens,\nnot comparable across objectives)", fontsize=9)
    a.grid(alpha=0.3)
    a.legend(fontsize=8)
    bands |= _lines(b, sizes, "params_non_embedding", probe_col)
    _log_x(b)
    b.set_xlabel("encoder parameters, non-embedding (count, log)")
    b.set_ylabel(f"{probe_col} (score, %)")
    b.set_title("frozen probe score", fontsize=9)
    b.grid(alpha=0.3)
    b.legend(fontsize=8)
    caption = band_caption(bands)
    fig.suptitle(f"Better pre-training loss, better frozen features?\n{caption}")
    return _save(fig, out, "loss_vs_probe", caption)


SIZE_STYLES = [(":", "v"), ("--", "s"), ("-", "o"), ("-.", "D"), ("-", "^"), ("--", "P")]  # smallest first


def _panel_grid(
    df: pd.DataFrame, x: str, xlabel: str, title: str, out: Path, name: str, panel: tuple = ("task", "probe"), ylabel: str = "score (%)",
    log_x: bool = False, levels: dict | None = None,
) -> list[Path]:  # fmt: skip
    """One panel per (task, probe); a line per (objective, size): colour = objective, line style and
    marker = size (one legend for the figure); error bars by the rule of seed_bands, named in the title.
    `levels`: {panel key: [(y, label, colour)]}, horizontal reference lines (plateau_levels)."""
    plt = _pyplot()
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
            ax.errorbar(line[x], line["mean"], yerr=_yerr(line), ls=style, marker=marker, ms=4, capsize=2, color=_color(objective),
                        label=f"{objective} {size}")  # fmt: skip
        _draw_levels(ax, (levels or {}).get((first, second), []))
        if log_x:
            _log_x(ax)
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
    return _save(fig, out, name, caption)


def plot_layerwise(scores: pd.DataFrame, out: Path) -> list[Path]:
    final = _headline_split(scores[scores["is_main"] & scores["is_final"]])
    return _panel_grid(final, "relative_depth", "relative depth (layer / layers; 0 = embeddings)",
                       "Layer-wise frozen probe score (final checkpoints)", out, "layerwise")  # fmt: skip


# The two x axes of every along-training plot: sample efficiency (corpus tokens) and compute (FLOPs).
TRAINING_AXES = {
    "corpus_tokens": ("training tokens (corpus tokens read)", "", False),
    "train_flops": ("training FLOPs (log scale)", "_flops", True),
}


def _along_training(df: pd.DataFrame) -> bool:
    """Whether some run has two or more checkpoints: a curve to draw against tokens or FLOPs."""
    return len(df) > 0 and df.groupby(["objective", "size", "seed"])["step"].nunique().max() >= 2


def plot_training(scores: pd.DataFrame, out: Path) -> list[Path]:
    last = _headline_split(scores[scores["is_main"] & scores["is_last_layer"]])
    if not _along_training(last):
        return []
    paths = []
    for x, (xlabel, suffix, log_x) in TRAINING_AXES.items():
        paths += _panel_grid(last, x, xlabel, "Frozen probe score along training (last layer)", out, f"training{suffix}", log_x=log_x)
    return paths


def loss_curves(checkpoints: pd.DataFrame) -> pd.DataFrame:
    """checkpoints.jsonl in long form, one row per (checkpoint, loss): native and shared-protocol losses."""
    if checkpoints.empty:
        return pd.DataFrame()
    present = [c for c in LOSS_COLUMNS if c in checkpoints.columns]
    ids = ["objective", "size", "seed", "step", "params_non_embedding", *TRAINING_AXES]
    long = checkpoints.drop_duplicates(["run", "step"]).melt(id_vars=ids, value_vars=present, var_name="loss", value_name="score")
    long = long.dropna(subset=["score"]).assign(protocol=lambda d: np.where(d["loss"] == "val_loss", "native (not comparable across objectives)", "shared protocol"))
    return long


def plot_losses(checkpoints: pd.DataFrame, out: Path) -> list[Path]:
    """Native and shared-protocol masked-token losses against tokens and against FLOPs, each panel with
    the unigram entropy of its targets (the plateau) as a horizontal line."""
    curves = loss_curves(checkpoints)
    if not _along_training(curves):
        return []
    panels = curves[["loss", "protocol"]].drop_duplicates().itertuples(index=False)
    levels = {(loss, protocol): plateau_levels(checkpoints, loss) for loss, protocol in panels}
    paths = []
    for x, (xlabel, suffix, log_x) in TRAINING_AXES.items():
        paths += _panel_grid(curves, x, xlabel, "Masked-token loss along training (compare objectives by the shared protocol)", out,
                             f"losses{suffix}", panel=("loss", "protocol"), ylabel="cross-entropy (nats)", log_x=log_x,
                             levels=levels)  # fmt: skip
    return paths


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


def sample_efficiency(checkpoints: pd.DataFrame, loss: str = SHARED_LOSS_R50, plateau: pd.DataFrame | None = None,
                      ) -> pd.DataFrame:  # fmt: skip
    """How many corpus tokens (and FLOPs) each objective needs to reach each reference objective's
    shared-protocol loss at the reference's final checkpoint, per size, on seed-mean curves. ratio > 1:
    the objective needs that many times the reference's tokens (the paper's "2x sample efficiency" of CMS
    is tokens_ratio = 2 for CrossBERT without CMS against CrossBERT with it). A pair with a run on the
    unigram plateau (`plateau`: plateau_table) says so in `note`."""
    curves = loss_curves(checkpoints)
    if curves.empty or loss not in set(curves["loss"]):
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
                on_plateau = plateau_runs(plateau, size, [reference, other])
                note = "; ".join(n for n in (need["corpus_tokens"][1], not_comparable(on_plateau) if on_plateau else "") if n)
                rows.append({"size": size, "reference": reference, "objective": other, "loss": loss, "target": ref["score"],
                             "reference_tokens": ref["corpus_tokens"], "tokens_needed": need["corpus_tokens"][0],
                             "tokens_ratio": need["corpus_tokens"][0] / ref["corpus_tokens"],
                             "flops_ratio": need["train_flops"][0] / ref["train_flops"], "note": note})  # fmt: skip
    return pd.DataFrame(rows)


def plot_geometry_training(geo: pd.DataFrame, out: Path) -> list[Path]:
    """Each geometry metric of the last layer along training, against tokens and against FLOPs."""
    last = geo[geo["is_last_layer"]] if len(geo) else geo
    if not _along_training(last):
        return []
    paths = []
    for x, (xlabel, suffix, log_x) in TRAINING_AXES.items():
        paths += _panel_grid(last, x, xlabel, "Last-layer representation geometry along training", out, f"geometry_training{suffix}",
                             panel=("task", "metric"), ylabel="metric value", log_x=log_x)  # fmt: skip
    return paths


def plot_geometry_depth(geo: pd.DataFrame, out: Path) -> list[Path]:
    """Each geometry metric against relative depth, a line per (objective, size), final checkpoints."""
    final = geo[geo["is_final"]] if len(geo) else geo
    return _panel_grid(final, "relative_depth", "relative depth (layer / layers; 0 = embeddings)",
                       "Representation geometry by layer (final checkpoints)", out, "geometry_depth",
                       panel=("task", "metric"), ylabel="metric value")  # fmt: skip


def plot_geometry_size(geo: pd.DataFrame, out: Path) -> list[Path]:
    """The last layer's geometry metric against model size, a line per objective, final checkpoints."""
    plt = _pyplot()
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
            ax.errorbar(line["params_non_embedding"], line["mean"], yerr=_yerr(line), marker="o", capsize=3, color=_color(objective), label=objective)
        _log_x(ax)
        ax.set_title(f"{task} - {metric}", fontsize=9)
        ax.set_xlabel("non-embedding parameters (log)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    caption = band_caption(drawn)
    fig.suptitle(f"Last-layer representation geometry vs model size (final checkpoints)\n{caption}")
    return _save(fig, out, "geometry_size", caption)


def geometry_table(geo: pd.DataFrame) -> pd.DataFrame:
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
    geo = load_geometry(root, rows)
    checkpoints = load_checkpoints(root)
    plateau = plateau_table(checkpoints)
    reference = reference_objective(sweep_config(root))
    extras = {
        "plateau": plateau,
        "comparisons": comparisons(scores, reference, ResultsStore(root / "results").load_predictions, plateau),
        "geometry": geometry_table(geo),
        "sample_efficiency": sample_efficiency(checkpoints, plateau=plateau),
    }
    for name, df in (("scores", scores), ("summary", summary), ("summary_by_size", sizes), *extras.items()):
        df.to_csv(tables / f"{name}.csv", index=False)
        df.to_parquet(tables / f"{name}.parquet", index=False)
    plots_dir = root / "plots"
    CAPTIONS.clear()
    plots = plot_collapse(sizes, plots_dir) + plot_loss_vs_probe(sizes, plots_dir, checkpoints)
    plots += plot_layerwise(scores, plots_dir) + plot_training(scores, plots_dir) + plot_losses(checkpoints, plots_dir)
    plots += plot_geometry_depth(geo, plots_dir) + plot_geometry_size(geo, plots_dir) + plot_geometry_training(geo, plots_dir)
    md = render_markdown(root, sizes, summary, scores, [p for p in plots if p.suffix == ".png"], duplicates_warning(rows), extras)
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


def _layer_best(scores: pd.DataFrame) -> pd.DataFrame:
    """Per (objective, size, task, probe): the last layer's and the best layer's score, each the mean over
    seeds (the best layer is chosen on that mean), with the std over seeds and the number of seeds."""
    final = _headline_split(scores[scores["is_main"] & scores["is_final"]])
    if final.empty:
        return pd.DataFrame()
    bands = seed_bands(final, ["objective", "params_non_embedding", "size", "task", "probe", "layer"])

    def pick(g: pd.DataFrame) -> pd.Series:
        last, best = g.loc[g["layer"].idxmax()], g.loc[g["mean"].idxmax()]
        return pd.Series({"last_layer": last["mean"], "last_layer_std": last["std"], "best_layer": int(best["layer"]),
                          "best": best["mean"], "best_std": best["std"], "seeds": int(last["seeds"])})  # fmt: skip

    out = bands.groupby(["objective", "params_non_embedding", "size", "task", "probe"]).apply(pick, include_groups=False).reset_index()
    return out.drop(columns="params_non_embedding").astype({"best_layer": int, "seeds": int})


def render_markdown(
    root: Path, sizes: pd.DataFrame, summary: pd.DataFrame, scores: pd.DataFrame, plots: list[Path], warning: str | None = None,
    extras: dict | None = None,
) -> str:  # fmt: skip
    prov = provenance()  # of the report build; each row carries its own (git_revision, packages)
    sweep_yaml = (root / "sweep.yaml").read_text() if (root / "sweep.yaml").exists() else ""
    extras = extras or {}
    score_cols = [c for c in sizes.columns if (c.startswith(("glue_", "mteb_")) or ":" in c) and not c.endswith(("_std", "_min", "_max"))]
    with_std = [x for c in score_cols for x in (c, f"{c}_std")]
    losses = [c for c in LOSS_COLUMNS if c in sizes.columns]
    shown = sizes[["objective", "size", "params_non_embedding", "train_flops", *losses, *with_std, "seeds"]]
    layer_best = _layer_best(scores)
    compared = extras.get("comparisons", pd.DataFrame())
    plateau = extras.get("plateau", pd.DataFrame())
    geometry = extras.get("geometry", pd.DataFrame())
    efficiency = extras.get("sample_efficiency", pd.DataFrame())
    parts = [
        f"# Sweep report: {root.name}",
        "",
        *([f"**{warning}**", ""] if warning else []),
        "Scores are points (x100) of each task's main metric, frozen encoder, mean pooling; last layer unless said.",
        "`glue_*` averages the GLUE tasks probed; `mteb_*` averages mteb's main scores (by task type, and overall).",
        "`val_loss` is the masked-token cross-entropy of each objective on its own task (MLM at its ratio with BERT's "
        "80/10/10, CrossBERT at its mask ratio): it ranks sizes within an objective, not objectives against each other. "
        "`shared_loss_r15` / `shared_loss_r50` are the shared-protocol losses (crossbert_model/shared_loss.py: the same "
        "seeded masks at 15% / 50%, every selected token [MASK] for MLM, only the unselected tokens visible to CrossBERT's "
        "encoder): compare objectives by these.",
        "",
        "## Final checkpoints by size",
        "",
        _markdown_table(shown),
        "",
        "`*_std`: standard deviation over seeds (empty with one seed); `seeds`: how many seeds each mean averages.",
        "",
        "## Last layer vs best layer (final checkpoints)",
        "",
        _markdown_table(layer_best),
        "",
        *(["## The unigram plateau", "",
           "A model that knows token frequencies and nothing else scores the unigram entropy of the targets "
           "(crossbert_model/plateau.py: add-one-smoothed unigram counts of the run's training sequences). A run is off the "
           f"plateau when its shared-protocol loss at its own training ratio is at least {PLATEAU_MARGIN:g} nats below the "
           "unigram entropy of the same targets (issue 20); a comparison that involves a run on the plateau gives no verdict "
           "below (`not comparable`). `unknown`: the run recorded no unigram entropy (runs trained before it was recorded: "
           "`crossbert plateau SWEEP_DIR` fills it in).", "", _markdown_table(plateau, floatfmt="{:.3f}"), ""]
          if len(plateau) else []),  # fmt: skip
        "## Which differences are beyond noise",
        "",
        f"Objectives: {_objectives_compared(reference_objective(sweep_config(root)))}; depth: layer 0 against the last layer "
        "of each objective and size. The plots' error bars describe the spread; this table tests it.",
        "",
        methods_paragraph(compared),
        "",
        noise_paragraph(compared),
        "",
        _markdown_table(compared),
        "",
        *(["## Sample efficiency (shared-protocol loss)", "",
           "Corpus tokens each objective needs to reach the reference objective's final shared-protocol loss "
           "(seed means, interpolated in log tokens between checkpoints, never extrapolated: `note` says when the target "
           "lies below the first checkpoint or was not reached). `flops_ratio` is the same in training FLOPs.", "", _markdown_table(efficiency, floatfmt="{:.3f}"), ""]
          if len(efficiency) else []),  # fmt: skip
        *(["## Representation geometry (final checkpoints, last layer)", "",
           "Mean and std over seeds of each metric of crossbert_eval.geometry on the tasks' evaluation texts "
           "(pair tasks: both sentences, each encoded alone).", "", *centring_section(geometry),
           _markdown_table(geometry, floatfmt="{:.4f}"), ""]
          if len(geometry) else []),  # fmt: skip
        "## Plots",
        "",
        *[f"![{p.stem}](plots/{p.name})\n\n*{p.stem}: {CAPTIONS.get(p.stem, '')}*\n" for p in plots],
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
        "`tables/summary_by_size.csv`, `tables/plateau.csv`, `tables/comparisons.csv`, `tables/geometry.csv` (also as parquet).",
    ]
    return "\n".join(parts) + "\n"


def centring_section(geometry: pd.DataFrame, value: str = "mean") -> list[str]:
    """The report's lines for centring_table: raw and centred RankMe and dataset entropy side by side (none for rows
    computed before the centred metrics existed)."""
    table = centring_table(geometry, value)
    if table.empty:
        return []
    return ["Raw and mean-centred features side by side (seed means): uncentred, a mean direction shared by every "
            "example is one large singular value that dominates RankMe and the dataset entropy; centred, they measure "
            "how the examples differ from one another.", "", _markdown_table(table, floatfmt="{:.4f}"), "", "Every metric:", ""]


def _objectives_compared(reference: str | None) -> str:
    if reference is None:
        return "none compared (no sweep.yaml names the objectives)"
    return (f"every objective against the reference objective `{reference}` (the sweep config's `reference_objective`, else "
            "its first objective), per size, task and probe (last layer)")  # fmt: skip


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
