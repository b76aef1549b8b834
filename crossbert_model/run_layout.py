"""The one owner of a training run's folder layout and of a checkpoint folder's file names (lingua's CheckpointManager
owns its folder the same way). Writers and readers both take their paths from here; nothing else spells a file name
of a run or walks up from a checkpoint to its run. Standard library only: commands that merely name a run stay light.

    runs/<name>/                     RunDir
        config.yaml                  the resolved training config
        run_info.json                provenance, precision, the history of accepted config changes
        metrics.jsonl                every logged step
        checkpoints/step_0000400/    CheckpointDir: model.safetensors, config.json, tokenizer, trainer_state.json,
                                     optimizer.pt, COMPLETE (written last)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

CHECKPOINTS = "checkpoints"
_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass(frozen=True)
class Folder:
    """A folder whose layout one class owns (its subclasses name its files); the path as given, str or Path."""

    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))


@dataclass(frozen=True)
class RunDir(Folder):
    """A training run's folder."""

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def run_info(self) -> Path:
        return self.path / "run_info.json"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    def checkpoint(self, step: int) -> CheckpointDir:
        return CheckpointDir(self.checkpoints / f"step_{step:07d}")

    def checkpoint_folders(self) -> list[CheckpointDir]:
        """Every folder named like a checkpoint (complete or not), by step."""
        if not self.checkpoints.is_dir():
            return []
        return sorted((CheckpointDir(p) for p in self.checkpoints.iterdir() if _STEP_DIR.match(p.name)), key=lambda c: c.step)

    def temporaries(self) -> list[Path]:
        """Checkpoint folders a killed save left half-written (their atomic writer's temporary siblings)."""
        return sorted(self.checkpoints.glob(".step_*")) if self.checkpoints.is_dir() else []


@dataclass(frozen=True)
class CheckpointDir(Folder):
    """One checkpoint's folder: a model loadable by itself (AutoModel, sentence-transformers) plus training state."""

    @property
    def step(self) -> int | None:
        """The step its folder name says (step_N), None for a folder named otherwise (an exported model)."""
        match = _STEP_DIR.match(self.path.name)
        return int(match.group(1)) if match else None

    @property
    def run(self) -> RunDir | None:
        """The run it belongs to (runs/<name>/checkpoints/step_N), None for a folder outside a run."""
        return RunDir(self.path.parent.parent) if self.path.parent.name == CHECKPOINTS else None

    @property
    def run_name(self) -> str:
        """Its run's name, or its own folder's name outside a run."""
        return self.run.name if self.run else self.path.name

    @property
    def weights(self) -> Path:
        return self.path / "model.safetensors"

    @property
    def model_config(self) -> Path:
        return self.path / "config.json"

    @property
    def model_card(self) -> Path:
        """The README.md a model hub shows (crossbert_model.model_card writes its text)."""
        return self.path / "README.md"

    @property
    def trainer_state(self) -> Path:
        return self.path / "trainer_state.json"

    @property
    def optimizer(self) -> Path:
        return self.path / "optimizer.pt"

    @property
    def complete_marker(self) -> Path:
        """Written last: a folder without it was not finished (or was copied half-way)."""
        return self.path / "COMPLETE"

    @property
    def is_complete(self) -> bool:
        return self.complete_marker.exists()

    def training_state_files(self) -> tuple[Path, ...]:
        """What only resuming the training needs (an exported model leaves them out)."""
        return self.optimizer, self.trainer_state, self.complete_marker
