"""A sweep folder seeded from a committed reference of it (`make reference` keeps scores, checkpoint rows and timings,
never the checkpoints): `crossbert sweep CONFIG --restore results/<study>` on a machine whose sweep folder is gone
adds only the runs the reference lacks, instead of training every run again.

A run counts as done in the reference when the reference's own sweep.yaml plans it with the same training config
(crossbert_model.train_config.defining_changes: the keys a resume refuses to change), the same probe settings (completion_signature)
and the reference holds its final checkpoint's row. Its scores, checkpoint rows, encoder reliance and timings are
copied and it is recorded complete, with the reference it came from; every other run is trained and probed as usual.
The folder is written whole or not at all, and a rerun of the same command goes on with the restored folder."""

from __future__ import annotations

import os
from pathlib import Path

from crossbert_model.args import ConfigError, load_config, to_dict
from crossbert_model.claims import this_process, timestamp
from crossbert_model.errors import SETTING
from crossbert_model.readers import read_jsonl
from crossbert_model.train_config import defining_changes
from crossbert_model.utils import atomic_path, exclusive_lock, json_text, lock_file_of

from .folder_layout import SweepDir
from .baselines import baselines_path
from .results import RESULTS_FILE, stored_file
from .sweep_config import SweepConfig
from .sweep_plan import RunSpec, completion_signature, plan_runs

RESTORED_FROM = "restored_from"  # the completed.jsonl field naming the reference a run was restored from


def restore_sweep(cfg: SweepConfig, reference: str | os.PathLike) -> list[str]:
    """Seed cfg's sweep folder with the runs `reference` completed; the keys of the runs restored. A folder this
    reference restored before is left as it is (the keys it restored then); any other folder that is not empty is
    refused (it may hold checkpoints or scores of its own)."""
    reference = Path(reference)
    source = SweepDir(reference)
    for needed in (source.config, source.models):
        if not needed.is_file():
            raise ConfigError(
                f"{SETTING}: {reference} is not a reference of a sweep ({needed} is missing; `make reference` writes it)",
                setting="reference",
            )
    reference_cfg = load_config(SweepConfig, source.config)  # a damaged reference is refused before anything is written
    target = SweepDir(cfg.root)
    target.path.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(lock_file_of(target.path), waiting=f"waiting for another worker's restore of {target.path}"):
        return _restore_into(target, source, reference, cfg, reference_cfg)


def _restore_into(target: SweepDir, source: SweepDir, reference: Path, cfg: SweepConfig, reference_cfg: SweepConfig) -> list[str]:
    done_here = read_jsonl(target.completed)
    if restored_before := [row["run"] for row in done_here if row.get(RESTORED_FROM) == str(reference)]:
        return restored_before
    if target.path.exists() and any(target.path.iterdir()):
        raise ConfigError(
            f"{SETTING}: {target.path} already holds runs of its own; restore only into a new sweep folder "
            f"(another name= or out_dir=), or run the sweep without {SETTING}",
            setting="reference",
        )
    restored = done_runs(cfg, reference_cfg, source)
    if restored:
        _write_restored(target, source, restored, cfg)
    return [run.key for run in restored]


def done_runs(cfg: SweepConfig, reference_cfg: SweepConfig, source: SweepDir) -> list[RunSpec]:
    """The runs of cfg's plan that the reference trained the same way, probed the same way and finished."""
    theirs = {run.key: run for run in plan_runs(reference_cfg)}
    finished = {(row.get("run"), row.get("step")) for row in read_jsonl(source.models)}
    done = []
    for run in plan_runs(cfg):
        same = theirs.get(run.key)
        if (
            same is not None
            and (run.key, run.train.steps) in finished
            and completion_signature(cfg, run) == completion_signature(reference_cfg, same)
            and not defining_changes(to_dict(same.train), to_dict(run.train))
        ):
            done.append(run)
    return done


def _write_restored(target: SweepDir, source: SweepDir, runs: list[RunSpec], cfg: SweepConfig) -> None:
    keys = {run.key for run in runs}
    models = [row for row in read_jsonl(source.models) if row.get("run") in keys]
    fingerprints = {row["model_fingerprint"] for row in models}
    copies = {
        target.results / RESULTS_FILE: [
            r for r in read_jsonl(stored_file(source.results / RESULTS_FILE)) if r.get("model_fingerprint") in fingerprints
        ],
        baselines_path(target.path): read_jsonl(stored_file(baselines_path(source.path))),
        target.models: models,
        target.reliance: [r for r in read_jsonl(source.reliance) if r.get("run") in keys],
        target.unigram_entropies: [r for r in read_jsonl(source.unigram_entropies) if r.get("run") in keys],
        target.timings: [r for r in read_jsonl(source.timings) if r.get("run") in keys],
        target.completed: [
            {
                "run": run.key,
                "signature": completion_signature(cfg, run),
                RESTORED_FROM: str(source.path),
                **this_process(),
                "time": timestamp(),
            }
            for run in runs
        ],
    }
    with atomic_path(target.path, is_dir=True) as tmp:
        for path, rows in copies.items():
            if rows:
                staged = tmp / path.relative_to(target.path)
                staged.parent.mkdir(parents=True, exist_ok=True)
                staged.write_text("".join(json_text(row) + "\n" for row in rows), encoding="utf-8")
