"""Which differences a report calls real: the test, its error rate and the correction for many comparisons.

The decisions, named once here and printed in every report's methods paragraph:

* **Over seeds: Welch's two-sided t-test** (unequal variances) of the per-seed scores of the two sides, at
  ALPHA. A sweep has 2-3 seeds per side. An exact permutation test over 3 + 3 seeds has only C(6, 3) = 20
  splits, so its smallest two-sided p-value is 2/20 = 0.1: it can never reach 0.05, let alone a corrected
  threshold (with 2 + 2 seeds: 1/3). Welch's t is exact under normal seed scores with equal variances and
  close to it otherwise (Welch-Satterthwaite degrees of freedom, about 2-4 here); probe scores over seeds
  are averages over hundreds of evaluation examples, close to normal. With n = 3 it is slightly conservative
  (tests/test_stats.py measures its false-positive rate). Welch treats the two sides as independent
  samples; in a depth comparison (layer 0 vs the last layer of the same runs) they share seeds, and a good
  seed at one layer is usually good at the other (positive correlation), which makes the test conservative,
  never liberal.
* **One seed per side: the paired bootstrap** over evaluation examples (probes.bootstrap_diff, Koehn 2004),
  only between two scores of the same pre-trained model on one evaluation set (its layer 0 and last layer).
  It measures evaluation noise only, not seed variance, and every table says so (EVALUATION_NOISE). Two
  different pre-trained models with one seed each are not tested: their difference mixes the objective
  with the seed, and nothing measured covers the seed.
* **Across a report: Benjamini-Hochberg** over every comparison that has a test (runs on the unigram plateau
  are left out: `not comparable`), false-discovery rate ALPHA: a difference is beyond noise when its
  adjusted p-value is at most ALPHA. When nothing differs the FDR is the chance of any false call, so the
  family-wise error rate is controlled at ALPHA in exactly the case the old overlap rule failed (about 8%
  per comparison with 3 seeds, 1/3 with 2 seeds' min-max). Holm (family-wise under any dependence) was the
  other candidate; with 3 seeds and a report's ~66 comparisons its threshold for the smallest p-value,
  0.05/66, needs |t| of about 9 at 4 degrees of freedom, and it stays that strict however many differences
  are real. BH relaxes as real differences accumulate and still bounds the share of false calls among
  them. BH assumes independent or positively dependent tests; a report's tests share runs (one objective's
  seeds enter every task's comparison), which tests/test_stats.py simulates with a shared run effect.

Power is measured by simulation (power()) and printed in the report: with 3 seeds a true difference of
2 standard deviations is called by Welch at 0.05 about a third of the time, and rarely once a report's
correction applies. Few seeds can only find large differences; the report says how large.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import stats as _scipy

ALPHA = 0.05  # per test, and the false-discovery rate of the correction
CORRECTION = "Benjamini-Hochberg"  # a key of CORRECTIONS
WELCH = "Welch t-test over seeds"
PAIRED = "paired bootstrap over evaluation examples (1 seed)"
SEED_NOISE = "seed variance"
EVALUATION_NOISE = "evaluation noise only, not seed variance"
# The power the report prints: a true difference of POWER_EFFECT_SD standard deviations with POWER_SEEDS seeds per side.
POWER_EFFECT_SD = 2.0
POWER_SEEDS = 3
POWER_SIMULATIONS = 10_000
POWER_SEED = 0


class WelchResult(NamedTuple):
    diff: np.ndarray  # mean(b) - mean(a)
    ci_low: np.ndarray  # the (1 - ALPHA) Welch interval of the difference, unadjusted
    ci_high: np.ndarray
    p: np.ndarray  # two-sided; NaN where neither side varies and the means differ (no test possible)
    df: np.ndarray  # Welch-Satterthwaite degrees of freedom


def welch(a, b) -> WelchResult:
    """Welch's two-sided t-test of mean(b) - mean(a), vectorised over leading axes (last axis: seeds, at
    least 2 per side). Where neither side varies, equal means give p = 1 and unequal ones NaN."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    na, nb = a.shape[-1], b.shape[-1]
    va, vb = a.var(axis=-1, ddof=1) / na, b.var(axis=-1, ddof=1) / nb
    diff = b.mean(axis=-1) - a.mean(axis=-1)
    se2 = va + vb
    with np.errstate(divide="ignore", invalid="ignore"):
        df = se2**2 / (va**2 / (na - 1) + vb**2 / (nb - 1))
        p = 2 * _scipy.t.sf(np.abs(diff / np.sqrt(se2)), df)
        half = _scipy.t.ppf(1 - ALPHA / 2, df) * np.sqrt(se2)
    p = np.where(se2 > 0, p, np.where(diff == 0, 1.0, np.nan))
    return WelchResult(diff, diff - half, diff + half, p, df)


def bootstrap_p(differences: np.ndarray) -> float:
    """Two-sided p-value of a difference from its bootstrap resamples: twice the smaller share of resamples
    at or beyond 0 on either side, each count + 1 over resamples + 1 (never 0). Below ALPHA exactly when
    the percentile (1 - ALPHA) interval excludes 0, up to one resample."""
    d = np.asarray(differences, dtype=float)
    d = d[np.isfinite(d)]
    if not len(d):
        return float("nan")
    tail = min(int((d <= 0).sum()), int((d >= 0).sum()))
    return min(1.0, 2 * (tail + 1) / (len(d) + 1))


def holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values along the last axis (family-wise error rate, any dependence)."""
    p = np.asarray(p, dtype=float)
    m = p.shape[-1]
    order = np.argsort(p, axis=-1)
    ranked = np.maximum.accumulate(np.take_along_axis(p, order, -1) * (m - np.arange(m)), axis=-1)
    return _unsort(np.minimum(ranked, 1.0), order)


def benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg step-up adjusted p-values along the last axis (false-discovery rate)."""
    p = np.asarray(p, dtype=float)
    m = p.shape[-1]
    order = np.argsort(p, axis=-1)
    ranked = np.take_along_axis(p, order, -1) * m / np.arange(1, m + 1)
    ranked = np.minimum.accumulate(ranked[..., ::-1], axis=-1)[..., ::-1]
    return _unsort(np.minimum(ranked, 1.0), order)


def _unsort(ranked: np.ndarray, order: np.ndarray) -> np.ndarray:
    out = np.empty_like(ranked)
    np.put_along_axis(out, order, ranked, -1)
    return out


CORRECTIONS = {"Holm": holm, "Benjamini-Hochberg": benjamini_hochberg}


def adjusted(p, correction: str = CORRECTION) -> np.ndarray:
    """The report's correction along the last axis. In one family (1-D), NaN entries (no test) stay NaN
    and do not count towards its size."""
    p = np.asarray(p, dtype=float)
    if p.ndim > 1:
        return CORRECTIONS[correction](p)
    out = np.full_like(p, np.nan)
    tested = np.isfinite(p)
    out[tested] = CORRECTIONS[correction](p[tested])
    return out


def beyond_noise(p_adjusted) -> np.ndarray:
    """The report's call: an adjusted p-value at most ALPHA (False for NaN)."""
    return np.asarray(p_adjusted, dtype=float) <= ALPHA


def simulated_welch_p(effects_sd, seeds: int, simulations: int, rng: np.random.Generator) -> np.ndarray:
    """(simulations, comparisons) Welch p-values of independent comparisons, each of `seeds` normal scores
    per side with unit standard deviation, side b shifted by the comparison's entry of `effects_sd`."""
    effects = np.asarray(effects_sd, dtype=float)
    a = rng.standard_normal((simulations, len(effects), seeds))
    b = rng.standard_normal((simulations, len(effects), seeds)) + effects[:, None]
    return welch(a, b).p


class Power(NamedTuple):
    alone: float  # share of simulations in which the true difference is called at ALPHA, uncorrected
    in_family: float  # ... after the correction, as one true difference among `family` comparisons, the rest null
    family: int


def power(
    effect_sd: float = POWER_EFFECT_SD,
    seeds: int = POWER_SEEDS,
    family: int = 1,
    simulations: int = POWER_SIMULATIONS,
    seed: int = POWER_SEED,
) -> Power:
    """The chance that a true difference of `effect_sd` seed standard deviations is called beyond noise, by simulation."""
    effects = np.zeros(max(family, 1))
    effects[0] = effect_sd
    p = simulated_welch_p(effects, seeds, simulations, np.random.default_rng(seed))
    return Power(float(beyond_noise(p[:, 0]).mean()), float(beyond_noise(adjusted(p)[:, 0]).mean()), max(family, 1))
