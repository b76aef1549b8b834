"""Hugging Face-format checkpoints of a training run.

    runs/<name>/checkpoints/step_0000500/
        config.json  model.safetensors      <- AutoModel.from_pretrained gives the encoder
        tokenizer.json tokenizer_config.json ...
        trainer_state.json                  <- step, tokens seen, validation metrics, git revision
        optimizer.pt                        <- AdamW state (tensors only; loaded with weights_only=True)

A checkpoint folder is written under a temporary name and renamed when complete, so every
`step_*` folder that exists is whole; a killed save leaves only a hidden `.step_*.tmp`.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch

from .config import CrossBertConfig
from .model import PRETRAINING_CLASSES
from .utils import atomic_path, atomic_write_json
from .errors import CrossbertError

STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(CrossbertError, ValueError):
    pass


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step:07d}"


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = STEP_DIR.match(p.name)
        if m and (p / "trainer_state.json").exists():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def remove_stale_temporaries(run_dir: Path) -> None:
    root = Path(run_dir) / "checkpoints"
    if root.is_dir():
        for p in root.glob(".step_*"):
            shutil.rmtree(p, ignore_errors=True)


def save_checkpoint(
    path: Path, model, model_state: dict, tokenizer, trainer_state: dict, optimizer_state: dict | None
) -> Path:
    """Write one complete checkpoint folder atomically. `model_state` is the full (gathered) state dict."""
    with atomic_path(path, is_dir=True) as tmp:
        model.save_pretrained(tmp, state_dict=model_state, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if optimizer_state is not None:
            torch.save(optimizer_state, tmp / "optimizer.pt")
        atomic_write_json(tmp / "trainer_state.json", trainer_state)
    return path


def read_config(path: Path) -> CrossBertConfig:
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{path}: not a checkpoint folder (no config.json)")
    data = json.loads(config_file.read_text())
    if data.get("model_type") != CrossBertConfig.model_type:
        raise CheckpointError(
            f"{config_file}: model_type is {data.get('model_type')!r}, expected {CrossBertConfig.model_type!r} "
            "(a checkpoint written by crossbert_model)"
        )
    return CrossBertConfig.from_dict(data)


def load_optimizer_state(path: Path) -> dict | None:
    file = Path(path) / "optimizer.pt"
    return torch.load(file, map_location="cpu", weights_only=True) if file.is_file() else None


def pretraining_model_from_pretrained(path: str | Path):
    """The pre-training model (encoder + head or predictor) of a checkpoint, whatever its objective."""
    config = read_config(Path(path))
    return PRETRAINING_CLASSES[config.objective].from_pretrained(str(path), local_files_only=True)
