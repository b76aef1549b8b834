"""Noise statistics of a report: the error bars over seeds (descriptive) and the tests of its comparisons, with the
sentences that state them (the methods, the verdicts, the power)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from crossbert_model.readers import read_table

from .. import stats as S
from .loading import headline_split

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
BANDS = {
    "std": "mean ± std over seeds",
    "min-max": "min–max over 2 seeds",
    "bootstrap": "bootstrap 95% interval (1 seed)",
    "none": "no noise estimate (1 seed, no interval)",
}
# How a caption says "none": a figure whose every point has it has no error bars; beside bars of other kinds, its
# points are the exception (band_caption).
NO_BARS = "no error bars (1 seed, no interval)"
NONE_BESIDE_BARS = "none on points of 1 seed without an interval"


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
    low = {
        "std": out["mean"] - out["std"],
        "min-max": out["min"],
        "bootstrap": out.get("ci_low", out["mean"]),
        "none": out["mean"],
    }
    high = {
        "std": out["mean"] + out["std"],
        "min-max": out["max"],
        "bootstrap": out.get("ci_high", out["mean"]),
        "none": out["mean"],
    }
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
    """What the error bars of a figure are, from the bands of the lines it draws: one statement per kind drawn, and
    where some points have no bar, which ones (never "an interval" and "no interval" of the same points)."""
    kinds = [b for b in BANDS if b in set(bands)]
    drawn = [BANDS[k] for k in kinds if k != "none"]
    if not drawn:
        return NO_BARS if kinds else "no error bars"
    return "error bars: " + "; ".join(drawn + ([NONE_BESIDE_BARS] if "none" in kinds else []))


# Why a comparison has no test (its `noise` column; `test` says "none").
UNTESTED = {
    "models": "untested: one seed per model (seed variance unmeasured)",
    "predictions": "untested: one seed, no kept predictions for the paired bootstrap",
    "mixed": "untested: a side with one seed",
    "constant": "untested: neither side varies over seeds",
}


def _pair_values(rows: pd.DataFrame, keys: list[str], side_col: str, first, second) -> pd.DataFrame:
    """One row per key present on both sides: first_values / second_values, the per-seed scores of each side."""
    per_seed = rows.groupby([*keys, side_col, "seed"], dropna=False)["score"].mean().reset_index()
    sides = per_seed.groupby([*keys, side_col], dropna=False)["score"].agg(list).rename("values").reset_index()
    left, right = (
        sides[sides[side_col] == value].drop(columns=side_col).set_index(keys).add_prefix(f"{side}_")
        for side, value in zip(SIDES, (first, second))
    )
    return left.join(right, how="inner").reset_index()


def _with_units(pairs: pd.DataFrame, rows: pd.DataFrame, keys: list[str], side_col: str, first, second) -> pd.DataFrame:
    """first_unit / second_unit / metric: the one result row behind each side of a pair, where it is one row (one
    seed, one pooling); what a paired comparison needs."""
    if "unit" not in rows.columns or pairs.empty:
        return pairs
    groups = rows.groupby([*keys, side_col], dropna=False)
    single = groups[["unit", "metric"]].first()[groups.size() == 1]
    out = pairs.copy()
    for side, value in zip(SIDES, (first, second)):
        found = [single.loc[k] if k in single.index else None for k in (tuple(r[keys]) + (value,) for _, r in pairs.iterrows())]
        out[f"{side}_unit"] = [f["unit"] if f is not None else None for f in found]
        if side == "first":  # both sides: the same task and probe, so the same main metric
            out["metric"] = [f["metric"] if f is not None else None for f in found]
    return out


def _seed_test(first: list, second: list) -> dict:
    """Welch's test over seeds (stats.welch) of first - second where both sides have two or more seeds; else why
    there is none."""
    if min(len(first), len(second)) < 2:
        return {"test": "none", "noise": UNTESTED["mixed" if max(len(first), len(second)) > 1 else "models"]}
    w = S.welch(second, first)  # stats.welch tests mean(b) - mean(a)
    if np.isnan(w.p):
        return {"test": "none", "noise": UNTESTED["constant"]}
    return {
        "test": f"{S.WELCH} ({len(first)} vs {len(second)})",
        "noise": S.SEED_NOISE,
        "p_value": float(w.p),
        "diff_ci_low": float(w.ci_low),
        "diff_ci_high": float(w.ci_high),
    }


def seed_tests(pairs: pd.DataFrame) -> pd.DataFrame:
    """Each pair's means, spreads and seeds, its difference (first - second) and its test over seeds."""
    out = pairs.copy()
    for side in SIDES:
        values = out[f"{side}_values"]
        out[f"{side}_mean"] = [float(np.mean(v)) for v in values]
        out[f"{side}_mean_std"] = [float(np.std(v, ddof=1)) if len(v) > 1 else np.nan for v in values]
        out[f"{side}_seeds"] = [len(v) for v in values]
    out["diff"] = out["first_mean"] - out["second_mean"]
    tests = pd.DataFrame([_seed_test(f, s) for f, s in zip(out["first_values"], out["second_values"])], index=out.index)
    return out.join(tests.reindex(columns=["test", "noise", "p_value", "diff_ci_low", "diff_ci_high"]))


def paired_tests(table: pd.DataFrame, predictions) -> pd.DataFrame:
    """Test each pair of two 1-seed scores of the same pre-trained model (`within_model`) by the paired bootstrap
    of the difference over its evaluation examples (probes.bootstrap_diff; in points): evaluation noise only.
    `predictions(unit)` -> (labels, predictions) or None. Two different models with one seed each stay untested."""
    out = table.copy()
    one_seed = (out["first_seeds"] == 1) & (out["second_seeds"] == 1) & out["within_model"]
    out.loc[one_seed, "noise"] = UNTESTED["predictions"]
    if predictions is None or "first_unit" not in out.columns:
        return out
    from ..probes import bootstrap_diff  # here: probes imports FAISS and scikit-learn, which a report rarely needs

    for i, row in out[one_seed].iterrows():
        first, second = (predictions(u) if pd.notna(u) else None for u in (row["first_unit"], row["second_unit"]))
        if first is None or second is None or not np.array_equal(first[0], second[0]):
            continue
        d = bootstrap_diff(row["metric"], second[0], second[1], first[1])  # score(b) - score(a): first - second
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


# A comparison's two sides, in the order its label names them: the row "crossbert - mlm" has `first` = crossbert and
# `second` = mlm, its first_* columns are crossbert's, and diff = first_mean - second_mean (the test and its interval
# are of that same difference). `x_std` beside `x`: the page shows them as one "mean ± std" cell (markdown_table).
# Every writer and reader of the comparison table goes by these names.
SIDES = ("first", "second")
COMPARISON_COLUMNS = [
    "comparison",
    "objective",
    "size",
    "task",
    "probe",
    "first",
    "second",
    "first_mean",
    "second_mean",
    "diff",
    "diff_ci_low",
    "diff_ci_high",
    "first_mean_std",
    "second_mean_std",
    "first_seeds",
    "second_seeds",
    "test",
    "noise",
    "p_value",
    "p_adjusted",
    "verdict",
]
# How a row reads, said once on the page above the table (methods_paragraph).
READING = (
    'Each row reads as its comparison\'s label, first side minus second: in "last layer - layer 0", `first` is '
    'the last layer and `second` layer 0, and the difference ("first - second"; `diff` in tables/comparisons.csv) is '
    "the first side's mean minus the second's, with its test and interval"
)
# The columns of tables written before the sides were named in the label's order: `b` was the label's first side and
# `a` its second (diff = b_mean - a_mean). read_comparisons renames them, so committed tables read as new ones.
OLD_SIDE_COLUMNS = {
    f"{old}_{stat}": f"{new}_{now}"
    for old, new in (("b", "first"), ("a", "second"))
    for stat, now in (("mean", "mean"), ("std", "mean_std"), ("seeds", "seeds"))
}


def read_comparisons(path) -> pd.DataFrame:
    """A comparison table (tables/comparisons.csv) in COMPARISON_COLUMNS' names, whichever code wrote it; an old
    table's side names (`first`, `second`) are read back from its labels."""
    table = read_table(path, "a comparison table (tables/comparisons.csv)").rename(columns=OLD_SIDE_COLUMNS)
    if "first" not in table:
        sides = [
            (row["size"].split(" -> ")[::-1] if row["comparison"] in ACROSS_SIZES else row["comparison"].split(" - ", 1))
            for _, row in table.iterrows()
        ]
        table["first"], table["second"] = [s[0] for s in sides], [s[-1] for s in sides]
    return table[[*(c for c in COMPARISON_COLUMNS if c in table), *(c for c in table if c not in COMPARISON_COLUMNS)]]


# The scaling question: one objective at the next size up against the size below (last layer, final checkpoints).
SIZE_COMPARISON = "larger size - smaller size"
# The collapse question (the paper's Figure 1): does the gap between an objective's best layer and its last layer grow
# from one size to the next? Per seed, best-layer score minus last-layer score, the best layer chosen on the seed mean.
COLLAPSE_COMPARISON = "collapse gap (best - last layer): larger size - smaller size"
ACROSS_SIZES = (SIZE_COMPARISON, COLLAPSE_COMPARISON)


def comparisons(
    scores: pd.DataFrame,
    reference: str | None = None,
    predictions=None,
    plateau: pd.DataFrame | None = None,
    across_sizes: bool = False,
) -> pd.DataFrame:
    """The comparisons the report makes, each with its test and verdict:
    * objectives at each size: the `reference` objective (reference_objective: the sweep config's) vs every
      other objective, per task and probe (final checkpoints, last layer, main metric); none without a reference;
    * depth per run: layer 0 (embeddings) vs the last layer, per objective, size, task and probe;
    * with `across_sizes`: each objective's adjacent sizes (ordered by non-embedding parameters), the larger minus the
      smaller, per task and probe (last layer; `size` reads "smaller -> larger"); and the same for the collapse gap
      (collapse_gaps: best layer minus last layer, per seed), which grows with size where the last layer collapses.
    Tests: Welch over seeds, or for two 1-seed scores of one model the paired bootstrap over evaluation examples
    (`predictions`: ResultsStore.load_predictions); then the report's correction over every tested comparison
    (family_verdicts). `plateau` (plateau_table) withholds the verdict of every comparison that involves a run on the
    plateau, and those are left out of the correction's family."""
    final = headline_split(scores[scores["is_main"] & scores["is_final"]])
    if final.empty:
        return pd.DataFrame(columns=COMPARISON_COLUMNS)
    parts = []
    by_objective = final[final["is_last_layer"]]
    keys = ["size", "params_non_embedding", "task", "probe"]
    for other in sorted(set(by_objective["objective"]) - {reference}) if reference in set(by_objective["objective"]) else []:
        pairs = _pair_values(by_objective, keys, "objective", other, reference)
        pairs = _with_units(pairs, by_objective, keys, "objective", other, reference)
        if len(pairs):
            parts.append(pairs.assign(comparison=f"{other} - {reference}", first=other, second=reference, within_model=False))
    ends = final[final["layer"].eq(0) | final["is_last_layer"]].assign(
        end=lambda d: np.where(d["layer"].eq(0), "layer 0", "last layer")
    )
    keys = ["objective", "size", "params_non_embedding", "task", "probe"]
    pairs = _with_units(_pair_values(ends, keys, "end", "last layer", "layer 0"), ends, keys, "end", "last layer", "layer 0")
    if len(pairs):
        parts.append(pairs.assign(comparison="last layer - layer 0", first="last layer", second="layer 0", within_model=True))
    if across_sizes:
        parts += _size_pairs(by_objective)
        parts += _size_pairs(collapse_gaps(final), COLLAPSE_COMPARISON)
    if not parts:
        return pd.DataFrame(columns=COMPARISON_COLUMNS)
    out = paired_tests(seed_tests(pd.concat(parts, ignore_index=True)), predictions)
    out["objective"] = out["objective"].fillna("") if "objective" in out else ""
    out = family_verdicts(plateau_verdicts(out.assign(verdict=""), plateau))
    out = out.sort_values(["comparison", "params_non_embedding", "objective", "task", "probe"])
    return out[COMPARISON_COLUMNS]


def collapse_gaps(final: pd.DataFrame) -> pd.DataFrame:
    """Per run (objective, size, seed), task and probe: `score` = its best layer's score minus its last layer's, the
    best layer being the one with the highest mean over the seeds of that objective and size (final checkpoints)."""
    keys = ["objective", "size", "params_non_embedding", "task", "probe"]
    if final.empty:
        return pd.DataFrame(columns=[*keys, "seed", "score"])
    per_seed = final.groupby([*keys, "layer", "seed"], dropna=False)["score"].mean().reset_index()
    means = per_seed.groupby([*keys, "layer"], dropna=False)["score"].mean().reset_index()
    best = means.loc[means.groupby(keys, dropna=False)["score"].idxmax(), [*keys, "layer"]].rename(columns={"layer": "best"})
    last = per_seed.groupby(keys, dropna=False)["layer"].max().rename("last").reset_index()
    ends = per_seed.merge(best, on=keys).merge(last, on=keys)
    at = lambda layer: ends[ends["layer"] == ends[layer]].set_index([*keys, "seed"])["score"]  # noqa: E731
    return (at("best") - at("last")).dropna().rename("score").reset_index()


def _size_pairs(last_layer: pd.DataFrame, comparison: str = SIZE_COMPARISON) -> list[pd.DataFrame]:
    """Per objective, each size against the next size up: one row per task and probe scored at both."""
    parts, keys = [], ["objective", "task", "probe"]
    for objective, rows in last_layer.groupby("objective"):
        params = rows.groupby("size")["params_non_embedding"].max().sort_values()
        for smaller, larger in zip(params.index, params.index[1:]):
            pairs = _with_units(_pair_values(rows, keys, "size", larger, smaller), rows, keys, "size", larger, smaller)
            if len(pairs):
                parts.append(
                    pairs.assign(
                        comparison=comparison,
                        size=f"{smaller} -> {larger}",
                        first=larger,
                        second=smaller,
                        params_non_embedding=params[larger],
                        within_model=False,
                    )
                )
    return parts


# The rules a run must pass before its features are compared, as the columns of plateau_table that say so, and the
# words a withheld verdict gives for a run that fails each (crossbert_model.plateau; crossbert_model.reliance).
RUN_RULES = {
    "off_plateau": "on the unigram plateau",
    "encoder_carries_context": "whose encoder does not carry context",
}


def failing_runs(plateau: pd.DataFrame | None, size, objectives) -> dict[str, list[str]]:
    """The runs of `objectives` at `size` (every seed) that fail each rule of RUN_RULES: {rule column: runs}."""
    if plateau is None or plateau.empty:
        return {}
    here = plateau[(plateau["size"] == size) & plateau["objective"].isin(list(objectives))]
    return {
        rule: sorted(here.loc[here[rule] == "no", "run"]) for rule in RUN_RULES if rule in here and (here[rule] == "no").any()
    }


def not_comparable(runs: list[str] | dict[str, list[str]]) -> str:
    """The withheld verdict: runs by the rule they fail (a plain list: on the unigram plateau)."""
    failing = runs if isinstance(runs, dict) else {"off_plateau": list(runs)}
    return "not comparable: " + "; ".join(f"{', '.join(r)} {RUN_RULES[rule]}" for rule, r in failing.items() if r)


def plateau_verdicts(table: pd.DataFrame, plateau: pd.DataFrame | None) -> pd.DataFrame:
    """A comparison that involves a run failing a rule (any seed of either side: both objectives of an objective
    comparison, the objective of a depth comparison, both sizes of a size comparison) gets no verdict but
    'not comparable: <runs> on the unigram plateau' or '... whose encoder does not carry context'. The numbers stay."""
    if plateau is None or plateau.empty:
        return table
    out = table.copy()
    for i, row in out.iterrows():
        sizes = [row["first"], row["second"]] if row["comparison"] in ACROSS_SIZES else [row["size"]]
        objectives = [row["objective"]] if row["objective"] else [row["first"], row["second"]]
        failing: dict[str, set] = {}
        for size in sizes:
            for rule, runs in failing_runs(plateau, size, objectives).items():
                failing.setdefault(rule, set()).update(runs)
        if failing:
            out.loc[i, "verdict"] = not_comparable({rule: sorted(runs) for rule, runs in failing.items()})
    return out


def _named(row: pd.Series) -> str:
    evaluation_only = " [evaluation noise only]" if row["noise"] == S.EVALUATION_NOISE else ""
    who = (row["objective"] + " ") if row["objective"] else ""
    return f"{who}{row['size']} {row['task']}:{row['probe']} ({row['diff']:+.2f}, adjusted p {row['p_adjusted']:.2g}){evaluation_only}"


NO_COMPARISONS = "No comparisons: a sweep needs two objectives or two sizes, or a layer-0 and a last-layer score."


def noise_paragraph(table: pd.DataFrame, no_comparisons: str = NO_COMPARISONS) -> str:
    """The generated summary above the comparison table: how many differences are beyond noise, and which
    (`no_comparisons`: the line for a table without any, which says what the report would need)."""
    if table.empty:
        return no_comparisons
    lines = []
    for comparison, sub in table.groupby("comparison", sort=False):
        counts = sub["verdict"].value_counts()
        withheld = "".join(
            f", {n} not comparable: a run {reason}"
            for reason in RUN_RULES.values()
            if (n := int(sub["verdict"].str.contains(reason, regex=False).sum()))
        )
        named = ", ".join(_named(r) for _, r in sub[sub["verdict"] == "beyond noise"].iterrows())
        lines.append(
            f"- **{comparison}**: {counts.get('beyond noise', 0)} of {len(sub)} differences are beyond noise"
            f" ({counts.get('within noise', 0)} within it, {counts.get('unknown', 0)} untested"
            + withheld
            + ")"
            + (f": {named}." if named else ".")
        )
    return "\n".join(lines)


def verdict_summary(table: pd.DataFrame, plateau: pd.DataFrame | None) -> dict:
    """The report's answer in numbers (summary.json, and the page's first section): per comparison kind, how many were
    tested and how many are beyond noise (named), within it, untested or withheld by each rule; the runs failing each
    rule; the error rate and the power."""
    failing = {
        rule: sorted(plateau.loc[plateau[rule] == "no", "run"])
        for rule in RUN_RULES
        if plateau is not None and len(plateau) and rule in plateau
    }
    kinds = {}
    for comparison, sub in table.groupby("comparison", sort=False) if len(table) else []:
        verdicts = sub["verdict"].fillna("")
        kinds[comparison] = {
            "compared": len(sub),
            "tested": int(sub["p_adjusted"].notna().sum()),
            "beyond_noise": [_named(r) for _, r in sub[verdicts == "beyond noise"].iterrows()],
            "within_noise": int((verdicts == "within noise").sum()),
            "untested": int((verdicts == "unknown").sum()),
            "withheld": {rule: int(verdicts.str.contains(reason, regex=False).sum()) for rule, reason in RUN_RULES.items()},
        }
    family = int(table["p_adjusted"].notna().sum()) if len(table) else 0
    return {
        "comparisons": kinds,
        "runs_failing": {rule: runs for rule, runs in failing.items() if runs},
        "error_rate": f"{S.CORRECTION}, false-discovery rate {S.ALPHA:g}, over {family} tested comparisons",
        "power": power_sentence([S.POWER_SEEDS], family) if family else "No comparison tested.",
    }


def verdict_lines(summary: dict) -> list[str]:
    """The verdict as the first lines of a report: what was tested, what was withheld and why, what is beyond noise."""
    kinds = summary["comparisons"]
    if not kinds:
        return ["No comparison could be made (one objective, one size, or no final checkpoint probed yet)."]
    lines = []
    for comparison, k in kinds.items():
        named = k["beyond_noise"]
        parts = [
            f"{len(named)} beyond noise" + (f" ({'; '.join(named[:4])}{'; ...' if len(named) > 4 else ''})" if named else ""),
            f"{k['within_noise']} within noise",
        ]
        parts += [f"{n} withheld: a run {RUN_RULES[rule]}" for rule, n in k["withheld"].items() if n]
        parts += [f"{k['untested']} untested"] if k["untested"] else []
        lines.append(f"- **{comparison}**: {k['compared']} compared, {k['tested']} tested: {', '.join(parts)}.")
    for rule, runs in summary["runs_failing"].items():
        lines.append(f"- Runs {RUN_RULES[rule]}: {', '.join(runs)} (their comparisons are withheld).")
    lines.append(f'- Error rate: {summary["error_rate"]}. {summary["power"]} "Within noise" is not "equal".')
    return lines


def withheld_notice(summary: dict) -> str | None:
    """The line a figure carries when the verdict withholds comparisons (plots.figure_notice); None when none is."""
    kinds = summary.get("comparisons", {})
    compared = sum(k["compared"] for k in kinds.values())
    withheld = {rule: sum(k["withheld"].get(rule, 0) for k in kinds.values()) for rule in RUN_RULES}
    if not any(withheld.values()):
        return None
    why = "; ".join(f"{n} with a run {RUN_RULES[rule]}" for rule, n in withheld.items() if n)
    return f"Comparisons withheld ({why}; {compared} compared): differences drawn here are not evidence either way"


def methods_paragraph(table: pd.DataFrame) -> str:
    """How the report decides (crossbert_eval.stats): the tests, alpha, the correction and its family, and the power."""
    family = int(table["p_adjusted"].notna().sum()) if len(table) else 0
    text = (
        f"**Method.** {READING}. With two or more seeds per side: {S.WELCH}, two-sided, unequal variances ({S.SEED_NOISE}; "
        f"`diff_ci_low` / `diff_ci_high`: its uncorrected {1 - S.ALPHA:.0%} interval of the difference). With one seed: two "
        f"scores of the same pre-trained model on one evaluation set (layer 0 and the last layer) by the {S.PAIRED}, labelled "
        f"`{S.EVALUATION_NOISE}`; two different models with one seed each are not tested. Multiple comparisons: "
        f"{S.CORRECTION} over the {family} tested comparisons of this report (those withheld by the unigram-plateau or encoder rule are "
        f"left out), false-discovery rate {S.ALPHA:g}: a difference is beyond noise when its adjusted p-value (`p_adjusted`) "
        f"is at most {S.ALPHA:g}. When no difference is real this bounds the chance of any false call at {S.ALPHA:g} "
        "(tests/test_stats.py measures it over simulated reports)."
    )
    sides = zip(table["first_seeds"], table["second_seeds"], table["test"])
    seeds = sorted({int(min(f, s)) for f, s, t in sides if str(t).startswith(S.WELCH)}) if len(table) else []
    return f"{text} {power_sentence(sorted({S.POWER_SEEDS, *seeds}), family)}" if seeds else text


def power_sentence(seeds: list[int], family: int) -> str:
    """The simulated power (stats.power) of a true difference of stats.POWER_EFFECT_SD seed standard deviations."""
    cases = []
    for n in seeds:
        power = S.power(seeds=n, family=family)
        case = f"with {n} seeds per side it is called in {power.alone:.1%} of tests at {S.ALPHA:g} uncorrected"
        if power.family > 1:  # a family of one (or none tested) has nothing to correct for
            case += (
                f", and in {power.in_family:.1%} as the one real difference among {power.family} comparisons after {S.CORRECTION}"
            )
        cases.append(case)
    return f"Power (simulated, normal seed scores), a true difference of {S.POWER_EFFECT_SD:g} standard deviations: {'; '.join(cases)}."


def size_bands(table: pd.DataFrame, y: str) -> pd.DataFrame:
    """The error bars of a by_size column, by the rule of seed_bands: std (3+ seeds), min-max (2), none (1)."""
    band = np.where(table["seeds"] >= MIN_SEEDS_FOR_STD, "std", np.where(table["seeds"] == 2, "min-max", "none"))
    std, low, high = (table.get(f"{y}_{k}", pd.Series(np.nan, index=table.index)) for k in ("std", "min", "max"))
    # one assign: the by_size table is wide (a column per task and probe), and adding columns one at a time
    # fragments it (pandas' PerformanceWarning on every plot)
    return table.assign(
        mean=table[y],
        band=band,
        err_low=np.where(band == "std", std, np.where(band == "min-max", table[y] - low, 0.0)),
        err_high=np.where(band == "std", std, np.where(band == "min-max", high - table[y], 0.0)),
    )
