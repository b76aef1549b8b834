"""The GPU Figure 1 sweep (configs/sweep/gpu_figure1.yaml) and what it relies on: the wall budget that skips the runs
that no longer fit, the machine checks made before the first step, and a rehearsal of the sweep itself on a CPU at
nano shape through the same `crossbert sweep`, killed half-way and resumed under a budget."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crossbert_model.args import ConfigError, dump_yaml, load_config
from crossbert_model.readers import read_jsonl
from crossbert_eval.sweep_config import SweepConfig
from crossbert_eval.sweep_plan import check_machine
from crossbert_eval.wall_budget import PREDICTION_MARGIN, REPORT_RESERVE_S, RunCost, WallBudget, measured_rates, predicted_seconds

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "sweep" / "gpu_figure1.yaml"


# -- the wall budget ---------------------------------------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


COSTS = {
    "a": RunCost("a", train_flops=1e12, done_fraction=0.0, hidden_size=64),
    "b": RunCost("b", train_flops=4e12, done_fraction=0.0, hidden_size=128),
    "c": RunCost("c", train_flops=4e12, done_fraction=0.5, hidden_size=64),
}
# run a trained in 100 s (two rows: a resumed training), evaluated in 20 + 10 s
TIMINGS = [
    {"stage": "train", "run": "a", "seconds": 60.0},
    {"stage": "train", "run": "a", "seconds": 40.0},
    {"stage": "probe", "run": "a", "seconds": 20.0},
    {"stage": "reliance", "run": "a", "seconds": 10.0},
    {"stage": "sweep", "run": "(sweep)", "seconds": 999.0},
]


def test_a_runs_time_is_predicted_from_the_measured_seconds_per_flop_and_the_longest_evaluation():
    rates = measured_rates(TIMINGS, COSTS)
    assert rates.seconds_per_flop == pytest.approx(100 / 1e12) and rates.evaluation_s == 30.0
    # four times the FLOPs, twice as wide: 400 s of training, the evaluation scaled by the width
    assert predicted_seconds(COSTS["b"], rates) == pytest.approx(PREDICTION_MARGIN * (400 + 60))
    # half trained already: only the rest of its training is predicted; as wide as the measured run
    assert predicted_seconds(COSTS["c"], rates) == pytest.approx(PREDICTION_MARGIN * (200 + 30))


def test_nothing_is_predicted_before_a_run_is_timed_and_the_first_run_goes_while_time_is_left():
    clock = Clock()
    budget = WallBudget(REPORT_RESERVE_S + 10, clock)
    assert budget.verdict(COSTS["b"], [], COSTS) == (True, None, pytest.approx(10.0))
    clock.now += 11  # the report's reserve is all that is left
    assert budget.verdict(COSTS["a"], [], COSTS)[0] is False


def test_a_run_predicted_past_the_budget_is_refused_and_one_inside_it_is_not():
    budget = WallBudget(REPORT_RESERVE_S + 300, Clock())
    fits, predicted, left = budget.verdict(COSTS["c"], TIMINGS, COSTS)
    assert fits and predicted == pytest.approx(PREDICTION_MARGIN * 230) and left == pytest.approx(300)
    fits, predicted, _ = budget.verdict(COSTS["b"], TIMINGS, COSTS)
    assert not fits and predicted == pytest.approx(PREDICTION_MARGIN * 460)


@pytest.mark.parametrize("value", [0, -5, "soon", float("nan"), True])
def test_a_budget_that_is_not_a_positive_number_of_seconds_is_refused_before_anything_runs(value, tmp_path):
    from crossbert_eval.sweep_plan import plan_runs

    with pytest.raises(ConfigError, match=r"budget_s'?: expected (a positive number of seconds|float)"):
        plan_runs(load_config(SweepConfig, REPO / "configs/sweep/cpu_small.yaml", [f"out_dir={tmp_path}", f"budget_s={value}"]))


# -- what the machine must have --------------------------------------------------------------------------------------


def test_a_sweep_that_names_a_cuda_device_is_refused_on_a_machine_without_one(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = load_config(SweepConfig, CONFIG)
    with pytest.raises(ConfigError, match=r"^sweep field 'device': expected a machine with a CUDA GPU"):
        check_machine(cfg)


def test_a_missing_optional_package_is_refused_or_left_out_as_the_config_says(monkeypatch, caplog):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("faiss", "mteb") else real(name, *a))
    cfg = load_config(SweepConfig, REPO / "configs/sweep/cpu_small.yaml")
    with pytest.raises(
        ConfigError, match=r"^sweep field 'probes': the kNN probe needs the package faiss, which is not installed"
    ):
        check_machine(cfg)
    cfg.missing_packages = "leave_out"
    check_machine(cfg)
    assert "knn" not in cfg.probes and "linear" in cfg.probes and cfg.mteb_tasks == []
    left_out = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(left_out) == 2 and "the package faiss is not installed" in left_out[0]


# -- the rehearsal -----------------------------------------------------------------------------------------------------


def _rehearsal(tmp_path: Path, corpus_args, real_data_root, **fields) -> Path:
    """gpu_figure1.yaml at nano shape on the test corpus: 12 fp32 steps per run, uncompiled, on this machine."""
    overrides = [
        f"out_dir={tmp_path}",
        "sizes=[nano]",
        "device=null",
        f"data_root={real_data_root}",
        f"budget_tokens={12 * 8 * 64}",
        "max_probe_train=300",
        "batch_size=128",
        "train.batch_size=8",
        "train.compile=false",
        "train.dtype=fp32",
        "train.num_threads=1",
        "train.log_every=1",
        "train.eval_every=6",
        "train.eval_sequences=16",
        "train.checkpoint_every=6",
        "train.data.tokenizer=train",
        f"train.data.corpus={corpus_args.corpus}",
        f"train.data.vocab_size={corpus_args.vocab_size}",
        f"train.data.seq_len={corpus_args.seq_len}",
        f"train.data.max_documents={corpus_args.max_documents}",
        f"train.data.val_fraction={corpus_args.val_fraction}",
        f"train.data.cache_dir={corpus_args.cache_dir}",
        *(f"{k}={v}" for k, v in fields.items()),
    ]
    cfg = load_config(SweepConfig, CONFIG, overrides)
    path = tmp_path / "rehearsal.yaml"
    path.write_text(dump_yaml(cfg))
    return path


def _sweep(config: Path, log: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, "-m", "crossbert_eval.sweep", str(config)], env=env, stdout=subprocess.DEVNULL, stderr=open(log, "w")
    )


def _every_line_whole(path: Path) -> list[dict]:
    text = path.read_text()
    assert text.endswith("\n"), f"{path}: a half-written last line"
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.slow  # a sweep of nano runs trained, killed, resumed and reported (about 70 s on an idle 2-core machine)
def test_the_gpu_sweep_rehearsed_on_a_cpu_writes_every_row_kind_survives_a_kill_and_skips_what_its_budget_cannot_fit(
    tmp_path, corpus_args, corpus, real_data_root
):
    root = tmp_path / "gpu_figure1"
    first, second, third = "mlm-nano-s0", "crossbert-rotary-emb1-nano-s0", "crossbert-encoder-emb1-nano-s0"  # cheapest first
    proc = _sweep(_rehearsal(tmp_path, corpus_args, real_data_root), tmp_path / "first.log")
    deadline = time.time() + 300
    while time.time() < deadline:  # kill -9 once the first run is probed and the second has started training
        done = (
            any(r.get("run") == first for r in read_jsonl(root / "completed.jsonl"))
            if (root / "completed.jsonl").exists()
            else False
        )
        if done and (root / "runs" / second / "metrics.jsonl").exists():
            break
        assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        time.sleep(0.1)
    else:
        pytest.fail("the rehearsal never reached its second run")
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL

    # the finished run's rows are whole, every kind the GPU run writes
    (checkpoint,) = [r for r in _every_line_whole(root / "checkpoints.jsonl") if r["run"] == first]
    rows = [
        r
        for r in _every_line_whole(root / "results" / "results.jsonl")
        if r["model_fingerprint"] == checkpoint["model_fingerprint"]
    ]
    kinds = {(r["task"], r["probe"], r.get("feature_transform", "raw")) for r in rows}
    for task in ("SST-2", "STS-B", "BigramShift"):
        assert (task, "linear", "raw") in kinds, task
    assert ("STS-B", "cosine", "raw") in kinds and ("STS-B", "cosine", "whitened") in kinds
    assert {r["layer"] for r in rows} == {0, 1, 2}  # every layer
    (reliance,) = [r for r in _every_line_whole(root / "encoder_reliance.jsonl") if r["run"] == first]
    assert reliance["step"] == checkpoint["total_steps"] and "reliance_loss_order_blind" in reliance
    assert {"train", "reliance"} <= {r["stage"] for r in _every_line_whole(root / "timings.jsonl") if r["run"] == first}

    # resumed under a budget that leaves no room for the second run once the first has been timed: skipped, recorded,
    # and the report built from what finished
    config = _rehearsal(tmp_path, corpus_args, real_data_root, budget_s=REPORT_RESERVE_S + 0.5)
    resumed = _sweep(config, tmp_path / "second.log")
    assert resumed.wait(timeout=300) == 0, (tmp_path / "second.log").read_text()[-3000:]
    skipped = read_jsonl(root / "skipped.jsonl")
    assert [s["run"] for s in skipped] == [second, third] and all(s["predicted_s"] > s["left_s"] for s in skipped)
    assert f"skipping {second} for the wall budget" in (tmp_path / "second.log").read_text()
    report = (root / "report.md").read_text()
    assert "Not in this report: 2 run(s) skipped for the sweep's wall budget" in report and second in report and third in report
    assert (root / "tables" / "plateau.csv").exists() and (root / "tables" / "encoder_reliance.csv").exists()
    assert (root / "plots" / "collapse.png").exists()
