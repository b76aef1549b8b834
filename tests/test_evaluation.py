"""The one evaluation pipeline a sweep and a zoo share: what it runs in which order with which settings, how it
times each stage, and checkpoints.jsonl's one writer."""

from pathlib import Path

import pytest

from crossbert_eval import evaluation as E
from crossbert_eval.geometry_runner import GeometrySettings
from crossbert_eval.layer_spec import LayerSpec
from crossbert_eval.mteb_runner import MtebSettings
from crossbert_eval.probe_runner import ProbeSettings
from crossbert_eval.tasks import TaskDataMissing
from crossbert_model.readers import read_jsonl


class FakeEncoder:
    num_layers = 2

    def layer_indices(self, spec):
        return spec.indices(self.num_layers)


def _plan(tmp_path: Path, who: str = "zoo z", probe_tasks=("SST-2",), mteb_tasks=("STSBenchmark",)) -> E.EvaluationPlan:
    stores = {"results_dir": str(tmp_path / "results"), "cache_dir": str(tmp_path / "features"), "data_root": None}
    return E.EvaluationPlan(
        who=who,
        probe=ProbeSettings(tasks=list(probe_tasks), probes=["linear"], layers=LayerSpec.LAST, max_train=50, **stores),
        geometry=GeometrySettings(tasks=["STS-B"], layers=LayerSpec.LAST, **stores),
        mteb=MtebSettings(tasks=list(mteb_tasks), layers=LayerSpec.ALL, pooling="cls", out_dir=str(tmp_path / "mteb"), **stores),
    )


@pytest.fixture
def runners(monkeypatch):
    """Every runner the pipeline calls, replaced by one that records what it was asked."""
    from crossbert_eval import geometry_runner, mteb_runner, probe_runner

    calls, missing = [], {}

    class Runner:
        def __init__(self, encoder, settings):
            self.settings, self.missing = settings, dict(missing.get(type(settings).__name__, {}))

        def run(self, tasks):
            calls.append((type(self.settings).__name__, [t.name for t in tasks], self.settings))

    monkeypatch.setattr(probe_runner, "ProbeRunner", Runner)
    monkeypatch.setattr(geometry_runner, "GeometryRunner", Runner)
    monkeypatch.setattr(mteb_runner, "run_mteb", lambda encoder, settings, **kw: calls.append(("mteb", settings.tasks, settings)))
    return calls, missing


def test_probes_then_geometry_then_mteb_on_every_layer_in_one_run_each_timed(tmp_path, runners):
    # catches: a stage run out of order, a runner handed copies of the plan's settings under other names (each stage's
    # settings object is built once, by the sweep or zoo, and reaches its runner whole), mteb run once per layer
    calls, _ = runners
    timed = []
    timer = lambda stage, **extra: E.timed_stage(tmp_path / "timings.jsonl", stage, "m", step=3, **extra)  # noqa: E731
    plan = _plan(tmp_path)
    E.evaluate_encoder(FakeEncoder(), plan, lambda stage, **extra: timed.append(stage) or timer(stage, **extra))
    assert [c[:2] for c in calls] == [("ProbeSettings", ["SST-2"]), ("GeometrySettings", ["STS-B"]), ("mteb", ["STSBenchmark"])]
    assert calls[0][2] is plan.probe and calls[1][2] is plan.geometry and calls[2][2] is plan.mteb
    # mteb: one run for every layer (the texts encoded once for all of them: tests/test_mteb_layers.py)
    rows = read_jsonl(tmp_path / "timings.jsonl")
    assert [(r["stage"], r["run"], r.get("layers")) for r in rows] == [
        ("probe", "m", None),
        ("geometry", "m", None),
        ("mteb", "m", [0, 1, 2]),
    ]
    assert all(r["step"] == 3 for r in rows)


def test_a_stage_without_tasks_is_skipped_and_missing_data_names_the_caller(tmp_path, runners):
    calls, missing = runners
    E.evaluate_encoder(
        FakeEncoder(), _plan(tmp_path, probe_tasks=[], mteb_tasks=[]), lambda stage, **extra: E.timed_stage(None, stage, "m")
    )
    assert [c[0] for c in calls] == ["GeometrySettings"]
    missing["GeometrySettings"] = {"STS-B": "STS-B: no data under /nowhere"}
    with pytest.raises(TaskDataMissing, match=r"^sweep s: geometry task data missing: STS-B: no data under /nowhere$"):
        E.evaluate_encoder(
            FakeEncoder(), _plan(tmp_path, who="sweep s", probe_tasks=[]), lambda stage, **extra: E.timed_stage(None, stage, "m")
        )
    assert not (tmp_path / "timings.jsonl").exists()  # no file: nothing timed (a torchrun rank other than 0)


def _record(run="bert", line="BERT", point="bert", fingerprint="f1", step=0) -> E.ModelRecord:
    return E.ModelRecord(
        run=run,
        line=line,
        point=point,
        seed=0,
        step=step,
        total_steps=step,
        checkpoint="ckpt",
        details={"model_fingerprint": fingerprint, "layers": 2},
    )


def test_a_model_record_keeps_the_columns_the_report_reads(tmp_path):
    assert list(_record().row()) == [
        "run",
        "objective",
        "size",
        "seed",
        "step",
        "total_steps",
        "checkpoint",
        "model_fingerprint",
        "layers",
    ]
    assert (_record().row()["objective"], _record().row()["size"]) == ("BERT", "bert")  # the plot line and the point on it


def test_checkpoints_jsonl_has_one_writer_that_skips_the_same_model_and_replaces_a_changed_one(tmp_path):
    models = E.ModelRecords(tmp_path / "checkpoints.jsonl")
    identity = ("model_fingerprint", "objective", "checkpoint")
    assert models.put(_record(), key=("run",), identity=identity) is False
    assert models.put(_record("other", fingerprint="f2"), key=("run",), identity=identity) is False
    assert models.put(_record(), key=("run",), identity=identity) is False  # the same model again: nothing written
    assert models.put(_record(fingerprint="f3"), key=("run",), identity=identity) is True  # other weights under its name
    assert [(r["run"], r["model_fingerprint"]) for r in read_jsonl(models.file)] == [("other", "f2"), ("bert", "f3")]
    # a sweep's key is (run, step): a checkpoint already recorded is kept as it is
    assert models.has(run="bert", step=0) and not models.has(run="bert", step=5)
    models.put(_record(fingerprint="f4"), key=("run", "step"))
    assert [r["model_fingerprint"] for r in read_jsonl(models.file)] == ["f2", "f3"]
