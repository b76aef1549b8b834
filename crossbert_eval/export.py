"""`crossbert export RUN_OR_CHECKPOINT DIR [--push org/name]`: a clean folder of one checkpoint that loads where
this package is not installed, and optionally its upload to the Hugging Face Hub.

DIR holds the weights, config (with auto_map), tokenizer, the model code, sentence-transformers' files
(crossbert_model.portable) and a model card with the probe scores the results store holds for this checkpoint
(crossbert_model.model_card); not the optimizer state, the trainer state, the COMPLETE marker or any lock or
temporary file. It is written under a temporary name and renamed when whole. A run folder means its latest
complete checkpoint. An existing non-empty DIR is refused (export never overwrites).

--push needs the network, which this tool only uses when asked (CROSSBERT_ONLINE=1): offline, the command
refuses before writing anything and says how to upload.
"""

from __future__ import annotations

import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from crossbert_model.checkpoint import CheckpointError, check_finite_weights, latest_checkpoint, read_config, read_trainer_state
from crossbert_model.errors import SETTING, CrossbertError, named_as_final
from crossbert_model.model_card import run_config_of, write_model_card
from crossbert_model.portable import write_portable_files
from crossbert_model.readers import safetensors_tensors
from crossbert_model.run_layout import CheckpointDir, RunDir
from crossbert_model.utils import ONLINE_ENV, atomic_path, online

from .encoders import FrozenEncoder
from .model_names import hub_offline
from .results import ResultsStore

log = logging.getLogger(__name__)
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ExportError(CrossbertError):
    pass


@dataclass
class Exported:
    source: Path  # the checkpoint folder exported
    folder: Path
    files: list[str]
    probe_rows: int  # result rows of this checkpoint summarised in the model card
    url: str | None = None  # where --push put it


def checkpoint_to_export(spec: str | Path) -> Path:
    """A checkpoint folder, or a run folder's latest complete checkpoint."""
    path = Path(spec)
    if not path.is_dir():
        raise ExportError(f"{path}: no such folder (expected a run folder runs/<name> or a checkpoint folder)")
    if not CheckpointDir(path).model_config.is_file() and RunDir(path).checkpoints.is_dir():
        latest = latest_checkpoint(path)
        if latest is None:
            raise ExportError(f"{path}: the run holds no complete checkpoint yet")
        return latest[1]
    checkpoint = CheckpointDir(path)
    if checkpoint.run is not None and not checkpoint.is_complete:
        raise ExportError(
            f"{path}: an incomplete checkpoint (no {checkpoint.complete_marker.name} marker); export a complete one"
        )
    read_config(path)  # one line naming the file when it is not one of ours
    return path


def check_destination(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ExportError(f"{dest}: already exists and is not an empty folder; export writes a new folder (choose another DIR)")


def check_push(repo_id: str, dest: Path) -> None:
    """Refused before anything is written: a malformed id, or no network allowed."""
    if not REPO_ID.match(repo_id):
        raise ExportError(f"{SETTING} {repo_id!r}: expected a Hugging Face Hub id org/name", setting="push")
    if hub_offline() or not online():
        raise ExportError(
            f"{SETTING} {repo_id}: offline ({'HF_HUB_OFFLINE=1' if hub_offline() else ONLINE_ENV + ' is not 1'}), nothing "
            f"written; export without {SETTING}, then upload {dest} when online with `hf upload {repo_id} {dest}`, "
            f"or run again with {ONLINE_ENV}=1 (after `hf auth login`)",
            setting="push",
        )


def exported_files(checkpoint: Path) -> list[Path]:
    """The checkpoint's files an export copies: no training state, no hidden, lock or temporary file."""
    keep, training_only = [], set(CheckpointDir(checkpoint).training_state_files())
    for path in sorted(checkpoint.rglob("*")):
        name = path.relative_to(checkpoint).as_posix()
        hidden = any(part.startswith(".") for part in Path(name).parts)
        if path.is_file() and not hidden and path not in training_only and not name.endswith((".lock", ".tmp")):
            keep.append(path)
    return keep


def rows_of_checkpoint(checkpoint: Path, results_dir: str | Path | None) -> list[dict]:
    """Result rows of this checkpoint (the same weights fingerprint) in a results store; none without one."""
    if results_dir is None or not (Path(results_dir) / "results.jsonl").is_file():
        return []
    rows = ResultsStore(results_dir).rows()
    if not rows:
        return []
    fingerprint = FrozenEncoder.load(str(checkpoint)).fingerprint  # the identity every row carries
    return [r for r in rows if r.get("model_fingerprint") == fingerprint]


def export_checkpoint(
    spec: str | Path, dest: str | Path, results_dir: str | Path | None = None, push: str | None = None
) -> Exported:
    dest = Path(dest)
    checkpoint = checkpoint_to_export(spec)
    check_destination(dest)
    if push:
        check_push(push, dest)
    config = read_config(checkpoint)
    for weights in sorted(checkpoint.glob("*.safetensors")):  # never export (or push) a model with NaN or Inf weights
        check_finite_weights(safetensors_tensors(weights, CheckpointError), str(weights))
    trainer_state = read_trainer_state(checkpoint) if CheckpointDir(checkpoint).trainer_state.is_file() else {}
    rows = rows_of_checkpoint(checkpoint, results_dir)
    # a failed write names the file under DIR, not its temporary folder, nor (shutil.copyfile) the file copied from
    with atomic_path(dest, is_dir=True) as tmp, named_as_final(tmp, dest):
        for path in exported_files(checkpoint):
            target = tmp / path.relative_to(checkpoint)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        write_portable_files(tmp, config)  # a checkpoint saved before checkpoints carried them gets them here
        write_model_card(tmp, config, trainer_state, run_config_of(checkpoint), CheckpointDir(checkpoint).run_name, rows)
    files = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    exported = Exported(checkpoint, dest, files, len(rows))
    if push:
        exported.url = upload(dest, push)
    return exported


def upload(folder: Path, repo_id: str) -> str:
    """The folder uploaded to a (new or existing) model repository of the Hub; one line when that fails."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi()
    try:
        api.create_repo(repo_id, repo_type="model", exist_ok=True)
        commit = api.upload_folder(
            folder_path=str(folder), repo_id=repo_id, repo_type="model", commit_message=f"crossbert export of {folder.name}"
        )
    except (HfHubHTTPError, OSError) as e:  # OSError: no route to the hub (requests' ConnectionError is one)
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ExportError(
            f"{SETTING} {repo_id}: the upload failed ({first}); {folder} is written: upload it with "
            f"`hf upload {repo_id} {folder}` once the hub is reachable and you are logged in (`hf auth login`)",
            setting="push",
        ) from None
    return getattr(commit, "commit_url", None) or f"https://huggingface.co/{repo_id}"
