"""Representation geometry of a set of pooled features (n examples x d dims), no labels needed.

    geometry(x)  ->  {"effective_rank": ..., "effective_rank_centred": ..., "anisotropy": ..., "uniformity": ...,
                      "dataset_entropy": ..., "dataset_entropy_centred": ..., "dataset_entropy_normalised": ...}

* effective_rank: RankMe (Garrido et al. 2023, "RankMe: Assessing the downstream performance of
  pretrained self-supervised representations by their rank"): exp of the Shannon entropy of the
  singular values sigma of the (uncentred) feature matrix, normalised to sum 1: p_i = sigma_i / sum sigma
  (the singular values themselves, not their squares). 1 for identical vectors, k for data spanning k
  equally scaled directions, close to d for isotropic Gaussian features with n >> d; singular values
  (2, 1) give exp H(2/3, 1/3) = 1.89.
* anisotropy: mean cosine similarity between two different examples (Ethayarajh 2019, "How
  contextual are contextualized word representations?"); 0 for isotropic features, 1 when every
  vector points the same way. Computed exactly over all pairs, not from a sample.
* uniformity: log E exp(-t ||u - v||^2) over pairs of L2-normalised features, t = 2 (Wang & Isola
  2020, "Understanding contrastive representation learning through alignment and uniformity").
  0 for identical vectors (the worst), towards -2t = -4 for features spread over a high-dimensional sphere.
* dataset_entropy: the matrix-based alpha-order Renyi entropy of the trace-normalised Gram matrix of
  the examples (Skean et al. 2025, "Layer by Layer: Uncovering hidden representations in language
  models"; alpha = 1, the von Neumann limit). 0 for identical vectors, log k for k equally scaled
  orthogonal directions; reported in nats, and normalised by log(min(n, d)) as `dataset_entropy_normalised`.
  The Gram matrix's eigenvalues are the squared singular values: (2, 1) give H(4/5, 1/5) = 0.50 nats.
* effective_rank_centred, dataset_entropy_centred: the same of the features minus their mean (the spectrum
  of their covariance). Uncentred, a mean direction shared by every example (the anisotropy of transformer
  features) is one large singular value that dominates both; centred, they measure how the examples differ
  from one another. The report shows both side by side.

Constants are named once here and recorded with every result (`GEOMETRY_PROTOCOL`).
"""

from __future__ import annotations

import numpy as np

RANKME_EPS = 1e-7  # Garrido et al.'s epsilon inside the entropy
UNIFORMITY_T = 2.0  # Wang & Isola's t
UNIFORMITY_MAX_EXAMPLES = 2048  # pairwise distances are O(n^2): a seeded subsample beyond this
ENTROPY_ALPHA = 1.0  # Skean et al.'s default order; alpha = 1 is the von Neumann entropy
GEOMETRY_SEED = 0

GEOMETRY_PROTOCOL = {
    "rankme_eps": RANKME_EPS,
    "uniformity_t": UNIFORMITY_T,
    "uniformity_max_examples": UNIFORMITY_MAX_EXAMPLES,
    "entropy_alpha": ENTROPY_ALPHA,
    "seed": GEOMETRY_SEED,
    "centred": "raw features, and *_centred metrics after subtracting the features' mean",
}
METRICS = (
    "effective_rank",
    "effective_rank_centred",
    "anisotropy",
    "uniformity",
    "dataset_entropy",
    "dataset_entropy_centred",
    "dataset_entropy_normalised",
)


def _as_float64(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or len(x) < 2:
        raise ValueError(f"geometry needs a 2-D feature matrix with at least 2 rows, got shape {x.shape}")
    return x


def _unit_rows(x: np.ndarray) -> np.ndarray:
    return x / np.clip(np.linalg.norm(x, axis=1, keepdims=True), 1e-12, None)


def singular_values(x: np.ndarray) -> np.ndarray:
    return np.linalg.svd(_as_float64(x), compute_uv=False)


def effective_rank(x: np.ndarray, sigma: np.ndarray | None = None) -> float:
    sigma = singular_values(x) if sigma is None else sigma
    p = sigma / max(sigma.sum(), 1e-300) + RANKME_EPS
    return float(np.exp(-(p * np.log(p)).sum()))


def anisotropy(x: np.ndarray) -> float:
    """Mean cosine over the n(n-1) ordered pairs of different examples, exactly:
    sum_{i != j} u_i.u_j = ||sum_i u_i||^2 - n for unit vectors u."""
    u = _unit_rows(_as_float64(x))
    n = len(u)
    total = float(np.square(u.sum(0)).sum())
    return (total - n) / (n * (n - 1))


def uniformity(x: np.ndarray, t: float = UNIFORMITY_T, seed: int = GEOMETRY_SEED) -> float:
    u = _unit_rows(_as_float64(x))
    if len(u) > UNIFORMITY_MAX_EXAMPLES:
        u = u[np.sort(np.random.default_rng(seed).choice(len(u), UNIFORMITY_MAX_EXAMPLES, replace=False))]
    sq = np.clip(2.0 - 2.0 * (u @ u.T), 0.0, None)  # ||u - v||^2 of unit vectors
    off_diagonal = ~np.eye(len(u), dtype=bool)
    values = -t * sq[off_diagonal]
    top = values.max()  # log-mean-exp, stable
    return float(top + np.log(np.exp(values - top).mean()))


def dataset_entropy(x: np.ndarray, alpha: float = ENTROPY_ALPHA, sigma: np.ndarray | None = None) -> float:
    """The Gram matrix Z Z^T has the squared singular values of Z as its non-zero eigenvalues, so the
    n x n matrix is never built."""
    sigma = singular_values(x) if sigma is None else sigma
    eig = np.square(sigma)
    lam = eig / max(eig.sum(), 1e-300)
    lam = lam[lam > 0]
    if alpha == 1.0:
        return float(-(lam * np.log(lam)).sum())
    return float(np.log(np.power(lam, alpha).sum()) / (1.0 - alpha))


def centred(x: np.ndarray) -> np.ndarray:
    """The features minus their mean (over the rows measured)."""
    x = _as_float64(x)
    return x - x.mean(axis=0)


def geometry(x: np.ndarray) -> dict[str, float]:
    x = _as_float64(x)
    sigma, sigma_centred = singular_values(x), singular_values(centred(x))
    entropy = dataset_entropy(x, sigma=sigma)
    return {
        "effective_rank": effective_rank(x, sigma),
        "effective_rank_centred": effective_rank(x, sigma_centred),
        "anisotropy": anisotropy(x),
        "uniformity": uniformity(x),
        "dataset_entropy": entropy,
        "dataset_entropy_centred": dataset_entropy(x, sigma=sigma_centred),
        "dataset_entropy_normalised": entropy / np.log(min(x.shape)),
    }
