"""The mteb runner: mteb's own task classes and evaluators on the local data root, offline."""

import json

import pytest
import torch

import crossbert_model as cm
from crossbert_eval.mteb_runner import MtebError, local_mteb_task, make_mteb_encoder, published_score, run_mteb
from crossbert_eval.encoders import FrozenEncoder
from crossbert_eval.tasks import TaskDataMissing, get_task


def test_minilm_sts13_through_mteb_matches_published_score_offline(tmp_path, no_network):
    rows, table = run_mteb("minilm", tasks=["STS13"], benchmark=None, out_dir=tmp_path, feature_cache=None)
    main = [r for r in rows if r["is_main"]]
    assert main[0]["metric"] == "cosine_spearman" and main[0]["value"] == pytest.approx(0.80603, abs=0.003)
    # no pooling given: the model's own (its sentence-transformers Pooling config), recorded as such
    assert main[0]["pooling"] == "mean" and main[0]["features_dtype"] == "float32"
    assert main[0]["pooling_source"] == "sentence-transformers:1_Pooling/config.json"
    files = list((tmp_path / "results").glob("*/*/STS13.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["task_name"] == "STS13"
    assert "STS13" in table and (tmp_path / "results" / "results.jsonl").exists()


def test_the_wrapper_satisfies_mteb_protocols():
    from mteb.models import EncoderProtocol

    minilm = FrozenEncoder.load("minilm")
    wrapped = make_mteb_encoder(minilm, 6, "mean", None)
    assert isinstance(wrapped, EncoderProtocol)
    meta = wrapped.mteb_model_meta
    assert meta.name == "sentence-transformers/all-MiniLM-L6-v2" and meta.revision.endswith("-L6-mean-norm")
    # pooling None: the model's default; normalize None: the model's Normalize module
    assert make_mteb_encoder(minilm, 6, None, None).mteb_model_meta.revision == meta.revision
    assert make_mteb_encoder(minilm, 6, "cls", None, normalize=False).mteb_model_meta.revision.endswith("-L6-cls")


def test_mteb_superseded_warning_becomes_one_note_of_ours(caplog, recwarn):
    """mteb warns twice per evaluation (a log record and a Python warning) that a legacy task is superseded;
    we run the legacy versions on purpose, so the runner logs one note of its own instead."""
    import logging
    import warnings

    from crossbert_eval.mteb_runner import _without_superseded_warnings, note_superseded

    task = local_mteb_task(get_task("STSBenchmark"))
    assert task.superseded_by == "STSBenchmark.v2"
    caplog.set_level(logging.INFO)
    note_superseded([task])
    with warnings.catch_warnings(), _without_superseded_warnings():
        task.check_if_dataset_is_superseded()
    messages = [r.getMessage() for r in caplog.records if "superseded" in r.getMessage()]
    assert messages == [
        "mteb task STSBenchmark is superseded by STSBenchmark.v2; running STSBenchmark as asked (mteb's own warning is silenced)"
    ]
    assert not [w for w in recwarn if "superseded" in str(w.message)]
    task.check_if_dataset_is_superseded()  # outside the runner mteb's warning is untouched
    assert len([w for w in recwarn if "superseded" in str(w.message)]) == 1


def test_local_tasks_are_mteb_classes_with_mteb_metadata(real_data_root):
    import mteb

    for name in ("Banking77Classification", "STS12", "TwentyNewsgroupsClustering", "AmazonCounterfactualClassification"):
        task = local_mteb_task(get_task(name))
        assert isinstance(task, type(mteb.get_task(name))) and task.metadata == mteb.get_task(name).metadata
    amazon = local_mteb_task(get_task("AmazonCounterfactualClassification"))
    amazon.load_data()
    assert amazon.hf_subsets == ["en"] and len(amazon.dataset["en"]["test"]) == 670
    clustering = local_mteb_task(get_task("TwentyNewsgroupsClustering"))
    clustering.load_data()
    assert len(clustering.dataset["test"]) == 10 and all(len(s) == 7532 for s in clustering.dataset["test"]["sentences"])


def _checkpoint(path, tokenizer, seed):
    torch.manual_seed(seed)
    model = cm.pretraining_model_for(cm.config_from_preset("nano", vocab_size=len(tokenizer)))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_two_checkpoints_never_share_result_paths(corpus, tmp_path):
    a = _checkpoint(tmp_path / "a", corpus.tokenizer, 0)
    b = _checkpoint(tmp_path / "b", corpus.tokenizer, 1)
    out = tmp_path / "mteb"
    rows_a, _ = run_mteb(str(a), tasks=["STS16"], benchmark=None, out_dir=out, feature_cache=None)
    rows_b, _ = run_mteb(str(b), tasks=["STS16"], benchmark=None, out_dir=out, feature_cache=None)
    files = sorted(out.glob("results/*/*/STS16.json"))
    assert len(files) == 2 and files[0].parent != files[1].parent
    va = [r["value"] for r in rows_a if r["is_main"]]
    vb = [r["value"] for r in rows_b if r["is_main"]]
    assert va != vb  # each checkpoint got its own evaluation, not the other's cached scores


def test_unknown_and_hub_only_tasks_fail_fast_and_write_nothing(tmp_path, no_network):
    with pytest.raises(MtebError, match="mteb has no task named 'STS99'"):
        run_mteb("minilm", tasks=["STS99"], benchmark=None, out_dir=tmp_path, feature_cache=None)
    with pytest.raises(TaskDataMissing, match="SciDocsRR is an mteb task without local data.*CROSSBERT_ONLINE=1"):
        run_mteb("minilm", tasks=["SciDocsRR"], benchmark=None, out_dir=tmp_path, feature_cache=None)
    assert not list(tmp_path.glob("results/**/*.json"))


def test_missing_data_files_stop_before_any_evaluation(tmp_path, monkeypatch, real_data_root):
    tasks_dir = tmp_path / "tasks"
    tasks_dir.mkdir()
    spec = get_task("STS13").source_file.read_text().replace("local: sts_semeval/2013", "local: sts_semeval/2099")
    (tasks_dir / "STS13.yaml").write_text(spec)
    monkeypatch.setenv("CROSSBERT_TASKS_DIR", str(tasks_dir))
    with pytest.raises(TaskDataMissing, match=r"task STS13 .*looked for .*sts_semeval/2099/FNWN.test.tsv"):
        run_mteb("minilm", tasks=["STS13"], benchmark=None, out_dir=tmp_path / "out", feature_cache=None)
    assert not list((tmp_path / "out").glob("results/**/*.json"))


def test_materialised_labels_score_exactly_as_mteb_own(real_data_root):
    """The speed-up in our local classification tasks must not change a single metric."""
    import numpy as np

    ours = local_mteb_task(get_task("Banking77Classification"), materialise_labels=True)
    theirs = local_mteb_task(get_task("Banking77Classification"), materialise_labels=False)
    ours.load_data()
    theirs.load_data()
    labels = ours.dataset["test"]["label"]  # mteb's lazy datasets Column
    assert type(labels).__name__ == "Column"
    predictions = np.random.default_rng(0).permutation(np.asarray(list(labels)))
    assert ours._calculate_scores(labels, predictions) == theirs._calculate_scores(labels, predictions)


# Tasks whose local data is MTEB's own: all-MiniLM-L6-v2 must reproduce its published score (0.1-point
# tolerance for the summation order of another BLAS). STS12, TwentyNewsgroups and AmazonCounterfactual
# differ for named reasons (README, "MTEB") and are not in this list.
EXACT_TASKS = ["STSBenchmark", "SICK-R", "STS13", "STS14", "STS15", "STS16", "Banking77Classification", "EmotionClassification"]


@pytest.mark.slow
def test_minilm_reproduces_its_published_scores_on_every_exact_local_task(tmp_path, no_network):
    rows, _ = run_mteb("minilm", tasks=EXACT_TASKS, benchmark=None, out_dir=tmp_path, feature_cache=None)
    model = "sentence-transformers/all-MiniLM-L6-v2"
    for task in EXACT_TASKS:
        (ours,) = [r["value"] for r in rows if r["task"] == task and r["is_main"] and r["split"] == "test"]
        assert 100 * ours == pytest.approx(100 * published_score(task, model, "test"), abs=0.1), task
