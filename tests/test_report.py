"""The sweep report: aggregation over seeds, GLUE / MTEB averages, plots and pages from the sweep's files."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from crossbert_eval.report import ReportError, build_report
from crossbert_model.errors import CrossbertError

SIZES = {"nano": (2, 100_000), "tiny": (4, 400_000)}  # layers, non-embedding params


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _score(objective: str, size: str, seed: int, task: str, layer: int, step: int) -> float:
    """A deterministic, distinct value per cell so every aggregate can be recomputed by hand."""
    base = {"mlm": 0.6, "crossbert": 0.5}[objective] + 0.1 * list(SIZES).index(size)
    return round(base + 0.01 * seed + 0.001 * layer + 0.0001 * step + 0.02 * ("STS" in task), 6)


@pytest.fixture
def sweep_root(tmp_path):
    checkpoints, results = [], []
    tasks = [("SST-2", "glue", "linear"), ("STS-B", "glue", "linear"), ("STSBenchmark", "mteb:STS", "mteb"), ("Banking77Classification", "mteb:Classification", "mteb")]
    for objective in ("mlm", "crossbert"):
        for size, (layers, params) in SIZES.items():
            for seed in (0, 1):
                for step in (50, 100):
                    fp = f"{objective}-{size}-{seed}-{step}"
                    checkpoints.append({
                        "run": f"{objective}-{size}-s{seed}", "objective": objective, "size": size, "seed": seed, "step": step,
                        "total_steps": 100, "checkpoint": fp, "model_fingerprint": fp, "params_non_embedding": params,
                        "params_encoder": params, "hidden_size": 32, "layers": layers, "corpus_tokens": step * 1000,
                        "train_flops": step * 1000 * params * 6.0, "val_loss": 7.0 - 0.5 * layers - 0.1 * seed,
                    })  # fmt: skip
                    for task, family, probe in tasks:
                        for layer in range(layers + 1):
                            results.append({
                                "model_fingerprint": fp, "task": task, "family": family, "split": "validation" if probe != "mteb" else "test",
                                "probe": probe, "layer": layer, "relative_depth": layer / layers, "pooling": "mean",
                                "metric": "main", "value": _score(objective, size, seed, task, layer, step), "is_main": True,
                            })  # fmt: skip
    _write_jsonl(tmp_path / "checkpoints.jsonl", checkpoints)
    _write_jsonl(tmp_path / "results" / "results.jsonl", results)
    return tmp_path


def test_report_averages_over_seeds_with_their_spread(sweep_root):
    build_report(sweep_root)
    sizes = pd.read_csv(sweep_root / "tables" / "summary_by_size.csv")
    row = sizes[(sizes["objective"] == "mlm") & (sizes["size"] == "tiny")].iloc[0]
    assert row["seeds"] == 2
    per_seed = [100 * _score("mlm", "tiny", s, "SST-2", 4, 100) for s in (0, 1)]
    assert row["SST-2:linear"] == pytest.approx(np.mean(per_seed))
    assert row["SST-2:linear_std"] == pytest.approx(np.std(per_seed, ddof=1))
    glue = [np.mean([100 * _score("mlm", "tiny", s, t, 4, 100) for t in ("SST-2", "STS-B")]) for s in (0, 1)]
    assert row["glue_linear"] == pytest.approx(np.mean(glue))
    assert row["mteb_sts"] == pytest.approx(np.mean([100 * _score("mlm", "tiny", s, "STSBenchmark", 4, 100) for s in (0, 1)]))
    assert row["val_loss"] == pytest.approx(7.0 - 2.0 - 0.05)


def test_report_writes_every_plot_and_both_pages(sweep_root):
    report = build_report(sweep_root)
    for name in ("collapse", "loss_vs_probe", "layerwise", "training"):
        for ext in ("png", "svg"):
            assert (sweep_root / "plots" / f"{name}.{ext}").stat().st_size > 1000, name
    md = report.read_text()
    assert "plots/collapse.png" in md and "| mlm | tiny |" in md
    assert "<table>" in (sweep_root / "report.html").read_text()
    summary = pd.read_parquet(sweep_root / "tables" / "summary.parquet")
    assert len(summary) == 2 * 2 * 2 * 2  # objectives x sizes x seeds x checkpoints


def test_report_of_a_sweep_without_scores_writes_nothing(tmp_path):
    (tmp_path / "sweep.yaml").write_text("name: empty\n")
    assert build_report(tmp_path) is None
    assert not (tmp_path / "report.md").exists()


@pytest.mark.parametrize("make", [False, True])
def test_report_of_a_folder_that_is_no_sweep_is_a_user_error(tmp_path, make):
    folder = tmp_path / "nothing"
    if make:
        folder.mkdir()
    with pytest.raises(ReportError, match=r"nothing: not a sweep folder \(no results/results.jsonl or sweep.yaml\)") as e:
        build_report(folder)
    assert isinstance(e.value, CrossbertError)
    assert not folder.exists() or not list(folder.iterdir())  # nothing written


def _rewrite_results(root: Path, edit) -> None:
    path = root / "results" / "results.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    _write_jsonl(path, edit(rows))


def test_report_flags_units_written_twice(sweep_root):
    def duplicate_two(rows):
        for i, r in enumerate(rows):
            r["unit"] = f"u{i:05d}"
        return rows + [dict(rows[0]), dict(rows[1]), dict(rows[1])]

    _rewrite_results(sweep_root, duplicate_two)
    md = build_report(sweep_root).read_text()
    warning = next(line for line in md.splitlines() if "WARNING" in line)
    assert "2 unit(s) are in results/results.jsonl more than once (3 extra copies" in warning
    assert "u00000 (2x)" in warning and "u00001 (3x)" in warning


def test_clean_store_has_no_duplicate_warning(sweep_root):
    assert "WARNING" not in build_report(sweep_root).read_text()


def test_old_rows_with_versions_and_string_layers_still_report(sweep_root):
    """Rows written before provenance used `packages`, and with the layer as a string, read as today's."""
    def old_style(rows):
        return [{**r, "layer": str(r["layer"]), "versions": {"torch": "2.0"}} for r in rows]

    _rewrite_results(sweep_root, old_style)
    build_report(sweep_root)
    scores = pd.read_csv(sweep_root / "tables" / "scores.csv")
    assert scores["layer"].dtype.kind == "i" and scores["layer"].max() == 4
    sizes = pd.read_csv(sweep_root / "tables" / "summary_by_size.csv")
    row = sizes[(sizes["objective"] == "mlm") & (sizes["size"] == "tiny")].iloc[0]
    assert row["SST-2:linear"] == pytest.approx(np.mean([100 * _score("mlm", "tiny", s, "SST-2", 4, 100) for s in (0, 1)]))
