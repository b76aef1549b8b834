"""Representation geometry on inputs whose answers are known in closed form."""

import numpy as np
import pytest

from crossbert_eval import geometry as G
from crossbert_eval.layer_spec import LayerSpec


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


# RankMe adds Garrido et al.'s epsilon to every one of the min(n, d) normalised singular values, the zero ones
# included: 16 of them contribute about 16 x 1e-7 x log(1e7) to the entropy.
RANKME_REL = 1e-4


def entropy(*weights: float) -> float:
    """Shannon entropy (nats) of weights normalised to sum 1."""
    p = np.array(weights) / sum(weights)
    return float(-(p * np.log(p)).sum())


def spectrum(scales, offset: float = 0.0, d: int = 16, reps: int = 50, seed: int = 0):
    """Examples whose centred singular values are exactly sqrt(n) x `scales`: every +-1 combination of len(scales)
    orthonormal directions (a full factorial: columns of mean 0, orthogonal), repeated, each direction scaled; plus
    `offset` times a further orthonormal direction shared by every example (a mean the centred metrics remove)."""
    from itertools import product

    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.standard_normal((d, len(scales) + 1)))[0].T  # orthonormal rows: the directions, then the mean's
    coef = np.tile(np.array(list(product([-1.0, 1.0], repeat=len(scales)))), (reps, 1))
    return (coef * np.array(scales)) @ basis[:-1] + offset * basis[-1]


def test_rankme_is_the_entropy_of_the_singular_values_and_dataset_entropy_of_their_squares():
    """Unequal spectra tell the formulas apart (equal ones give log k either way): singular values (2, 1) give RankMe
    exp H(2/3, 1/3) = 1.89 (Garrido et al.: sigma / sum sigma) and dataset entropy H(4/5, 1/5) (Gram eigenvalues sigma^2)."""
    x = np.array([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    assert G.effective_rank(x) == pytest.approx(np.exp(entropy(2, 1)), rel=1e-6)
    assert G.dataset_entropy(x) == pytest.approx(entropy(4, 1), rel=1e-9)
    assert G.effective_rank(x) != pytest.approx(np.exp(entropy(4, 1)), rel=1e-3)  # the squared-singular-value RankMe fails
    for scales in ([2.0, 1.0], [3.0, 2.0, 1.0]):  # the same on many examples in a higher dimension
        many = spectrum(scales)
        assert G.effective_rank(many) == pytest.approx(np.exp(entropy(*scales)), rel=RANKME_REL)
        assert G.dataset_entropy(many) == pytest.approx(entropy(*np.square(scales)), rel=1e-9)
    assert G.dataset_entropy(x, alpha=2.0) == pytest.approx(-np.log(0.8**2 + 0.2**2), rel=1e-9)  # Renyi order 2


def test_centred_metrics_see_the_spread_and_not_the_shared_mean():
    """A cloud with centred singular values (2, 1), shifted by 10 along a further direction: uncentred, the shift is
    a third singular value of 10 that dominates; centred, the closed forms of the unshifted cloud come back."""
    shifted = spectrum([2.0, 1.0], offset=10.0)
    out = G.geometry(shifted)
    assert out["effective_rank_centred"] == pytest.approx(np.exp(entropy(2, 1)), rel=RANKME_REL)
    assert out["dataset_entropy_centred"] == pytest.approx(entropy(4, 1), rel=1e-9)
    assert out["effective_rank"] == pytest.approx(np.exp(entropy(10, 2, 1)), rel=RANKME_REL)
    assert out["dataset_entropy"] == pytest.approx(entropy(100, 4, 1), rel=1e-9)
    unshifted = G.geometry(spectrum([2.0, 1.0]))
    assert unshifted["effective_rank"] == pytest.approx(unshifted["effective_rank_centred"], rel=1e-9)  # mean 0: the same
    offset = G.geometry(isotropic(d=32) + 10.0)  # the anisotropic cloud of test_anisotropy_...: 32 directions in use
    assert offset["effective_rank"] < 7 and offset["effective_rank_centred"] == pytest.approx(32.0, rel=0.02)


def test_geometry_returns_every_metric_and_refuses_a_single_row():
    out = G.geometry(rank_k(4))
    assert set(out) == set(G.METRICS)
    assert out["dataset_entropy_normalised"] == pytest.approx(np.log(4) / np.log(64), rel=0.01)
    with pytest.raises(ValueError, match="at least 2 rows"):
        G.geometry(np.ones((1, 8)))


# -- per layer, from the feature cache: `crossbert geometry` ------------------------------------------


def _geometry_cli(tmp_path, *extra):
    from crossbert_eval.cli import main

    main(
        [
            "geometry",
            "minilm",
            "--tasks",
            "TREC",
            "--layers",
            "all",
            "--pooling",
            "mean",
            "--results",
            str(tmp_path / "results"),
            "--cache",
            str(tmp_path / "features"),
            *extra,
        ]
    )


def test_geometry_cli_writes_one_row_per_metric_per_layer_from_the_cache_and_reruns_nothing(tmp_path, capsys):
    import json

    from crossbert_eval.encoders import FrozenEncoder
    from crossbert_eval.feature_cache import FeatureCache
    from crossbert_model.utils import texts_digest
    from crossbert_eval.tasks import get_task

    _geometry_cli(tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "results" / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 7 * len(G.METRICS)  # minilm: embeddings + 6 blocks
    assert {(r["layer"], r["metric"]) for r in rows} == {(l, m) for l in range(7) for m in G.METRICS}
    row = rows[0]
    assert row["probe"] == "geometry" and row["task"] == "TREC" and row["split"] == "test" and row["n_eval"] == 500
    assert row["pooling"] == "mean" and row["pooling_source"] == "user" and row["relative_depth"] == row["layer"] / 6
    assert {k: row["protocol"][k] for k in G.GEOMETRY_PROTOCOL} == G.GEOMETRY_PROTOCOL
    assert len({r["unit"] for r in rows}) == 7 and "L6" in capsys.readouterr().out

    # the values are geometry() of the cached features
    encoder = FrozenEncoder.load("minilm", dtype="fp32")
    texts = get_task("TREC").load_split("test").texts
    cache = FeatureCache(tmp_path / "features")
    for layer in (0, 6):
        x = np.load(cache.path(cache.key(encoder, texts_digest(texts, None), layer, "mean")))
        want = G.geometry(x)
        got = {r["metric"]: r["value"] for r in rows if r["layer"] == layer}
        assert got == pytest.approx(want, rel=1e-9)

    # a rerun computes and writes nothing
    files = sorted((tmp_path / "features").rglob("*.npy"))
    stamps = [f.stat().st_mtime_ns for f in files]
    _geometry_cli(tmp_path)
    assert len((tmp_path / "results" / "results.jsonl").read_text().splitlines()) == len(rows)
    assert [f.stat().st_mtime_ns for f in sorted((tmp_path / "features").rglob("*.npy"))] == stamps


def test_geometry_of_a_pair_task_reads_the_cosine_probes_features(tmp_path):
    from crossbert_eval.encoders import FrozenEncoder
    from crossbert_eval.geometry_runner import GeometryRunner, GeometrySettings
    from crossbert_eval.probe_runner import ProbeRunner, ProbeSettings
    from crossbert_eval.tasks import get_task

    encoder = FrozenEncoder.load("minilm", dtype="fp32")
    dirs = {"results_dir": str(tmp_path / "results"), "cache_dir": str(tmp_path / "features")}
    probe = ProbeRunner(encoder, ProbeSettings(tasks=["BIOSSES"], probes=["cosine"], layers=LayerSpec.LAST, **dirs))  # 100 pairs
    probe.run([get_task("BIOSSES")])
    runner = GeometryRunner(encoder, GeometrySettings(tasks=["BIOSSES"], layers=LayerSpec.LAST, **dirs))
    df = runner.run([get_task("BIOSSES")])
    assert runner.cache.misses == 0 and runner.cache.hits == 2  # both sides from the probe's cache
    assert len(df) == len(G.METRICS) and (df["n_eval"] == 2 * 100).all()
    assert df["protocol"].iloc[0]["texts"].startswith("first and second sentences")


def test_geometry_of_a_capped_split_measures_the_probes_sample_at_their_seed(tmp_path):
    from crossbert_eval.encoders import FrozenEncoder
    from crossbert_eval.geometry_runner import GeometryRunner, GeometrySettings
    from crossbert_eval.probe_runner import ProbeRunner, ProbeSettings
    from crossbert_eval.tasks import get_task

    encoder = FrozenEncoder.load("minilm", dtype="fp32")
    dirs = {"results_dir": str(tmp_path / "results"), "cache_dir": str(tmp_path / "features")}
    sample = {"tasks": ["BIOSSES"], "layers": LayerSpec.LAST, "max_eval": 30, "seed": 3}
    ProbeRunner(encoder, ProbeSettings(probes=["cosine"], **sample, **dirs)).run([get_task("BIOSSES")])
    same = GeometryRunner(encoder, GeometrySettings(**sample, **dirs))
    df = same.run([get_task("BIOSSES")])
    assert same.cache.misses == 0 and (df["n_eval"] == 2 * 30).all()  # the probe's 30 pairs, read from its cache
    assert {"max_eval": 30, "sample_seed": 3}.items() <= df["protocol"].iloc[0].items()

    other = GeometryRunner(encoder, GeometrySettings(**{**sample, "seed": 4}, **dirs))
    rows = other.run([get_task("BIOSSES")])
    assert other.cache.misses == 2 and len(rows) == len(G.METRICS)  # another sample: its own texts, its own units
    assert not set(rows["unit"]) & set(df["unit"])


def test_geometry_options_are_checked_before_a_model_loads():
    from crossbert_eval.geometry_runner import GeometrySettings
    from crossbert_model.errors import CrossbertError

    with pytest.raises(CrossbertError, match="^geometry setting 'poolings': expected one or more of mean, cls, max"):
        GeometrySettings(tasks=["TREC"], poolings=["avg"])
