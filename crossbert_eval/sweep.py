"""Scale sweeps: objectives x sizes x seeds, trained on one budget, every checkpoint probed frozen.

    crossbert sweep configs/sweep/cpu_small.yaml [key=value ...]
    torchrun --nproc_per_node 8 -m crossbert_eval.sweep configs/sweep/gpu_base.yaml

Order: runs are sorted by training cost (run_order: cheapest or costliest first), and each run is probed (final checkpoint first, then the
earlier ones) as soon as it is trained, so partial results are useful early. Everything is resumable:
a run's training resumes from its latest checkpoint, probe and mteb units already in the results
store are skipped, and tables / plots / report are rebuilt from the store as runs finish (every report_every_s) and at the end.

Every `crossbert sweep` process is a worker: started several times on one sweep (one machine, or many
sharing its filesystem), the processes split its runs. A worker claims a run (crossbert_model.claims:
`claims/<run>.json`, renewed by a heartbeat) before training and probing it, skips runs other live
workers hold, takes over the run of a worker that died (its training resumes from the latest checkpoint),
records the run in `completed.jsonl` when done, and waits while others hold the remaining runs; the
report is rebuilt at the end by each worker unless its inputs are unchanged since the last rebuild.
`crossbert_eval.launcher` submits one cluster job per run through submitit instead.
Under torchrun all ranks train every run (no claims); rank 0 alone probes, after the last run is trained.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from crossbert_model.args import ConfigError, config_main, dump_yaml
from crossbert_model.checkpoint import list_checkpoints, read_trainer_state
from crossbert_model.claims import CLAIMED, Claims, this_process, timestamp
from crossbert_model.objectives import parameter_counts
from crossbert_model.plateau import plateau_metric_keys
from crossbert_model.logs import duration
from crossbert_model.train_config import model_config
from crossbert_model.errors import report_crashes_in
from crossbert_model.readers import ReadError, read_json, read_jsonl
from crossbert_model.utils import (
    append_jsonl,
    atomic_write_json,
    atomic_write_text,
    exclusive_lock,
    provenance,
)

from .evaluation import ModelRecord, ModelRecords, evaluate_baselines, evaluate_encoder, timed_stage
from .folder_layout import SweepDir
from .results import RESULTS_FILE
from .report.loading import SMOKE_TEST_KEY
from .wall_budget import PREDICTION_MARGIN, RunCost, WallBudget, measured_rates, predicted_seconds
from .sweep_config import SweepConfig
from .sweep_plan import RunSpec, check_tasks, completion_signature, evaluation_plan, plan_runs, prepare_sweep

log = logging.getLogger("crossbert.sweep")


def _readable_json(path: Path) -> dict | None:
    """A stamp of our own: a damaged one is as good as none (the work it stamps is done again)."""
    try:
        return read_json(path, "a stamp")
    except ReadError:
        return None


class Sweep:
    def __init__(self, cfg: SweepConfig):
        self.cfg = cfg
        self.root = cfg.root
        self.folder = SweepDir(cfg.root)
        self.runs = plan_runs(cfg)
        check_tasks(cfg)
        # {final checkpoint?: its EvaluationPlan}, built here once from the config's fields (checked by plan_runs)
        self.evaluation_plans = {final: evaluation_plan(cfg, self.folder, final) for final in (True, False)}
        self.rank = int(os.environ.get("RANK", "0"))
        self.results_dir = self.folder.results
        self.checkpoints_file = self.folder.models
        self.models = ModelRecords(self.checkpoints_file)
        self.completed_file = self.folder.completed
        self.claims = Claims(self.folder.claims, self.folder.claims_lock, cfg.claim_lease_s)
        self.budget = WallBudget(cfg.budget_s) if cfg.budget_s is not None else None
        self.skipped: set[str] = set()  # runs this worker skipped for its wall budget

    def timed(self, stage: str, run: RunSpec | None, **extra):
        """Wall time of each stage of the sweep, for the report and the end-to-end benchmark (run None: the whole sweep);
        rank 0 alone writes it."""
        return timed_stage(None if self.rank else self.folder.timings, stage, run.key if run else "(sweep)", **extra)

    def write_manifest(self) -> None:
        if self.rank:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.folder.config, dump_yaml(self.cfg))
        plan = [
            {
                "run": r.key,
                "objective": r.objective.name,
                "size": r.size,
                "seed": r.seed,
                "steps": r.train.steps,
                "checkpoint_steps": r.train.checkpoint_steps,
                "batch_size": r.train.batch_size,
                "seq_len": r.train.data.seq_len,
                "train_flops_per_token": r.flops_per_token,
            }
            for r in self.runs
        ]
        atomic_write_json(self.folder.plan, {"runs": plan, **provenance()})

    def train_run(self, run: RunSpec) -> None:
        from crossbert_model.train import train

        done = [s for s, _ in list_checkpoints(run.train.run_dir)]
        if run.train.steps in done:
            log.info("sweep %s: %s already trained (%d steps)", self.cfg.name, run.key, run.train.steps)
            return
        log.info("sweep %s: training %s (%d steps)", self.cfg.name, run.key, run.train.steps)
        with self.timed("train", run, steps=run.train.steps):
            train(run.train)

    def evaluate_run(self, run: RunSpec) -> None:
        """Probes, geometry and mteb on every checkpoint of a run: the final one first (all layers), then the others."""
        from crossbert_eval.encoders import FrozenEncoder

        checkpoints = [(s, p) for s, p in list_checkpoints(run.train.run_dir) if s in run.train.checkpoint_steps]
        for step, path in sorted(checkpoints, reverse=True):
            encoder = FrozenEncoder.load(str(path), batch_size=self.cfg.batch_size)
            self._record_checkpoint(run, step, path, encoder)
            plan = self.evaluation_plans[step == run.train.steps]
            evaluate_encoder(encoder, plan, lambda stage, **extra: self.timed(stage, run, step=step, **extra))

    def record_reliance(self, run: RunSpec) -> None:
        """The encoder reliance of the run's final checkpoint (crossbert_model.reliance), once, in SweepDir.reliance."""
        from crossbert_model.reliance import encoder_reliance_for_checkpoint

        if self.rank or any(r.get("run") == run.key for r in read_jsonl(self.folder.reliance)):
            return
        final = dict(list_checkpoints(run.train.run_dir)).get(run.train.steps)
        if final is None:
            return
        with self.timed("reliance", run, step=run.train.steps):
            row = {"run": run.key, "step": run.train.steps, **encoder_reliance_for_checkpoint(final)}
        append_jsonl(self.folder.reliance, [row])

    def _record_checkpoint(self, run: RunSpec, step: int, path: Path, encoder) -> None:
        if self.models.has(run=run.key, step=step):
            return
        state = read_trainer_state(path)
        metrics = state.get("metrics") or {}
        config = encoder.model.config
        counts = parameter_counts(config)
        details = {
            "model_fingerprint": encoder.fingerprint,
            "params_non_embedding": counts["encoder_non_embedding"],
            "params_encoder": counts["encoder"],
            "hidden_size": config.hidden_size,
            "layers": config.num_hidden_layers,
            "corpus_tokens": state["corpus_tokens"],
            "train_flops": state["train_flops"],
            "val_loss": metrics.get("val_loss"),
            "val_ppl": metrics.get("val_ppl"),
            "mask_ratio": config.mask_ratio,
            # the loss both objectives answer identically (crossbert_model.shared_loss): the one to compare them by, at
            # the protocol's ratios and the run's own, and the unigram entropies of its targets (crossbert_model.plateau)
            **{key: metrics.get(key) for key in plateau_metric_keys(config.mask_ratio)},
        }
        record = ModelRecord(
            run=run.key,
            line=run.objective.name,
            point=run.size,
            seed=run.seed,
            step=step,
            total_steps=run.train.steps,
            checkpoint=str(path),
            details=details,
        )
        self.models.put(record, key=("run", "step"))

    def report(self) -> None:
        """Rebuild tables, plots and report from the store, unless their inputs are unchanged since the last
        rebuild (workers finishing together rebuild once); under a lock, so two workers never write it at once."""
        from crossbert_eval.report.sweep_report import build_sweep_report

        stamp = self.folder.report_stamp
        self.root.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(self.folder.report_lock, waiting="waiting for another worker's report rebuild"):
            for run in self.runs:  # runs completed before the sweep measured encoder reliance
                if self.is_complete(run):
                    self.record_reliance(run)
            inputs = self._report_inputs()
            if stamp.exists() and _readable_json(stamp) == inputs:
                log.info("sweep %s: report up to date (nothing new since its last rebuild)", self.cfg.name)
                return
            with self.timed("report", None):
                build_sweep_report(self.root)
            atomic_write_json(stamp, inputs)

    def _report_inputs(self) -> dict:
        """The report's inputs as (inode, size) of its append-only files, taken before a rebuild starts."""
        files = [
            self.results_dir / RESULTS_FILE,
            self.checkpoints_file,
            self.completed_file,
            self.folder.unigram_entropies,
            self.folder.reliance,
        ]
        return {f.name: [f.stat().st_ino, f.stat().st_size] if f.exists() else None for f in files}

    # -- work: claimed runs ------------------------------------------------------------------------

    def run_named(self, key: str) -> RunSpec:
        for run in self.runs:
            if run.key == key:
                return run
        raise ConfigError(f"sweep {self.cfg.name}: no run {key!r} in its plan ({', '.join(r.key for r in self.runs)})")

    def is_complete(self, run: RunSpec) -> bool:
        signature = completion_signature(self.cfg, run)
        return any(r["run"] == run.key and r["signature"] == signature for r in read_jsonl(self.completed_file))

    def pending(self) -> list[RunSpec]:
        return [r for r in self.runs if not self.is_complete(r) and r.key not in self.skipped]

    def run_cost(self, run: RunSpec) -> RunCost:
        done = max([s for s, _ in list_checkpoints(run.train.run_dir)] + [0])
        flops = run.flops_per_token * run.train.steps * run.train.batch_size * run.train.data.seq_len
        hidden = model_config(run.train.model, run.train.data).hidden_size
        return RunCost(run.key, flops, min(done / run.train.steps, 1.0), hidden)

    def work_left(self) -> str:
        """', about T of work left': the runs not complete, at the rates this sweep has measured (one worker's time;
        several workers share it); '' before any run was timed."""
        costs = {r.key: self.run_cost(r) for r in self.runs}
        rates = measured_rates(read_jsonl(self.folder.timings), costs)
        if rates is None:
            return ""
        left = sum(predicted_seconds(costs[r.key], rates) for r in self.pending()) / PREDICTION_MARGIN
        return f", about {duration(left)} of work left at the measured rates"

    def fits_budget(self, run: RunSpec) -> bool:
        """Whether `run` is predicted to end inside the wall budget (always, without one); a run that is not is
        skipped by this worker and recorded in SweepDir.skipped with the prediction."""
        if self.budget is None:
            return True
        costs = {r.key: self.run_cost(r) for r in self.runs}
        fits, predicted, left = self.budget.verdict(costs[run.key], read_jsonl(self.folder.timings), costs)
        if fits:
            return True
        self.skipped.add(run.key)
        why = f"predicted {predicted:.0f} s" if predicted is not None else "no time left"
        log.warning("sweep %s: skipping %s for the wall budget (%s, %.0f s left for runs)", self.cfg.name, run.key, why, left)
        if not self.rank:
            append_jsonl(
                self.folder.skipped,
                [
                    {
                        "run": run.key,
                        "predicted_s": predicted,
                        "left_s": round(left, 1),
                        "budget_s": self.cfg.budget_s,
                        **this_process(),
                        "time": timestamp(),
                    }
                ],
            )
        return False

    def work_on(self, run: RunSpec) -> str:
        """Train and probe `run` under our claim: CLAIMED (done now), DONE (complete already) or BUSY (another
        live worker holds it). A run whose worker died is taken over; its training resumes from its checkpoint."""
        status = self.claims.claim(run.key, is_done=lambda: self.is_complete(run))
        if status != CLAIMED:
            return status
        log.info(
            "sweep %s: %s claimed by pid %d (%d of %d runs complete%s)",
            self.cfg.name,
            run.key,
            os.getpid(),
            len(self.runs) - len(self.pending()),
            len(self.runs),
            self.work_left(),
        )
        with self.claims.held(run.key, heartbeat_s=self.cfg.claim_lease_s / 10):
            self.train_run(run)
            self.evaluate_run(run)
            self.record_reliance(run)
            # recorded before the claim is dropped: no other worker can find it neither held nor complete
            row = {"run": run.key, "signature": completion_signature(self.cfg, run), **this_process(), "time": timestamp()}
            append_jsonl(self.completed_file, [row])
        return CLAIMED

    def work(self) -> None:
        """Take runs in plan order until every one is complete or skipped for the wall budget: the free ones first,
        then (after waiting worker_poll_s) those of workers that died meanwhile. Rebuilds the report every report_every_s."""
        last_report = time.monotonic()
        while pending := self.pending():
            worked = False
            for run in pending:
                if not self.fits_budget(run) or self.work_on(run) != CLAIMED:
                    continue
                worked = True
                if not self.pending():
                    break  # the last run: the report follows
                if time.monotonic() - last_report >= self.cfg.report_every_s:
                    self.report()
                    last_report = time.monotonic()
            if not worked:
                self.wait_for_others(pending)

    def wait_for_others(self, pending: list[RunSpec]) -> None:
        """Sleep worker_poll_s, saying who holds the runs waited for."""
        held = []
        for run in pending:
            owner = self.claims.owner(run.key) or {}
            held.append(f"{run.key} (pid {owner.get('pid')} on {owner.get('host')})")
        log.info(
            "sweep %s: %d run(s) held by other workers, looking again in %.0f s: %s",
            self.cfg.name,
            len(held),
            self.cfg.worker_poll_s,
            ", ".join(held),
        )
        time.sleep(self.cfg.worker_poll_s)

    def run(self) -> Path:
        self.write_manifest()
        report_crashes_in(self.root)
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            return self._run_distributed()
        self.compute_baselines()
        self.work()
        self.report()
        self.log_verdict()
        if self.skipped:
            log.warning(
                "sweep %s: %d run(s) skipped for the wall budget (%s); run the sweep again to add them",
                self.cfg.name,
                len(self.skipped),
                ", ".join(sorted(self.skipped)),
            )
        log.info("sweep %s complete: %s", self.cfg.name, self.folder.report)
        return self.root

    def compute_baselines(self) -> None:
        """Chance, majority-class and TF-IDF scores of the probe tasks on the probes' splits, once for the sweep (before
        the first run, so every report from the first on draws them; crossbert_eval.baselines)."""
        evaluate_baselines(self.evaluation_plans[True], self.root, lambda stage, **extra: self.timed(stage, None, **extra))

    def log_verdict(self) -> None:
        """The report's verdict (summary.json) as the sweep's last lines."""
        from .report.noise import verdict_lines

        if not self.rank and self.folder.summary.is_file():
            summary = read_json(self.folder.summary, "the report's summary")
            notice = [summary[SMOKE_TEST_KEY]] if SMOKE_TEST_KEY in summary else []  # a limited sweep's, first
            log.info("sweep %s verdict:\n%s", self.cfg.name, "\n".join(notice + verdict_lines(summary) + notice))

    def _run_distributed(self) -> Path:
        """Under torchrun: every rank trains every run (no claims: the ranks are one worker), in one process group made
        here for all of them; rank 0 probes."""
        from crossbert_model.distributed import shared_process_group

        with shared_process_group():
            for i, run in enumerate(self.runs, 1):
                log.info("sweep %s: run %d/%d %s", self.cfg.name, i, len(self.runs), run.key)
                self.train_run(run)
        if self.rank:
            return self.root
        for run in self.runs:
            self.evaluate_run(run)
        self.report()
        log.info("sweep %s complete: %s", self.cfg.name, self.folder.report)
        return self.root


def run_sweep(cfg: SweepConfig) -> Path:
    """Work on the sweep in this process (`crossbert sweep CONFIG --submitit` submits its runs instead: crossbert_eval.launcher)."""
    return Sweep(prepare_sweep(cfg)).run()


def main(argv: list[str] | None = None) -> None:
    """torchrun entry point (`crossbert sweep` is the same for one process)."""
    config_main("crossbert_eval.sweep", SweepConfig, run_sweep, argv)


if __name__ == "__main__":
    main()
