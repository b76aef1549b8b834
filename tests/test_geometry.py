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


# -- per layer, from the feature cache: `crossbert geometry` ------------------------------------------


def _geometry_cli(tmp_path, *extra):
    from crossbert_eval.cli import main

    main(["geometry", "minilm", "--tasks", "TREC", "--layers", "all", "--pooling", "mean", "--results", str(tmp_path / "results"),
          "--cache", str(tmp_path / "features"), *extra])  # fmt: skip


def test_geometry_cli_writes_one_row_per_metric_per_layer_from_the_cache_and_reruns_nothing(tmp_path, capsys):
    import json

    from crossbert_eval.encoders import FeatureCache, FrozenEncoder, texts_digest
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
    from crossbert_eval.probe import ProbeRunner, ProbeSettings
    from crossbert_eval.tasks import get_task

    encoder = FrozenEncoder.load("minilm", dtype="fp32")
    dirs = {"results_dir": str(tmp_path / "results"), "cache_dir": str(tmp_path / "features")}
    probe = ProbeRunner(encoder, ProbeSettings(tasks=["STS16"], probes=["cosine"], layers="last", **dirs))
    probe.run([get_task("STS16")])
    runner = GeometryRunner(encoder, GeometrySettings(tasks=["STS16"], layers="last", **dirs))
    df = runner.run([get_task("STS16")])
    assert runner.cache.misses == 0 and runner.cache.hits == 2  # both sides from the probe's cache
    assert len(df) == len(G.METRICS) and (df["n_eval"] == 2 * 1186).all()
    assert df["protocol"].iloc[0]["texts"].startswith("first and second sentences")


def test_geometry_options_are_checked_before_a_model_loads():
    from crossbert_eval.geometry_runner import GeometrySettings
    from crossbert_model.errors import CrossbertError

    with pytest.raises(CrossbertError, match="--pooling: expected one or more of mean, cls, max"):
        GeometrySettings(tasks=["TREC"], poolings=["avg"])
