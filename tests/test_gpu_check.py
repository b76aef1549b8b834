"""bench/gpu_check.py, the one prepared GPU script, runs on the CPU at tiny shapes (a machine with a GPU
runs exactly this code): every row is written the moment it is measured, a row that raises becomes an
error row and the rest go on, and a run killed half-way keeps every finished row."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture
def gpu_check(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_check

    return gpu_check


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_section_is_measured_and_an_injected_failure_is_one_error_row(gpu_check, tmp_path):
    # the nano shape: the same sections and rows as the tiny one that --smoke measures, at a quarter of the work
    result = gpu_check.main(
        ["--smoke", "--shapes", "nano", "--fail", "crossbert_r50_nocms", "--run-steps", "20", "--out", str(tmp_path)]
    )
    rows = read_rows(tmp_path / "gpu_check.jsonl")
    assert rows == json.loads(json.dumps(result["rows"], default=str))
    throughput = {r["contender"]: r for r in rows if r["section"] == "throughput"}
    assert set(throughput) == set(gpu_check.CONTENDERS)
    assert throughput["crossbert_r50_nocms"]["error"] == "RuntimeError: injected failure in crossbert_r50_nocms"
    measured = {n: r for n, r in throughput.items() if "error" not in r}
    assert len(measured) == 4 and all(r["sequence_tokens_per_s"] > 0 and r["mfu"] > 0 for r in measured.values())
    assert measured["crossbert_r50_cms"]["views"] == 2 and measured["crossbert_r75_cms"]["views"] == 4
    assert measured["flat_mlm30"]["step_ms_p90"] >= measured["flat_mlm30"]["step_ms_median"] > 0
    assert "flash" in measured["flat_mlm30"]["sdpa"]  # packed batches: SDPA's unmasked flash kernel
    assert measured["flat_mlm30"]["top_kernels"] and "top_kernels" not in measured["hf_bert_mlm30"]
    runs = [r for r in rows if r["section"] == "short_run"]
    assert [r["contender"] for r in runs] == ["flat_mlm30", "crossbert_r50_cms", "crossbert_r50_nocms"]
    assert all(r["finite"] and r["loss_falls"] for r in runs[:2]), runs
    assert "injected failure" in runs[2]["error"]  # the failing contender fails wherever it runs; the others go on
    loops = [r for r in rows if r["section"] == "trainer_loop"]
    assert [r["contender"] for r in loops] == ["flat_mlm30", "crossbert_r50_cms"]
    assert all(r["host_ms_per_batch"] > 0 and r["loop_ms_per_step"] > 0 for r in loops), loops
    assert [r["sentences_per_s"] > 0 for r in rows if r["section"] == "features"] == [True]
    table = (tmp_path / "gpu_check.md").read_text()
    assert table.startswith("# GPU check on cpu") and "ERROR" not in table and "injected failure" in table
    assert any(line.startswith("* eager: CrossBERT r=0.5 CMS vs eager flat MLM") for line in table.splitlines())


def test_a_run_killed_half_way_keeps_every_finished_row(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, str(BENCH / "gpu_check.py"), "--smoke", "--shapes", "nano", "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    jsonl = out / "gpu_check.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        if jsonl.exists() and len(jsonl.read_text().splitlines()) >= 4:  # state, peak and two throughput rows
            break
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    rows = read_rows(jsonl)  # every line whole: each row was written and synced in one piece
    assert len(rows) >= 4 and [r["section"] for r in rows[:3]] == ["gpu_state", "peak", "throughput"]
    assert all(r["section"] != "gpu_state" or r["name"] == "before" for r in rows)  # it never reached the end
    assert not (out / "gpu_check.md").exists()


def test_the_budget_skips_a_row_predicted_to_overrun(gpu_check, tmp_path):
    rows = gpu_check.RowLog(tmp_path / "rows.jsonl", time.perf_counter() - 100)  # 100 s already spent
    budget = gpu_check.Budget(rows, budget_s=150)
    assert budget.fits("base", "eager")  # 20 s guessed
    assert not budget.fits("base", "compiled")  # 90 s guessed for a first compile
    budget.record("base", "compiled", 30.0)
    assert budget.fits("base", "compiled") and not budget.fits("large", "compiled")  # a larger model: twice as long
    assert "--budget-s 150" in budget.skipped("large", "compiled")["skipped"]


def test_step_counts_default_per_mode_but_an_explicit_value_is_kept(gpu_check):
    smoke, full = gpu_check.parse_args(["--smoke"]), gpu_check.parse_args([])
    assert (smoke.warmup, smoke.steps, full.warmup, full.steps) == (1, 2, 5, 20)
    assert (smoke.shapes, full.shapes) == (["tiny"], ["base", "large"])  # the test's nano shape only when asked for
    assert gpu_check.parse_args(["--smoke", "--warmup", "2", "--steps", "3"]).warmup == 2
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--steps", "0"])
    with pytest.raises(SystemExit):  # the first step is the compile and the loss probe: one is needed
        gpu_check.parse_args(["--warmup", "0"])
