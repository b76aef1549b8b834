"""Task metrics by name (the names used in task files), computed by scikit-learn / scipy."""

from __future__ import annotations

import numpy as np
from scipy import stats
from sklearn import metrics as skm

from crossbert_model.errors import CrossbertError


class MetricError(CrossbertError, ValueError):
    """An unknown metric name (in a task file or an option): a user mistake, not a bug."""


def _pearson(y, s) -> float:
    return float(stats.pearsonr(y, s).statistic)


def _spearman(y, s) -> float:
    return float(stats.spearmanr(y, s).statistic)


METRICS = {
    "accuracy": lambda y, p: float(skm.accuracy_score(y, p)),
    "f1": lambda y, p: float(skm.f1_score(y, p, pos_label=1, average="binary")),  # GLUE MRPC/QQP: positive class
    "f1_macro": lambda y, p: float(skm.f1_score(y, p, average="macro")),
    "matthews_corrcoef": lambda y, p: float(skm.matthews_corrcoef(y, p)),  # GLUE CoLA
    "pearson": _pearson,
    "spearman": _spearman,
    "cosine_pearson": _pearson,  # zero-shot STS: correlation of cosine similarity with gold
    "cosine_spearman": _spearman,
}


def score(metric: str, y_true: np.ndarray, y_pred: np.ndarray) -> float:
    if metric not in METRICS:
        raise MetricError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
    return METRICS[metric](np.asarray(y_true), np.asarray(y_pred))


def score_all(metrics: list[str], y_true, y_pred) -> dict[str, float]:
    return {m: score(m, y_true, y_pred) for m in metrics}


# ------------------------------------------------------------------------------------------------
# Resampled metrics: the same metrics on B bootstrap resamples at once
# ------------------------------------------------------------------------------------------------
# A resample is a vector of counts w (how often each example was drawn), so every metric is a few
# weighted sums: one (B, n) @ (n, k) product for all B resamples instead of B scikit-learn calls.


def _weighted_pearson(w: np.ndarray, y: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Pearson of (y, s) with example weights w (B, n); y, s are (n,) or (B, n)."""
    total = w.sum(1)
    mean_y, mean_s = (w * y).sum(1) / total, (w * s).sum(1) / total
    cov = (w * y * s).sum(1) / total - mean_y * mean_s
    var_y = (w * y * y).sum(1) / total - mean_y**2
    var_s = (w * s * s).sum(1) / total - mean_s**2
    with np.errstate(invalid="ignore", divide="ignore"):
        return cov / np.sqrt(np.clip(var_y, 0, None) * np.clip(var_s, 0, None))


def _weighted_ranks(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """(B, n) mid-ranks each example has inside each resample (ties averaged, as scipy's rankdata):
    a value's rank is the count drawn below it plus the mean position among the copies equal to it."""
    values, inverse = np.unique(x, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    starts = np.searchsorted(inverse[order], np.arange(len(values)))
    per_value = np.add.reduceat(w[:, order], starts, axis=1)  # (B, distinct values): copies drawn
    below = np.cumsum(per_value, axis=1) - per_value
    return (below + (per_value + 1) / 2)[:, inverse]


def _weighted_confusion(w: np.ndarray, y: np.ndarray, p: np.ndarray):
    """Per resample: correct count, true count and predicted count of each class."""
    classes = np.unique(np.concatenate([y, p]))
    true_onehot = (y[:, None] == classes[None, :]).astype(np.float64)
    pred_onehot = (p[:, None] == classes[None, :]).astype(np.float64)
    return w @ (y == p).astype(np.float64), w @ true_onehot, w @ pred_onehot, w @ (true_onehot * pred_onehot)


def _resampled_f1(w, y, p, pos_label=1):
    tp = w @ ((y == pos_label) & (p == pos_label)).astype(np.float64)
    predicted, actual = w @ (p == pos_label).astype(np.float64), w @ (y == pos_label).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(predicted + actual > 0, 2 * tp / (predicted + actual), 0.0)  # sklearn: 0 when undefined


def _resampled_f1_macro(w, y, p):
    _, true_k, pred_k, tp_k = _weighted_confusion(w, y, p)
    with np.errstate(invalid="ignore", divide="ignore"):
        f1 = np.where(true_k + pred_k > 0, 2 * tp_k / (true_k + pred_k), 0.0)
    present = (true_k + pred_k) > 0  # sklearn averages over the labels present in y_true or y_pred
    return (f1 * present).sum(1) / present.sum(1)


def _resampled_mcc(w, y, p):
    """Multiclass MCC (Gorodkin 2004), as sklearn: (c s - sum t_k p_k) / sqrt((s^2 - sum p_k^2)(s^2 - sum t_k^2))."""
    correct, true_k, pred_k, _ = _weighted_confusion(w, y, p)
    s = w.sum(1)
    num = correct * s - (true_k * pred_k).sum(1)
    den = np.sqrt((s**2 - (pred_k**2).sum(1)) * (s**2 - (true_k**2).sum(1)))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, 0.0)  # sklearn: 0 when a marginal is constant


def _resampled_spearman(w, y, s):
    return _weighted_pearson(w, _weighted_ranks(w, y), _weighted_ranks(w, s))


RESAMPLED = {
    "accuracy": lambda w, y, p: (w @ (y == p).astype(np.float64)) / w.sum(1),
    "f1": _resampled_f1,
    "f1_macro": _resampled_f1_macro,
    "matthews_corrcoef": _resampled_mcc,
    "pearson": lambda w, y, s: _weighted_pearson(w, y.astype(np.float64), s.astype(np.float64)),
    "spearman": _resampled_spearman,
    "cosine_pearson": lambda w, y, s: _weighted_pearson(w, y.astype(np.float64), s.astype(np.float64)),
    "cosine_spearman": _resampled_spearman,
}


def resampled_scores(metric: str, y_true, y_pred, counts: np.ndarray) -> np.ndarray:
    """The metric on each resample; counts (B, n): how often resample b drew example i. Equal to
    score(metric, y[idx_b], p[idx_b]) for the index vector idx_b those counts come from."""
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    counts = np.asarray(counts, dtype=np.float64)
    if metric in RESAMPLED:
        return RESAMPLED[metric](counts, y_true, y_pred)
    score(metric, y_true[:2], y_pred[:2])  # unknown names raise MetricError here
    return np.array([score(metric, np.repeat(y_true, c.astype(int)), np.repeat(y_pred, c.astype(int))) for c in counts])
