"""Representation geometry on inputs whose answers are known in closed form."""

import numpy as np
import pytest

from crossbert_eval import geometry as G


def isotropic(n=20000, d=32, seed=0):
    return np.random.default_rng(seed).standard_normal((n, d))


def rank_k(k=5, n=4000, d=64, seed=0):
    """k orthonormal directions, equal energy on each: every example lies in a k-dim subspace."""
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.standard_normal((d, k)))[0].T  # (k, d), orthonormal rows
    coef = rng.choice([-1.0, 1.0], size=(n, k))  # +-1 coefficients: equal singular values
    return coef @ basis


def identical(n=500, d=16):
    return np.tile(np.random.default_rng(0).standard_normal(d), (n, 1))


def test_effective_rank_counts_the_directions_used():
    assert G.effective_rank(identical()) == pytest.approx(1.0, abs=0.01)
    assert G.effective_rank(rank_k(5)) == pytest.approx(5.0, rel=0.02)
    assert G.effective_rank(isotropic(d=32)) == pytest.approx(32.0, rel=0.02)


def test_anisotropy_is_zero_for_isotropic_and_one_for_one_direction():
    assert abs(G.anisotropy(isotropic())) < 0.01
    assert G.anisotropy(identical()) == pytest.approx(1.0, abs=1e-9)
    shifted = isotropic(d=32) + 10.0  # a common offset: the anisotropy of raw transformer features
    assert G.anisotropy(shifted) > 0.9


def test_anisotropy_is_the_mean_over_all_pairs():
    x = np.random.default_rng(1).standard_normal((40, 8)) + 0.5
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    cos = u @ u.T
    assert G.anisotropy(x) == pytest.approx(cos[~np.eye(40, dtype=bool)].mean(), abs=1e-12)


def test_uniformity_bounds():
    assert G.uniformity(identical()) == pytest.approx(0.0, abs=1e-9)  # all on one point: the worst
    high_d = G.uniformity(isotropic(n=3000, d=512))
    assert -4.0 - 1e-9 <= high_d < -3.9  # near-orthogonal pairs: ||u-v||^2 ~ 2, so about -2t
    assert G.uniformity(isotropic(n=3000, d=2)) > high_d  # a circle cannot spread as far as a 512-d sphere


def test_dataset_entropy_is_log_of_the_rank_for_equal_directions():
    assert G.dataset_entropy(identical()) == pytest.approx(0.0, abs=1e-9)
    assert G.dataset_entropy(rank_k(5)) == pytest.approx(np.log(5), rel=0.01)
    assert G.dataset_entropy(isotropic(d=32)) == pytest.approx(np.log(32), rel=0.01)
    # Renyi order 2 of equal eigenvalues is the same log k
    assert G.dataset_entropy(rank_k(5), alpha=2.0) == pytest.approx(np.log(5), rel=0.01)


def test_geometry_returns_every_metric_and_refuses_a_single_row():
    out = G.geometry(rank_k(4))
    assert set(out) == set(G.METRICS)
    assert out["dataset_entropy_normalised"] == pytest.approx(np.log(4) / np.log(64), rel=0.01)
    with pytest.raises(ValueError, match="at least 2 rows"):
        G.geometry(np.ones((1, 8)))
