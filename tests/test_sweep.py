"""The sweep: planning by budget, a killed sweep that resumes to the same final tables, and workers that share
one sweep (run claims, a worker killed mid-run, runs as submitit jobs)."""

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from crossbert_model.args import ConfigError, deep_merge, dump_yaml, load_config
from crossbert_model.utils import append_jsonl, core_share
from crossbert_model.readers import read_jsonl
from crossbert_eval.layer_spec import LayerSpec
from crossbert_eval.sweep import Sweep
from crossbert_eval.sweep_config import SweepConfig
from crossbert_eval.sweep_plan import plan_runs

REPO = Path(__file__).resolve().parent.parent


def tiny_sweep(tmp_path: Path, corpus_args, name: str, **fields) -> Path:
    """A sweep of two nano runs (mlm, crossbert) on the test corpus; `fields` replace SweepConfig fields (`train`
    is merged into the sweep's own train section)."""
    cfg = SweepConfig(
        name=name,
        out_dir=str(tmp_path),
        sizes=["nano"],
        budget_tokens=16 * 8 * 64,
        train={
            "batch_size": 8,
            "eval_every": 8,
            "eval_sequences": 16,
            "dtype": "fp32",
            "num_threads": 1,
            "data": {
                "corpus": corpus_args.corpus,
                "vocab_size": corpus_args.vocab_size,
                "seq_len": corpus_args.seq_len,
                "max_documents": corpus_args.max_documents,
                "val_fraction": corpus_args.val_fraction,
                "cache_dir": corpus_args.cache_dir,
            },
            "optim": {"warmup_steps": 4},
        },
        probe_tasks=["SST-2", "STS-B"],
        max_probe_train=400,
        mteb_tasks=["STS16"],
        mteb_layers=LayerSpec.ALL,
    )
    cfg = dataclasses.replace(cfg, **{**fields, "train": deep_merge(cfg.train, fields.get("train", {}))})
    path = tmp_path / f"{name}.yaml"
    path.write_text(dump_yaml(cfg))
    return path


def _run(config: Path, **popen):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "crossbert_eval.sweep", str(config)], env=env, **popen)


def _completed_units(root: Path) -> dict:
    """Complete checkpoints, result rows and probed checkpoints a sweep folder holds."""
    from crossbert_model.checkpoint import list_checkpoints
    from crossbert_model.readers import read_jsonl

    return {
        "checkpoints": sum(len(list_checkpoints(run)) for run in (root / "runs").iterdir() if run.is_dir()),
        "results": len(read_jsonl(root / "results" / "results.jsonl")),
        "probed_checkpoints": len(read_jsonl(root / "checkpoints.jsonl")),
    }


def _final_scores(root: Path) -> pd.DataFrame:
    df = pd.read_csv(root / "tables" / "scores.csv")
    cols = ["run", "step", "task", "probe", "split", "layer", "metric", "value"]
    return df[cols].sort_values(cols[:-1]).reset_index(drop=True)


@pytest.mark.slow  # two tiny sweeps end to end (about 1-4 minutes on 2 cores); `make test-all`
def test_killed_sweep_resumes_to_the_tables_of_an_uninterrupted_one(tmp_path, corpus_args, corpus):
    straight = tiny_sweep(tmp_path, corpus_args, "straight")
    assert _run(straight, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).wait(timeout=900) == 0

    killed = tiny_sweep(tmp_path, corpus_args, "killed")
    proc = _run(killed, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    second_run_metrics = tmp_path / "killed" / "runs"
    deadline = time.time() + 600
    # kill while the SECOND run trains: the first is trained and probed, the second half-way
    while time.time() < deadline:
        started = [p for p in second_run_metrics.glob("*/metrics.jsonl") if p.stat().st_size > 0]
        if len(started) == 2 and (tmp_path / "killed" / "results" / "results.jsonl").exists():
            break
        assert proc.poll() is None, "the sweep ended before it could be killed during its second run"
        time.sleep(0.2)
    else:
        pytest.fail("the sweep never reached its second run")
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL  # killed, not finished
    # What the kill left is less than a finished sweep: the resume below has work to do.
    at_kill, finished = _completed_units(tmp_path / "killed"), _completed_units(tmp_path / "straight")
    assert at_kill["checkpoints"] <= finished["checkpoints"] and at_kill["results"] < finished["results"], (at_kill, finished)
    assert at_kill["probed_checkpoints"] < finished["probed_checkpoints"], (at_kill, finished)
    assert _run(killed, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).wait(timeout=900) == 0
    pd.testing.assert_frame_equal(_final_scores(tmp_path / "killed"), _final_scores(tmp_path / "straight"))
    for name in ("collapse", "layerwise", "training", "loss_vs_probe"):
        assert (tmp_path / "killed" / "plots" / f"{name}.png").exists()
    assert "## Final checkpoints by size" in (tmp_path / "killed" / "report.md").read_text()


@pytest.mark.parametrize("run_order", ["cheapest_first", "costliest_first"])
def test_plans_give_every_run_the_same_token_budget_in_the_asked_order_of_cost(run_order):
    cfg = load_config(SweepConfig, REPO / "configs/sweep/cpu_small.yaml", [f"run_order={run_order}"])
    runs = plan_runs(cfg)
    assert len(runs) == 12 and {r.size for r in runs} == {"nano", "tiny"} and {r.seed for r in runs} == {0, 1, 2}
    assert len({r.train.steps * r.train.batch_size * r.train.data.seq_len for r in runs}) == 1
    costs = [r.flops_per_token * r.train.steps for r in runs]
    assert costs == sorted(costs, reverse=run_order == "costliest_first")
    cheapest, costliest = (
        ("mlm-nano-s0", "crossbert-tiny-s2") if run_order == "cheapest_first" else ("crossbert-tiny-s0", "mlm-nano-s2")
    )
    assert (runs[0].key, runs[-1].key) == (cheapest, costliest)  # equal costs keep the config's order (seed 0 first)
    assert all(r.train.checkpoint_steps[-1] == r.train.steps for r in runs)


def test_each_of_several_workers_gets_its_share_of_the_cores_and_never_none(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert [core_share(n) for n in (1, 2, 3, 16, 32)] == [16, 8, 5, 1, 1]
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # unknown: one thread, not zero
    assert core_share(2) == 1


def test_a_wall_budget_is_refused_with_the_costliest_runs_first():
    with pytest.raises(ConfigError, match=r"sweep field 'run_order': expected cheapest_first with a wall budget"):
        plan_runs(load_config(SweepConfig, REPO / "configs/sweep/cpu_small.yaml", ["run_order=costliest_first", "budget_s=600"]))


def test_the_main_jobs_arms_share_one_embedding_draw_and_reproduce_bit_for_bit():
    runs = plan_runs(load_config(SweepConfig, REPO / "configs/sweep/cpu_small.yaml"))
    assert {(r.train.model.objective, r.train.model.embedding_init_std) for r in runs} == {("mlm", 1.0), ("crossbert", 1.0)}
    # a compiled step is reproduced bit for bit only when deterministic (results/cpu_small/README.md)
    assert all(r.train.deterministic for r in runs if r.train.compile)


def test_the_second_target_trains_both_objectives_at_two_sizes_with_crossberts_larger_embedding_draw():
    runs = plan_runs(load_config(SweepConfig, REPO / "configs/sweep/cpu_second_target.yaml"))
    assert {(r.train.model.objective, r.size, r.seed) for r in runs} == {
        (objective, size, seed) for objective in ("mlm", "crossbert") for size in ("tiny", "tiny4") for seed in (0, 1, 2)
    }
    assert {r.train.steps * r.train.batch_size * r.train.data.seq_len for r in runs} == {8_007_680}
    # the lever that takes CrossBERT off the plateau (results/escape_scan); flat MLM keeps the default draw here
    assert {r.train.model.objective: r.train.model.embedding_init_std for r in runs} == {"mlm": None, "crossbert": 1.0}


def test_the_width_ladder_compares_objectives_with_one_embedding_draw():
    runs = plan_runs(load_config(SweepConfig, REPO / "configs/sweep/cpu_width_ladder.yaml"))
    assert {(r.train.model.objective, r.size, r.seed) for r in runs} == {
        (objective, size, seed) for objective in ("mlm", "crossbert") for size in ("nano", "tiny", "mini") for seed in (0, 1, 2)
    }
    assert {r.train.steps * r.train.batch_size * r.train.data.seq_len for r in runs} == {8_007_680}
    assert {r.train.model.embedding_init_std for r in runs} == {1.0}


def test_compute_budget_gives_bigger_models_fewer_tokens():
    cfg = load_config(SweepConfig, REPO / "configs/sweep/cpu_small.yaml", ["budget=flops", "budget_flops=1e14"])
    tokens = {(r.objective.name, r.size): r.train.steps for r in plan_runs(cfg)}
    assert tokens[("mlm", "nano")] > tokens[("mlm", "tiny")] and tokens[("crossbert", "tiny")] < tokens[("mlm", "tiny")]


@pytest.mark.parametrize("config", sorted((REPO / "configs/sweep").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_sweep_config_resolves(config):
    assert plan_runs(load_config(SweepConfig, config))


def test_overrides_reach_into_the_free_form_train_section():
    cfg = load_config(
        SweepConfig,
        REPO / "configs/sweep/cpu_small.yaml",
        ["train.data.cache_dir=/tmp/x", "train.optim.lr=3e-4", "size_overrides={tiny: {optim: {lr: 7.0e-4}}}"],
    )
    assert cfg.train["data"]["cache_dir"] == "/tmp/x" and cfg.train["data"]["seq_len"] == 128
    runs = plan_runs(cfg)
    assert {r.train.data.cache_dir for r in runs} == {"/tmp/x"}
    assert {r.train.optim.lr for r in runs if r.size == "nano"} == {3e-4}
    assert {r.train.optim.lr for r in runs if r.size == "tiny"} == {7e-4}  # size_overrides win over the shared section


def test_the_reference_objective_must_be_one_of_the_sweeps_objectives():
    cfg = load_config(SweepConfig, REPO / "configs/sweep/cpu_small.yaml", ["reference_objective=crossbert"])
    assert plan_runs(cfg) and "reference_objective: crossbert" in dump_yaml(cfg)  # the report reads it from sweep.yaml
    assert load_config(SweepConfig, REPO / "configs/sweep/cpu_small.yaml").reference_objective is None  # the first listed
    bad = load_config(SweepConfig, REPO / "configs/sweep/cpu_small.yaml", ["reference_objective=bert"])
    with pytest.raises(
        ConfigError, match=r"sweep field 'reference_objective': expected one of the objectives \(mlm, crossbert\), got 'bert'"
    ):
        plan_runs(bad)


def test_probe_settings_are_checked_before_any_run_trains():
    with pytest.raises(ConfigError, match="feature_transforms.*expected one or more of raw, centred, whitened"):
        plan_runs(load_config(SweepConfig, REPO / "configs/sweep/cpu_small.yaml", ["feature_transforms=[raw, centered]"]))


class _TokenizerOfSize:
    """Stands in for the trained WordPiece: the vocabulary size and special ids the trainer reads."""

    def __init__(self, size: int):
        self.size = size
        self.pad_token_id, self.cls_token_id, self.sep_token_id, self.mask_token_id = 0, 2, 3, 4
        self.all_special_ids = [0, 1, 2, 3, 4]

    def __len__(self) -> int:
        return self.size


SHAPES = [
    [],
    ["train.model.hidden_size=512", "train.model.mlp_type=swiglu"],
    ["train.model.num_hidden_layers=6", "train.model.intermediate_size=1024"],
    ["train.model.norm_type=rmsnorm", "train.model.predictor_layers=4", "train.model.predictor_hidden_size=256"],
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "+".join(o.split(".")[-1] for o in s) or "preset")
def test_planned_flops_are_those_of_the_model_the_trainer_builds(shape):
    from crossbert_model.objectives import training_flops_per_token
    from crossbert_model.train_config import model_config

    cfg = load_config(SweepConfig, REPO / "configs/sweep/cpu_small.yaml", ["budget=flops", "budget_flops=1e14", *shape])
    for run in plan_runs(cfg):
        built = model_config(run.train.model, run.train.data, _TokenizerOfSize(run.train.data.vocab_size))
        assert run.flops_per_token == training_flops_per_token(built, run.train.data.seq_len), run.key


def test_compute_budget_plans_follow_shape_overrides():
    def steps(*overrides):
        cfg = load_config(SweepConfig, REPO / "configs/sweep/cpu_small.yaml", ["budget=flops", "budget_flops=1e14", *overrides])
        return {r.key: r.train.steps for r in plan_runs(cfg)}

    plans = [steps(*shape) for shape in SHAPES]
    for i, plan in enumerate(plans):
        for other in plans[i + 1 :]:
            assert plan["mlm-nano-s0"] != other["mlm-nano-s0"]
    assert plans[1]["mlm-nano-s0"] < plans[0]["mlm-nano-s0"]  # a wider swiglu model gets fewer tokens for the same FLOPs


def test_the_sweep_data_root_reaches_every_run(tmp_path):
    cfg = load_config(SweepConfig, REPO / "configs/sweep/cpu_small.yaml", [f"data_root={tmp_path}"])
    assert {r.train.data.data_root for r in plan_runs(cfg)} == {str(tmp_path)}
    cfg = load_config(SweepConfig, REPO / "configs/sweep/cpu_small.yaml")
    assert {r.train.data.data_root for r in plan_runs(cfg)} == {None}  # no sweep data_root: the runs' own lookup


def test_an_objective_carries_its_own_model_options(tmp_path):
    """The study's pure-mask MLM: mlm_mask_prob / mlm_random_prob reach that objective's runs only."""
    objectives = (
        "[{name: mlm15, objective: mlm, mask_ratio: 0.15}, "
        "{name: mlm50_pure, objective: mlm, mask_ratio: 0.5, model: {mlm_mask_prob: 1.0, mlm_random_prob: 0.0}}]"
    )
    cfg = load_config(SweepConfig, REPO / "configs/sweep/cpu_small.yaml", [f"objectives={objectives}"])
    corruption = {
        r.objective.name: (r.train.model.mask_ratio, r.train.model.mlm_mask_prob, r.train.model.mlm_random_prob)
        for r in plan_runs(cfg)
    }
    assert corruption == {"mlm15": (0.15, 0.8, 0.1), "mlm50_pure": (0.5, 1.0, 0.0)}
    bad = load_config(
        SweepConfig, REPO / "configs/sweep/cpu_small.yaml", ["objectives=[{name: x, objective: mlm, model: {mlm_mask_prb: 1.0}}]"]
    )
    with pytest.raises(ConfigError, match="mlm_mask_prb"):
        plan_runs(bad)


@pytest.mark.parametrize("every_s, reports", [(0.0, 12), (3600.0, 1)])
def test_the_report_is_rebuilt_as_often_as_asked_and_always_at_the_end(tmp_path, monkeypatch, every_s, reports):

    sweep, calls = _stub_sweep(tmp_path, monkeypatch, f"report_every_s={every_s}")
    sweep.run()
    assert calls[0] == ("baselines", None)  # before the first run: every report draws them
    assert [c for c, _ in calls].count("report") == reports and calls[-1] == ("report", None)
    assert [k for c, k in calls if c == "train"] == [k for c, k in calls if c == "probe"] == [r.key for r in sweep.runs]


def test_a_sweep_run_trained_before_unigram_entropies_were_recorded_gets_them_filled_in(tmp_path, corpus_args, corpus):
    """An old sweep's checkpoints.jsonl lacks the entropies and the own ratio: `crossbert plateau` computes them from
    the sweep's plan and the run's tokenizer, the same numbers the trainer records now, and the report reads them."""
    from crossbert_eval.report.loading import load_checkpoints
    from crossbert_eval.report.tables import plateau_table
    from crossbert_eval.plateau_backfill import fill_unigram_entropies
    from crossbert_model.train import train

    cfg = load_config(SweepConfig, tiny_sweep(tmp_path, corpus_args, "old"), ["budget_tokens=1024"])
    cfg.objectives = [o for o in cfg.objectives if o.objective == "crossbert"]
    (run,) = plan_runs(cfg)
    train(run.train)
    (cfg.root / "sweep.yaml").write_text(dump_yaml(cfg))
    checkpoint = run.train.run_dir / "checkpoints" / f"step_{run.train.steps:07d}"
    recorded = json.loads((checkpoint / "trainer_state.json").read_text())["metrics"]
    old_row = {
        "run": run.key,
        "objective": "crossbert",
        "size": "nano",
        "seed": 0,
        "step": run.train.steps,
        "total_steps": run.train.steps,
        "checkpoint": str(checkpoint),
        "params_non_embedding": 1,
        "shared_loss_r15": recorded["shared_loss_r15"],
        "shared_loss_r50": recorded["shared_loss_r50"],
    }
    (cfg.root / "checkpoints.jsonl").write_text(json.dumps(old_row) + "\n")

    (filled,) = read_jsonl(fill_unigram_entropies(cfg.root))
    assert filled["mask_ratio"] == 0.5 and filled["tokenizer"] == str(checkpoint)  # no pinned copy: the checkpoint's
    for key in ("unigram_entropy_val", "unigram_entropy_r15", "unigram_entropy_r50"):
        assert filled[key] == pytest.approx(recorded[key], rel=1e-12), key
    (row,) = plateau_table(load_checkpoints(cfg.root)).to_dict("records")
    assert row["unigram_entropy"] == pytest.approx(recorded["unigram_entropy_r50"], rel=1e-12)
    assert row["margin"] == pytest.approx(recorded["unigram_entropy_r50"] - recorded["shared_loss_r50"])
    assert row["off_plateau"] in ("yes", "no")  # known, no longer "unknown"

    # the encoder reliance of the same run, measured once for the sweep and joined onto its final checkpoint's row
    sweep = Sweep(cfg)
    sweep.record_reliance(run), sweep.record_reliance(run)
    (measured,) = read_jsonl(cfg.root / "encoder_reliance.jsonl")
    assert measured["run"] == run.key and measured["step"] == run.train.steps
    assert measured["reliance_unigram_entropy"] == pytest.approx(recorded["unigram_entropy_r50"], rel=1e-12)  # the same targets
    assert measured["reliance_loss"] == pytest.approx(recorded["shared_loss_r50"], rel=1e-4)  # the same protocol
    (row,) = plateau_table(load_checkpoints(cfg.root)).to_dict("records")
    assert row["margin"] <= 0  # two steps: above the unigram entropy, so the encoder rule has no margin to share out
    assert pd.isna(row["order_blind_share"]) and row["encoder_carries_context"] == "unknown"


# ------------------------------------------------------------------------------------------------
# Workers: several processes on one sweep, and its runs as submitit jobs
# ------------------------------------------------------------------------------------------------

RUNS_OF_TINY_SWEEP = {"mlm-nano-s0", "crossbert-nano-s0"}
WORKER_STEPS = 48


def worker_sweep(tmp_path: Path, corpus_args, name: str) -> Path:
    """The tiny sweep for workers: runs of 48 steps with a resume point every 12 (so a kill can land between
    two), every step logged; RTE probes on the final checkpoint, no geometry or mteb (claims are the subject)."""
    return tiny_sweep(
        tmp_path,
        corpus_args,
        name,
        budget_tokens=WORKER_STEPS * 8 * 64,
        checkpoint_fractions=[1.0],
        probe_tasks=["RTE"],
        geometry_tasks=[],
        mteb_tasks=[],
        worker_poll_s=1.0,
        report_every_s=3600.0,
        train={"log_every": 1},
    )


@pytest.fixture(scope="module")
def one_worker_sweep(tmp_path_factory, corpus_args, corpus) -> Path:
    """The worker sweep done by one process: what several workers must reproduce."""
    tmp = tmp_path_factory.mktemp("one-worker")
    assert _run(worker_sweep(tmp, corpus_args, "one"), stderr=subprocess.DEVNULL).wait(timeout=900) == 0
    return tmp / "one"


def _worker(config: Path, log: Path) -> subprocess.Popen:
    return _run(config, stdout=subprocess.DEVNULL, stderr=open(log, "w"))


def _trained(log: Path) -> Counter:
    """Runs a worker started (or resumed) training, from its log."""
    return Counter(re.findall(r"sweep \S+: training (\S+) \(", log.read_text()))


def _assert_every_step_once_and_nothing_lost(root: Path, reference: Path) -> None:
    from crossbert_model.checkpoint import list_checkpoints
    from crossbert_eval.results import duplicate_units

    for run in RUNS_OF_TINY_SWEEP:
        steps = [r["step"] for r in read_jsonl(root / "runs" / run / "metrics.jsonl") if "loss" in r]
        assert steps == list(range(1, WORKER_STEPS + 1)), (run, steps)  # each step once, in order
        assert WORKER_STEPS in [s for s, _ in list_checkpoints(root / "runs" / run)], run
    assert not duplicate_units(read_jsonl(root / "results" / "results.jsonl"))  # no probe unit computed twice
    assert {r["run"] for r in read_jsonl(root / "completed.jsonl")} == RUNS_OF_TINY_SWEEP
    assert not list((root / "claims").glob("*.json"))  # every claim released
    pd.testing.assert_frame_equal(_final_scores(root), _final_scores(reference))
    assert "## Final checkpoints by size" in (root / "report.md").read_text()


@pytest.mark.slow  # three tiny sweeps' worth of work (the one-worker reference included): minutes on 2 cores
def test_two_workers_on_one_sweep_train_each_run_once_and_give_one_workers_tables(tmp_path, corpus_args, one_worker_sweep):
    config = worker_sweep(tmp_path, corpus_args, "two")
    logs = [tmp_path / f"worker{i}.log" for i in range(2)]
    workers = [_worker(config, log) for log in logs]
    assert [w.wait(timeout=900) for w in workers] == [0, 0], [log.read_text()[-3000:] for log in logs]
    trained = [_trained(log) for log in logs]
    assert sum(trained, Counter()) == dict.fromkeys(RUNS_OF_TINY_SWEEP, 1), trained  # each run trained once, by one worker
    assert all(trained), trained  # the two shared the sweep
    _assert_every_step_once_and_nothing_lost(tmp_path / "two", one_worker_sweep)


def _worker_mid_training(root: Path, workers: list[subprocess.Popen]) -> tuple[subprocess.Popen, str]:
    """A worker and the run it holds, once that run has a resume point and no final checkpoint yet."""
    from crossbert_model.checkpoint import list_checkpoints

    deadline = time.time() + 600
    while time.time() < deadline:
        for claim in (root / "claims").glob("*.json"):
            with contextlib.suppress(OSError, ValueError):  # a claim renamed into place as we read
                owner = json.loads(claim.read_text())
                steps = [s for s, _ in list_checkpoints(root / "runs" / claim.stem)]
                worker = next((w for w in workers if w.pid == owner["pid"]), None)
                if worker and steps and WORKER_STEPS not in steps:
                    return worker, claim.stem
        assert all(w.poll() is None for w in workers), "a worker ended before one could be killed mid-run"
        time.sleep(0.05)
    pytest.fail("no worker was ever seen between two checkpoints of its run")


@pytest.mark.slow  # as above
def test_a_worker_killed_mid_run_leaves_its_run_to_the_other_which_resumes_it(tmp_path, corpus_args, one_worker_sweep):
    config = worker_sweep(tmp_path, corpus_args, "killed")
    logs = [tmp_path / f"worker{i}.log" for i in range(2)]
    workers = [_worker(config, log) for log in logs]
    victim, run = _worker_mid_training(tmp_path / "killed", workers)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    (survivor,) = [w for w in workers if w is not victim]
    survivor_log = logs[workers.index(survivor)]
    assert survivor.wait(timeout=900) == 0, survivor_log.read_text()[-3000:]
    # the survivor took the dead worker's run over and continued it from its latest resume point
    assert re.search(rf"taking over the stale claim of {run} \(pid {victim.pid} ", survivor_log.read_text())
    resumed = re.search(rf"resumed \S+/{run} from \S+ \(step (\d+) of {WORKER_STEPS}\)", survivor_log.read_text())
    assert resumed and int(resumed.group(1)) > 0, survivor_log.read_text()[-3000:]
    _assert_every_step_once_and_nothing_lost(tmp_path / "killed", one_worker_sweep)


@pytest.mark.slow  # one run trained and probed in a submitit job: about a minute on 2 cores
def test_a_run_launched_through_submitits_local_executor_lands_in_the_store(tmp_path, corpus_args, one_worker_sweep, monkeypatch):
    from crossbert_eval.launcher import submit_sweep

    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the job's process imports this checkout
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    only_mlm = "objectives=[{name: mlm, objective: mlm, mask_ratio: 0.15}]"
    cfg = load_config(SweepConfig, worker_sweep(tmp_path, corpus_args, "jobs"), [only_mlm, "submitit.cluster=local"])
    root = submit_sweep(cfg)
    (job_log,) = (root / "submitit").rglob("*_log.err")
    assert "sweep jobs: training mlm-nano-s0 (48 steps)" in job_log.read_text()  # trained in the job, not here
    assert [r["run"] for r in read_jsonl(root / "completed.jsonl")] == ["mlm-nano-s0"]
    reference = _final_scores(one_worker_sweep)
    pd.testing.assert_frame_equal(_final_scores(root), reference[reference.run == "mlm-nano-s0"].reset_index(drop=True))


# -- claims without training: the worker's decisions on a plan whose runs are stubs ---------------


def _stub_sweep(tmp_path: Path, monkeypatch, *overrides: str):
    """The main job's plan (12 runs) in tmp_path, with training, probing, baselines and the report replaced by a log of calls."""

    cfg = load_config(SweepConfig, REPO / "configs/sweep/cpu_small.yaml", [f"out_dir={tmp_path}", *overrides])
    sweep, calls = Sweep(cfg), []
    monkeypatch.setattr(sweep, "train_run", lambda run: calls.append(("train", run.key)))
    monkeypatch.setattr(sweep, "evaluate_run", lambda run: calls.append(("probe", run.key)))
    monkeypatch.setattr(sweep, "report", lambda: calls.append(("report", None)))
    monkeypatch.setattr(sweep, "compute_baselines", lambda: calls.append(("baselines", None)))
    return sweep, calls


def _claim_by(sweep, key: str, pid: int, host: str, renewed_s_ago: float = 0.0) -> None:
    """Another process's claim of a run, as its Claims would have written it."""
    sweep.claims.folder.mkdir(parents=True, exist_ok=True)
    when = time.time() - renewed_s_ago
    (sweep.claims.folder / f"{key}.json").write_text(json.dumps({"pid": pid, "host": host, "since": when, "heartbeat": when}))


def test_a_worker_takes_over_a_dead_workers_run_and_waits_for_a_live_ones(tmp_path, monkeypatch):
    import socket

    sweep, calls = _stub_sweep(tmp_path, monkeypatch, "worker_poll_s=0.2", "claim_lease_s=1.0")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    first, second = sweep.runs[0].key, sweep.runs[1].key
    started = time.monotonic()
    _claim_by(sweep, first, dead.pid, socket.gethostname())  # this host, process gone: taken over at once
    _claim_by(sweep, second, os.getppid(), "elsewhere")  # another host, renewed just now: left alone until its lease ends
    sweep.run()
    trained = [key for call, key in calls if call == "train"]
    assert trained == [r.key for r in sweep.runs if r.key != second] + [second]  # the live worker's run last
    assert time.monotonic() - started >= 1.0  # ... after its claim had gone unrenewed for the lease
    assert not sweep.pending() and not list(sweep.claims.folder.glob("*.json"))


def test_a_run_complete_under_other_probe_settings_is_probed_again(tmp_path, monkeypatch):
    sweep, _ = _stub_sweep(tmp_path, monkeypatch)
    sweep.run()
    assert not sweep.pending()
    # what only schedules or places the work (threads, polling, the report's pace) keeps the runs complete ...
    same, _ = _stub_sweep(tmp_path, monkeypatch, "train.num_threads=1", "worker_poll_s=5", "report_every_s=1", "batch_size=32")
    assert not same.pending()
    # ... a probe task more (or other probed checkpoints) makes every run due again; its done units are skipped
    more, calls = _stub_sweep(tmp_path, monkeypatch, "probe_tasks=[SST-2,STS-B,MRPC]")
    assert more.pending() == more.runs
    more.run()
    assert [k for c, k in calls if c == "probe"] == [r.key for r in more.runs]


def test_workers_finishing_together_rebuild_the_report_once(tmp_path, monkeypatch):
    import crossbert_eval.report.sweep_report

    cfg = load_config(SweepConfig, REPO / "configs/sweep/cpu_small.yaml", [f"out_dir={tmp_path}"])
    builds = []
    monkeypatch.setattr(crossbert_eval.report.sweep_report, "build_sweep_report", lambda root: builds.append(root))
    first, second = Sweep(cfg), Sweep(cfg)  # two workers
    first.report()
    second.report()  # nothing new since the first one's rebuild
    assert len(builds) == 1
    append_jsonl(second.results_dir / "results.jsonl", [{"unit": "u", "metric": "m", "value": 1.0}])
    second.report()
    assert len(builds) == 2


def test_a_held_claim_is_renewed_past_its_lease_and_released_after(tmp_path):
    from crossbert_model.claims import CLAIMED, Claims

    claims = Claims(tmp_path / "claims", tmp_path / ".lock", timeout_s=0.5)
    assert claims.claim("run") == CLAIMED
    with claims.held("run", heartbeat_s=0.1):
        time.sleep(1.0)
        seen_elsewhere = {**claims.owner("run"), "host": "elsewhere"}  # as a worker on another host reads it
        assert not claims.is_stale(seen_elsewhere)  # twice the lease old, but renewed
    assert claims.owner("run") is None  # released
    assert claims.claim("run") == CLAIMED
    time.sleep(0.6)
    assert claims.is_stale({**claims.owner("run"), "host": "elsewhere"})  # not renewed for the lease


def test_a_timed_out_job_drops_its_runs_claim_and_is_requeued(tmp_path):
    from submitit.helpers import DelayedSubmission

    from crossbert_eval.launcher import RunJob

    sweep = Sweep(load_config(SweepConfig, REPO / "configs/sweep/cpu_small.yaml", [f"out_dir={tmp_path}"]))
    key = sweep.runs[0].key
    sweep.claims.claim(key)
    requeued = RunJob().checkpoint(sweep.cfg, key)
    assert isinstance(requeued, DelayedSubmission) and requeued.args == (sweep.cfg, key)
    assert sweep.claims.owner(key) is None  # the requeued job, wherever it lands, takes the run at once
