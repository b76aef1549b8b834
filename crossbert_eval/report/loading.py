"""Reading a sweep or zoo folder: its score rows, its checkpoints and the frames the tables are built from.

checkpoints.jsonl         one row per probed checkpoint (a zoo: per model): objective, size, step, params, tokens, FLOPs, losses
results/results.jsonl     every probe / geometry / mteb row (a committed reference: results.jsonl.xz)
unigram_entropies.jsonl   (optional) unigram entropies of runs trained before they were recorded
encoder_reliance.jsonl    one row per run: the encoder reliance of its final checkpoint (crossbert_model.reliance)
skipped.jsonl             runs skipped for a worker's wall budget (crossbert_eval.wall_budget)
baselines/results.jsonl   chance, majority-class and TF-IDF rows of each probed task (crossbert_eval.baselines)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from crossbert_model.args import read_yaml
from crossbert_model.errors import CrossbertError
from crossbert_model.shared_loss import SHARED_LOSS_KEYS
from crossbert_model.readers import read_jsonl

from ..baselines import baselines_path
from ..folder_layout import EvaluationFolder, SweepDir
from ..results import RESULTS_FILE, normalise_row, probe_variant, stored_file


GEOMETRY_PROBE = "geometry"  # crossbert_eval.geometry_runner.PROBE_NAME, without importing the encoders


class ReportError(CrossbertError, ValueError):
    """The report was asked of something that is not a sweep (or zoo) folder."""


# Loss columns of checkpoints.jsonl, native first; shared-protocol ones exist for checkpoints trained since they did.
LOSS_COLUMNS = ("val_loss", *SHARED_LOSS_KEYS.values())


def results_path(root: Path) -> Path:
    """The folder's score rows: results/results.jsonl, or its xz-compressed copy."""
    return stored_file(EvaluationFolder(root).results / RESULTS_FILE)


def read_result_rows(root: Path) -> list[dict]:
    """The sweep's score rows in today's shape (old rows: `versions` -> `packages`, string layers -> int)."""
    return [normalise_row(r) for r in read_jsonl(results_path(root))]


def load_checkpoints(root: Path) -> pd.DataFrame:
    """checkpoints.jsonl of a sweep: one row per probed checkpoint (tokens, FLOPs, losses, params), with the own mask
    ratio and unigram entropies of older runs filled in (`crossbert plateau SWEEP_DIR` writes them) and each run's
    encoder reliance (written by the sweep after a run's probes) joined onto its final checkpoint's row."""
    folder = SweepDir(root)
    checkpoints = pd.DataFrame(read_jsonl(folder.models))
    checkpoints = fill_by_run(checkpoints, pd.DataFrame(read_jsonl(folder.unigram_entropies)))
    return with_reliance(checkpoints, pd.DataFrame(read_jsonl(folder.reliance)))


def skipped_runs(root: Path, checkpoints: pd.DataFrame) -> pd.DataFrame:
    """The runs skipped for a wall budget (crossbert_eval.wall_budget) that have no probed final checkpoint since: the
    last skip of each."""
    skipped = pd.DataFrame(read_jsonl(SweepDir(root).skipped))
    if skipped.empty:
        return skipped
    done = set() if checkpoints.empty else set(checkpoints.loc[checkpoints["step"] == checkpoints["total_steps"], "run"])
    skipped = skipped.drop_duplicates("run", keep="last")
    return skipped[~skipped["run"].isin(done)][["run", "predicted_s", "left_s", "budget_s", "time"]].reset_index(drop=True)


def with_reliance(checkpoints: pd.DataFrame, reliance: pd.DataFrame) -> pd.DataFrame:
    """`checkpoints` with each run's encoder-reliance columns on the row of the checkpoint they were measured on."""
    if checkpoints.empty or reliance.empty:
        return checkpoints
    reliance = reliance.drop_duplicates(["run", "step"], keep="last")
    return checkpoints.merge(reliance, on=["run", "step"], how="left", suffixes=("", "_reliance"))


def fill_by_run(checkpoints: pd.DataFrame, filled: pd.DataFrame) -> pd.DataFrame:
    """The missing `mask_ratio` and `unigram_entropy_*` values of `checkpoints`, from `filled`'s row of the same run."""
    if checkpoints.empty or filled.empty:
        return checkpoints
    by_run = filled.drop_duplicates("run", keep="last").set_index("run")
    out = checkpoints.copy()
    for col in [c for c in by_run.columns if c == "mask_ratio" or c.startswith("unigram_entropy")]:
        values = pd.to_numeric(out["run"].map(by_run[col]), errors="coerce")
        out[col] = pd.to_numeric(out[col], errors="coerce").fillna(values) if col in out else values
    return out


def sweep_config(root: Path) -> dict:
    """The sweep's sweep.yaml as a mapping ({} where there is none)."""
    config = SweepDir(root).config
    return read_yaml(config) if config.is_file() else {}


# summary.json's key for a limited sweep's notice (`crossbert sweep --limit N`), which its verdict prints first.
SMOKE_TEST_KEY = "smoke_test"


def smoke_notice(sweep: dict) -> str | None:
    """What a limited sweep's report, summary.json and verdict say first (crossbert_eval.sweep_config.SweepConfig.limit);
    None for a real sweep."""
    limit = sweep.get("limit")
    if not limit:
        return None
    return (
        f"SMOKE TEST (`crossbert sweep --limit {limit}`): every run trained a few steps and every probe split was "
        f"capped at {limit} examples. Its numbers mean nothing; it shows only that every stage runs end to end."
    )


def reference_objective(sweep: dict) -> str | None:
    """The objective every other is compared with: the sweep config's `reference_objective`, else the first
    objective it lists (None: no sweep config, no objective comparisons)."""
    objectives = sweep.get("objectives") or []
    return sweep.get("reference_objective") or (objectives[0]["name"] if objectives else None)


def with_probe_variants(results: pd.DataFrame) -> pd.DataFrame:
    """`probe` named with its feature transform (results.probe_variant: `knn`, `knn (centred)`), so every table
    keeps the raw and the transformed scores of one probe apart, side by side."""
    if "feature_transform" not in results.columns:
        return results
    probes = [probe_variant(p, t) for p, t in zip(results["probe"], results["feature_transform"])]
    return results.assign(probe=probes).drop(columns="feature_transform")


# The columns of a result row that the report's tables read (the rest describe how it was computed).
RESULT_COLUMNS = (
    "model_fingerprint",
    "task",
    "family",
    "split",
    "probe",
    "feature_transform",
    "layer",
    "relative_depth",
    "pooling",
    "metric",
    "value",
    "is_main",
    "ci_low",
    "ci_high",
    "n_eval",
    "unit",
)


def result_frame(results: pd.DataFrame) -> pd.DataFrame:
    """Result rows as the report's tables read them: RESULT_COLUMNS (those present), each probe variant named
    (with_probe_variants), and only rows of a numbered layer, the layer an int end to end (tables sort 2 < 10, L6 not
    L6.0). Sweep and zoo reports both read their rows through it."""
    results = with_probe_variants(results[[c for c in RESULT_COLUMNS if c in results.columns]])
    if results.empty:
        return results
    layer = pd.to_numeric(results["layer"], errors="coerce")
    return results[layer.notna()].assign(layer=layer.dropna().astype(int))


def load_scores(root: Path, rows: list[dict] | None = None) -> pd.DataFrame:
    checkpoints = load_checkpoints(root)
    results = pd.DataFrame(read_result_rows(root) if rows is None else rows)
    if checkpoints.empty or results.empty:
        return pd.DataFrame()
    if "probe" in results.columns:  # geometry rows are not scores: load_geometry reads them
        results = results[results["probe"] != GEOMETRY_PROBE]
    results = result_frame(results)
    if results.empty:
        return pd.DataFrame()
    scores = results.merge(checkpoints.drop_duplicates("model_fingerprint"), on="model_fingerprint", how="inner")
    scores["is_final"] = scores["step"] == scores["total_steps"]
    scores["is_last_layer"] = scores["layer"] == scores["layers"]
    scores["score"] = 100 * scores["value"]
    for end in ("low", "high"):  # the bootstrap interval over evaluation examples, in points (mteb rows: none)
        scores[f"score_ci_{end}"] = 100 * pd.to_numeric(scores.get(f"ci_{end}", np.nan), errors="coerce")
    return scores


def load_baselines(root: Path) -> pd.DataFrame:
    """The folder's baseline rows (crossbert_eval.baselines), main metric, headline split, in points (`score`, `score_ci_low`,
    `score_ci_high`); empty where none were computed."""
    rows = read_jsonl(stored_file(baselines_path(root)))
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    frame = frame[frame["is_main"].astype(bool)]
    frame = frame.assign(score=100 * frame["value"], score_ci_low=100 * frame["ci_low"], score_ci_high=100 * frame["ci_high"])
    return headline_split(frame)[
        ["task", "family", "split", "baseline", "probe", "metric", "score", "score_ci_low", "score_ci_high", "n_train", "n_eval"]
    ].reset_index(drop=True)


def load_geometry(root: Path, rows: list[dict] | None = None) -> pd.DataFrame:
    """Geometry rows (probe="geometry") joined with their checkpoints; `score` is the raw metric value."""
    checkpoints = load_checkpoints(root)
    results = pd.DataFrame(read_result_rows(root) if rows is None else rows)
    if checkpoints.empty or results.empty or "probe" not in results.columns:
        return pd.DataFrame()
    keep = ["model_fingerprint", "task", "split", "probe", "layer", "relative_depth", "pooling", "metric", "value", "n_eval"]
    results = results[results["probe"] == GEOMETRY_PROBE]
    results = results[[c for c in keep if c in results.columns]]
    if results.empty:
        return pd.DataFrame()
    results = results.assign(layer=pd.to_numeric(results["layer"]).astype(int))
    geo = results.merge(checkpoints.drop_duplicates("model_fingerprint"), on="model_fingerprint", how="inner")
    geo["is_final"] = geo["step"] == geo["total_steps"]
    geo["is_last_layer"] = geo["layer"] == geo["layers"]
    geo["score"] = geo["value"]
    return headline_split(geo)


def headline_split(df: pd.DataFrame) -> pd.DataFrame:
    """One split per task: the last in sort order (test after validation) - what tables report."""
    last = df.groupby("task")["split"].transform("max")
    return df[df["split"] == last]
