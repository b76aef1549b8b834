"""One evaluation of one loaded encoder: probes, geometry and mteb, in that order, into one results store, and
the model's row in checkpoints.jsonl.

A sweep evaluates each checkpoint of a run (crossbert_eval.sweep), a zoo each model of its list
(crossbert_eval.zoo); both describe what to run as an EvaluationPlan, time each stage with the same timer
(timed_stage) and record the model as a ModelRecord through ModelRecords, the file's one writer, so the two
cannot drift apart. Units already in the store are skipped by each runner.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ContextManager

from crossbert_model.utils import append_jsonl, atomic_write_text

from crossbert_model.readers import read_jsonl

if TYPE_CHECKING:  # the runners import torch: each is imported when its stage runs
    from crossbert_eval.geometry_runner import GeometrySettings
    from crossbert_eval.mteb_runner import MtebSettings
    from crossbert_eval.probe_runner import ProbeSettings


@contextlib.contextmanager
def timed_stage(file: Path | None, stage: str, run: str, **extra):
    """Append {stage, run, seconds, **extra} to `file` once the block ends (file None: time nothing, e.g. ranks > 0)."""
    started = time.perf_counter()
    yield
    if file is not None:
        append_jsonl(file, [{"stage": stage, "run": run, "seconds": round(time.perf_counter() - started, 2), **extra}])


@dataclass(frozen=True)
class EvaluationPlan:
    """What to evaluate on one encoder: each stage's settings, built once by the caller from its config (the config's
    keys mapped to the settings' fields there) and handed to the stage's runner whole. A stage without tasks is skipped."""

    who: str  # "sweep NAME" / "zoo NAME": names the caller in a missing-data error
    probe: ProbeSettings
    geometry: GeometrySettings
    mteb: MtebSettings


# timer(stage, **extra) -> a context manager that records how long the stage took (timed_stage, bound to a run)
StageTimer = Callable[..., ContextManager]


def evaluate_encoder(encoder, plan: EvaluationPlan, timer: StageTimer) -> None:
    """Probes, then geometry, then mteb (one run for every layer of plan.mteb.layers) on `encoder`. A task whose data
    is missing fails the evaluation (TaskDataMissing) after its stage, naming every such task."""
    if plan.probe.tasks:
        _probe(encoder, plan, timer)
    if plan.geometry.tasks:
        _geometry(encoder, plan, timer)
    if plan.mteb.tasks:
        _mteb(encoder, plan, timer)


def _probe(encoder, plan: EvaluationPlan, timer: StageTimer) -> None:
    from crossbert_eval.probe_runner import ProbeRunner
    from crossbert_eval.tasks import resolve_tasks

    runner = ProbeRunner(encoder, plan.probe)
    with timer("probe"):
        runner.run(resolve_tasks(plan.probe.tasks))
    _fail_on_missing(plan, "probe", runner.missing)


def _geometry(encoder, plan: EvaluationPlan, timer: StageTimer) -> None:
    from crossbert_eval.geometry_runner import GeometryRunner
    from crossbert_eval.tasks import resolve_tasks

    runner = GeometryRunner(encoder, plan.geometry)
    with timer("geometry"):
        runner.run(resolve_tasks(plan.geometry.tasks))
    _fail_on_missing(plan, "geometry", runner.missing)


def _mteb(encoder, plan: EvaluationPlan, timer: StageTimer) -> None:
    from crossbert_eval.mteb_runner import run_mteb

    # every layer of plan.mteb.layers in one run: the texts are encoded once for all of them (as `crossbert mteb --layers`)
    with timer("mteb", layers=encoder.layer_indices(plan.mteb.layers)):
        run_mteb(encoder, plan.mteb)


def evaluate_baselines(plan: EvaluationPlan, folder: Path, timer: StageTimer) -> None:
    """The chance, majority-class and TF-IDF baselines of the plan's probe tasks on the probes' splits (crossbert_eval.baselines),
    into `folder`'s baseline store: once per folder, whatever the number of models."""
    from crossbert_eval.baselines import BaselineSettings, run_baselines
    from crossbert_eval.tasks import resolve_tasks

    names = baseline_task_names(plan.probe.tasks, plan.mteb.tasks)
    if not names:
        return
    settings = BaselineSettings(data_root=plan.probe.data_root, max_train=plan.probe.max_train, max_eval=plan.probe.max_eval)
    with timer("baselines"):
        run_baselines(resolve_tasks(names), folder, settings)


def baseline_task_names(probe_tasks: list[str], mteb_tasks: list[str]) -> list[str]:
    """The tasks a folder's baselines cover: its probe tasks, and its mteb tasks that have a local task file (mteb's
    own, hub-only tasks have no local splits to score)."""
    from crossbert_eval.tasks import all_tasks

    local = all_tasks()
    return list(dict.fromkeys([*probe_tasks, *(t for t in mteb_tasks or [] if t in local)]))


def _fail_on_missing(plan: EvaluationPlan, stage: str, missing: dict[str, str]) -> None:
    from crossbert_eval.tasks import TaskDataMissing

    if missing:
        raise TaskDataMissing(f"{plan.who}: {stage} task data missing: {'; '.join(missing.values())}")


@dataclass(frozen=True)
class ModelRecord:
    """One row of checkpoints.jsonl: a model the report draws, and where it sits in the plots. The file keeps the
    report's column names, which committed sweeps and zoos already use: `line` is written as `objective`, `point`
    as `size`."""

    run: str  # a sweep's run key; a zoo's display name
    line: str  # the plot line the model belongs to: a sweep's objective, a zoo's family
    point: str  # its label on that line: a sweep's size preset, a zoo's display name
    seed: int
    step: int
    total_steps: int  # step == total_steps: a final checkpoint (every zoo model is one)
    checkpoint: str
    details: dict = field(default_factory=dict)  # the rest: fingerprint, parameter counts, tokens, FLOPs, losses, ...

    def row(self) -> dict:
        return {
            "run": self.run,
            "objective": self.line,
            "size": self.point,
            "seed": self.seed,
            "step": self.step,
            "total_steps": self.total_steps,
            "checkpoint": self.checkpoint,
            **self.details,
        }


class ModelRecords:
    """checkpoints.jsonl's one writer. A row is identified by its `key` columns (a sweep: run and step; a zoo: run)."""

    def __init__(self, file: Path):
        self.file = Path(file)

    def has(self, **key) -> bool:
        return any(all(r.get(k) == v for k, v in key.items()) for r in read_jsonl(self.file))

    def put(self, record: ModelRecord, key: tuple[str, ...], identity: tuple[str, ...] = ()) -> bool:
        """Append the record's row unless rows of the same key are there and agree with it on `identity`; rows of
        the same key that disagree are replaced (a zoo entry changed under its name). Returns whether rows were replaced."""
        row = record.row()
        rows = read_jsonl(self.file)
        same = [r for r in rows if all(r.get(k) == row[k] for k in key)]
        if same and all(all(r.get(k) == row[k] for k in identity) for r in same):
            return False
        if same:
            kept = [r for r in rows if not all(r.get(k) == row[k] for k in key)]
            atomic_write_text(self.file, "".join(json.dumps(r, default=str) + "\n" for r in kept))
        append_jsonl(self.file, [row])
        return bool(same)
