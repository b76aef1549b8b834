"""Baselines: what a task's scores are read against (chance, majority class, TF-IDF + the linear probe), stored once per
folder, drawn on the plots, listed under the models, and used to leave tasks that separate nothing out of averages."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from crossbert_eval import baselines as B
from crossbert_eval.folder_layout import EvaluationFolder
from crossbert_eval.report import plots as PL
from crossbert_eval.report.loading import load_baselines
from crossbert_eval.report.noise import withheld_notice
from crossbert_eval.report.tables import baseline_rows, redundant_averages, summarise, uninformative_tasks
from crossbert_eval.results import ResultsStore
from crossbert_eval.tasks import get_task
from tiny_tasks import STS_FILES, make_tasks, tiny_sts

TINY_MRPC = """
name: TinyMRPC
family: glue
input: pair
target: class
metrics: [f1, accuracy]
data: {local: tiny_mrpc, format: tsv, header: true}
splits: {train: train.tsv, validation: dev.tsv}
columns: {text: "#1 String", text_pair: "#2 String", label: Quality}
labels: [0, 1]
eval_split: validation
"""

TINY_STS = tiny_sts()
TINY_STS_ZERO_SHOT = tiny_sts("TinySTSZeroShot", extra="train_split: null\nprobes: [cosine]\n")


@pytest.fixture
def tiny_tasks(tmp_path, real_data_root, monkeypatch):
    """Slices of the real MRPC (600 train / 200 dev pairs) and STS-B (600 / 200) files as tasks of their own."""
    mrpc = {"train.tsv": ("glue/MRPC/train.tsv.xz", 601), "dev.tsv": ("glue/MRPC/dev.tsv.xz", 201)}  # a header line each
    sts = {name: (source, 600 if name == "train.tsv" else 200) for name, source in STS_FILES.items()}
    return make_tasks(
        tmp_path,
        real_data_root,
        monkeypatch,
        {"tiny_mrpc": mrpc, "tiny_sts": sts},
        {"TinyMRPC": TINY_MRPC, "TinySTS": TINY_STS, "TinySTSZeroShot": TINY_STS_ZERO_SHOT},
    )


def _main(rows: pd.DataFrame) -> dict:
    main = rows[rows["is_main"]]
    return {(b, p): v for b, p, v in zip(main["baseline"], main["probe"], main["value"])}


def test_each_baseline_scores_what_it_claims(tiny_tasks):
    """Majority: F1 of always answering the training split's most frequent class; chance: about what uniform guessing
    gives; TF-IDF: the linear probe on bag-of-words features, fitted on the same training split; STS: no majority (a
    constant has no correlation), a TF-IDF cosine beside the cosine probe."""
    rows = B.run_baselines([get_task("TinyMRPC"), get_task("TinySTS")], tiny_tasks / "out", B.BaselineSettings())
    mrpc = _main(rows[rows["task"] == "TinyMRPC"])
    dev = get_task("TinyMRPC").load_split("validation")
    train = get_task("TinyMRPC").load_split("train")
    top = np.bincount(train.labels).argmax()
    precision, recall = (dev.labels == 1).mean(), 1.0
    assert top == 1 and mrpc[("majority", "majority")] == pytest.approx(2 * precision * recall / (precision + recall))
    assert 0.45 < mrpc[("chance", "chance")] < 0.65  # F1 of coin flips at about two thirds positives: 2p/(2p+1) ~ 0.57
    assert ("tfidf", "linear") in mrpc and ("tfidf", "cosine") not in mrpc  # cosine is a STS probe
    sts = _main(rows[rows["task"] == "TinySTS"])
    assert ("majority", "majority") not in sts
    assert abs(sts[("chance", "chance")]) < 0.1
    assert sts[("tfidf", "cosine")] > 0.3  # word overlap says much about STS-B similarity
    assert set(rows["model"]) == {"baseline:chance", "baseline:majority", "baseline:tfidf"}


def test_a_zero_shot_task_gets_chance_and_a_tfidf_cosine_fitted_on_its_unlabelled_texts(tiny_tasks):
    """A task without a training split (mteb's STS tasks): nothing to fit a class or a probe on, so chance over its
    declared score range and the TF-IDF cosine, its vocabulary and IDF fitted on the evaluation texts without labels."""
    rows = B.run_baselines([get_task("TinySTSZeroShot")], tiny_tasks / "out", B.BaselineSettings())
    main = rows[rows["is_main"]]
    assert sorted(zip(main["baseline"], main["probe"])) == [("chance", "chance"), ("tfidf", "cosine")]
    tfidf = main[main["baseline"] == "tfidf"].iloc[0]
    assert tfidf["n_train"] == 0 and tfidf["protocol"]["fitted_on"] == "evaluation texts, unlabelled" and tfidf["value"] > 0.3
    # mteb's STS score is a cosine: the TF-IDF cosine stands beside it
    table = load_baselines(tiny_tasks / "out")
    assert set(PL.baselines_beside(table, "TinySTSZeroShot", "mteb")["baseline"]) == {"chance", "tfidf"}


def test_a_task_scored_by_mteb_metrics_alone_gets_no_baseline_and_stops_nothing(tmp_path):
    """Clustering, reranking and pair-classification tasks are scored by mteb's own metrics (v_measure, map, max_ap):
    there is no probe score to read a baseline against, and a sweep listing them among its mteb tasks must still run."""
    store = ResultsStore(tmp_path / "s")
    for name in ("TwentyNewsgroupsClustering", "TrecQAReranking", "TwitterURLCorpus-lowercasedtrain"):
        assert B.task_baselines(get_task(name), store, B.BaselineSettings()) == []


def test_baselines_are_computed_once_per_folder(tiny_tasks):
    folder = tiny_tasks / "out"
    first = B.run_baselines([get_task("TinyMRPC")], folder, B.BaselineSettings())
    store = ResultsStore(EvaluationFolder(folder).baselines)
    assert B.task_baselines(get_task("TinyMRPC"), store, B.BaselineSettings()) == []  # every unit done: nothing written
    assert len(store.dataframe()) == len(first)
    capped = B.task_baselines(get_task("TinyMRPC"), store, B.BaselineSettings(max_train=100))
    assert capped and {r["n_train"] for r in capped} == {100}  # another cap of the training split is another unit


def test_the_tfidf_baseline_takes_the_probes_capped_training_split(tiny_tasks):
    """The same seeded sample of the training split as the probes' max_train (Split.subsample)."""
    task = get_task("TinyMRPC")
    seen = []
    original = B.BASELINES["tfidf"]
    B.BASELINES["tfidf"] = lambda t, train, ev: seen.append(train) or original(t, train, ev)
    try:
        B.task_baselines(task, ResultsStore(tiny_tasks / "s"), B.BaselineSettings(max_train=50, seed=3))
    finally:
        B.BASELINES["tfidf"] = original
    expected = task.load_split("train").subsample(50, 3)
    assert seen[0].texts == expected.texts and seen[0].texts_pair == expected.texts_pair


def _scores(task_scores: dict[tuple[str, str], float]) -> pd.DataFrame:
    """Final, last-layer main scores of two models on GLUE tasks, as the report's loader gives them."""
    rows = []
    for (task, objective), value in task_scores.items():
        for layer in (0, 2):
            rows.append(
                {
                    "objective": objective,
                    "size": "tiny",
                    "seed": 0,
                    "step": 10,
                    "total_steps": 10,
                    "is_final": True,
                    "params_non_embedding": 1,
                    "corpus_tokens": 1,
                    "train_flops": 1,
                    "task": task,
                    "family": "glue",
                    "split": "validation",
                    "probe": "linear",
                    "metric": "f1",
                    "layer": layer,
                    "layers": 2,
                    "is_last_layer": layer == 2,
                    "is_main": True,
                    "score": value - (2 if layer == 0 else 0),
                }
            )
    return pd.DataFrame(rows)


def _baselines(task: str, majority: float, high: float) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "task": task,
                "family": "glue",
                "split": "validation",
                "baseline": "majority",
                "probe": "majority",
                "metric": "f1",
                "score": majority,
                "score_ci_low": majority - 3,
                "score_ci_high": high,
                "n_train": 10,
                "n_eval": 10,
            },
            {
                "task": task,
                "family": "glue",
                "split": "validation",
                "baseline": "tfidf",
                "probe": "linear",
                "metric": "f1",
                "score": 70.0,
                "score_ci_low": 67.0,
                "score_ci_high": 73.0,
                "n_train": 10,
                "n_eval": 10,
            },
        ]
    )


def test_a_task_the_majority_class_matches_is_flagged_and_left_out_of_averages():
    scores = _scores({("MRPC", "mlm"): 81.4, ("MRPC", "crossbert"): 80.8, ("SST-2", "mlm"): 62.0, ("SST-2", "crossbert"): 60.0})
    baselines = pd.concat([_baselines("MRPC", 81.2, 84.3), _baselines("SST-2", 50.9, 54.1)])
    flagged = uninformative_tasks(scores, baselines)
    assert list(flagged) == ["MRPC"] and "81.2" in flagged["MRPC"] and "81.4" in flagged["MRPC"]
    kept = summarise(scores, flagged)
    assert kept.set_index("objective")["glue_linear"].to_dict() == {"crossbert": 60.0, "mlm": 62.0}  # SST-2 alone
    assert summarise(scores).set_index("objective")["glue_linear"].to_dict() == {"crossbert": 70.4, "mlm": 71.7}
    # one model clearing the top of the majority's interval makes the task informative
    assert uninformative_tasks(_scores({("MRPC", "mlm"): 84.5}), _baselines("MRPC", 81.2, 84.3)) == {}


def test_baseline_rows_stand_beside_the_columns_of_their_probe():
    baselines = _baselines("MRPC", 81.2, 84.3)
    rows = baseline_rows(["MRPC:linear", "MRPC:knn", "glue_linear"], baselines, {"glue_linear": ["MRPC"]}).set_index("size")
    assert rows.loc["majority class", "MRPC:knn"] == 81.2  # guessing stands beside every probe
    assert rows.loc["TF-IDF + linear probe", "MRPC:linear"] == 70.0
    assert pd.isna(rows.loc["TF-IDF + linear probe", "MRPC:knn"])  # a fitted baseline only beside its own probe
    assert rows.loc["majority class", "glue_linear"] == 81.2


def test_an_average_of_one_task_is_not_shown_twice():
    assert redundant_averages(
        {"glue_linear": ["SST-2"], "mteb_sts": ["STSBenchmark"], "mteb_avg": ["STSBenchmark"], "SST-2:linear": ["SST-2"]}
    ) == ["glue_linear", "mteb_avg", "mteb_sts"]
    assert redundant_averages(
        {
            "glue_linear": ["MRPC", "SST-2"],
            "mteb_sts": ["STS12", "STS13"],
            "mteb_classification": ["Banking77"],
            "mteb_avg": ["Banking77", "STS12", "STS13"],
        }
    ) == ["mteb_classification"]


def test_score_panels_draw_their_baselines_and_are_not_stretched_to_noise(tmp_path):
    plt = PL.pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [50.1, 50.6])
    PL.draw_levels(ax, PL.baseline_levels(_baselines("MRPC", 81.2, 84.3), "MRPC", "knn"))
    assert [line.get_label() for line in ax.get_lines()[1:]] == ["majority class"]  # no TF-IDF kNN was fitted
    fig2, ax2 = plt.subplots()
    ax2.plot([0, 1], [50.1, 50.6])
    PL.floor_span(ax2)
    low, high = ax2.get_ylim()
    assert high - low >= PL.MIN_SCORE_SPAN and low < 50.1 and high > 50.6
    plt.close("all")


def test_a_withheld_verdict_is_written_on_every_figure(tmp_path):
    verdict = {"comparisons": {"crossbert - mlm": {"compared": 4, "withheld": {"off_plateau": 3, "encoder_carries_context": 0}}}}
    notice = withheld_notice(verdict)
    assert "3 with a run on the unigram plateau" in notice and "not evidence" in notice
    assert withheld_notice({"comparisons": {"x": {"compared": 4, "withheld": {"off_plateau": 0}}}}) is None
    plt = PL.pyplot()
    with PL.figure_notice(notice):
        fig, _ = plt.subplots()
        PL.save_figure(fig, tmp_path, "f")
    assert any(notice.split(" (")[0] in t.get_text() for t in fig.texts)
    fig, _ = plt.subplots()
    PL.save_figure(fig, tmp_path, "g")
    assert not fig.texts  # outside the context: no notice


def test_the_report_loader_reads_a_folders_baselines(tiny_tasks):
    B.run_baselines([get_task("TinyMRPC")], tiny_tasks / "out", B.BaselineSettings())
    table = load_baselines(tiny_tasks / "out")
    assert set(table["baseline"]) == {"chance", "majority", "tfidf"} and (table["metric"] == "f1").all()
    stored = ResultsStore(EvaluationFolder(tiny_tasks / "out").baselines).dataframe()
    stored = stored[stored["is_main"].astype(bool)].set_index(["baseline", "probe"])["value"]
    assert np.allclose(table.set_index(["baseline", "probe"])["score"].sort_index(), 100 * stored.sort_index())  # in points
    assert load_baselines(tiny_tasks / "elsewhere").empty


def test_the_command_refuses_a_plain_folder_without_tasks(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "crossbert_eval.cli", "baselines", str(tmp_path / "new")], capture_output=True, text=True
    )
    assert out.returncode == 2 and "--tasks" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    "layout, config, n_train, n_eval",
    [
        ("zoo", {"max_probe_train": 100, "max_probe_eval": 50}, 100, 50),
        ("sweep", {"max_probe_train": 300, "limit": 40}, 40, 40),  # a limited sweep: its limit caps both splits
        ("sweep", {"max_probe_train": 100}, 100, 200),
    ],
)
def test_the_command_scores_a_folders_baselines_on_the_splits_its_probes_read(tiny_tasks, layout, config, n_train, n_eval):
    from crossbert_eval.cli import main
    from crossbert_eval.folder_layout import SweepDir, ZooDir
    from crossbert_model.args import dump_yaml

    folder = tiny_tasks / "folder"
    path = (ZooDir if layout == "zoo" else SweepDir)(folder).config
    path.parent.mkdir(parents=True)
    path.write_text(dump_yaml({"probe_tasks": ["TinyMRPC"], **config}))
    main(["baselines", str(folder)])
    rows = ResultsStore(EvaluationFolder(folder).baselines).dataframe()
    assert set(rows["n_train"]) == {n_train} and set(rows["n_eval"]) == {n_eval}
