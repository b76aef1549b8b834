"""Trackers: the scalars of a run's metrics.jsonl, also written where experiment trackers read them.

    trackers = open_trackers(cfg)     # rank 0, when training starts or resumes
    trackers.log(row)                 # each row metrics.jsonl gets, as it gets it
    trackers.close()                  # or: with open_trackers(cfg) as trackers: ...

metrics.jsonl stays the record; a tracker is a view of it, under the same names (`loss`, `lr`,
`grad_norm`, `corpus_tokens_per_s`, `val_loss`, `shared_loss_r15`, `unigram_entropy_val`, ...) at the
same steps. The config's `tracking` list says which (crossbert_model.train_config):

* tensorboard: event files in the run folder, beside metrics.jsonl (`tensorboard --logdir RUN_OR_SWEEP`).
  They are rebuilt from metrics.jsonl each time a run starts or resumes, so after a resume they hold
  each step once, with the values metrics.jsonl keeps (the steps logged after the checkpoint by the
  interrupted process are gone from both).
* wandb: a W&B run in `<run>/wandb`, offline unless `wandb_mode=online`; `wandb sync <run>/wandb/offline-run-*`
  uploads it later. Its id is the run folder's, so a resume continues the same W&B run; its group is the
  config's `group` (a sweep sets its name).

A backend is a class with `log(row)` and `close(failed)`, with an entry in BACKENDS: its package, and how
it opens.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from .utils import stable_hash

from .readers import read_jsonl
from .run_layout import RunDir


class TrackedRun(Protocol):
    """What a tracker reads of a run's training config (crossbert_model.train_config.TrainConfig, which imports this
    module for the tracker names: described here, not imported, so the two do not import each other)."""

    name: str
    group: str | None
    run_dir: Path
    tracking: list[str]
    wandb_project: str
    wandb_mode: str


log = logging.getLogger("crossbert.tracking")

# The name every TensorBoard writer gives its files; a run folder's are all ours to rebuild.
TENSORBOARD_EVENTS = "events.out.tfevents.*"
# How long TensorBoard may wait for the newest rows of a running job.
TENSORBOARD_FLUSH_S = 10
WANDB_MODES = ("offline", "online")


class Tracker(Protocol):
    def log(self, row: dict) -> None: ...

    def close(self, failed: bool = False) -> None: ...


def scalars(row: dict) -> dict[str, float]:
    """The numbers of a metrics.jsonl row a tracker plots: every int or float but the step itself."""
    return {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


class TensorBoardTracker:
    """Event files in the run folder, rebuilt from metrics.jsonl when opened. Values are written as doubles
    (TensorBoard's default, float32, would not read back as the numbers metrics.jsonl holds)."""

    def __init__(self, cfg: TrackedRun):
        from torch.utils.tensorboard import SummaryWriter

        run_dir = cfg.run_dir
        for old in run_dir.glob(TENSORBOARD_EVENTS):  # the previous process's view, replaced whole below
            old.unlink()
        self.writer = SummaryWriter(log_dir=str(run_dir), flush_secs=TENSORBOARD_FLUSH_S)
        for row in read_jsonl(RunDir(run_dir).metrics):
            self.log(row)

    def log(self, row: dict) -> None:
        for key, value in scalars(row).items():
            # classic scalar summaries (float32): what TensorBoard's scalar dashboard and EventAccumulator.Scalars read;
            # metrics.jsonl keeps the doubles
            self.writer.add_scalar(key, value, row["step"])

    def close(self, failed: bool = False) -> None:
        self.writer.close()


class WandbTracker:
    """A W&B run of the training run: offline by default, id from the run folder (a resume continues it),
    the config as W&B's config, the sweep (cfg.group) as its group."""

    def __init__(self, cfg: TrackedRun):
        import wandb

        from .args import to_dict

        self.run = wandb.init(
            project=cfg.wandb_project,
            name=cfg.name,
            group=cfg.group,
            id=wandb_run_id(cfg.run_dir),
            resume="allow",
            dir=str(cfg.run_dir),
            mode=cfg.wandb_mode,
            config=to_dict(cfg),
            # no console capture (it would break our progress bars) and no system-metrics sampling thread
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True, save_code=False),
        )
        where = Path(self.run.dir).parent  # <run>/wandb/offline-run-*/files -> the folder `wandb sync` takes
        how = f"upload it with: wandb sync {where}" if cfg.wandb_mode == "offline" else "online"
        log.info("W&B run %s (group %s) in %s; %s", self.run.id, cfg.group, where, how)

    def log(self, row: dict) -> None:
        self.run.log(scalars(row), step=row["step"])

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def wandb_run_id(run_dir: Path) -> str:
    """The W&B id of a run folder: the same at every resume, different for two folders of one name (two sweeps)."""
    return stable_hash(str(Path(run_dir).resolve()), 16)


@dataclass(frozen=True)
class Backend:
    package: str  # the module its writer needs
    install: str  # what to install when it is missing
    opens: Callable[[TrackedRun], Tracker]


# The one place a backend is added.
BACKENDS: dict[str, Backend] = {
    "tensorboard": Backend("tensorboard", "pip install tensorboard", TensorBoardTracker),
    "wandb": Backend("wandb", "pip install 'crossbert[tracking]'", WandbTracker),
}


def tracking_problem(names: list[str]) -> str | None:
    """What is wrong with a `tracking` list (unknown, repeated or not installed backend), or None. Imports nothing."""
    if not isinstance(names, list):
        return f"a list of trackers ({', '.join(BACKENDS)}), e.g. [tensorboard]"
    for name in names:
        if name not in BACKENDS:
            return f"trackers from {', '.join(BACKENDS)}; {name!r} is none of them"
        if names.count(name) > 1:
            return f"each tracker once; {name!r} is listed {names.count(name)} times"
        backend = BACKENDS[name]
        if importlib.util.find_spec(backend.package) is None:
            return f"installed trackers; {name!r} needs the {backend.package} package: {backend.install}, or leave it out"
    return None


class Trackers:
    """The trackers of one run, each row to all of them; closing reports a failed run as failed."""

    def __init__(self, trackers: list[Tracker]):
        self.trackers = trackers

    def log(self, row: dict) -> None:
        for tracker in self.trackers:
            tracker.log(row)

    def close(self, failed: bool = False) -> None:
        for tracker in self.trackers:
            tracker.close(failed)
        self.trackers = []

    def __enter__(self) -> Trackers:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc_type is not None)


def open_trackers(cfg: TrackedRun) -> Trackers:
    """The trackers `cfg.tracking` names, opened on its run folder (which exists: the trainer made it)."""
    opened: list[Tracker] = []
    try:
        for name in cfg.tracking:
            opened.append(BACKENDS[name].opens(cfg))
    except BaseException:
        Trackers(opened).close(failed=True)
        raise
    return Trackers(opened)
