"""The mteb runner: mteb's own task classes and evaluators on the local data root, offline."""

import json

import pytest

from crossbert_eval.mteb_encoder import make_mteb_encoder
from crossbert_eval.layer_spec import LayerSpec
from crossbert_eval.mteb_runner import MtebSettings, run_mteb
from crossbert_eval.report.text_tables import mteb_text_table
from crossbert_eval.mteb_tasks import MtebError, local_mteb_task
from crossbert_eval.report.text_tables import published_score
from crossbert_eval.encoders import FrozenEncoder
from crossbert_eval.tasks import TaskDataMissing, get_task


def test_the_wrapper_satisfies_mteb_protocols():
    from mteb.models import EncoderProtocol

    minilm = FrozenEncoder.load("minilm", own_length=True)
    wrapped = make_mteb_encoder(minilm, 6, "mean", None)
    assert isinstance(wrapped, EncoderProtocol)
    meta = wrapped.mteb_model_meta
    # the revision is the weights' fingerprint; the model as it runs by itself is no experiment
    assert meta.name == "sentence-transformers/all-MiniLM-L6-v2" and meta.revision == minilm.fingerprint
    assert meta.experiment_name is None
    # pooling None: the model's default; normalize None: the model's Normalize module
    assert make_mteb_encoder(minilm, 6, None, None).mteb_model_meta == meta
    other = make_mteb_encoder(minilm, 3, "cls", None, normalize=False).mteb_model_meta
    assert other.revision == meta.revision and other.experiment_kwargs == {"layer": 3, "pooling": "cls", "normalize": False}
    short = make_mteb_encoder(FrozenEncoder.load("minilm"), 6, None, None).mteb_model_meta  # 128 tokens, not its own 256
    assert short.revision == meta.revision and short.experiment_name == "max_length_128"


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

    for name in (
        "Banking77Classification",
        "STS12",
        "TwentyNewsgroupsClustering",
        "AmazonCounterfactualClassification",
        "STS17",
        "BIOSSES",
        "MassiveIntentClassification",
        "ImdbClassification",
        "SciFact",
    ):
        task = local_mteb_task(get_task(name))
        assert isinstance(task, type(mteb.get_task(name))) and task.metadata == mteb.get_task(name).metadata
    variant = local_mteb_task(get_task("TwitterURLCorpus-lowercasedtrain"))  # mteb's class and metrics, our name
    assert (
        isinstance(variant, type(mteb.get_task("TwitterURLCorpus")))
        and variant.metadata.name == "TwitterURLCorpus-lowercasedtrain"
    )
    assert (
        variant.metadata.main_score == mteb.get_task("TwitterURLCorpus").metadata.main_score
        and "LOCAL VARIANT" in variant.metadata.description
    )
    sts17 = local_mteb_task(get_task("STS17"))
    sts17.load_data()
    assert sts17.hf_subsets == ["en-en"] and len(sts17.dataset["en-en"]["test"]) == 250
    amazon = local_mteb_task(get_task("AmazonCounterfactualClassification"))
    amazon.load_data()
    assert amazon.hf_subsets == ["en"] and len(amazon.dataset["en"]["test"]) == 670
    clustering = local_mteb_task(get_task("TwentyNewsgroupsClustering"))
    clustering.load_data()
    assert len(clustering.dataset["test"]) == 10 and all(len(s) == 7532 for s in clustering.dataset["test"]["sentences"])


def test_two_checkpoints_never_share_result_paths(nano_checkpoint, tmp_path):
    a, b = nano_checkpoint(0), nano_checkpoint(1)
    out = tmp_path / "mteb"
    rows_a, _ = run_mteb(str(a), MtebSettings(tasks=["STS16"], out_dir=out, cache_dir=None))
    rows_b, _ = run_mteb(str(b), MtebSettings(tasks=["STS16"], out_dir=out, cache_dir=None))
    files = sorted(out.glob("results/*/*/STS16.json"))
    assert len(files) == 2 and files[0].parent != files[1].parent
    va = [r["value"] for r in rows_a if r["is_main"]]
    vb = [r["value"] for r in rows_b if r["is_main"]]
    assert va != vb  # each checkpoint got its own evaluation, not the other's cached scores


def test_unknown_and_hub_only_tasks_fail_fast_and_write_nothing(tmp_path, no_network):
    with pytest.raises(MtebError, match="mteb has no task named 'STS99'"):
        run_mteb("minilm", MtebSettings(tasks=["STS99"], out_dir=tmp_path, cache_dir=None))
    with pytest.raises(TaskDataMissing, match="SciDocsRR is an mteb task without local data.*CROSSBERT_ONLINE=1"):
        run_mteb("minilm", MtebSettings(tasks=["SciDocsRR"], out_dir=tmp_path, cache_dir=None))
    assert not list(tmp_path.glob("results/**/*.json"))


def test_missing_data_files_stop_before_any_evaluation(tmp_path, monkeypatch, real_data_root):
    tasks_dir = tmp_path / "tasks"
    tasks_dir.mkdir()
    spec = get_task("STS13").source_file.read_text().replace("local: sts_semeval/2013", "local: sts_semeval/2099")
    (tasks_dir / "STS13.yaml").write_text(spec)
    monkeypatch.setenv("CROSSBERT_TASKS_DIR", str(tasks_dir))
    with pytest.raises(TaskDataMissing, match=r"task STS13 .*looked for .*sts_semeval/2099/FNWN.test.tsv"):
        run_mteb("minilm", MtebSettings(tasks=["STS13"], out_dir=tmp_path / "out", cache_dir=None))
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
# tolerance for the summation order of another BLAS). TwentyNewsgroups, AmazonCounterfactual, BIOSSES, IMDB
# and the marked variants differ for named reasons (README, "MTEB"; results/mteb_eng_v2_minilm/README.md).
EXACT_TASKS = [
    "STSBenchmark",
    "SICK-R",
    "STS12",
    "STS13",
    "STS14",
    "STS15",
    "STS16",
    "STS17",
    "Banking77Classification",
    "EmotionClassification",
    "MassiveIntentClassification",
    "MassiveScenarioClassification",
]


@pytest.mark.slow
def test_minilm_reproduces_its_published_scores_on_every_exact_local_task(tmp_path, no_network):
    rows, _ = run_mteb("minilm", MtebSettings(tasks=EXACT_TASKS, out_dir=tmp_path, cache_dir=None))
    model = "sentence-transformers/all-MiniLM-L6-v2"
    for task in EXACT_TASKS:
        for split in get_task(task).mteb.eval_splits:
            (ours,) = [r["value"] for r in rows if r["task"] == task and r["is_main"] and r["split"] == split]
            assert 100 * ours == pytest.approx(100 * published_score(task, model, split), abs=0.1), (task, split)


# ------------------------------------------------------------------------------------------------
# More of MTEB(eng, v2); marked variants; pair classification and retrieval; the benchmark
# ------------------------------------------------------------------------------------------------


def test_minilm_reproduces_its_published_sts17_en_en_score_exactly(tmp_path, no_network):
    """STS17 en-en (250 pairs) is MTEB's data: the published score to its 6th digit, at the model's own
    max length (sentence-transformers' 256), recorded in the rows."""
    rows, run = run_mteb("minilm", MtebSettings(tasks=["STS17"], out_dir=tmp_path, cache_dir=None))
    table = mteb_text_table(rows, run.plan, run.wall_s)
    (main,) = [r for r in rows if r["is_main"]]
    assert main["hf_subset"] == "en-en" and main["max_length"] == 256 and main["protocol"]["data"] == "mteb"
    # no pooling given: the model's own (its sentence-transformers Pooling config), recorded as such
    assert main["metric"] == "cosine_spearman" and main["pooling"] == "mean" and main["features_dtype"] == "float32"
    assert main["pooling_source"] == "sentence-transformers:1_Pooling/config.json"
    files = list((tmp_path / "results").glob("*/*/STS17.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["task_name"] == "STS17"
    assert (tmp_path / "results" / "results.jsonl").exists()
    assert main["value"] == pytest.approx(published_score("STS17", "sentence-transformers/all-MiniLM-L6-v2", "test"), abs=5e-6)
    assert 0 < main["encoded_texts"] <= 500 and main["eval_time_s"] > 0  # distinct texts of the 250 pairs
    assert "STS17" in table and " 256 " in table


VARIANT_PAIRS = """
name: ToyTwitter-lowercased
family: pair_classification
input: pair
target: class
metrics: [max_ap]
data: {local: toy, format: tsv, header: false, fields: [sentence1, sentence2, label]}
splits:
  train: {paste: [a.txt, b.txt, sim.txt]}
  test: test.tsv
columns: {text: sentence1, text_pair: sentence2, label: label}
labels: [0, 1]
probes: []
mteb: {type: PairClassification, variant_of: TwitterURLCorpus, data_differs: "toy pairs", from_splits: [train, test], eval_splits: [test]}
"""

VARIANT_RETRIEVAL = """
name: ToySciFact
family: retrieval
input: pair
target: score
metrics: [ndcg_at_10]
data: {local: toyir, format: beir, corpus: corpus.jsonl, queries: queries.jsonl}
splits: {test: qrels.tsv}
columns: {text: query-id, text_pair: corpus-id, label: score}
train_split: null
eval_split: test
probes: []
mteb: {type: Retrieval, variant_of: SciFact, data_differs: "three toy abstracts", eval_splits: [test]}
"""


@pytest.fixture
def toy_variant_tasks(tmp_path, monkeypatch):
    import json as _json

    tasks, data = tmp_path / "tasks", tmp_path / "data"
    tasks.mkdir()
    (tasks / "ToyTwitter.yaml").write_text(VARIANT_PAIRS)
    (tasks / "ToySciFact.yaml").write_text(VARIANT_RETRIEVAL)
    (data / "toy").mkdir(parents=True)
    (data / "toy" / "a.txt").write_text("a man plays a guitar\nthe stock market fell\n")
    (data / "toy" / "b.txt").write_text("a man is playing guitar\nit is raining in paris\n")
    (data / "toy" / "sim.txt").write_text("1\n0\n")
    (data / "toy" / "test.tsv").write_text("Dogs bark at night\tDogs are barking at night\t1\nI like tea\tThe train is late\t0\n")
    (data / "toyir").mkdir()
    docs = [
        ("d1", "Aspirin", "Aspirin reduces the risk of heart attacks."),
        ("d2", "Volcanoes", "Lava flows from volcanoes."),
        ("d3", "Sleep", "Adults need seven hours of sleep."),
    ]
    (data / "toyir" / "corpus.jsonl").write_text(
        "".join(_json.dumps({"_id": i, "title": t, "text": x}) + "\n" for i, t, x in docs)
    )
    (data / "toyir" / "queries.jsonl").write_text(
        '{"_id": "q1", "text": "aspirin prevents heart attacks"}\n{"_id": "q2", "text": "how long should adults sleep"}\n'
    )
    (data / "toyir" / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td3\t1\n")
    monkeypatch.setenv("CROSSBERT_TASKS_DIR", str(tasks))
    return data


def test_marked_variants_run_under_mteb_classes_with_their_own_name_in_every_row(toy_variant_tasks, tmp_path, no_network):
    rows, run = run_mteb(
        "minilm",
        MtebSettings(
            tasks=["ToyTwitter-lowercased", "ToySciFact"], out_dir=tmp_path / "out", cache_dir=None, data_root=toy_variant_tasks
        ),
    )
    table = mteb_text_table(rows, run.plan, run.wall_s)
    assert {r["task"] for r in rows} == {"ToyTwitter-lowercased", "ToySciFact"}
    assert all(
        r["protocol"]["data"] == "variant" and r["protocol"]["variant_of"] in ("TwitterURLCorpus", "SciFact") for r in rows
    )
    (ap,) = [r for r in rows if r["task"] == "ToyTwitter-lowercased" and r["is_main"]]
    assert ap["metric"] == "max_ap" and ap["task_type"] == "PairClassification" and ap["encoded_texts"] == 8  # 4 pairs
    (ndcg,) = [r for r in rows if r["task"] == "ToySciFact" and r["is_main"]]
    assert ndcg["metric"] == "ndcg_at_10" and ndcg["value"] == pytest.approx(1.0)  # each query finds its abstract first
    assert sorted(p.name for p in (tmp_path / "out").glob("results/*/*/*.json") if p.name != "model_meta.json") == [
        "ToySciFact.json",
        "ToyTwitter-lowercased.json",
    ]
    assert "VARIANT" in table and "VARIANT ToySciFact: three toy abstracts" in table


def test_benchmark_plan_runs_what_task_files_stand_for_and_says_where_the_rest_was_looked_for(
    tmp_path, monkeypatch, real_data_root
):
    from crossbert_eval.mteb_benchmark import plan_benchmark

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name in ("STS17", "BIOSSES"):
        (tasks / f"{name}.yaml").write_text(get_task(name).source_file.read_text())
    (tasks / "STS13.yaml").write_text(
        get_task("STS13").source_file.read_text().replace("local: sts_semeval/2013", "local: sts_semeval/2099")
    )
    monkeypatch.setenv("CROSSBERT_TASKS_DIR", str(tasks))
    objects, plan = plan_benchmark("MTEB(eng, v2)", real_data_root)
    assert [t.metadata.name for t in objects] == ["BIOSSES", "STS17"] and plan.size == 41
    assert objects[1].hf_subsets == ["en-en"] and objects[1].eval_splits == ["test"]
    assert plan.coverage_line() == (
        "coverage: 2 of 41 MTEB(eng, v2) tasks ran on local data (1 with MTEB's data, 1 with a named data difference); 39 skipped"
    )
    assert "looked for" in plan.skipped["STS13"] and "sts_semeval/2099/FNWN.test.tsv" in plan.skipped["STS13"]
    assert (
        plan.skipped["ArguAna"].startswith(f"no task file in {tasks} declares it")
        and "mteb/arguana@c22ab2a5" in plan.skipped["ArguAna"]
    )
    assert plan.versions["STS22.v2"] == "not reproduced: no local data"
    assert "TwentyNewsgroupsClustering.v2" in plan.versions


def test_an_unknown_benchmark_names_ours_and_mtebs(tmp_path):
    with pytest.raises(
        MtebError,
        match=r"unknown benchmark 'MTEB\(eng, v9\)': neither ours \(local-eng\) nor mteb's \(English ones: .*MTEB\(eng, v2\)",
    ):
        run_mteb("minilm", MtebSettings(tasks=[], benchmark="MTEB(eng, v9)", out_dir=tmp_path, cache_dir=None))


def test_an_mteb_name_with_only_a_local_variant_says_so(tmp_path, no_network):
    with pytest.raises(
        TaskDataMissing, match=r"TwitterURLCorpus .*the local variant TwitterURLCorpus-lowercasedtrain stands for it"
    ):
        run_mteb("minilm", MtebSettings(tasks=["TwitterURLCorpus"], out_dir=tmp_path, cache_dir=None))


def test_mteb_max_length_is_the_models_own_and_keys_the_feature_cache():
    from crossbert_eval.feature_cache import FeatureCache

    own, short = FrozenEncoder.load("minilm", own_length=True), FrozenEncoder.load("minilm")
    assert own.max_length == 256 and short.max_length == 128  # sentence_bert_config.json / the probes' default
    cache = FeatureCache("unused")
    assert cache.path(cache.key(own, "t", 6, "mean")) != cache.path(cache.key(short, "t", 6, "mean"))


def test_every_mteb_type_of_the_schema_has_a_dataset_adapter():
    from crossbert_eval.mteb_tasks import DATASET_ADAPTERS
    from crossbert_eval.tasks.schema import MTEB_TYPES

    assert sorted(DATASET_ADAPTERS) == sorted(MTEB_TYPES)


def test_a_local_task_loads_through_the_adapter_of_its_type(monkeypatch, real_data_root):
    """load_data asks the adapter registered for the file's mteb.type, with the task and the data root."""
    from datasets import Dataset, DatasetDict

    from crossbert_eval import mteb_tasks

    seen = []

    def tiny_sts(task, root):
        seen.append((task.name, root))
        return DatasetDict({"test": Dataset.from_dict({"sentence1": ["a"], "sentence2": ["b"], "score": [1.0]})})

    monkeypatch.setitem(mteb_tasks.DATASET_ADAPTERS, "STS", tiny_sts)
    task = local_mteb_task(get_task("STS13"), real_data_root)
    task.load_data()
    assert seen == [("STS13", real_data_root)] and len(task.dataset["test"]) == 1 and type(task).__name__.startswith("Local")


# ------------------------------------------------------------------------------------------------
# Results mteb accepts (ModelMeta, revisions, prompts, data marks, private members)
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def run_checkpoint(nano_checkpoint, tmp_path):
    """A nano checkpoint in a run's layout (runs/<run>/checkpoints/step_N + trainer_state.json + run_info.json)."""
    import shutil

    run = tmp_path / "runs" / "tiny"
    step = run / "checkpoints" / "step_0000020"
    shutil.copytree(nano_checkpoint(0), step)
    (step / "trainer_state.json").write_text(json.dumps({"step": 20, "objective": "mlm"}))
    (step / "COMPLETE").write_text("step 20\n")
    (run / "run_info.json").write_text(json.dumps({"data": {"corpus": "/data/wikipedia_en_2015"}}))
    return run


def test_result_folder_with_complete_model_meta_loads_in_mteb_result_cache(run_checkpoint, tmp_path, no_network):
    """What mteb's ResultCache reads back: our model's name, the weights' fingerprint as revision, every
    ModelMeta field the leaderboard shows, MTEB's dataset revision for STS17 (MTEB's data) and a local
    one for BIOSSES (our copy differs); another layer lands in an mteb experiment of the same revision."""
    import datetime

    import mteb

    out = tmp_path / "mteb"
    rows, _ = run_mteb(str(run_checkpoint), MtebSettings(tasks=["STS17", "BIOSSES"], out_dir=out, cache_dir=None))
    fingerprint = rows[0]["model_fingerprint"]
    (model,) = mteb.ResultCache(out).load_results(models=["crossbert/tiny"], include_remote=False).model_results
    assert (model.model_name, model.model_revision, model.experiment_name) == ("crossbert/tiny", fingerprint, None)
    meta = model.model_meta
    assert meta.n_parameters == sum(p.numel() for p in FrozenEncoder.load(str(run_checkpoint)).model.parameters())
    config = json.loads((run_checkpoint / "checkpoints" / "step_0000020" / "config.json").read_text())
    assert (
        meta.embed_dim == config["hidden_size"]
        and meta.max_tokens == config["max_position_embeddings"]
        and meta.languages == ["eng-Latn"]
    )
    assert meta.release_date == datetime.datetime.now(datetime.timezone.utc).date().isoformat()  # written by the fixture
    assert meta.license == "not specified" and meta.public_training_data == "wikipedia_en_2015"
    assert meta.training_datasets is not None and len(meta.training_datasets) == 0  # known: none of MTEB's
    assert meta.similarity_fn_name == "cosine" and "PyTorch" in meta.framework and meta.n_embedding_parameters > 0
    revisions = {r.task_name: r.dataset_revision for r in model.task_results}
    assert revisions["STS17"] == mteb.get_task("STS17").metadata.revision
    assert revisions["BIOSSES"].startswith("local-") and revisions["BIOSSES"] != mteb.get_task("BIOSSES").metadata.revision
    assert {r["task"]: r["protocol"]["dataset_revision"] for r in rows} == revisions  # our rows say the same
    run_mteb(str(run_checkpoint), MtebSettings(tasks=["STS17"], layers=LayerSpec.of(1), out_dir=out, cache_dir=None))
    both = mteb.ResultCache(out).load_results(models=["crossbert/tiny"], include_remote=False, load_experiments="match_name")
    assert sorted((m.model_revision, m.experiment_name or "") for m in both.model_results) == [
        (fingerprint, ""),
        (fingerprint, "layer_1"),
    ]


def test_a_model_declaring_prompts_gets_them_when_mteb_asks_with_a_prompt_type(tmp_path, toy_variant_tasks, no_network):
    """A sentence-transformers folder with query/document prompts: queries are encoded as 'query: <text>',
    documents as 'passage: <text>', exactly as if the prompt were part of the text; rows record them."""
    import numpy as np
    from mteb.types import PromptType

    from crossbert_model.data.tokenizer import minilm_path

    folder = tmp_path / "e5-like"
    folder.mkdir()
    for f in minilm_path().iterdir():
        if f.name != "config_sentence_transformers.json":
            (folder / f.name).symlink_to(f)
    prompts = {"query": "query: ", "document": "passage: "}
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"prompts": prompts, "default_prompt_name": None}))
    encoder = FrozenEncoder.load(str(folder), own_length=True)
    wrapped = make_mteb_encoder(encoder, 6, None, None)
    assert wrapped.mteb_model_meta.use_instructions is True
    task = local_mteb_task(get_task("ToySciFact"), toy_variant_tasks)

    def features(texts):
        x = encoder.encode(texts, layers=[6], poolings=["mean"])[(6, "mean")]
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    for prompt_type, prefix in ((PromptType.query, "query: "), (PromptType.document, "passage: ")):
        got = wrapped.encode(
            [{"text": ["aspirin prevents heart attacks"]}],
            task_metadata=task.metadata,
            hf_split="test",
            hf_subset="default",
            prompt_type=prompt_type,
        )
        assert np.allclose(got, features([prefix + "aspirin prevents heart attacks"]), atol=1e-5)
        assert not np.allclose(got, features(["aspirin prevents heart attacks"]), atol=1e-3)
    rows, _ = run_mteb(
        str(folder), MtebSettings(tasks=["ToySciFact"], out_dir=tmp_path / "out", cache_dir=None, data_root=toy_variant_tasks)
    )
    assert all(r["protocol"]["prompts"] == prompts for r in rows)  # mteb asked with both prompt types


TOY_CLASSIFICATION = """
name: ToyBanking
family: classification
input: single
target: class
metrics: [accuracy]
data: {local: toycls, format: tsv, header: false, fields: [text, label]}
splits: {train: train.tsv, test: test.tsv}
columns: {text: text, label: label}
labels: [card, cash]
eval_split: test
probes: []
mteb: {type: Classification, variant_of: Banking77Classification, data_differs: "toy sentences", eval_splits: [test]}
"""


def test_the_private_calculate_scores_override_still_takes_effect(nano_checkpoint, tmp_path, monkeypatch, no_network):
    """mteb has no public hook for the labels its classification scores; MaterialisedLabels overrides the
    private `_calculate_scores` (mteb 2.26). If mteb renames it or stops calling it, this fails."""
    from crossbert_eval import mteb_tasks

    tasks, data = tmp_path / "tasks", tmp_path / "data"
    tasks.mkdir()
    (tasks / "ToyBanking.yaml").write_text(TOY_CLASSIFICATION)
    (data / "toycls").mkdir(parents=True)
    train = [
        ("my card was declined", "card"),
        ("the card is blocked", "card"),
        ("new card please", "card"),
        ("withdraw cash at the atm", "cash"),
        ("the atm kept my cash", "cash"),
        ("cash limit per day", "cash"),
    ]
    (data / "toycls" / "train.tsv").write_text("".join(f"{t}\t{y}\n" for t, y in train))
    (data / "toycls" / "test.tsv").write_text("card stopped working\tcard\nno cash from the machine\tcash\n")
    monkeypatch.setenv("CROSSBERT_TASKS_DIR", str(tasks))
    seen = []
    real = mteb_tasks.column_array
    monkeypatch.setattr(mteb_tasks, "column_array", lambda values: seen.append(type(values).__name__) or real(values))
    rows, _ = run_mteb(
        str(nano_checkpoint(0)), MtebSettings(tasks=["ToyBanking"], out_dir=tmp_path / "out", cache_dir=None, data_root=data)
    )
    assert seen and set(seen) == {"Column"}  # mteb handed the override its lazy label column, every experiment
    assert any(r["metric"] == "accuracy" and r["is_main"] for r in rows)


def test_a_tampered_cached_result_is_not_trusted_but_evaluated_again_and_every_row_says_where_it_came_from(tmp_path, no_network):
    # BIOSSES: 100 pairs, the smallest local STS task (every mteb result file has the same shape)
    first, _ = run_mteb(
        "minilm", MtebSettings(tasks=["BIOSSES"], out_dir=tmp_path, cache_dir=None, results_dir=str(tmp_path / "a"))
    )
    measured = next(r["value"] for r in first if r["is_main"])
    assert {r["result_source"] for r in first} == {"computed"}
    again, _ = run_mteb(
        "minilm", MtebSettings(tasks=["BIOSSES"], out_dir=tmp_path, cache_dir=None, results_dir=str(tmp_path / "b"))
    )
    assert {r["result_source"] for r in again} == {"mteb result cache (verified)"}  # untouched: read back, and said so
    (path,) = (tmp_path / "results").glob("*/*/BIOSSES.json")
    tampered = json.loads(path.read_text())
    for subset in tampered["scores"]["test"]:
        subset["main_score"] = subset["cosine_spearman"] = 0.999
    path.write_text(json.dumps(tampered))
    rows, run = run_mteb(
        "minilm", MtebSettings(tasks=["BIOSSES"], out_dir=tmp_path, cache_dir=None, results_dir=str(tmp_path / "c"))
    )
    table = mteb_text_table(rows, run.plan, run.wall_s)
    main = next(r for r in rows if r["is_main"])
    assert main["value"] == pytest.approx(measured) and main["result_source"] == "computed"  # measured again, not 0.999
    assert "99.90" not in table
