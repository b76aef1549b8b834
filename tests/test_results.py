"""The results store: one locked appender that repairs torn tails, unit claims so concurrent probe runs
never write a unit twice, one provenance stamp, and the probe settings checked before any work."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from crossbert_eval.layer_spec import LayerSpec
from crossbert_eval.probe_runner import ProbeSettings
from crossbert_eval.results import BUSY, CLAIMED, DONE, ResultsStore, duplicate_units, normalise_row
from crossbert_model.errors import CrossbertError
from crossbert_model.utils import append_jsonl
from crossbert_model.readers import read_jsonl

# ------------------------------------------------------------------------------------------------
# The one appender / reader
# ------------------------------------------------------------------------------------------------


def test_append_cuts_a_torn_tail_and_keeps_every_whole_row(tmp_path):
    path = tmp_path / "rows.jsonl"
    append_jsonl(path, [{"i": 0}, {"i": 1}])
    with open(path, "a") as f:
        f.write('{"i": 2, "half": "writ')  # a writer killed mid-line
    assert read_jsonl(path) == [{"i": 0}, {"i": 1}]  # readers skip the torn tail
    append_jsonl(path, [{"i": 3}, {"i": 4}])
    assert read_jsonl(path) == [{"i": 0}, {"i": 1}, {"i": 3}, {"i": 4}]
    assert path.read_text().endswith('{"i": 4}\n') and "half" not in path.read_text()


def test_a_torn_file_with_no_whole_line_is_emptied_before_the_append(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"torn": ')
    append_jsonl(path, [{"i": 1}])
    assert path.read_text() == '{"i": 1}\n'


def test_a_bad_line_inside_the_file_names_file_and_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"i": 0}\nnot json\n{"i": 2}\n')
    with pytest.raises(CrossbertError, match=r"rows.jsonl:2: not a JSON line"):
        read_jsonl(path)


def test_store_rows_go_through_the_one_appender_with_one_provenance(tmp_path):
    store = ResultsStore(tmp_path)
    with open(store.path, "w") as f:
        f.write('{"unit": "old", "metric": "m"}\n{"unit": "torn", "met')
    written = store.append([{"unit": "u1", "metric": "accuracy", "value": 0.5}])
    rows = read_jsonl(store.path)
    assert [r["unit"] for r in rows] == ["old", "u1"] and written[0]["unit"] == "u1"
    assert set(rows[1]["packages"]) >= {"numpy"} and "git_revision" in rows[1] and "timestamp" in rows[1]
    assert "versions" not in rows[1] and "machine" not in rows[1]  # utils.provenance(machine=False)


def test_old_rows_read_in_todays_shape():
    assert normalise_row({"versions": {"torch": "2"}, "layer": "6"}) == {"packages": {"torch": "2"}, "layer": 6}
    assert normalise_row({"layer": 6.0})["layer"] == 6 and isinstance(normalise_row({"layer": 6.0})["layer"], int)


# ------------------------------------------------------------------------------------------------
# Claims
# ------------------------------------------------------------------------------------------------


def _claim_by(store: ResultsStore, key: str, pid: int, host: str | None = None, age: float = 0.0) -> None:
    import socket

    store.claims.mkdir(parents=True, exist_ok=True)
    owner = {"pid": pid, "host": host or socket.gethostname(), "since": time.time() - age, "unit": key}
    (store.claims / f"{key}.json").write_text(json.dumps(owner))


def test_a_unit_is_claimed_once_and_released_after_its_rows(tmp_path):
    store = ResultsStore(tmp_path)
    assert store.claim("u1") == CLAIMED
    assert store.claim("u1") == CLAIMED  # our own claim: still ours
    store.append([{"unit": "u1", "metric": "m", "value": 1.0}])
    store.release("u1")
    assert not (store.claims / "u1.json").exists()
    assert store.claim("u1") == DONE


def test_a_live_claim_of_another_process_is_respected(tmp_path):
    store = ResultsStore(tmp_path)
    _claim_by(store, "u1", os.getppid())  # a live process that is not us
    assert store.claim("u1") == BUSY and store.last_owner["pid"] == os.getppid()
    store.release("u1")  # not ours: left alone
    assert (store.claims / "u1.json").exists()


def test_a_dead_or_old_claim_is_stale_and_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store = ResultsStore(tmp_path, claim_timeout=60)
    _claim_by(store, "u1", dead.pid)
    assert store.claim("u1") == CLAIMED
    _claim_by(store, "u2", os.getppid(), host="elsewhere", age=120)  # another host: only age can free it
    assert store.claim("u2") == CLAIMED
    _claim_by(store, "u3", os.getppid(), host="elsewhere", age=10)
    assert store.claim("u3") == BUSY


def test_append_never_writes_a_done_unit_twice(tmp_path):
    store, other = ResultsStore(tmp_path), ResultsStore(tmp_path)  # two runners on one store
    assert other.append([{"unit": "u1", "metric": "m", "value": 1.0}])
    assert store.append([{"unit": "u1", "metric": "m", "value": 2.0}, {"unit": "u2", "metric": "m", "value": 3.0}]) == [
        {"unit": "u2", "metric": "m", "value": 3.0}
    ]
    rows = store.rows()
    assert [(r["unit"], r["value"]) for r in rows] == [("u1", 1.0), ("u2", 3.0)] and not duplicate_units(rows)


def test_duplicates_are_counted_per_unit():
    rows = [{"unit": "a", "metric": m} for m in ("x", "y")] * 2 + [{"unit": "b", "metric": "x"}]
    assert duplicate_units(rows) == {"a": 2}


# ------------------------------------------------------------------------------------------------
# Two probe processes on one store
# ------------------------------------------------------------------------------------------------

TOY_TASK = """
name: TinyTREC
family: senteval
input: single
target: class
metrics: [accuracy]
data: {local: tiny_trec, format: label_first, encoding: latin-1}
splits: {train: train.txt, test: test.txt}
columns: {text: text, label: label}
labels: ["0", "1", "2", "3", "4", "5"]
eval_split: test
"""

CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import torch
    torch.set_num_threads(1)
    from crossbert_eval import probe_runner
    from crossbert_eval.encoders import FrozenEncoder
    from crossbert_eval.layer_spec import LayerSpec
    from crossbert_eval.probe_runner import ProbeRunner, ProbeSettings
    from crossbert_eval.tasks import resolve_tasks

    results, cache, go = sys.argv[1:4]
    settings = ProbeSettings(tasks=["TinyTREC"], probes=["knn"], layers=LayerSpec.ALL, poolings=["mean", "cls", "max"],
                             results_dir=results, cache_dir=cache)
    runner = ProbeRunner(FrozenEncoder.load("minilm", dtype="fp32"), settings)
    fit = runner._fit
    def slow_fit(*args):  # units of some milliseconds would not overlap between the two runs
        time.sleep(0.05)
        return fit(*args)
    runner._fit = slow_fit
    written = []
    append = runner.store.append
    runner.store.append = lambda rows: written.extend(append(rows)) or rows
    Path(go + ".ready." + sys.argv[4]).touch()
    while not Path(go).exists():
        time.sleep(0.01)
    runner.run(resolve_tasks("TinyTREC"))
    print("UNITS", len({r["unit"] for r in written}))
    """
)


@pytest.fixture
def tiny_trec(tmp_path, real_data_root, monkeypatch):
    """A 120 + 40 question slice of the real TREC files as a task of its own (fast to encode)."""
    import lzma

    source = real_data_root / "sentence_classification"
    train = lzma.open(source / "TREC.train.all.xz", "rt", encoding="latin-1").read().splitlines()[:120]
    test = (source / "TREC.test.all").read_text(encoding="latin-1").splitlines()[:40]
    folder = tmp_path / "data" / "tiny_trec"
    folder.mkdir(parents=True)
    (folder / "train.txt").write_text("\n".join(train) + "\n", encoding="latin-1")
    (folder / "test.txt").write_text("\n".join(test) + "\n", encoding="latin-1")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "TinyTREC.yaml").write_text(TOY_TASK)
    monkeypatch.setenv("CROSSBERT_TASKS_DIR", str(tasks))
    monkeypatch.setenv("CROSSBERT_DATA_ROOT", str(tmp_path / "data"))
    return tmp_path


@pytest.mark.parametrize("probe", ["linear", "knn"])
def test_a_probe_is_fitted_on_the_training_split_and_scored_on_the_evaluation_split(tiny_trec, probe, monkeypatch):
    from crossbert_eval import probes as P
    from crossbert_eval.encoders import FrozenEncoder
    from crossbert_eval.probe_runner import ProbeRunner
    from crossbert_eval.tasks import get_task

    fits, fit = [], getattr(P, f"{probe}_probe")

    def recorded(x_train, y_train, x_eval, **kwargs):
        fits.append((len(x_train), list(y_train), len(x_eval)))
        return fit(x_train, y_train, x_eval, **kwargs)

    monkeypatch.setattr(P, f"{probe}_probe", recorded)
    settings = ProbeSettings(
        tasks=["TinyTREC"],
        probes=[probe],
        layers=LayerSpec.LAST,
        results_dir=str(tiny_trec / "results"),
        cache_dir=str(tiny_trec / "features"),
    )
    task = get_task("TinyTREC")
    rows = ProbeRunner(FrozenEncoder.load("minilm", dtype="fp32"), settings).run([task])
    assert fits == [
        (120, list(task.load_split("train").labels), 40)
    ]  # fitted on the 120 training questions, scored on the 40 test ones
    assert set(rows["split"]) == {"test"}


def test_two_concurrent_probe_runs_write_each_unit_once(tiny_trec):
    from crossbert_eval.encoders import FrozenEncoder
    from crossbert_eval.probe_runner import ProbeRunner
    from crossbert_eval.tasks import resolve_tasks

    root = tiny_trec
    cache, results, go = root / "features", root / "shared_results", root / "go"
    warm = ProbeSettings(
        tasks=["TinyTREC"],
        probes=["knn"],
        layers=LayerSpec.ALL,
        poolings=["mean", "cls", "max"],
        results_dir=str(root / "warmup_results"),
        cache_dir=str(cache),
    )
    runner = ProbeRunner(FrozenEncoder.load("minilm", dtype="fp32"), warm)
    expected = len(runner.run(resolve_tasks("TinyTREC"))["unit"].unique())  # also fills the feature cache
    assert expected == 7 * 3  # layers 0..6 x 3 poolings, one knn unit each

    env = {**os.environ, "CROSSBERT_DATA_ROOT": str(root / "data"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cwd = Path(__file__).resolve().parent.parent
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(results), str(cache), str(go), str(i)],
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    deadline = time.time() + 120
    while not all(Path(f"{go}.ready.{i}").exists() for i in range(2)):  # both loaded: start together
        assert time.time() < deadline and all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.05)
    go.touch()
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    rows = read_jsonl(results / "results.jsonl")
    units = [r["unit"] for r in rows]
    assert len(units) == len(set(units)) == expected  # each unit exactly once (knn: one metric per unit)
    written = [int(out.split("UNITS")[-1]) for out, _ in outputs]
    assert sum(written) == expected and min(written) > 0, written  # the two runs shared the work
    assert not list((results / "claims").glob("*.json"))  # every claim released


# ------------------------------------------------------------------------------------------------
# Probe settings
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "option,message",
    [
        ({"k": 0}, r"^probe setting 'k': expected a positive integer, got 0$"),
        ({"temperature": 0}, r"^probe setting 'temperature': expected a positive number, got 0$"),
        ({"temperature": -1.0}, r"^probe setting 'temperature': expected a positive number, got -1.0$"),
        ({"poolings": ["avg"]}, r"^probe setting 'poolings': expected one or more of mean, cls, max or null, got \['avg'\]"),
        ({"probes": ["svm"]}, r"^probe setting 'probes': expected one or more of linear, knn, cosine, got \['svm'\]"),
        ({"pair_mode": "concat"}, r"^probe setting 'pair_mode': expected one of joint, senteval, got 'concat'$"),
        ({"max_train": 0}, r"^probe setting 'max_train': expected a positive integer or null, got 0$"),
        (
            {"layers": "5,6"},
            r"^probe setting 'layers': expected a LayerSpec \(LayerSpec.parse\('all\|last\|N,M,...'\)\), got '5,6'$",
        ),
    ],
)
def test_probe_settings_are_checked_with_the_field_named(option, message):
    # catches: the library naming a command-line option (--k) a sweep or zoo never had; a setting checked by a rule of
    # its own rather than its declared limit; a layer spec taken as text (parsed again below the edge)
    from crossbert_eval.settings import SettingError

    with pytest.raises(SettingError, match=message) as e:
        ProbeSettings(tasks=["TREC"], **option)
    assert e.value.field == next(iter(option)) and "--" not in str(e.value)
    assert isinstance(e.value, CrossbertError)


def test_pooling_defaults_to_the_model_and_records_its_source(tmp_path):
    from crossbert_eval.encoders import FrozenEncoder
    from crossbert_eval.probe_runner import ProbeRunner

    class Stub:  # what ProbeRunner reads of an encoder before any work
        default_pooling, pooling_source = "cls", "sentence-transformers:1_Pooling/config.json"
        poolings_and_source = FrozenEncoder.poolings_and_source

        def layer_indices(self, spec):
            return [6]

    base = dict(tasks=["TREC"], results_dir=str(tmp_path / "r"), cache_dir=str(tmp_path / "f"))
    runner = ProbeRunner(Stub(), ProbeSettings(**base))
    assert runner.poolings == ["cls"] and runner.pooling_source == "sentence-transformers:1_Pooling/config.json"
    runner = ProbeRunner(Stub(), ProbeSettings(poolings=["max"], **base))
    assert runner.poolings == ["max"] and runner.pooling_source == "user"


def test_every_json_file_the_tool_writes_is_strict_json_a_number_that_is_none_recorded_as_null(tmp_path):
    import json

    import numpy as np

    from crossbert_model.utils import append_jsonl, atomic_write_json

    def strict(text):
        return json.loads(text, parse_constant=lambda name: pytest.fail(f"bare {name} in {text!r}"))

    row = {"value": float("nan"), "high": np.float32("inf"), "ci": [0.5, float("-inf")], "n": np.int64(3)}
    append_jsonl(tmp_path / "rows.jsonl", [row])
    atomic_write_json(tmp_path / "one.json", row)
    for text in ((tmp_path / "rows.jsonl").read_text(), (tmp_path / "one.json").read_text()):
        assert strict(text) == {"value": None, "high": None, "ci": [0.5, None], "n": 3}
