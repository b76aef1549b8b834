"""Scale sweeps: objectives x sizes x seeds, trained on one budget, every checkpoint probed frozen.

    crossbert sweep configs/sweep/cpu_small.yaml [key=value ...]
    torchrun --nproc_per_node 8 -m crossbert_eval.sweep configs/sweep/gpu_base.yaml

Order: runs are sorted by training cost, and each run is probed (final checkpoint first, then the
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

import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from crossbert_model.args import ConfigError, config_main, deep_merge, dump_yaml, from_dict, load_config, to_dict
from crossbert_model.checkpoint import list_checkpoints, read_trainer_state
from crossbert_model.claims import CLAIMED, Claims, this_process, timestamp
from crossbert_model.presets import PRESETS
from crossbert_model.objectives import objective, objective_names, parameter_counts, training_flops_per_token
from crossbert_model.plateau import SMOOTHING, plateau_metric_keys
from crossbert_model.logs import duration
from crossbert_model.train_config import TrainConfig, model_config, validate_config
from crossbert_model.defaults import FEATURE_TRANSFORM_NAMES, POOLINGS, PROBES
from crossbert_model.limits import (
    FOLDER_NAME_LIMIT,
    NON_EMPTY,
    NON_NEGATIVE_INT,
    POSITIVE,
    POSITIVE_INT,
    SECONDS,
    SEED,
    OneOf,
    OutsideDataRoot,
    Range,
    SameAs,
    SomeOf,
    Text,
    Unique,
    check_limits,
    check_relations,
    relation,
)
from crossbert_model.errors import CrossbertError, report_crashes_in
from crossbert_model.readers import ReadError, read_json, read_jsonl
from crossbert_model.utils import (
    append_jsonl,
    atomic_write_json,
    atomic_write_text,
    data_root,
    exclusive_lock,
    provenance,
    set_offline_env,
    stable_hash,
)

from .evaluation import EvaluationPlan, ModelRecord, ModelRecords, evaluate_baselines, evaluate_encoder, timed_stage
from .folder_layout import SweepDir
from .layer_spec import LAYERS, LayerSpec
from .results import RESULTS_FILE
from .report.loading import SMOKE_TEST_KEY
from .wall_budget import PREDICTION_MARGIN, RunCost, WallBudget, measured_rates, predicted_seconds

log = logging.getLogger("crossbert.sweep")


@dataclass
class ObjectiveSpec:
    name: Annotated[str, FOLDER_NAME_LIMIT]  # it names run folders <name>-<size>-s<seed>
    objective: Annotated[
        str, SameAs("crossbert_model.train_config:ModelArgs.objective")
    ]  # a name of crossbert_model.objectives: mlm | crossbert
    mask_ratio: Annotated[float | None, SameAs("crossbert_model.train_config:ModelArgs.mask_ratio")] = None
    complementary_masking: bool = True
    # further model options of this objective, e.g. pure-mask MLM: {mlm_mask_prob: 1.0, mlm_random_prob: 0.0}
    model: dict = field(default_factory=dict)
    # nested TrainConfig overrides of this objective's runs, after the sweep's `train` and `size_overrides`:
    # its own learning rate ({optim: {lr: 4.0e-3}}), compilation ({compile: true}), ...
    train: dict = field(default_factory=dict)


@dataclass
class SubmititArgs:
    """Where `crossbert sweep CONFIG --submitit` sends its runs (crossbert_eval.launcher): one job per run
    (train + probe) through submitit's AutoExecutor, for SLURM; `cluster: local` runs the jobs as processes
    of this machine (all at once: for tests and debugging)."""

    cluster: Annotated[str | None, OneOf("slurm", "local", "debug")] = None  # None: SLURM where `sbatch` is found, else local
    folder: str | None = None  # job scripts, pickles and logs; default <sweep>/submitit
    partition: str | None = None  # SLURM partition
    timeout_min: Annotated[int, POSITIVE] = 24 * 60  # per job; a job timed out (or pre-empted) is requeued and resumes its run
    cpus_per_task: Annotated[int | None, POSITIVE] = None
    gpus_per_node: Annotated[int, NON_NEGATIVE_INT] = 0
    mem_gb: Annotated[float | None, POSITIVE] = None
    max_parallel: Annotated[int | None, POSITIVE] = (
        None  # SLURM: at most this many of the sweep's jobs at once (job array throttle)
    )
    slurm: dict = field(default_factory=dict)  # further submitit SLURM parameters: {account: x, qos: y, constraint: z}
    wait: bool = True  # wait for the jobs, then rebuild the report (the last job rebuilds it as well)


def _readable_json(path: Path) -> dict | None:
    """A stamp of our own: a damaged one is as good as none (the work it stamps is done again)."""
    try:
        return read_json(path, "a stamp")
    except ReadError:
        return None


@dataclass
class SweepConfig:
    FIELD_KIND = "sweep field"  # how messages name a field (crossbert_model.limits)

    name: Annotated[str, FOLDER_NAME_LIMIT] = "sweep"  # the sweep's folder is out_dir/name
    out_dir: Annotated[str, OutsideDataRoot()] = "runs/sweeps"
    sizes: Annotated[list[Annotated[str, OneOf(*PRESETS)]], NON_EMPTY, Unique()] = field(
        default_factory=lambda: ["nano", "tiny", "mini"]
    )
    # each named once: a run named twice would be trained once and reported twice
    objectives: Annotated[list[ObjectiveSpec], NON_EMPTY, Unique(lambda o: o.name, "name")] = field(
        default_factory=lambda: [ObjectiveSpec(name, name, objective(name).default_mask_ratio) for name in objective_names()]
    )
    # the objective every other is compared with in the report's comparisons (None: the first objective listed;
    # crossbert_eval.report.loading.reference_objective reads it back from sweep.yaml)
    reference_objective: Annotated[str | None, Text("an objective's name")] = None
    seeds: Annotated[list[Annotated[int, SEED]], NON_EMPTY, Unique()] = field(default_factory=lambda: [0])
    budget: Annotated[str, OneOf("tokens", "flops")] = (
        "tokens"  # tokens: every run reads budget_tokens corpus tokens; flops: every run spends budget_flops
    )
    budget_tokens: Annotated[int, POSITIVE_INT] = 2_000_000
    budget_flops: Annotated[float | None, POSITIVE] = None
    checkpoint_fractions: Annotated[
        list[Annotated[float, Range(0, 1, low_open=True, words="a fraction of the run in (0, 1]")]], NON_EMPTY
    ] = field(default_factory=lambda: [0.5, 1.0])
    train: dict = field(default_factory=dict)  # nested overrides of TrainConfig for every run
    size_overrides: dict = field(default_factory=dict)  # {preset: {nested TrainConfig overrides}}
    probe_tasks: list[str] = field(default_factory=lambda: ["SST-2", "STS-B"])
    probes: Annotated[list[str], SomeOf(*PROBES)] = field(default_factory=lambda: ["linear", "knn"])
    # all | last | N | N,M,... (crossbert_eval.layer_spec; a YAML number or list of numbers too): the settings' `layers`
    probe_layers: Annotated[str | int | list, LAYERS] = "all"  # for final checkpoints
    intermediate_layers: Annotated[str | int | list, LAYERS] = "last"  # for the earlier checkpoints (probe score along training)
    poolings: Annotated[list[str], SomeOf(*POOLINGS)] = field(default_factory=lambda: ["mean"])
    # features of the cosine and kNN probes: raw, centred, whitened (crossbert_eval.probes.FEATURE_TRANSFORMS)
    feature_transforms: Annotated[list[str], SomeOf(*FEATURE_TRANSFORM_NAMES)] = field(default_factory=lambda: ["raw"])
    max_probe_train: Annotated[int | None, POSITIVE_INT] = None  # seeded subsample of each probe's train split
    # Representation geometry (crossbert_eval.geometry_runner) of each probed checkpoint on the probed
    # layers and poolings: evaluation-split texts, the probe stage's cached features where they match.
    geometry_tasks: list[str] = field(default_factory=lambda: ["SST-2", "STS-B"])
    mteb_tasks: list[str] = field(default_factory=lambda: ["Banking77Classification", "STSBenchmark"])
    mteb_layers: Annotated[str | int | list, LAYERS] = "last"
    batch_size: Annotated[int, POSITIVE_INT] = 128  # encoding
    # Tables, plots and report are rebuilt after a run once this many seconds have passed since the last
    # rebuild (0: after every run), and always at the end: a rebuild costs ~10-15 s on 2 CPU cores.
    report_every_s: Annotated[float, Range(0, words="a number of seconds >= 0", shown=">= 0 s")] = 300.0
    data_root: str | None = None
    # Workers (see the module docstring): a run claimed on another host is taken over once its claim has not
    # been renewed for claim_lease_s (its worker renews it every tenth of that); on this host as soon as its
    # process is gone. A worker whose remaining runs are all held by others looks again every worker_poll_s.
    claim_lease_s: Annotated[float, SECONDS] = 600.0
    worker_poll_s: Annotated[float, SECONDS] = 30.0
    # A wall-clock budget for this worker (`--budget-s`; None: none). Runs go cheapest first; once a run has been timed,
    # a run predicted not to end inside the budget (WallBudget) is skipped and recorded in SweepDir.skipped, and the report
    # is built at the end. Rows land in the store as they are measured, so a kill at the limit loses the run in flight.
    budget_s: Annotated[float | None, SECONDS] = None
    # What the machine must have, checked before the first step (check_machine): "cuda" refuses to start without a
    # CUDA GPU (and without bf16 on it when train.dtype is bf16); None runs wherever it is started.
    device: Annotated[str | None, OneOf("cuda")] = None
    # An optional package a part of the sweep needs (OPTIONAL_PACKAGES) that is not installed: "refuse" stops before
    # the first step naming it; "leave_out" names it in one line and leaves that part's rows out (a machine without faiss).
    missing_packages: Annotated[str, OneOf("refuse", "leave_out")] = "refuse"
    # A smoke run of the whole pipeline (`--limit N`; None: a real sweep): every objective and size at the first LIMIT_SEEDS
    # seeds, each run LIMIT_STEPS steps uncompiled, validated on at most N sequences, each probe split capped at N examples
    # (train and evaluation), into a folder of its own, <name>-limit<N>. Its numbers mean nothing: its report,
    # summary.json and verdict say so (report.loading.smoke_notice).
    limit: Annotated[int | None, POSITIVE_INT] = None  # examples per probe split
    submitit: SubmititArgs = field(default_factory=SubmititArgs)

    def __post_init__(self) -> None:
        # a limited sweep never shares a folder with a real one; once only, so a reloaded sweep.yaml keeps its name
        suffix = f"-limit{self.limit}"
        if _is_limit(self.limit) and isinstance(self.name, str) and not self.name.endswith(suffix):
            self.name += suffix

    @property
    def root(self) -> Path:
        return Path(self.out_dir) / self.name

    @relation("budget", "budget_flops")
    def _a_flops_budget_names_its_flops(self, prefix: str) -> None:
        if self.budget == "flops" and self.budget_flops is None:
            raise ConfigError(f"sweep field '{prefix}budget_flops': expected a positive number when budget=flops, got None")

    @relation("reference_objective", "objectives")
    def _the_reference_is_one_of_the_objectives(self, prefix: str) -> None:
        names = [o.name for o in self.objectives]
        if self.reference_objective is not None and self.reference_objective not in names:
            raise ConfigError(
                f"sweep field '{prefix}reference_objective': expected one of the objectives ({', '.join(names)}), "
                f"got {self.reference_objective!r}"
            )


# A limited sweep (`--limit`): LIMIT_STEPS training steps a run, enough to write a checkpoint and every loss the report
# reads, far too few for any score to mean something; uncompiled, since a compiled step repays its ~30 s compile only
# after ~240 steps (configs/sweep/cpu_small.yaml). LIMIT_SEEDS seeds: the fewest the report's test over seeds takes.
LIMIT_STEPS = 20
LIMIT_SEEDS = 2


def _is_limit(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _capped(value: int | None, cap: int | None) -> int | None:
    """`value` (None: no cap) under `cap` (None: none)."""
    return value if cap is None else min(value or cap, cap)


@dataclass
class RunSpec:
    objective: ObjectiveSpec
    size: str
    seed: int
    train: TrainConfig
    flops_per_token: float = 0.0  # training FLOPs per corpus token of the model the trainer will build

    @property
    def key(self) -> str:
        return f"{self.objective.name}-{self.size}-s{self.seed}"


def plan_runs(cfg: SweepConfig) -> list[RunSpec]:
    """Every (objective, size, seed) with its resolved training config, cheapest first. The sweep's fields are checked
    first (their declared limits, again for a config built or changed in code, then their relations), every run's
    training config as it is resolved."""
    check_limits(cfg)
    check_relations(cfg)
    seeds = cfg.seeds[:LIMIT_SEEDS] if cfg.limit is not None else cfg.seeds
    runs = [_plan_run(cfg, obj, size, seed) for size in cfg.sizes for obj in cfg.objectives for seed in seeds]
    return sorted(runs, key=lambda r: r.flops_per_token * r.train.steps)


def _plan_run(cfg: SweepConfig, obj: ObjectiveSpec, size: str, seed: int) -> RunSpec:
    data = deep_merge(deep_merge(deep_merge({}, cfg.train), cfg.size_overrides.get(size, {})), obj.train)
    data = deep_merge(
        data,
        {
            "name": f"{obj.name}-{size}-s{seed}",
            "out_dir": str(SweepDir(cfg.root).runs),
            "seed": seed,
            "group": cfg.name,  # W&B's group
            "model": {
                "preset": size,
                "objective": obj.objective,
                "mask_ratio": obj.mask_ratio,
                "complementary_masking": obj.complementary_masking,
                **obj.model,
            },
        },
    )
    if cfg.data_root:  # the sweep's data root is where its runs read `${data_root}/...` corpora
        data = deep_merge(data, {"data": {"data_root": cfg.data_root}})
    try:
        tc = from_dict(TrainConfig, data)
        validate_config(
            tc
        )  # a bad train override fails here, before any run of the sweep starts (and before its FLOPs are counted)
        flops_per_token = planned_flops_per_token(tc)
        tokens = cfg.budget_tokens if cfg.budget == "tokens" else cfg.budget_flops / flops_per_token
        tc.max_tokens = None
        tc.steps = max(1, math.ceil(tokens / (tc.batch_size * tc.data.seq_len)))
        tc.checkpoint_every = tc.checkpoint_every or max(1, tc.steps // 4)  # resume points
        if cfg.limit is not None:  # a smoke run (SweepConfig.limit): no resume points, validation on at most N sequences
            tc.steps, tc.compile, tc.checkpoint_every = min(tc.steps, LIMIT_STEPS), False, 0
            tc.eval_sequences = min(tc.eval_sequences, cfg.limit)
        tc.checkpoint_steps = sorted({max(1, round(f * tc.steps)) for f in cfg.checkpoint_fractions})
        validate_config(tc)
    except ConfigError as e:
        raise ConfigError(f"sweep run {data['name']}: {e}") from None
    return RunSpec(obj, size, seed, tc, flops_per_token)


def check_tasks(cfg: SweepConfig) -> None:
    """Every probe, geometry and mteb task of the sweep exists, before any run trains."""
    from crossbert_eval.mteb_benchmark import resolve_mteb_tasks
    from crossbert_eval.tasks import resolve_tasks

    for key in ("probe_tasks", "geometry_tasks"):
        try:
            resolve_tasks(getattr(cfg, key))
        except CrossbertError as e:
            raise ConfigError(f"sweep field {key!r}: {e}") from None
    if cfg.mteb_tasks:
        try:
            resolve_mteb_tasks(cfg.mteb_tasks, None, cfg.data_root)
        except CrossbertError as e:
            raise ConfigError(f"sweep field 'mteb_tasks': {e}") from None


# Sweep fields that do not change what a run's probes compute: a run recorded complete stays complete
# when they change (training is judged by the run's final checkpoint, not by this).
NOT_PROBING_FIELDS = {
    "name",
    "out_dir",
    "sizes",
    "objectives",
    "seeds",
    "budget",
    "budget_tokens",
    "budget_flops",
    "checkpoint_fractions",
    "train",
    "size_overrides",
    "batch_size",
    "report_every_s",
    "data_root",
    "claim_lease_s",
    "worker_poll_s",
    "submitit",
    "reference_objective",
    "budget_s",
    "device",
    "missing_packages",
}


def completion_signature(cfg: SweepConfig, run: RunSpec) -> str:
    """What `run` was probed for: the sweep's probe settings and the run's probed checkpoints. A run recorded
    complete under another signature (a probe task added since) is probed again; done units are skipped."""
    probing = {k: v for k, v in to_dict(cfg).items() if k not in NOT_PROBING_FIELDS}
    return stable_hash({**probing, "steps": run.train.steps, "checkpoint_steps": run.train.checkpoint_steps})


def evaluation_plan(cfg: SweepConfig, folder: SweepDir, final: bool) -> EvaluationPlan:
    """What a checkpoint of the sweep is evaluated on: every layer the config asks of a final checkpoint, intermediate_layers
    of the earlier ones. The config's keys become the settings' fields here, once (probe_layers -> layers, parsed;
    max_probe_train -> max_train, capped by a limited sweep's limit; the sweep's features folder -> cache_dir)."""
    from .geometry_runner import GeometrySettings
    from .mteb_runner import MtebSettings
    from .probe_runner import ProbeSettings

    stores = {"results_dir": str(folder.results), "cache_dir": str(folder.features), "data_root": cfg.data_root}
    layers = LayerSpec.parse(cfg.probe_layers if final else cfg.intermediate_layers)
    probe = ProbeSettings(
        tasks=cfg.probe_tasks,
        probes=cfg.probes,
        layers=layers,
        poolings=cfg.poolings,
        feature_transforms=cfg.feature_transforms,
        max_train=_capped(cfg.max_probe_train, cfg.limit),
        max_eval=cfg.limit,
        **stores,
    )
    geometry = GeometrySettings(tasks=cfg.geometry_tasks, layers=layers, poolings=cfg.poolings, **stores)
    mteb = MtebSettings(
        tasks=cfg.mteb_tasks,
        layers=LayerSpec.parse(cfg.mteb_layers) if final else layers,
        pooling=cfg.poolings[0],
        out_dir=str(folder.mteb),
        **stores,
    )
    return EvaluationPlan(who=f"sweep {cfg.name}", probe=probe, geometry=geometry, mteb=mteb)


def planned_flops_per_token(tc: TrainConfig) -> float:
    """Training FLOPs per corpus token of the model `tc` trains: the trainer's own model-args translation,
    so shape overrides (hidden_size, mlp_type, ...) count; the vocabulary is data.vocab_size."""
    return training_flops_per_token(model_config(tc.model, tc.data), tc.data.seq_len)


# ------------------------------------------------------------------------------------------------


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
        """Under torchrun: every rank trains every run (no claims: the ranks are one worker); rank 0 probes."""
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


def fill_unigram_entropies(
    root: str | Path, tokenizer: str | Path | None = None, overrides: list[str] | None = None, data_root_dir: str | None = None
) -> Path:
    """The unigram entropies (crossbert_model.plateau) of a sweep's runs trained before the trainer recorded
    them, into <root>/unigram_entropies.jsonl (with each run's own mask ratio), from which the report fills
    what checkpoints.jsonl lacks. Each run's config comes from the sweep's plan (sweep.yaml, `overrides` as
    key=value), its corpus is read with the tokenizer the runs were trained with: `tokenizer`, else
    <root>/tokenizer (a committed sweep's pinned copy), else the run's final checkpoint. The corpus is
    tokenized once if the token cache (the plan's data.cache_dir) lacks it; no model is loaded."""
    from crossbert_model.train import unigram_entropies_for_run  # here: the trainer loads only for the command that fills

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


# The optional packages parts of a sweep need: {package: (the part, the config field that asks for it, how to leave it out)}.
OPTIONAL_PACKAGES = {
    "faiss": ("the kNN probe", "probes", lambda cfg: setattr(cfg, "probes", [p for p in cfg.probes if p != "knn"])),
    "mteb": ("mteb tasks", "mteb_tasks", lambda cfg: setattr(cfg, "mteb_tasks", [])),
}


def _asks_for(cfg: SweepConfig, package: str) -> bool:
    return ("knn" in cfg.probes) if package == "faiss" else bool(cfg.mteb_tasks)


def check_machine(cfg: SweepConfig) -> None:
    """What the sweep needs of this machine, before anything is written: the device it names (with bf16 where its
    runs train in bf16), and the optional packages its parts need (refused, or left out in one line each)."""
    import importlib.util

    if cfg.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                "sweep field 'device': expected a machine with a CUDA GPU (torch.cuda.is_available() is False "
                "here); set device=null to run on this machine"
            )
        if cfg.train.get("dtype") == "bf16" and not torch.cuda.is_bf16_supported():
            raise ConfigError(f"sweep field 'train.dtype': bf16, which {torch.cuda.get_device_name()} does not support")
    for package, (part, field_name, leave_out) in OPTIONAL_PACKAGES.items():
        if not _asks_for(cfg, package) or importlib.util.find_spec(package) is not None:
            continue
        if cfg.missing_packages == "refuse":
            raise ConfigError(
                f"sweep field '{field_name}': {part} needs the package {package}, which is not installed here; "
                "install it, or set missing_packages=leave_out to leave its rows out"
            )
        leave_out(cfg)
        log.warning(
            "sweep %s: %s left out: the package %s is not installed (missing_packages=leave_out)", cfg.name, part, package
        )


def prepare_sweep(cfg: SweepConfig) -> SweepConfig:
    """Offline unless asked otherwise, the machine checked (check_machine), and the data root resolved once: probes and
    every run's training read this root. Whatever then runs the sweep (run_sweep here, crossbert_eval.launcher.submit_sweep
    as cluster jobs) starts so."""
    set_offline_env()
    check_machine(cfg)
    cfg.data_root = str(data_root(cfg.data_root))
    return cfg


def run_sweep(cfg: SweepConfig) -> Path:
    """Work on the sweep in this process (`crossbert sweep CONFIG --submitit` submits its runs instead: crossbert_eval.launcher)."""
    return Sweep(prepare_sweep(cfg)).run()


def main(argv: list[str] | None = None) -> None:
    """torchrun entry point (`crossbert sweep` is the same for one process)."""
    config_main("crossbert_eval.sweep", SweepConfig, run_sweep, argv)


if __name__ == "__main__":
    main()
