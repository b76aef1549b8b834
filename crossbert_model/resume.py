"""The resume policy of a training run: what a resume may change and what it must keep. A run folder is resumed
only with the config it was trained with (its config.yaml), except the keys the user allows on purpose
(`resume_allow_changes`, recorded in run_info.json), from checkpoints whose masks were drawn by this version's
scheme, and with the precision the run chose at its start (dtype=auto is decided once)."""

from __future__ import annotations

from pathlib import Path

import torch

from .args import ConfigError, deep_merge, read_yaml, to_dict
from .checkpoint import CheckpointError
from .hardware import resolve_precision
from .masking import MASKING_SCHEME
from .readers import read_json
from .run_layout import RunDir
from .train_config import TrainConfig, defining_changes


def read_saved_config(run_dir: Path) -> dict | None:
    saved_file = RunDir(run_dir).config
    return read_yaml(saved_file) if saved_file.exists() else None


def check_resume_compatible(run_dir: Path, cfg: TrainConfig) -> list[tuple[str, object, object]]:
    """Refuse to resume a run folder trained with other defining values, except the keys listed in
    `resume_allow_changes`; return those allowed changes as (key, saved, now)."""
    saved_file = RunDir(run_dir).config
    saved = read_saved_config(run_dir)
    if saved is None:
        return []
    # A key the saved config lacks was added to the tool since (e.g. model.mlm_mask_prob): that run was
    # trained with the key's default, so only a non-default value now is a change.
    saved = deep_merge(to_dict(TrainConfig()), saved)
    diffs = defining_changes(saved, to_dict(cfg))
    # Runs saved before dtype was resolved at start recorded only 'auto': whatever it resolves to now is that run's choice.
    diffs = [d for d in diffs if not (d[0] == "dtype" and d[1] == "auto")]
    allowed = [d for d in diffs if _change_allowed(d[0], cfg.resume_allow_changes)]
    refused = [d for d in diffs if not _change_allowed(d[0], cfg.resume_allow_changes)]
    if refused:
        listing = "; ".join(f"{k}: saved {a!r}, now {b!r}" for k, a, b in refused)
        keys = ",".join(k for k, _, _ in refused)
        raise ConfigError(
            f"{saved_file}: this run folder was trained with another config ({listing}). "
            f"To continue this run with the new value(s) on purpose, add resume_allow_changes=[{keys}]; "
            "otherwise use another `name=`/`out_dir=`, or `resume=false` after removing the folder."
        )
    return allowed


def _change_allowed(key: str, allowed: list[str]) -> bool:
    """`optim.lr` allows that key; a section (`optim`) allows every key under it."""
    return any(key == a or key.startswith(a + ".") for a in allowed)


def check_masking_scheme(path: Path, trainer_state: dict) -> None:
    """Refuse to resume from a checkpoint whose masks were drawn by another recipe: the continued run would
    be neither the one it started as nor a fresh one. Checkpoints written before the scheme was recorded
    drew with scheme 1 (one generator per step over the global batch)."""
    saved = trainer_state.get("masking_scheme", 1)
    if saved != MASKING_SCHEME:
        raise ConfigError(
            f"{path}: its run drew masks with masking scheme {saved}, this version draws scheme {MASKING_SCHEME} "
            f"(masks of rows drawn per row), so a resume would not continue the same run: finish it with the "
            f"revision that started it (git_revision {trainer_state.get('git_revision', '?')}) or start a new run (another name=)"
        )


def resolve_run_precision(cfg: TrainConfig, device: torch.device) -> dict:
    """The run's concrete dtype, decided once: a resume with dtype=auto keeps what the run chose."""
    saved = read_saved_config(cfg.run_dir) if cfg.resume else None
    saved_dtype = (saved or {}).get("dtype")
    if cfg.dtype == "auto" and saved_dtype in ("fp32", "bf16"):
        info_file = RunDir(cfg.run_dir).run_info
        before = read_json(info_file, "a run's run_info.json", CheckpointError).get("precision", {}) if info_file.exists() else {}
        return {
            "requested": "auto",
            "resolved": saved_dtype,
            "bf16_speedup": before.get("bf16_speedup"),
            "reason": f"resume: kept dtype {saved_dtype} of {RunDir(cfg.run_dir).config}",
        }
    return resolve_precision(cfg.dtype, device)
