"""Frozen-feature probes: linear (logistic / ridge regression), kNN (FAISS), zero-shot cosine.

Protocol constants are named once here, with their sources, and copied into every result row.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from scipy import sparse
from scipy.linalg import LinAlgWarning
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from crossbert_model.defaults import FEATURE_TRANSFORM_NAMES

from .metrics import resampled_scores, score
from .stats import bootstrap_p

# Regularisation grid of the logistic-regression probe: scikit-learn LogisticRegressionCV's default
# (Cs=10 -> np.logspace(-4, 4, 10)); ascending, so each fit warm-starts from the previous solution.
C_GRID = tuple(float(c) for c in np.logspace(-4, 4, 10))
# Ridge probe (STS-B and other score tasks): a log grid around scikit-learn RidgeCV's (0.1, 1, 10).
ALPHA_GRID = tuple(float(a) for a in np.logspace(-2, 5, 8))
# The validation split for the choice of C / alpha is carved from train with a fixed seed
# (SentEval carves its dev split from train the same way, 10%).
VALIDATION_FRACTION = 0.1
PROBE_SEED = 0
LOGREG_MAX_ITER = 1000
# Weighted kNN of DINO (Caron et al. 2021): k = 20, votes weighted by exp(cosine / T), T = 0.07.
KNN_K = 20
KNN_TEMPERATURE = 0.07
# Confidence intervals of every probe score: the nonparametric bootstrap over evaluation examples with
# the percentile interval (Efron & Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13). The
# probe's predictions are fixed; only which evaluation examples are scored is resampled, so the interval
# covers evaluation-set noise, not the probe's fit or the pre-training seed. 1000 resamples is their
# suggestion for percentile intervals (ch. 19: B = 1000 or more for interval end points).
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_CI = 0.95
BOOTSTRAP_SEED = 0
BOOTSTRAP_CHUNK = 250  # resamples per batch: bounds memory at CHUNK x n counts
BOOTSTRAP_PROTOCOL = {
    "bootstrap_resamples": BOOTSTRAP_RESAMPLES,
    "bootstrap_ci": BOOTSTRAP_CI,
    "bootstrap_seed": BOOTSTRAP_SEED,
    "bootstrap_method": "percentile, resampling evaluation examples, predictions fixed",
}


@dataclass
class ProbeOutput:
    predictions: np.ndarray
    protocol: dict = field(default_factory=dict)


def _carve_validation(y: np.ndarray, regression: bool, seed: int) -> tuple[np.ndarray, np.ndarray]:
    idx = np.arange(len(y))
    stratify = None
    if not regression:
        _, counts = np.unique(y, return_counts=True)
        n_val = int(round(len(y) * VALIDATION_FRACTION))
        stratify = y if counts.min() >= 2 and n_val >= len(counts) else None
    return train_test_split(idx, test_size=VALIDATION_FRACTION, random_state=seed, stratify=stratify)


def _scaler(x) -> StandardScaler:
    """Standardisation of the probe's features. Sparse ones (the bag-of-words baseline's TF-IDF rows, L2-normalised
    already) are left as they are: centring would make them dense, and dividing by a rare term's tiny spread would blow
    it up (and slow the solver tenfold)."""
    return StandardScaler(with_mean=False, with_std=False) if sparse.issparse(x) else StandardScaler()


def _logreg(c: float) -> LogisticRegression:
    return LogisticRegression(C=c, max_iter=LOGREG_MAX_ITER, warm_start=True)


def linear_probe(
    x_train: np.ndarray, y_train: np.ndarray, x_eval: np.ndarray, *, regression: bool, select_metric: str, seed: int = PROBE_SEED
) -> ProbeOutput:
    """Standardise, choose C (alpha) on a validation split carved from train, refit on all of train."""
    started = time.perf_counter()
    fit_idx, val_idx = _carve_validation(y_train, regression, seed)
    scaler = _scaler(x_train).fit(x_train[fit_idx])
    x_fit, x_val = scaler.transform(x_train[fit_idx]), scaler.transform(x_train[val_idx])
    grid = ALPHA_GRID if regression else C_GRID
    val_scores = []
    model = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("ignore", LinAlgWarning)  # ridge at the small-alpha end of the grid
        for value in grid:
            if regression:
                model = Ridge(alpha=value).fit(x_fit, y_train[fit_idx])
            else:
                model = model or _logreg(value)
                model.set_params(C=value)
                model.fit(x_fit, y_train[fit_idx])
            val_scores.append(score(select_metric, y_train[val_idx], model.predict(x_val)))
        best = grid[int(np.nanargmax(val_scores))]
        searched = time.perf_counter()
        scaler = _scaler(x_train).fit(x_train)
        final = Ridge(alpha=best) if regression else LogisticRegression(C=best, max_iter=LOGREG_MAX_ITER)
        final.fit(scaler.transform(x_train), y_train)
    protocol = {
        "classifier": "ridge" if regression else "logistic_regression",
        "standardise": not sparse.issparse(x_train),
        "grid": list(grid),
        "chosen": best,
        "validation_scores": [round(v, 6) for v in val_scores],
        "select_metric": select_metric,
        "validation_fraction": VALIDATION_FRACTION,
        "seed": seed,
        "search_seconds": round(searched - started, 3),
        "final_fit_seconds": round(time.perf_counter() - searched, 3),
    }
    return ProbeOutput(final.predict(scaler.transform(x_eval)), protocol)


def _normalised(x: np.ndarray) -> np.ndarray:
    import faiss  # here, not at the top: the other probes run where faiss is not installed

    x = np.ascontiguousarray(x, dtype=np.float32).copy()
    faiss.normalize_L2(x)
    return x


def knn_search(x_train: np.ndarray, x_eval: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact cosine neighbours: inner product over L2-normalised vectors (FAISS IndexFlatIP)."""
    import faiss

    base = _normalised(x_train)
    index = faiss.IndexFlatIP(base.shape[1])
    index.add(base)
    return index.search(_normalised(x_eval), min(k, len(base)))


def knn_probe(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_eval: np.ndarray,
    *,
    regression: bool,
    num_classes: int | None = None,
    k: int = KNN_K,
    temperature: float = KNN_TEMPERATURE,
) -> ProbeOutput:
    """Similarity-weighted kNN vote (classes) or weighted mean of the neighbours' scores (regression)."""
    sims, idx = knn_search(x_train, x_eval, k)
    # exp(sim / T), shifted by the row max for numerical safety (the shift cancels in the vote / mean)
    weights = np.exp((sims - sims.max(axis=1, keepdims=True)) / temperature)
    neighbour_labels = y_train[idx]
    if regression:
        predictions = (weights * neighbour_labels).sum(1) / weights.sum(1)
    else:
        votes = np.zeros((len(x_eval), num_classes), dtype=np.float64)
        np.add.at(votes, (np.arange(len(x_eval))[:, None], neighbour_labels), weights)
        predictions = votes.argmax(1)
    protocol = {
        "index": "faiss.IndexFlatIP (L2-normalised: cosine)",
        "k": int(min(k, len(x_train))),
        "temperature": temperature,
        "weighting": "exp(cos/T)",
    }
    return ProbeOutput(predictions, protocol)


def cosine_similarity(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two feature matrices: the zero-shot STS score."""
    return (_normalised(u) * _normalised(v)).sum(1)


# Feature transforms of the similarity probes (cosine, kNN). A mean direction shared by every example dominates the
# cosine of raw transformer features (anisotropy: geometry.anisotropy), so a cosine or kNN score mixes what the
# features say about the content with where the cloud sits. `centred` subtracts the mean; `whitened` also rescales
# every principal direction to unit variance (Su et al. 2021, "Whitening sentence representations for better
# semantics and faster retrieval"). Both are fitted on the unlabelled features of the task's training split, never
# on an evaluation split, and applied to train and evaluation features alike. Whitening drops the directions whose
# variance is below WHITEN_RTOL x the largest (the numerical noise of a collapsed layer) instead of amplifying them.
# The linear probe standardises its features itself, so centring changes nothing there: it takes raw features only.
FEATURE_TRANSFORMS = FEATURE_TRANSFORM_NAMES  # named in crossbert_model.defaults: checked there before anything heavy loads
WHITEN_RTOL = 1e-6


@dataclass
class FeatureTransform:
    kind: str  # one of FEATURE_TRANSFORMS
    mean: np.ndarray | None = None
    projection: np.ndarray | None = None  # (d, k) whitening matrix
    fitted_rows: int = 0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.kind == "raw":
            return x
        centred = np.asarray(x, dtype=np.float64) - self.mean
        return (centred if self.projection is None else centred @ self.projection).astype(np.float32)

    @property
    def protocol(self) -> dict:
        """What a result row records of it."""
        if self.kind == "raw":
            return {"feature_transform": "raw"}
        whitened = (
            {"whiten_rtol": WHITEN_RTOL, "whitened_dims": int(self.projection.shape[1])} if self.projection is not None else {}
        )
        return {
            "feature_transform": self.kind,
            "transform_fitted_on": "train split, unlabelled",
            "transform_fit_rows": self.fitted_rows,
            **whitened,
        }


def fit_feature_transform(kind: str, x_fit: np.ndarray | None) -> FeatureTransform:
    """The transform `kind` fitted on the rows of `x_fit` (training-split features; unused for raw)."""
    if kind not in FEATURE_TRANSFORMS:
        raise ValueError(f"feature transform: expected one of {', '.join(FEATURE_TRANSFORMS)}, got {kind!r}")
    if kind == "raw":
        return FeatureTransform("raw")
    x = np.asarray(x_fit, dtype=np.float64)
    mean = x.mean(axis=0)
    if kind == "centred":
        return FeatureTransform(kind, mean, None, len(x))
    eig, vectors = np.linalg.eigh((x - mean).T @ (x - mean) / max(len(x) - 1, 1))
    keep = eig > WHITEN_RTOL * max(eig.max(), 0.0)
    return FeatureTransform(kind, mean, vectors[:, keep] / np.sqrt(eig[keep]), len(x))


def senteval_pair_features(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """SentEval's pair representation [u, v, |u - v|, u * v] (Conneau et al. 2017)."""
    return np.concatenate([u, v, np.abs(u - v), u * v], axis=1)


def bootstrap_counts(n: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(resamples, n) draw counts of n examples drawn n times with replacement, one row per resample."""
    idx = rng.integers(0, n, size=(resamples, n))
    flat = (np.arange(resamples)[:, None] * n + idx).ravel()
    return np.bincount(flat, minlength=resamples * n).reshape(resamples, n)


def _resampled_values(
    metric: str, y_true: np.ndarray, predictions: list[np.ndarray], resamples: int, seed: int
) -> list[np.ndarray]:
    """score(metric) of each of `predictions` on each bootstrap resample of the evaluation examples, all on
    the same resamples (drawn once; they depend only on the seed and the number of examples)."""
    rng = np.random.default_rng(seed)
    values = [[] for _ in predictions]
    for start in range(0, resamples, BOOTSTRAP_CHUNK):
        counts = bootstrap_counts(len(y_true), min(BOOTSTRAP_CHUNK, resamples - start), rng)
        for kept, y_pred in zip(values, predictions):
            kept.append(resampled_scores(metric, y_true, y_pred, counts))
    return [np.concatenate(kept) for kept in values]


def _percentile_interval(values: np.ndarray, ci: float) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    if not len(values):
        return float("nan"), float("nan")
    tail = 100 * (1 - ci) / 2
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def bootstrap_ci(
    metric: str, y_true, y_pred, *, resamples: int = BOOTSTRAP_RESAMPLES, ci: float = BOOTSTRAP_CI, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float]:
    """Percentile bootstrap interval of score(metric, y_true, y_pred) over the evaluation examples.
    Resamples where the metric is undefined (a constant side of a correlation) are left out."""
    (values,) = _resampled_values(metric, np.asarray(y_true), [np.asarray(y_pred)], resamples, seed)
    return _percentile_interval(values, ci)


class PairedDiff(NamedTuple):
    low: float  # percentile interval of score(b) - score(a)
    high: float
    p: float  # two-sided p-value of the difference (stats.bootstrap_p)


def bootstrap_diff(
    metric: str,
    y_true,
    pred_a,
    pred_b,
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    ci: float = BOOTSTRAP_CI,
    seed: int = BOOTSTRAP_SEED,
) -> PairedDiff:
    """Paired percentile bootstrap of score(b) - score(a), both scored on the same resamples of the same
    evaluation examples (Koehn 2004): its interval and two-sided p-value. Two probes of one model on one
    task (two layers, say) err on many of the same examples; the paired interval cancels that shared part,
    which comparing the two separate intervals for overlap does not. It covers evaluation noise only: the
    predictions are fixed, so it says nothing about another pre-training seed (stats.EVALUATION_NOISE)."""
    a, b = _resampled_values(metric, np.asarray(y_true), [np.asarray(pred_a), np.asarray(pred_b)], resamples, seed)
    return PairedDiff(*_percentile_interval(b - a, ci), bootstrap_p(b - a))
