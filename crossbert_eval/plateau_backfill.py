"""`crossbert plateau SWEEP_DIR`: the unigram entropies of a sweep's runs trained before the trainer recorded them (the
one migration of old sweep folders; the report reads them beside checkpoints.jsonl)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from crossbert_model.args import ConfigError, load_config
from crossbert_model.plateau import SMOOTHING
from crossbert_model.train_config import model_config
from crossbert_model.readers import read_jsonl
from crossbert_model.utils import (
    atomic_write_text,
    data_root,
    set_offline_env,
)

from .folder_layout import SweepDir
from .sweep_config import SweepConfig
from .sweep_plan import plan_runs

log = logging.getLogger("crossbert.sweep")


def fill_unigram_entropies(
    root: str | Path, tokenizer: str | Path | None = None, overrides: list[str] | None = None, data_root_dir: str | None = None
) -> Path:
    """The unigram entropies (crossbert_model.plateau) of a sweep's runs trained before the trainer recorded
    them, into <root>/unigram_entropies.jsonl (with each run's own mask ratio), from which the report fills
    what checkpoints.jsonl lacks. Each run's config comes from the sweep's plan (sweep.yaml, `overrides` as
    key=value), its corpus is read with the tokenizer the runs were trained with: `tokenizer`, else
    <root>/tokenizer (a committed sweep's pinned copy), else the run's final checkpoint. The corpus is
    tokenized once if the token cache (the plan's data.cache_dir) lacks it; no model is loaded."""
    from crossbert_model.validation import unigram_entropies_for_run  # here: torch loads only for the command that fills

    set_offline_env()
    root, folder = Path(root), SweepDir(root)
    if not folder.config.is_file():
        raise ConfigError(f"{root}: not a sweep folder (no {folder.config.name}): nothing to fill")
    cfg = load_config(SweepConfig, folder.config, overrides)
    cfg.data_root = str(data_root(data_root_dir))  # this machine's: the recorded one may be another's
    final = {r["run"]: r for r in read_jsonl(folder.models) if r.get("step") == r.get("total_steps")}
    rows = []
    for run in [r for r in plan_runs(cfg) if r.key in final]:
        source = _trained_tokenizer(root, final[run.key], tokenizer)
        log.info("unigram entropies of %s (tokenizer %s)", run.key, source)
        entropies = unigram_entropies_for_run(run.train, source)
        ratio = model_config(run.train.model, run.train.data).mask_ratio
        rows.append({"run": run.key, "mask_ratio": ratio, **entropies, "tokenizer": str(source), "smoothing": SMOOTHING})
    atomic_write_text(folder.unigram_entropies, "".join(json.dumps(r) + "\n" for r in rows))
    return folder.unigram_entropies


def _trained_tokenizer(root: Path, final_row: dict, tokenizer: str | Path | None) -> Path:
    """The tokenizer a sweep's run was trained with: as given, the sweep's pinned copy, or its checkpoint's."""
    for candidate in (tokenizer, SweepDir(root).tokenizer, final_row.get("checkpoint")):
        if candidate is not None and (Path(candidate) / "tokenizer.json").is_file():
            return Path(candidate)
    raise ConfigError(
        f"{root}: no tokenizer for run {final_row['run']}: pass the folder its runs were trained with "
        f"(looked in {tokenizer or '(none given)'}, {root / 'tokenizer'}, {final_row.get('checkpoint')})"
    )
