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

import json
import logging
import pickle
import re
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from .config import CrossBertConfig
from .model_card import run_config_of, write_model_card
from .objectives import objective_of
from .portable import write_portable_files
from .remote_code import from_pretrained
from .utils import atomic_path, atomic_write_json
from .errors import CrossbertError, one_line, quoted_os_error

log = logging.getLogger(__name__)
STEP_DIR = re.compile(r"^step_(\d+)$")
COMPLETE_MARKER = "COMPLETE"


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
        if m and (p / COMPLETE_MARKER).exists():
            found.append((int(m.group(1)), p))
        elif m:  # never silently: a folder copied half-way, or one written before the marker existed
            log.warning("%s: no %s marker, so not used as a checkpoint (touch %s if you trust it)", p, COMPLETE_MARKER, p / COMPLETE_MARKER)
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
    """Write one complete checkpoint folder atomically. `model_state` is the full (gathered) state dict. A full
    disk is an OSError naming the folder (nothing of it is left), whichever library was writing."""
    try:
        with atomic_path(path, is_dir=True) as tmp:
            model.save_pretrained(tmp, state_dict=model_state, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            write_portable_files(tmp, model.config)
            write_model_card(tmp, model.config, trainer_state, run_config_of(path), run_name_of(path))
            if optimizer_state is not None:
                torch.save(optimizer_state, tmp / "optimizer.pt")
            atomic_write_json(tmp / "trainer_state.json", trainer_state)
            (tmp / COMPLETE_MARKER).write_text(f"step {trainer_state.get('step')}\n")  # last: everything above is written
    except (SafetensorError, RuntimeError) as e:
        raise quoted_os_error(e, path) or e from None
    return path


def run_name_of(checkpoint: Path) -> str:
    """runs/<name>/checkpoints/step_N -> <name>; any other folder: its own name."""
    checkpoint = Path(checkpoint)
    return checkpoint.parent.parent.name if checkpoint.parent.name == "checkpoints" else checkpoint.name


def _model_file(path: Path) -> Path:
    file = Path(path) / "model.safetensors"
    if not file.is_file():
        raise CheckpointError(f"{file}: missing (the checkpoint folder has no model.safetensors)")
    return file


def _unreadable(file: Path, error: Exception) -> CheckpointError:
    return CheckpointError(f"{file}: not a readable safetensors file (truncated or corrupt?): {error}")


def load_model_state(path: Path) -> dict:
    """The model state dict of a checkpoint; a truncated or corrupt file is a CheckpointError naming it."""
    file = _model_file(path)
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as e:
        raise _unreadable(file, e) from None


def check_model_file(path: Path) -> None:
    """Open the model file's header (cheap: memory-mapped) so that a damaged file fails with its name,
    not deep inside transformers. safetensors checks that the header covers the whole file, which
    catches truncation."""
    check_safetensors_file(_model_file(path))


def check_safetensors_file(file: Path) -> None:
    try:
        with safe_open(str(file), "pt"):
            pass
    except (SafetensorError, OSError, ValueError) as e:
        raise _unreadable(file, e) from None


def nonfinite_tensors(named_tensors) -> list[str]:
    """The names of the floating-point tensors of (name, tensor) pairs that hold a NaN or an infinity."""
    return [name for name, t in named_tensors if t.is_floating_point() and not bool(torch.isfinite(t).all())]


def check_finite_weights(named_tensors, where: str) -> None:
    """Refuse weights with NaN or Inf (a diverged or damaged model): one line naming `where` and the first tensors."""
    bad = nonfinite_tensors(named_tensors)
    if bad:
        raise CheckpointError(f"{where}: {len(bad)} weight tensor(s) hold NaN or Inf ({', '.join(bad[:3])}"
                              f"{', ...' if len(bad) > 3 else ''}): refused (a diverged or damaged model)")


def safetensors_tensors(file: Path):
    """(name, tensor) of every tensor of a safetensors file, read one at a time."""
    with safe_open(str(file), framework="pt") as f:
        for name in f.keys():
            yield name, f.get_tensor(name)


def read_trainer_state(path: Path) -> dict:
    file = Path(path) / "trainer_state.json"
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{file}: not a readable trainer state (expected JSON written by the trainer): {e}") from None


def read_config(path: Path) -> CrossBertConfig:
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{path}: not a checkpoint folder (no config.json)")
    try:
        data = json.loads(config_file.read_text())
    except ValueError as e:
        raise CheckpointError(f"{config_file}: not valid JSON (truncated or corrupt?): {e}") from None
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
    file = Path(path) / "optimizer.pt"
    if not file.is_file():
        return None
    return read_torch_tensors(file, "an optimizer state")


# What torch.load raises on a damaged file or one whose pickle asks for more than tensors (weights_only refuses it:
# pickle.UnpicklingError and its subclasses).
TORCH_LOAD_ERRORS = (RuntimeError, OSError, EOFError, ValueError, pickle.UnpicklingError)


def read_torch_tensors(file: Path, what: str):
    """The one reader of torch pickles: tensors and plain containers only (weights_only), anything else one line."""
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        blocked = re.search(r"unsupported GLOBAL (\S+)", str(e))
        raise CheckpointError(f"{file}: not {what} this tool can read: a pickle that asks to run code when loaded"
                              f"{f' ({blocked.group(1)})' if blocked else ''}, refused") from None
    except TORCH_LOAD_ERRORS as e:
        raise CheckpointError(f"{file}: not {what} this tool can read (truncated or corrupt?): {one_line(str(e))[:200]}") from None


def pretraining_model_from_pretrained(path: str | Path):
    """The pre-training model (encoder + head or predictor) of a checkpoint, whatever its objective."""
    config = read_config(Path(path))
    check_model_file(Path(path))
    return from_pretrained(objective_of(config).model_class, path, trust_remote_code=False)
