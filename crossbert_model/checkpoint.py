"""Hugging Face-format checkpoints of a training run.

    runs/<name>/checkpoints/step_0000500/
        config.json  model.safetensors      <- AutoModel.from_pretrained gives the encoder
        tokenizer.json tokenizer_config.json ...
        config.py model.py masking.py       <- the package's model code, for users without it (auto_map)
        modules.json sentence_bert_config.json 1_Pooling/   <- SentenceTransformer(folder) (crossbert_model.portable)
        README.md                           <- model card (crossbert_model.model_card)
        trainer_state.json                  <- step, tokens seen, validation metrics, git revision
        optimizer.pt                        <- AdamW state (tensors only; loaded with weights_only=True)
        COMPLETE                            <- written last: the folder is whole

A checkpoint folder is written under a temporary name, gets its COMPLETE marker as the last file,
and is renamed when complete; only folders with the marker are listed. A killed save leaves only a
hidden `.step_*.tmp`. A file damaged later (a truncated copy, a full disk) raises CheckpointError
naming the file, so a resume can fall back to the previous checkpoint.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError

from . import readers
from .config import CrossBertConfig
from .objectives import objective_of
from .portable import write_portable_files
from .remote_code import from_pretrained
from .run_layout import CheckpointDir, RunDir
from .utils import atomic_path, atomic_write_json, atomic_write_text
from .errors import CrossbertError, quoted_os_error

log = logging.getLogger(__name__)


class CheckpointError(CrossbertError, ValueError):
    pass


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of the run's complete checkpoints, by step."""
    found = []
    for checkpoint in RunDir(run_dir).checkpoint_folders():
        if checkpoint.is_complete:
            found.append((checkpoint.step, checkpoint.path))
        else:  # never silently: a folder copied half-way, or one written before the marker existed
            marker = checkpoint.complete_marker
            log.warning(
                "%s: no %s marker, so not used as a checkpoint (touch %s if you trust it)", checkpoint.path, marker.name, marker
            )
    return found


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def remove_stale_temporaries(run_dir: Path) -> None:
    for p in RunDir(run_dir).temporaries():
        shutil.rmtree(p, ignore_errors=True)


def save_checkpoint(
    path: Path, model, model_state: dict, tokenizer, trainer_state: dict, optimizer_state: dict | None, model_card: str
) -> Path:
    """Write one complete checkpoint folder atomically. `model_state` is the full (gathered) state dict; `model_card`
    the README's text (crossbert_model.model_card: the caller knows the run). A full disk is an OSError naming the
    folder (nothing of it is left), whichever library was writing."""
    try:
        with atomic_path(path, is_dir=True) as tmp:
            model.save_pretrained(tmp, state_dict=model_state, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            write_portable_files(tmp, model.config)
            saved = CheckpointDir(tmp)
            atomic_write_text(saved.model_card, model_card)
            if optimizer_state is not None:
                torch.save(optimizer_state, saved.optimizer)
            atomic_write_json(saved.trainer_state, trainer_state)
            saved.complete_marker.write_text(f"step {trainer_state.get('step')}\n")  # last: everything above is written
    except (SafetensorError, RuntimeError) as e:
        raise quoted_os_error(e, path) or e from None
    return path


def _model_file(path: Path) -> Path:
    file = CheckpointDir(path).weights
    if not file.is_file():
        raise CheckpointError(f"{file}: missing (the checkpoint folder has no {file.name})")
    return file


def load_model_state(path: Path) -> dict:
    """The model state dict of a checkpoint; a truncated or corrupt file is a CheckpointError naming it."""
    return readers.read_safetensors(_model_file(path), CheckpointError)


def check_model_file(path: Path) -> None:
    """Open the model file's header (cheap: memory-mapped) so that a damaged file fails with its name,
    not deep inside transformers. safetensors checks that the header covers the whole file, which
    catches truncation."""
    readers.check_safetensors(_model_file(path), CheckpointError)


def nonfinite_tensors(named_tensors) -> list[str]:
    """The names of the floating-point tensors of (name, tensor) pairs that hold a NaN or an infinity."""
    return [name for name, t in named_tensors if t.is_floating_point() and not bool(torch.isfinite(t).all())]


def check_finite_weights(named_tensors, where: str) -> None:
    """Refuse weights with NaN or Inf (a diverged or damaged model): one line naming `where` and the first tensors."""
    bad = nonfinite_tensors(named_tensors)
    if bad:
        raise CheckpointError(
            f"{where}: {len(bad)} weight tensor(s) hold NaN or Inf ({', '.join(bad[:3])}"
            f"{', ...' if len(bad) > 3 else ''}): refused (a diverged or damaged model)"
        )


def read_trainer_state(path: Path) -> dict:
    return readers.read_json(CheckpointDir(path).trainer_state, "a trainer state (JSON written by the trainer)", CheckpointError)


def read_config(path: Path) -> CrossBertConfig:
    config_file = CheckpointDir(path).model_config
    if not config_file.is_file():
        raise CheckpointError(f"{path}: not a checkpoint folder (no {config_file.name})")
    data = readers.read_json(config_file, "a model config (config.json)", CheckpointError)
    if data.get("model_type") != CrossBertConfig.model_type:
        raise CheckpointError(
            f"{config_file}: model_type is {data.get('model_type')!r}, expected {CrossBertConfig.model_type!r} "
            "(a checkpoint written by crossbert_model)"
        )
    try:
        return CrossBertConfig.from_dict(data)
    except ValueError as e:  # a value config.py refuses (it raises plain ValueErrors: it travels inside checkpoints)
        raise CheckpointError(f"{config_file}: {e}") from None


def load_optimizer_state(path: Path) -> dict | None:
    file = CheckpointDir(path).optimizer
    if not file.is_file():
        return None
    return readers.read_torch_pickle(file, "an optimizer state", CheckpointError)


def pretraining_model_from_pretrained(path: str | Path):
    """The pre-training model (encoder + head or predictor) of a checkpoint, whatever its objective."""
    config = read_config(Path(path))
    check_model_file(Path(path))
    return from_pretrained(objective_of(config).model_class, path, trust_remote_code=False)
