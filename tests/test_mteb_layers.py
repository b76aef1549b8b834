"""`crossbert mteb --layers all|last|N|N,M,...`: the layer spec parsed once at the command line, the texts encoded once
for every layer asked for, published scores compared with the model's published setting only, and a refused run
leaving nothing behind."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from crossbert_eval import cli
from crossbert_eval.cli import main
from crossbert_eval.encoders import FrozenEncoder
from crossbert_eval.feature_cache import FeatureCache
from crossbert_eval.layer_spec import LayerSpec
from crossbert_eval.mteb_runner import MtebSettings, nothing_left_on_refusal, run_mteb
from crossbert_eval.report.text_tables import mteb_text_table
from crossbert_model.errors import USER_ERROR_EXIT

REPO = Path(__file__).resolve().parents[1]

# -- the layer spec, at the command line -----------------------------------------------------------


@pytest.fixture
def asked(monkeypatch):
    """What `crossbert mteb` hands run_mteb (the run itself replaced: only the command line is under test)."""
    from crossbert_eval import mteb_runner

    calls = []
    monkeypatch.setattr(
        mteb_runner, "run_mteb", lambda model, settings, **kw: calls.append(settings) or ([], mteb_runner.MtebRun(None, 0.0))
    )
    return calls


@pytest.mark.parametrize(
    "argv, parsed",
    [
        ([], LayerSpec.LAST),
        (["--layers", "all"], LayerSpec.ALL),
        (["--layers", "last"], LayerSpec.LAST),
        (["--layers", "3"], LayerSpec.of(3)),
        (["--layers", "0,3,6"], LayerSpec.of(0, 3, 6)),
        (["--layers", "-1"], LayerSpec.of(-1)),
        (["--layer", "2"], LayerSpec.of(2)),
        (["--layer", "all"], LayerSpec.ALL),
    ],
)
def test_the_layer_spec_is_parsed_once_at_the_command_line(argv, parsed, asked, tmp_path, capsys):
    main(["mteb", "minilm", "--tasks", "STSBenchmark", "--out", str(tmp_path / "m"), *argv])
    assert [settings.layers for settings in asked] == [parsed]  # parsed: run_mteb gets the spec, not the user's string


def test_the_deprecated_layer_option_still_works_and_says_so(asked, tmp_path, caplog):
    main(["mteb", "minilm", "--tasks", "STSBenchmark", "--layer", "0,6", "--out", str(tmp_path / "m")])
    assert asked[0].layers == LayerSpec.of(0, 6)
    assert "--layer is deprecated and goes in the next release: use --layers 0,6" in caplog.text
    help_text = cli.build_parser()._subparsers._group_actions[0].choices["mteb"].format_help()
    assert "deprecated alias of --layers" in help_text and "all | last | N | N,M,..." in help_text


@pytest.mark.parametrize(
    "argv, says",
    [
        (
            ["--layers", "abc"],
            "--layers: expected all, last or layer numbers N[,M,...] (0 = the embedding output, -1 = the last layer), got 'abc'",
        ),
        (["--layers", "1,x"], "--layers: expected all, last or layer numbers N[,M,...]"),
        (["--layers", ""], "--layers: expected all, last or layer numbers N[,M,...]"),
        (["--layer", "first"], "--layer: expected all, last or layer numbers N[,M,...]"),
        (["--layer", "1", "--layers", "2"], "--layer 1 and --layers 2: give --layers only (--layer is its deprecated alias)"),
    ],
)
def test_a_bad_layer_spec_is_one_line_before_anything_runs(argv, says, asked, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CROSSBERT_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(["mteb", "minilm", "--tasks", "STSBenchmark", "--out", str(tmp_path / "m"), *argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == USER_ERROR_EXIT and len(err.splitlines()) == 1, err
    assert err.startswith(f"crossbert mteb: error: {says}") and (repr(argv[1]) in err or "--layers only" in says), err
    assert not asked and not (tmp_path / "m").exists()


# -- encoded once, every layer scored --------------------------------------------------------------

TOY_STS = """
name: ToySTS
family: sts
input: pair
target: score
metrics: [spearman]
data: {local: toysts, format: tsv, header: false, fields: [sentence1, sentence2, score]}
splits: {test: test.tsv}
columns: {text: sentence1, text_pair: sentence2, label: score}
train_split: null
eval_split: test
probes: []
mteb: {type: STS, variant_of: STSBenchmark, data_differs: "eight toy pairs", eval_splits: [test]}
"""

PAIRS = [
    ("a man plays a guitar", "a man is playing the guitar", 4.8),
    ("a dog runs in the park", "the stock market fell", 0.2),
    ("the cat sleeps on the sofa", "a cat is sleeping on a couch", 4.5),
    ("children play football", "kids are playing soccer", 4.0),
    ("it is raining in paris", "paris has rain today", 3.9),
    ("she reads a book", "the train is late again", 0.5),
    ("a woman slices onions", "a woman is cutting an onion", 4.6),
    ("the sun is hot", "a man plays a guitar", 0.1),
]


@pytest.fixture
def toy_sts(tmp_path, monkeypatch):
    """An 8-pair STS task file (mteb's STS evaluator, a marked variant) and its data root."""
    tasks, data = tmp_path / "tasks", tmp_path / "data"
    tasks.mkdir()
    (tasks / "ToySTS.yaml").write_text(TOY_STS)
    (data / "toysts").mkdir(parents=True)
    (data / "toysts" / "test.tsv").write_text("".join(f"{a}\t{b}\t{s}\n" for a, b, s in PAIRS))
    monkeypatch.setenv("CROSSBERT_TASKS_DIR", str(tasks))
    return data


def counted(encoder: FrozenEncoder) -> list:
    """Count the model's forward passes (batches) and the texts they carried."""
    batches = []
    forward = encoder.model.forward

    def counting(*args, **kwargs):
        batches.append(kwargs["input_ids"].shape[0])
        return forward(*args, **kwargs)

    encoder.model.forward = counting
    return batches


def _main_scores(rows) -> dict[int, float]:
    return {r["layer"]: r["value"] for r in rows if r["is_main"]}


@pytest.mark.parametrize("with_feature_cache", [False, True])
def test_every_layer_is_scored_from_one_encoding_and_scores_as_a_run_of_that_layer_alone(
    with_feature_cache, nano_checkpoint, toy_sts, tmp_path, no_network
):
    """The nano model (layers 0..2): `layers="all"` runs the model over the 16 texts exactly as often as one layer does
    (once per STS side), and each layer's score is what a run of that layer alone gives."""
    encoder = FrozenEncoder.load(str(nano_checkpoint(0)), own_length=True)
    batches = counted(encoder)
    cache = str(tmp_path / "features") if with_feature_cache else None
    one, _ = run_mteb(
        encoder,
        MtebSettings(tasks=["ToySTS"], layers=LayerSpec.LAST, out_dir=tmp_path / "one", cache_dir=None, data_root=toy_sts),
    )
    one_layer = list(batches)
    batches.clear()
    every, run = run_mteb(
        encoder,
        MtebSettings(tasks=["ToySTS"], layers=LayerSpec.ALL, out_dir=tmp_path / "all", cache_dir=cache, data_root=toy_sts),
    )
    table = mteb_text_table(every, run.plan, run.wall_s)
    assert batches == one_layer and sum(batches) == 2 * len(PAIRS)  # the same forward passes for 3 layers as for 1
    scores = _main_scores(every)
    assert sorted(scores) == [0, 1, 2] and scores[2] == pytest.approx(_main_scores(one)[2], abs=1e-12)
    encoded = {r["layer"]: r["encoded_texts"] for r in every if r["is_main"]}
    assert sum(encoded.values()) == 2 * len(PAIRS) and sorted(encoded.values()) == [0, 0, 2 * len(PAIRS)]
    assert {r["result_source"] for r in every} == {"computed"}
    for layer in (0, 1):  # each other layer, alone: the same score
        batches.clear()
        alone, _ = run_mteb(
            encoder,
            MtebSettings(
                tasks=["ToySTS"], layers=LayerSpec.of(layer), out_dir=tmp_path / f"L{layer}", cache_dir=None, data_root=toy_sts
            ),
        )
        assert _main_scores(alone)[layer] == pytest.approx(scores[layer], abs=1e-12)
    # one table, a line per layer; mteb's result folders: the model's own setting, then an experiment per other layer
    assert [line.split()[4] for line in table.splitlines() if " ToySTS " in line] == ["0", "1", "2"]
    files = sorted(
        str(p.relative_to(tmp_path / "all" / "results")).split("/", 2)[2]
        for p in (tmp_path / "all" / "results").glob("**/ToySTS.json")
    )
    assert files == ["ToySTS.json", "experiments/layer_0/ToySTS.json", "experiments/layer_1/ToySTS.json"]
    if with_feature_cache:  # every layer went into the feature cache, from that one pass
        assert len(list((tmp_path / "features").rglob("*.npy"))) == 2 * 3


def test_layers_already_scored_come_from_mtebs_result_cache_and_the_rest_from_one_encoding(
    nano_checkpoint, toy_sts, tmp_path, no_network
):
    encoder = FrozenEncoder.load(str(nano_checkpoint(0)), own_length=True)
    batches = counted(encoder)
    run_mteb(encoder, MtebSettings(tasks=["ToySTS"], layers=LayerSpec.of(1), out_dir=tmp_path, cache_dir=None, data_root=toy_sts))
    batches.clear()
    rows, _ = run_mteb(
        encoder, MtebSettings(tasks=["ToySTS"], layers=LayerSpec.ALL, out_dir=tmp_path, cache_dir=None, data_root=toy_sts)
    )
    assert sum(batches) == 2 * len(PAIRS)  # layers 0 and 2, still one pass per text set
    assert {r["layer"]: r["result_source"] for r in rows} == {0: "computed", 1: "mteb result cache (verified)", 2: "computed"}


def test_layer_features_encode_a_text_set_once_for_every_layer(nano_checkpoint, tmp_path):
    from crossbert_eval.mteb_encoder import LayerFeatures

    encoder = FrozenEncoder.load(str(nano_checkpoint(0)))
    batches = counted(encoder)
    shared = LayerFeatures(encoder, [2, 0, 1], "mean", FeatureCache(tmp_path))
    texts = [a for a, _, _ in PAIRS]
    first, encoded = shared.features(texts, "toy")
    again, encoded_again = shared.features(texts, "toy")
    assert (encoded, encoded_again, shared.passes, sum(batches)) == (len(texts), 0, 1, len(texts))
    assert again is first and sorted(first) == [(0, "mean"), (1, "mean"), (2, "mean")]
    alone = encoder.encode(texts, layers=[1], poolings=["mean"])[(1, "mean")]
    assert np.array_equal(first[(1, "mean")], alone)
    shared.forget()  # the next task: read back from the feature cache, not encoded
    batches.clear()
    assert shared.features(texts, "toy")[1] == 0 and not batches and shared.passes == 2


# -- published scores: the published setting only ---------------------------------------------------

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def _row(layer: int, value: float, published_setting: bool | None, task="STSBenchmark") -> dict:
    protocol = {"data": "mteb"} if published_setting is None else {"data": "mteb", "published_setting": published_setting}
    return {
        "model": MINILM,
        "task_type": "STS",
        "task": task,
        "split": "test",
        "metric": "cosine_spearman",
        "layer": layer,
        "num_layers": 6,
        "pooling": "mean",
        "value": value,
        "is_main": True,
        "max_length": 256,
        "eval_time_s": 1.0,
        "encode_s": 0.5,
        "protocol": protocol,
    }


def _cells(table: str, layer: int) -> list[str]:
    (line,) = [line for line in table.splitlines() if " STSBenchmark " in line and line.split()[4] == str(layer)]
    return line.split()[5:8]  # score, publ., diff


def test_a_published_score_is_compared_with_the_published_layer_only():
    table = mteb_text_table([_row(0, 0.5559, False), _row(3, 0.60, False), _row(6, 0.82032, True)], wall_s=3.0)
    assert _cells(table, 0) == ["55.59", "-", "-"] and _cells(table, 3) == ["60.00", "-", "-"]
    assert _cells(table, 6) == ["82.03", "82.03", "+0.00"]
    assert "-26.44" not in table  # layer 0 is never set against the last layer's published score
    (why,) = [line for line in table.splitlines() if line.startswith("publ./diff")]
    assert why == (
        f"publ./diff '-': a published score is {MINILM} at its last layer (6) with its own pooling, so it is compared "
        "with that setting only"
    )
    assert "published mean over the same 1 tasks (layer 6, the published setting):  82.03" in table
    assert [line.split()[-3:] for line in table.splitlines() if line.startswith("over the 1 tasks")] == [
        ["55.59", "60.00", "82.03"]
    ]


def test_the_last_layer_at_another_pooling_or_alone_at_another_layer_is_not_compared():
    other_pooling = mteb_text_table([_row(6, 0.79, False)])
    assert (
        _cells(other_pooling, 6) == ["79.00", "-", "-"]
        and "published mean" not in other_pooling
        and "publ./diff '-'" in other_pooling
    )
    own = mteb_text_table([_row(6, 0.82032, True)])  # one layer, the published setting: as the table always showed it
    assert _cells(own, 6) == ["82.03", "82.03", "+0.00"] and "publ./diff '-'" not in own
    assert "published mean over the same 1 tasks: " in own
    older = mteb_text_table([_row(2, 0.56, None), _row(6, 0.82032, None)])  # rows written before the flag: the last layer
    assert _cells(older, 2)[1:] == ["-", "-"] and _cells(older, 6)[1] == "82.03"


def test_minilm_rows_say_which_layer_is_the_published_setting(tmp_path, no_network):
    """A real run: STS17 en-en at layers 5 and 6; only layer 6 (its own mean pooling) meets its published score."""
    from crossbert_eval.report.text_tables import published_score

    rows, run = run_mteb("minilm", MtebSettings(tasks=["STS17"], layers=LayerSpec.of(5, 6), out_dir=tmp_path, cache_dir=None))
    table = mteb_text_table(rows, run.plan, run.wall_s)
    flags = {r["layer"]: r["protocol"]["published_setting"] for r in rows if r["is_main"]}
    assert flags == {5: False, 6: True}
    assert _main_scores(rows)[6] == pytest.approx(published_score("STS17", MINILM, "test"), abs=5e-6)
    line5 = [line for line in table.splitlines() if " STS17 " in line and line.split()[4] == "5"]
    assert line5 and line5[0].split()[6:8] == ["-", "-"]
    cls, _ = run_mteb(
        "minilm", MtebSettings(tasks=["STS17"], layers=LayerSpec.LAST, pooling="cls", out_dir=tmp_path, cache_dir=None)
    )
    assert {r["protocol"]["published_setting"] for r in cls} == {False}


# -- a refused run leaves nothing behind ------------------------------------------------------------


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) + ("/" if p.is_dir() else "") for p in root.rglob("*"))


@pytest.mark.parametrize(
    "argv, says, fresh",
    [
        # in a fresh process: mteb makes its cache folder when first imported, and this refusal comes after that
        (["mteb", "minilm", "--tasks", "STS99"], "mteb has no task named 'STS99'", True),
        (["mteb", "minilm", "--tasks", "STSBenchmark", "--layers", "0,9"], "layers [9] out of range", False),  # model loaded
        (["mteb", "minilm", "--benchmark", "MTEB(eng, v9)"], "unknown benchmark 'MTEB(eng, v9)'", False),
        (["mteb", "minilm", "--tasks", "STSBenchmark", "--layers", "x"], "--layers: expected all", True),  # before mteb loads
        (["mteb", "./no_such_model", "--tasks", "STSBenchmark"], "model './no_such_model': no such folder", False),
    ],
)
def test_a_refused_mteb_run_leaves_the_folder_as_it_was(argv, says, fresh, tmp_path, monkeypatch, capsys):
    """In a folder with something in it, with the default output folders (runs/mteb, runs/features, OUT/results):
    the tree afterwards is the tree before. A fresh process where mteb's first import matters (each costs seconds of
    mteb's registry), this test's process elsewhere."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "notes.txt").write_text("mine\n")  # an existing runs/ folder: kept as it is
    before = _tree(tmp_path)
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)  # as a user has it: `crossbert mteb` points it into the run folder
    monkeypatch.setenv("CROSSBERT_DEBUG", "0")
    if fresh:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        done = subprocess.run(
            [sys.executable, "-m", "crossbert_eval.cli", *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        code, err = done.returncode, done.stderr
    else:
        monkeypatch.chdir(tmp_path)
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        code, err = exit_info.value.code, capsys.readouterr().err
    assert code == USER_ERROR_EXIT and says in err, err
    assert [line for line in err.splitlines() if "error:" in line] == err.strip().splitlines()[-1:]
    assert _tree(tmp_path) == before


def test_nothing_left_on_refusal_removes_only_the_empty_folders_it_saw_created(tmp_path):
    kept = tmp_path / "existing"
    kept.mkdir()
    with pytest.raises(ValueError):
        with nothing_left_on_refusal([tmp_path / "new" / "deep" / "results", kept / "cache", tmp_path / "partial"]):
            (tmp_path / "new" / "deep" / "results" / "a" / "b").mkdir(parents=True)
            (kept / "cache").mkdir()
            (tmp_path / "partial" / "done").mkdir(parents=True)
            (tmp_path / "partial" / "done" / "Task.json").write_text("{}")  # a result written before the failure: kept
            raise ValueError("refused")
    assert _tree(tmp_path) == ["existing/", "partial/", "partial/done/", "partial/done/Task.json"]
    with nothing_left_on_refusal([tmp_path / "ok"]):  # no exception: nothing touched
        (tmp_path / "ok").mkdir()
    assert (tmp_path / "ok").is_dir()
