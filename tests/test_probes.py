"""Frozen features and probes with the real all-MiniLM-L6-v2 on the real data."""

import json
import shutil

import numpy as np
import pytest

from crossbert_eval import probes as P
from crossbert_eval.encoders import FrozenEncoder, pool
from crossbert_eval.feature_cache import FeatureCache
from crossbert_eval.model_names import EncoderError
from crossbert_eval.layer_spec import LayerSpec
from crossbert_eval.metrics import score
from crossbert_eval.probe_runner import ProbeRunner, ProbeSettings
from crossbert_eval.results import ResultsStore
from crossbert_eval.tasks import get_task
from tiny_tasks import STS_FILES, make_tasks
from tiny_tasks import tiny_sts as tiny_sts_task


@pytest.fixture(scope="module")
def minilm():
    # fp32 pinned: these tests compare features numerically (bf16 would differ in the 3rd digit)
    return FrozenEncoder.load("minilm", batch_size=128, dtype="fp32")


def settings(tmp_path, **kw):
    return ProbeSettings(results_dir=str(tmp_path / "results"), cache_dir=str(tmp_path / "features"), **kw)


def test_zero_shot_sts_matches_the_published_mteb_score(minilm, tmp_path):
    """all-MiniLM-L6-v2 on MTEB's STS17 en-en (250 pairs, MTEB's own data): cosine Spearman 87.588 on the leaderboard
    (the task file's reference score). Our own cosine path, without mteb, must agree. (The slow tier checks
    every exact local task through mteb, STS13's 1,500 pairs among them.)"""
    from crossbert_eval.report.text_tables import published_score

    df = ProbeRunner(minilm, settings(tmp_path, tasks=["STS17"], probes=["cosine"])).run([get_task("STS17")])
    main = df[df["is_main"]].iloc[0]
    published = published_score("STS17", "sentence-transformers/all-MiniLM-L6-v2", "test")
    assert main["metric"] == "cosine_spearman" and main["value"] == pytest.approx(published, abs=1e-4)


def test_every_layer_comes_from_one_pass_and_matches_hf(minilm):
    texts = get_task("SST-2").load_split("validation").texts[:40]
    feats = minilm.encode(texts, layers=minilm.layer_indices(LayerSpec.ALL), poolings=["mean", "cls", "max"])
    assert len({l for l, _ in feats}) == 7  # embeddings + 6 blocks
    import torch

    batch = minilm.tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.no_grad():
        hidden = minilm.model(**batch, output_hidden_states=True).hidden_states
    for layer in (0, 3, 6):
        for p in ("mean", "cls", "max"):
            want = pool(hidden[layer], batch["attention_mask"], p).numpy()
            assert np.allclose(feats[(layer, p)], want, atol=1e-5), (layer, p)


def test_pair_is_encoded_as_one_sequence(minilm):
    split = get_task("MRPC").load_split("validation")
    enc = minilm.tokenize(split.texts[:3], split.texts_pair[:3])
    for ids, a, b in zip(enc["input_ids"], split.texts, split.texts_pair):
        want = minilm.tokenizer.encode(a, b)
        assert ids == want and ids.count(minilm.tokenizer.sep_token_id) == 2 and ids[0] == minilm.tokenizer.cls_token_id


def test_senteval_pair_features():
    u, v = np.array([[1.0, -2.0]]), np.array([[3.0, 1.0]])
    assert P.senteval_pair_features(u, v).tolist() == [[1, -2, 3, 1, 2, 3, 3, -2]]


def test_cache_key_changes_with_layer_pooling_and_model(minilm, tmp_path):
    cache = FeatureCache(tmp_path)
    keys = {cache.path(cache.key(minilm, "digest", layer, pooling)) for layer in (5, 6) for pooling in ("mean", "cls")}
    assert len(keys) == 4
    other = cache.key(minilm, "digest", 6, "mean") | {"model_fingerprint": "another-checkpoint"}
    assert cache.path(other) not in keys


def test_second_run_encodes_nothing_and_skips_done_units(minilm, tmp_path):
    task = get_task("WNLI")
    wnli = dict(tasks=["WNLI"], probes=["linear", "knn"], layers=LayerSpec.of(5, 6), max_train=100)  # 100 of 635 pairs: quick
    first = ProbeRunner(minilm, settings(tmp_path, **wnli))
    rows = first.run([task])
    assert first.cache.misses == 4 and len(rows) == 4  # (train, dev) x 2 layers; 2 probes x 2 layers x 1 metric
    again = ProbeRunner(minilm, settings(tmp_path, **wnli))
    assert again.run([task])["value"].tolist() == rows["value"].tolist()
    assert again.cache.misses == 0 and again.cache.hits == 0  # skipped: not even read
    forced = ProbeRunner(minilm, settings(tmp_path, **wnli, force=True))
    assert forced.run([task])["value"].tolist() == rows["value"].tolist()
    assert forced.cache.misses == 0 and forced.cache.hits > 0  # re-probed from cached features
    stored = [json.loads(line) for line in (tmp_path / "results/results.jsonl").read_text().splitlines()]
    assert len(stored) == 4  # the forced rerun replaced, not duplicated, its rows
    row = stored[0]
    for field in (
        "model",
        "model_fingerprint",
        "checkpoint_step",
        "layer",
        "pooling",
        "probe",
        "task",
        "split",
        "metric",
        "value",
        "seed",
        "protocol",
        "packages",
        "git_revision",
        "ci_low",
        "ci_high",
    ):
        assert field in row
    for r in stored:  # every score carries its bootstrap interval (probes.BOOTSTRAP_*), on the value's scale
        assert r["ci_low"] <= r["value"] <= r["ci_high"] and r["ci_high"] - r["ci_low"] < 0.5
        assert r["protocol"]["bootstrap_resamples"] == P.BOOTSTRAP_RESAMPLES and r["protocol"]["bootstrap_ci"] == P.BOOTSTRAP_CI
    kept = ResultsStore(tmp_path / "results")
    for r in stored:  # and its labels and predictions, for paired comparisons (report.paired_verdicts)
        labels, predictions = kept.load_predictions(r["unit"])
        assert len(labels) == len(predictions) == r["n_eval"]
        assert score(r["metric"], labels, predictions) == pytest.approx(r["value"])


def test_metrics_equal_values_computed_by_hand():
    """A confusion matrix small enough to do on paper: TP=3, FN=1, FP=1, TN=5."""
    y_true = np.array([1, 1, 1, 1, 0, 0, 0, 0, 0, 0])
    y_pred = np.array([1, 1, 1, 0, 1, 0, 0, 0, 0, 0])
    assert score("accuracy", y_true, y_pred) == pytest.approx(8 / 10)
    assert score("f1", y_true, y_pred) == pytest.approx(3 / 4)  # positive class: precision 3/4, recall 3/4
    assert score("f1_macro", y_true, y_pred) == pytest.approx((3 / 4 + 5 / 6) / 2)  # negative class: 5/6, 5/6
    assert score("matthews_corrcoef", y_true, y_pred) == pytest.approx((3 * 5 - 1 * 1) / np.sqrt(4 * 4 * 6 * 6))
    x = np.linspace(-2, 3, 25)
    assert score("pearson", x, 2 * x + 3) == pytest.approx(1.0)
    assert score("cosine_pearson", x, -0.5 * x) == pytest.approx(-1.0)
    assert score("spearman", x, np.exp(x)) == pytest.approx(1.0)  # monotone, not linear:
    assert score("pearson", x, np.exp(x)) < 0.95  # Pearson sees the curve, Spearman only the order
    assert score("cosine_spearman", x, -(x**3)) == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="unknown metric 'auc'; known: accuracy, f1"):
        score("auc", y_true, y_pred)
    assert get_task("MRPC").metrics[:2] == ["f1", "accuracy"]  # GLUE MRPC: positive-class F1 is the main score


def test_linear_probe_chooses_on_validation_and_fits_separable_data():
    """Logistic regression (C grid) separates two blobs; ridge (alpha grid) recovers a linear score."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-2, 1, (100, 8)), rng.normal(2, 1, (100, 8))])
    y = np.repeat([0, 1], 100)
    x_eval = np.concatenate([rng.normal(-2, 1, (20, 8)), rng.normal(2, 1, (20, 8))])
    out = P.linear_probe(x, y, x_eval, regression=False, select_metric="accuracy")
    assert out.predictions.tolist() == [0] * 20 + [1] * 20
    assert out.protocol["classifier"] == "logistic_regression" and out.protocol["chosen"] in P.C_GRID
    assert len(out.protocol["validation_scores"]) == len(P.C_GRID)
    w = rng.normal(size=8)
    reg = P.linear_probe(x, x @ w + 1, x_eval, regression=True, select_metric="pearson")
    assert reg.protocol["classifier"] == "ridge" and reg.protocol["chosen"] in P.ALPHA_GRID
    assert score("pearson", x_eval @ w + 1, reg.predictions) > 0.999


def test_faiss_knn_finds_the_exact_cosine_neighbours(minilm):
    texts = get_task("TREC").load_split("test").texts
    x = minilm.encode(texts, layers=[6], poolings=["mean"])[(6, "mean")]
    sims, idx = P.knn_search(x[:400], x[400:], k=5)
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    brute = np.argsort(-(xn[400:] @ xn[:400].T), axis=1)[:, :5]
    assert (idx == brute).mean() > 0.99  # ties aside


def test_knn_regression_and_vote():
    x_train = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])
    out = P.knn_probe(x_train, np.array([0, 0, 1]), np.array([[1.0, 0.05], [0.05, 1.0]]), regression=False, num_classes=2, k=3)
    assert out.predictions.tolist() == [0, 1]
    reg = P.knn_probe(x_train, np.array([5.0, 5.0, 1.0]), np.array([[0.0, 1.0]]), regression=True, k=3)
    assert 1.0 <= reg.predictions[0] < 1.5


def test_a_folder_that_is_not_an_encoder_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(EncoderError, match=r"config.json: not an encoder \(model_type 'gpt2'"):
        FrozenEncoder.load(str(tmp_path))
    with pytest.raises(EncoderError, match="not a model folder"):
        FrozenEncoder.load(str(tmp_path.parent))


def test_our_checkpoint_with_a_foreign_tokenizer_is_refused(tmp_path):
    import crossbert_model as cm
    from crossbert_model.data.errors import DataError
    from crossbert_model.data.tokenizer import minilm_path

    cm.pretraining_model_for(cm.config_from_preset("nano", vocab_size=2048)).save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm_path() / name, tmp_path / name)
    with pytest.raises(DataError, match="tokenizer does not match the model config.*vocab_size: model 2048, tokenizer 30522"):
        FrozenEncoder.load(str(tmp_path))


def test_token_budget_batches_give_the_same_features_in_input_order(minilm):
    texts = get_task("TREC").load_split("test").texts[:120]
    whole = minilm.encode(texts, layers=[6], poolings=["mean"])[(6, "mean")]
    budget, minilm.max_batch_tokens = minilm.max_batch_tokens, 100  # a handful of sentences per batch
    try:
        batched = minilm.encode(texts, layers=[6], poolings=["mean"])[(6, "mean")]
    finally:
        minilm.max_batch_tokens = budget
    assert np.allclose(whole, batched, atol=1e-5)
    single = minilm.encode(texts[7:8], layers=[6], poolings=["mean"])[(6, "mean")]
    assert np.allclose(whole[7], single[0], atol=1e-5)  # row i of the output is text i


# -- bootstrap confidence intervals ------------------------------------------------------------------


def _classification(n=2000, p=0.8, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    wrong = (y + rng.integers(1, classes, n)) % classes
    return y, np.where(rng.random(n) < p, y, wrong)


def _scores(n=2000, noise=1.0, seed=0):
    rng = np.random.default_rng(seed)
    y = np.round(rng.uniform(0, 5, n), 1)  # STS-like gold: many ties
    return y, np.round(y + rng.normal(0, noise, n), 1)


CASES = {
    "accuracy": _classification(),
    "f1_macro": _classification(),
    "matthews_corrcoef": _classification(),
    "f1": tuple((a > 0).astype(int) for a in _classification(classes=2)),
    "pearson": _scores(),
    "spearman": _scores(),
    "cosine_spearman": _scores(),
}


@pytest.mark.parametrize("metric", list(CASES))
def test_resampled_metrics_equal_the_metric_on_each_explicit_resample(metric):
    from crossbert_eval.metrics import resampled_scores

    y, p = CASES[metric]
    idx = np.random.default_rng(3).integers(0, len(y), (4, len(y)))
    counts = np.stack([np.bincount(i, minlength=len(y)) for i in idx])
    want = [score(metric, y[i], p[i]) for i in idx]
    assert resampled_scores(metric, y, p, counts) == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("metric", list(CASES))
def test_bootstrap_interval_contains_the_point_estimate_and_shrinks_as_one_over_sqrt_n(metric):
    y, p = CASES[metric]
    low, high = P.bootstrap_ci(metric, y, p)
    assert low < score(metric, y, p) < high
    low4, high4 = P.bootstrap_ci(metric, np.tile(y, 4), np.tile(p, 4))  # 4x the examples: half the width
    assert (high4 - low4) / (high - low) == pytest.approx(0.5, abs=0.1)


def test_bootstrap_accuracy_interval_matches_the_binomial_one():
    y, p = _classification(n=3000, p=0.8)
    acc = score("accuracy", y, p)
    low, high = P.bootstrap_ci("accuracy", y, p)
    assert (high - low) / 2 == pytest.approx(1.96 * np.sqrt(acc * (1 - acc) / len(y)), rel=0.15)


def _fixes(y, a, n):
    """a copy of predictions `a` with its first n errors corrected: better, and never worse on any example."""
    b = a.copy()
    wrong = np.flatnonzero(a != y)[:n]
    b[wrong] = y[wrong]
    return b


def test_paired_bootstrap_separates_what_the_overlap_of_two_intervals_cannot():
    """Two layers of one model err on mostly the same examples. Here b fixes 30 of a's errors on SST-2's 872
    (+3.4 points): the two separate 95% intervals overlap, the paired interval of b - a excludes 0."""
    y, a = _classification(n=872, p=0.7, classes=2, seed=1)
    b = _fixes(y, a, 30)
    assert P.bootstrap_ci("accuracy", y, b)[0] < P.bootstrap_ci("accuracy", y, a)[1]
    low, high, p = P.bootstrap_diff("accuracy", y, a, b)
    assert 0 < low < score("accuracy", y, b) - score("accuracy", y, a) < high
    assert p == pytest.approx(2 / (P.BOOTSTRAP_RESAMPLES + 1))  # no resample of b - a at or below 0: the smallest p
    assert P.bootstrap_diff("accuracy", y, b, a) == pytest.approx((-high, -low, p))  # b - a, mirrored
    assert P.bootstrap_diff("accuracy", y, a, a) == (0.0, 0.0, 1.0)


@pytest.mark.parametrize("metric", list(CASES))
def test_paired_bootstrap_interval_contains_the_observed_difference(metric):
    y, a = CASES[metric]
    b = np.where(np.random.default_rng(5).random(len(y)) < 0.1, y, a)  # a tenth of the predictions made exact
    low, high, p = P.bootstrap_diff(metric, y, a, b)
    assert low < score(metric, y, b) - score(metric, y, a) < high
    assert (p < 0.05) == (low > 0 or high < 0)  # the p-value and the 95% interval agree


def test_bootstrap_of_a_few_thousand_examples_costs_well_under_a_second():
    import time

    for metric in ("accuracy", "matthews_corrcoef", "pearson", "spearman"):
        y, p = _classification(n=3000) if metric in ("accuracy", "matthews_corrcoef") else _scores(n=3000)
        started = time.perf_counter()
        P.bootstrap_ci(metric, y, p)
        assert time.perf_counter() - started < 1.0, metric  # measured ~0.1-0.25 s on 2 shared cores


# -- feature transforms of the similarity probes: fitted on the training split, never the evaluation split -----------


def test_centring_and_whitening_are_fitted_on_the_rows_given():
    rng = np.random.default_rng(0)
    fit = rng.normal(5.0, 1.0, (500, 6)) @ rng.normal(size=(6, 6))  # correlated, far from the origin
    other = rng.normal(-3.0, 2.0, (40, 6))
    centred = P.fit_feature_transform("centred", fit)
    assert np.abs(centred(fit).mean(0)).max() < 1e-4
    assert centred(other) == pytest.approx(other - fit.mean(0), abs=1e-4)  # the fit's mean, not its own
    whitened = P.fit_feature_transform("whitened", fit)
    assert np.cov(whitened(fit), rowvar=False) == pytest.approx(np.eye(6), abs=1e-4)
    flat = np.c_[fit[:, :3], np.zeros((500, 3))]  # three directions without variance: dropped, not amplified
    assert P.fit_feature_transform("whitened", flat)(flat).shape == (500, 3)
    assert P.fit_feature_transform("raw", None)(other) is other
    assert P.fit_feature_transform("whitened", fit).protocol == {
        "feature_transform": "whitened",
        "transform_fitted_on": "train split, unlabelled",
        "transform_fit_rows": 500,
        "whiten_rtol": P.WHITEN_RTOL,
        "whitened_dims": 6,
    }


TINY_STS = tiny_sts_task(family="glue", extra="probes: [linear, knn, cosine]\n")


@pytest.fixture
def tiny_sts(tmp_path, real_data_root, monkeypatch):
    """60 training and 30 validation pairs of the real STS-B files as a task of its own (fast to encode)."""
    sts = {name: (source, 60 if name == "train.tsv" else 30) for name, source in STS_FILES.items()}
    return make_tasks(tmp_path, real_data_root, monkeypatch, {"tiny_sts": sts}, {"TinySTS": TINY_STS})


def test_feature_transforms_are_fitted_on_the_training_split_alone(minilm, tiny_sts, monkeypatch):
    """Every fit sees exactly the training split's features (both sides of each pair for the cosine probe, the joint
    encoding for kNN); centring with the validation split's own mean would give other scores."""
    fits = []
    fit = P.fit_feature_transform
    monkeypatch.setattr(P, "fit_feature_transform", lambda kind, x: fits.append((kind, x)) or fit(kind, x))
    task = get_task("TinySTS")
    run = settings(
        tiny_sts,
        tasks=["TinySTS"],
        probes=["linear", "knn", "cosine"],
        layers=LayerSpec.LAST,
        poolings=["mean"],
        feature_transforms=["raw", "centred"],
    )
    runner = ProbeRunner(minilm, run)
    df = runner.run([task])
    assert {(p, t) for p, t in zip(df["probe"], df["feature_transform"])} == {
        ("linear", "raw"),
        ("knn", "raw"),
        ("knn", "centred"),
        ("cosine", "raw"),
        ("cosine", "centred"),
    }
    train, dev = task.load_split("train"), task.load_split("validation")
    side = lambda texts: minilm.encode(texts, layers=[6], poolings=["mean"])[(6, "mean")]  # noqa: E731
    train_sides = np.concatenate([side(train.texts), side(train.texts_pair)])
    joint_train = minilm.encode(train.texts, train.texts_pair, layers=[6], poolings=["mean"])[(6, "mean")]
    fitted = {len(x): x for kind, x in fits if kind == "centred"}
    assert sorted(fitted) == [60, 120]  # kNN: the 60 training pairs; cosine: their 120 sentences; never the 30 of dev
    assert fitted[120] == pytest.approx(train_sides, abs=1e-5) and fitted[60] == pytest.approx(joint_train, abs=1e-5)

    u, v = side(dev.texts), side(dev.texts_pair)
    unit = df[(df["probe"] == "cosine") & (df["feature_transform"] == "centred")]["unit"].iloc[0]
    _, predicted = runner.store.load_predictions(unit)
    mean = train_sides.mean(0)
    assert predicted == pytest.approx(P.cosine_similarity(u - mean, v - mean), abs=1e-5)
    leaked = np.concatenate([u, v]).mean(0)  # the mistake the test guards against: centring on the evaluation split
    assert not np.allclose(predicted, P.cosine_similarity(u - leaked, v - leaked), atol=1e-3)
    row = df[df["unit"] == unit].iloc[0]
    assert row["protocol"]["feature_transform"] == "centred" and row["protocol"]["transform_fit_rows"] == 120


def test_a_transform_is_part_of_the_unit_key_and_raw_keys_are_unchanged(minilm, tiny_sts):
    from crossbert_eval.probe_runner import transform_key

    runner = ProbeRunner(
        minilm, settings(tiny_sts, tasks=["TinySTS"], probes=["knn"], feature_transforms=["raw", "centred", "whitened"])
    )
    keys = {u.transform: u.key for u in runner.plan(get_task("TinySTS"))}
    assert len(set(keys.values())) == 3
    assert transform_key("raw") == {}  # units probed before transforms existed keep their keys: nothing is recomputed
    with pytest.raises(Exception, match="^probe setting 'feature_transforms': expected one or more of raw, centred, whitened"):
        settings(tiny_sts, tasks=["TinySTS"], feature_transforms=["centered"])
