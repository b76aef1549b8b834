"""The statistics behind every "beyond noise": Welch's test, the corrections, and their error rates measured by simulation.

`pytest -s tests/test_stats.py` prints the calibration figures (false-call rates, false-discovery rate, power).
"""

import numpy as np
import pytest
from scipy import stats as scipy_stats

from crossbert_eval import stats as S

REPORTS = 1000  # simulated reports per calibration figure
# Three binomial standard errors of a rate of ALPHA over REPORTS reports: the Monte-Carlo allowance of a calibration.
MC_ERROR = 3 * np.sqrt(S.ALPHA * (1 - S.ALPHA) / REPORTS)


# -- the test over seeds ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("na, nb", [(3, 3), (2, 2), (2, 5), (4, 3)])
def test_welch_is_scipys_unequal_variance_t_test(na, nb):
    rng = np.random.default_rng(na * 10 + nb)
    for _ in range(20):
        a, b = rng.normal(0, 1, na), rng.normal(0.5, 3, nb)
        want = scipy_stats.ttest_ind(b, a, equal_var=False)
        got = S.welch(a, b)
        assert got.p == pytest.approx(want.pvalue, rel=1e-9)
        assert (got.ci_low, got.ci_high) == pytest.approx(tuple(want.confidence_interval(1 - S.ALPHA)), rel=1e-9)
        assert got.diff == pytest.approx(b.mean() - a.mean())


def test_welch_is_vectorised_over_comparisons():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(5, 4, 3)), rng.normal(size=(5, 4, 3))
    p = S.welch(a, b).p
    assert p.shape == (5, 4) and p[2, 1] == pytest.approx(scipy_stats.ttest_ind(b[2, 1], a[2, 1], equal_var=False).pvalue)


def test_welch_without_spread_on_either_side():
    assert S.welch([81.3, 81.3, 81.3], [81.3, 81.3, 81.3]).p == 1.0  # no difference at all
    assert np.isnan(S.welch([81.3, 81.3, 81.3], [80.0, 80.0, 80.0]).p)  # a difference nothing measures the noise of
    one_side = S.welch([81.3, 81.3, 81.3], [80.0, 81.0, 82.0])  # one side varies: df = its seeds - 1
    assert one_side.df == pytest.approx(2.0) and 0 < one_side.p < 1


def test_a_permutation_test_over_three_seeds_could_never_reach_alpha():
    """Why Welch: 3 + 3 seeds have C(6, 3) = 20 splits, so an exact permutation test's smallest two-sided p is 0.1."""
    from itertools import combinations

    values = np.array([0.0, 1.0, 2.0, 10.0, 11.0, 12.0])  # as separated as two groups can be
    observed = values[3:].mean() - values[:3].mean()
    splits = [np.array(c) for c in combinations(range(6), 3)]
    diffs = [values[np.setdiff1d(np.arange(6), s)].mean() - values[s].mean() for s in splits]
    assert len(splits) == 20 and np.mean(np.abs(diffs) >= abs(observed) - 1e-12) == 0.1 > S.ALPHA
    assert S.welch(values[:3], values[3:]).p < 0.001


def test_bootstrap_p_is_twice_the_smaller_tail():
    assert S.bootstrap_p(np.full(999, 0.5)) == pytest.approx(2 / 1000)  # every resample above 0: the smallest p
    assert S.bootstrap_p(np.zeros(999)) == 1.0  # identical predictions
    d = np.r_[np.full(49, -1.0), np.full(950, 1.0)]
    assert S.bootstrap_p(d) == pytest.approx(2 * 50 / 1000)


# -- corrections -------------------------------------------------------------------------------------------------


def test_holm_and_benjamini_hochberg_on_a_worked_example():
    p = np.array([0.01, 0.04, 0.03, 0.005])
    # Holm: sorted 0.005 x 4, 0.01 x 3, 0.03 x 2, 0.04 x 1 = 0.02, 0.03, 0.06, 0.04, made non-decreasing
    assert S.holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # BH: sorted 0.005 x 4/1, 0.01 x 4/2, 0.03 x 4/3, 0.04 x 4/4 = 0.02, 0.02, 0.04, 0.04, made non-increasing from the top
    assert S.benjamini_hochberg(p) == pytest.approx([0.02, 0.04, 0.04, 0.02])
    rng = np.random.default_rng(1)
    q = rng.uniform(size=40) ** 3
    assert S.benjamini_hochberg(q) == pytest.approx(scipy_stats.false_discovery_control(q, method="bh"))


def test_the_report_family_leaves_out_comparisons_without_a_test():
    assert S.CORRECTION in S.CORRECTIONS
    got = S.adjusted([0.01, np.nan, 0.04])
    assert np.isnan(got[1]) and got[[0, 2]] == pytest.approx(S.CORRECTIONS[S.CORRECTION](np.array([0.01, 0.04])))
    assert S.beyond_noise([S.ALPHA, 0.051, np.nan]).tolist() == [True, False, False]


# -- calibration by simulation --------------------------------------------------------------------------------

# The shape of results/cpu_small: 2 objectives x 2 sizes x 3 seeds; 11 (task, probe) scores per run (5 tasks x
# linear / kNN, and mteb's STSBenchmark) at layer 0 and the last layer. The report compares the objectives at each
# size (22 comparisons, last layer) and layer 0 with the last layer of every objective and size (44): 66.
OBJECTIVES, SIZES, SEEDS, CELLS = 2, 2, 3, 11


def null_reports(reports: int, shared: float, rng: np.random.Generator) -> np.ndarray:
    """(reports, 66) Welch p-values of reports in which nothing differs: every score is a run effect shared by all
    of the run's scores (weight `shared` of the variance: a good seed is good everywhere) plus its own noise."""
    shape = (reports, OBJECTIVES, SIZES, SEEDS)
    run = rng.standard_normal((*shape, 1, 1))
    scores = np.sqrt(shared) * run + np.sqrt(1 - shared) * rng.standard_normal((*shape, CELLS, 2))  # [..., layer 0 / last]
    by_seed_last = np.moveaxis(scores[..., 1], 3, -1)  # (reports, objectives, sizes, cells, seeds)
    objective_p = S.welch(by_seed_last[:, 0], by_seed_last[:, 1]).p.reshape(reports, -1)
    by_seed = np.moveaxis(scores, 3, -1)  # (reports, objectives, sizes, cells, layer, seeds)
    depth_p = S.welch(by_seed[..., 0, :], by_seed[..., 1, :]).p.reshape(reports, -1)
    return np.concatenate([objective_p, depth_p], axis=1)


def overlap_calls(reports: int, rng: np.random.Generator) -> np.ndarray:
    """The rule the test replaced, on the same kind of null report: mean +- std intervals over 3 seeds do not overlap."""
    a, b = rng.standard_normal((2, reports, 66, SEEDS))
    lo_a, hi_a = a.mean(-1) - a.std(-1, ddof=1), a.mean(-1) + a.std(-1, ddof=1)
    lo_b, hi_b = b.mean(-1) - b.std(-1, ddof=1), b.mean(-1) + b.std(-1, ddof=1)
    return (hi_a < lo_b) | (hi_b < lo_a)


@pytest.mark.parametrize("shared", [0.0, 0.5])
def test_when_nothing_differs_a_report_makes_a_false_call_at_most_alpha_of_the_time(shared):
    p = null_reports(REPORTS, shared, np.random.default_rng(2026))
    assert p.shape == (REPORTS, 66) and np.isfinite(p).all()
    any_call = S.beyond_noise(S.adjusted(p)).any(axis=1).mean()  # under the complete null, FDR = family-wise rate
    per_test = S.beyond_noise(p).mean()
    print(
        f"\ncalibration ({REPORTS} null reports of 66 comparisons, 3 seeds, shared run variance {shared:.0%}): "
        f"{S.CORRECTION} at {S.ALPHA}: a false call in {any_call:.1%} of reports; uncorrected Welch per test {per_test:.1%}"
    )
    assert any_call <= S.ALPHA + MC_ERROR
    assert per_test <= S.ALPHA + MC_ERROR  # Welch at 3 seeds is itself at (slightly under) its nominal rate


def test_the_overlap_rule_it_replaces_calls_false_differences_in_almost_every_report():
    calls = overlap_calls(REPORTS, np.random.default_rng(7))
    print(
        f"\nmean +- std overlap rule, 3 seeds: {calls.mean():.1%} false calls per comparison, "
        f"{calls.any(axis=1).mean():.1%} of null reports with at least one"
    )
    assert 0.06 < calls.mean() < 0.11 and calls.any(axis=1).mean() > 0.95  # the issue's ~8% per comparison


def test_when_some_differences_are_real_the_false_discovery_rate_stays_under_its_target():
    effects = np.r_[np.full(22, 3.0), np.zeros(44)]  # a third of the comparisons real, 3 standard deviations
    p = S.simulated_welch_p(effects, SEEDS, REPORTS, np.random.default_rng(3))
    calls = S.beyond_noise(S.adjusted(p))
    false = calls[:, 22:].sum(axis=1)
    fdr = np.mean(false / np.maximum(calls.sum(axis=1), 1))
    print(f"\nFDR with 22 of 66 comparisons real (3 sd, 3 seeds): {fdr:.1%}; real ones found: {calls[:, :22].mean():.1%}")
    assert fdr <= S.ALPHA + MC_ERROR


def test_power_for_two_standard_deviations_with_three_seeds():
    power = S.power(effect_sd=2.0, seeds=3, family=66)
    holm = S.beyond_noise(S.holm(S.simulated_welch_p(np.r_[2.0, np.zeros(65)], 3, S.POWER_SIMULATIONS, np.random.default_rng(0))))
    holm = holm[:, 0].mean()
    print(
        f"\npower, a true 2-sd difference with 3 seeds per side: {power.alone:.1%} alone at {S.ALPHA}, "
        f"{power.in_family:.1%} as the one real difference among 66 after {S.CORRECTION} (Holm: {holm:.1%})"
    )
    assert 0.30 < power.alone < 0.45  # noncentrality 2 / sqrt(2/3) = 2.45 at about 4 degrees of freedom
    assert power.in_family < 0.05 and power == S.power(effect_sd=2.0, seeds=3, family=66)  # seeded: the report prints one number
    assert S.power(effect_sd=2.0, seeds=10).alone > 0.95  # more seeds are what buys power


def test_the_simulations_are_cheap():
    import time

    started = time.process_time()  # CPU seconds: the machine may be shared
    null_reports(REPORTS, 0.5, np.random.default_rng(0))
    S.power(family=66)  # what a report build pays for its methods paragraph
    assert time.process_time() - started < 3.0  # measured ~0.7 s


def test_the_power_sentence_speaks_of_a_correction_only_when_there_is_a_family_to_correct():
    from crossbert_eval.report.noise import power_sentence

    alone = power_sentence([3], family=1)
    assert "uncorrected" in alone and "among" not in alone  # one comparison (or none tested): nothing to correct
    assert "as the one real difference among 66 comparisons" in power_sentence([3], family=66)
