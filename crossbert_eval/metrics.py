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
