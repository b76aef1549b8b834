"""`crossbert sweep CONFIG --limit N`: a smoke test of the whole pipeline (a few training steps a run, at most N examples
per probe split) into a folder of its own, whose every output says its numbers mean nothing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crossbert_eval.sweep_config import LIMIT_SEEDS, LIMIT_STEPS, SweepConfig
from crossbert_eval.sweep_plan import plan_runs
from crossbert_model.args import ConfigError, dump_yaml, load_config
from crossbert_model.readers import read_jsonl

from test_sweep import tiny_sweep

REPO = Path(__file__).resolve().parent.parent
MAIN_JOB = REPO / "configs/sweep/cpu_small.yaml"


def test_a_limited_sweep_gets_a_folder_of_its_own_and_a_few_uncompiled_steps_a_run_of_every_objective_and_size(tmp_path):
    full = load_config(SweepConfig, MAIN_JOB)
    limited = load_config(SweepConfig, MAIN_JOB, ["limit=200"])
    assert limited.root.name == "cpu_small-limit200" and full.root.name == "cpu_small"
    # its sweep.yaml, loaded again (a resumed smoke run), names the same folder
    (tmp_path / "sweep.yaml").write_text(dump_yaml(limited))
    assert load_config(SweepConfig, tmp_path / "sweep.yaml").root == limited.root
    runs, full_runs = plan_runs(limited), plan_runs(full)
    # the main job's runs at its first LIMIT_SEEDS seeds: every objective and size, and seeds enough for the test over seeds
    assert {r.key for r in runs} == {r.key for r in full_runs if r.seed in full.seeds[:LIMIT_SEEDS]} and LIMIT_SEEDS >= 2
    full_steps = {r.train.steps for r in full_runs}
    assert all(r.train.steps == LIMIT_STEPS < min(full_steps) for r in runs)
    assert all(r.train.checkpoint_steps == [LIMIT_STEPS] and r.train.checkpoint_every == 0 and not r.train.compile for r in runs)
    assert all(r.train.eval_sequences <= 200 for r in runs)


@pytest.mark.parametrize("value", [0, -3])
def test_a_limit_that_is_not_a_positive_integer_is_refused_by_name(value):
    with pytest.raises(ConfigError, match=rf"sweep field 'limit': expected a positive integer .*got {value}"):
        plan_runs(load_config(SweepConfig, MAIN_JOB, [f"limit={value}"]))


def test_the_command_line_refuses_a_bad_limit_in_one_line_and_writes_nothing(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "crossbert_eval.cli", "sweep", str(MAIN_JOB), "--limit", "0", f"out_dir={tmp_path}"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert out.returncode == 2 and "--limit" in out.stderr and "expected a positive integer" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not any(tmp_path.iterdir())


@pytest.mark.slow  # two nano runs trained, probed, measured and reported (about 1 minute on 2 cores); `make test-all`
def test_a_limited_sweep_runs_every_stage_on_capped_splits_and_says_it_is_a_smoke_test(tmp_path, corpus_args, corpus):
    limit = 60
    config = tiny_sweep(
        tmp_path,
        corpus_args,
        "smoke",
        budget_tokens=4 * LIMIT_STEPS * 8 * 64,
        geometry_tasks=["SST-2"],
        mteb_tasks=["STSBenchmark"],
    )
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-m", "crossbert_eval.cli", "sweep", str(config), "--limit", str(limit)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    root = tmp_path / f"smoke-limit{limit}"
    assert root.is_dir() and not (tmp_path / "smoke").exists()  # never mixed with a real sweep's folder

    # every stage ran: trained (LIMIT_STEPS steps), probed, geometry, mteb, encoder reliance, report
    plan = json.loads((root / "plan.json").read_text())["runs"]
    assert {r["steps"] for r in plan} == {LIMIT_STEPS}
    stages = {r["stage"] for r in read_jsonl(root / "timings.jsonl")}
    assert {"train", "probe", "geometry", "mteb", "reliance", "report"} <= stages
    assert len(read_jsonl(root / "encoder_reliance.jsonl")) == len(plan)

    # the probe splits were capped: N examples of each training split, N of each evaluation split
    rows = [r for r in read_jsonl(root / "results" / "results.jsonl") if r["probe"] in ("linear", "knn")]
    assert rows and {r["task"] for r in rows} == {"SST-2", "STS-B"}
    assert max(r["n_train"] for r in rows) == limit and max(r["n_eval"] for r in rows) == limit
    assert all(r["protocol"]["max_eval"] == limit for r in rows)

    # every output says it is a smoke test: report.md's first lines, summary.json, the final printed verdict
    notice = "Its numbers mean nothing"
    assert notice in "\n".join((root / "report.md").read_text().splitlines()[:3])
    assert notice in json.loads((root / "summary.json").read_text())["smoke_test"]
    assert notice in out.stderr.split(" verdict:\n", 1)[1].splitlines()[0]  # the verdict's first line
    assert "mean nothing" in out.stdout.strip().splitlines()[-1]  # and the command's last
