"""A sweep's runs as cluster jobs: `crossbert sweep CONFIG --submitit`.

One job per run that is not complete, through submitit's AutoExecutor (SLURM where `sbatch` is found;
`submitit.cluster=local` runs them as processes of this machine), with the sweep config's `submitit:`
section (crossbert_eval.sweep_config.SubmititArgs) as the job shape. A job is a sweep worker limited to its run
(Sweep.work_on: the run's claim, training resumed from its latest checkpoint, probes, completion), so jobs
and `crossbert sweep` workers can share one sweep. The job that completes the sweep rebuilds the report;
the submitting process waits for its jobs (unless `submitit.wait=false`) and rebuilds it as well, which
costs nothing when a job already did. A job timed out or pre-empted drops its claim and is requeued.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import submitit
from submitit.core.utils import FailedJobError, UncompletedJobError

from crossbert_model.args import ConfigError
from crossbert_model.claims import BUSY, Claims
from crossbert_model.errors import CrossbertError
from crossbert_model.logs import setup_logging
from crossbert_model.utils import set_offline_env

from .folder_layout import SweepDir
from .sweep import Sweep
from .sweep_config import SweepConfig
from .sweep_plan import prepare_sweep

log = logging.getLogger("crossbert.launcher")


class SweepJobsFailed(CrossbertError):
    """Some runs' jobs failed: the message names them and their logs; running the command again retries them."""


@dataclass
class Submitted:
    run: str
    job: submitit.Job


class RunJob(submitit.helpers.Checkpointable):
    """One sweep run in a cluster job: train + probe under the run's claim, then the report if the sweep is complete."""

    def __call__(self, cfg: SweepConfig, key: str) -> str:
        setup_logging()
        set_offline_env()
        sweep = Sweep(cfg)
        run = sweep.run_named(key)
        # held by a live worker: wait, as a worker would, until it completes the run or dies (then take it over)
        while (status := sweep.work_on(run)) == BUSY:
            sweep.wait_for_others([run])
        if not sweep.pending():  # whoever completes the sweep leaves its report behind
            sweep.report()
        return status

    def checkpoint(self, cfg: SweepConfig, key: str) -> submitit.helpers.DelayedSubmission:
        """Timed out or pre-empted: drop the run's claim, so the requeued job (perhaps on another host) takes the run
        at once rather than after the claim's lease; its training resumes from the latest checkpoint."""
        folder = SweepDir(cfg.root)  # the claim alone: no plan, no task checks for a job on its way out
        Claims(folder.claims, folder.claims_lock, cfg.claim_lease_s).release(key)
        return super().checkpoint(cfg, key)


def make_executor(cfg: SweepConfig) -> submitit.AutoExecutor:
    """The executor of the config's `submitit:` section, every option checked before anything is submitted."""
    args = cfg.submitit  # its values within their declared limits (SubmititArgs; checked with the sweep's plan)
    if args.cluster == "slurm" and shutil.which("sbatch") is None:
        raise ConfigError("sweep field 'submitit.cluster': slurm asked, but `sbatch` is not on this machine's PATH")
    folder = Path(args.folder) if args.folder else SweepDir(cfg.root).submitit
    executor = submitit.AutoExecutor(folder=folder / "%j", cluster=args.cluster)
    params = {
        "name": f"sweep-{cfg.name}",
        "timeout_min": args.timeout_min,
        "cpus_per_task": args.cpus_per_task,
        "gpus_per_node": args.gpus_per_node,
        "mem_gb": args.mem_gb,
        "nodes": 1,
        "tasks_per_node": 1,
        "slurm_partition": args.partition,
        "slurm_array_parallelism": args.max_parallel,
        **{f"slurm_{key}": value for key, value in args.slurm.items()},
    }
    try:
        executor.update_parameters(**params)
    except (NameError, TypeError, ValueError, AssertionError) as e:  # submitit's own checks: unknown or mistyped names
        raise ConfigError(f"sweep section 'submitit': {str(e).splitlines()[0]}") from None
    return executor


def submit_sweep(cfg: SweepConfig) -> Path:
    """Submit a job per run not yet complete; wait for them (submitit.wait) and rebuild the report."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("submitting a sweep's runs as cluster jobs: start the submission as one process, not under torchrun")
    sweep = Sweep(prepare_sweep(cfg))  # the plan is checked first, then the job options; nothing is written before both pass
    executor = make_executor(cfg)
    sweep.write_manifest()
    submitted = submit_runs(executor, sweep)
    if not cfg.submitit.wait:
        log.info("sweep %s: %d job(s) submitted; the last to finish rebuilds %s", cfg.name, len(submitted), sweep.folder.report)
        return sweep.root
    failed = [s for s in submitted if not _succeeded(s)]
    if len(failed) < len(submitted) or not submitted:
        sweep.report()
    if failed:
        logs = "; ".join(f"{s.run} (job {s.job.job_id}, log {s.job.paths.stderr})" for s in failed)
        raise SweepJobsFailed(
            f"sweep {cfg.name}: {len(failed)} of {len(submitted)} run job(s) failed: {logs}; "
            "run the same command again to retry them"
        )
    return sweep.root


def submit_runs(executor: submitit.AutoExecutor, sweep: Sweep) -> list[Submitted]:
    """A job per run not complete (one SLURM job array), in plan order; runs held by live workers are included:
    their job waits until that worker completes the run, or takes it over if the worker dies first."""
    todo = sweep.pending()
    if not todo:
        log.info("sweep %s: every run is complete; nothing to submit", sweep.cfg.name)
        return []
    with executor.batch():
        jobs = [executor.submit(RunJob(), sweep.cfg, run.key) for run in todo]
    submitted = [Submitted(run.key, job) for run, job in zip(todo, jobs)]
    for s in submitted:
        log.info("sweep %s: %s -> job %s (%s)", sweep.cfg.name, s.run, s.job.job_id, s.job.paths.stdout)
    return submitted


def _succeeded(s: Submitted) -> bool:
    try:
        status = s.job.result()
    except (FailedJobError, UncompletedJobError) as e:
        log.error("job %s of run %s failed: %s", s.job.job_id, s.run, str(e).splitlines()[0] if str(e) else type(e).__name__)
        return False
    log.info("job %s of run %s: %s", s.job.job_id, s.run, status)
    return True
