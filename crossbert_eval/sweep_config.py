"""A sweep's config: objectives x sizes x seeds on one budget, what each checkpoint is probed on, how workers share
the runs (crossbert_eval.sweep). Parsed once by crossbert_model.args.load_config; every field declares its limit."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from crossbert_model.args import ConfigError
from crossbert_model.presets import PRESETS
from crossbert_model.objectives import objective, objective_names
from crossbert_model.defaults import FEATURE_TRANSFORM_NAMES, POOLINGS, PROBES, REPORT_EVERY_S
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
    relation,
)

from .layer_spec import LAYERS, LayerSpec


@dataclass
class ObjectiveSpec:
    ITEM_LABEL = ("name",)  # how a message names an objective: objectives[1] (its name)

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
    # Which runs workers claim first, by training cost (FLOPs per token x steps). cheapest_first: partial results
    # early, and what a wall budget (budget_s) predicts from; costliest_first: several workers end together (the
    # costliest run is not left for last while the others wait), for a sweep run to its end.
    run_order: Annotated[str, OneOf("cheapest_first", "costliest_first")] = "cheapest_first"
    checkpoint_fractions: Annotated[
        list[Annotated[float, Range(0, 1, low_open=True, words="a fraction of the run in (0, 1]")]], NON_EMPTY
    ] = field(default_factory=lambda: [0.5, 1.0])
    train: dict = field(default_factory=dict)  # nested overrides of TrainConfig for every run
    size_overrides: dict = field(default_factory=dict)  # {preset: {nested TrainConfig overrides}}
    probe_tasks: list[str] = field(default_factory=lambda: ["SST-2", "STS-B"])
    probes: Annotated[list[str], SomeOf(*PROBES)] = field(default_factory=lambda: ["linear", "knn"])
    # all | last | N | N,M,... (crossbert_eval.layer_spec; a YAML number or list of numbers too): the settings' `layers`
    probe_layers: Annotated[LayerSpec, LAYERS] = LayerSpec.ALL  # for final checkpoints
    intermediate_layers: Annotated[LayerSpec, LAYERS] = LayerSpec.LAST  # for the earlier checkpoints (probe score along training)
    poolings: Annotated[list[str], SomeOf(*POOLINGS)] = field(default_factory=lambda: ["mean"])
    # features of the cosine and kNN probes: raw, centred, whitened (crossbert_eval.probes.FEATURE_TRANSFORMS)
    feature_transforms: Annotated[list[str], SomeOf(*FEATURE_TRANSFORM_NAMES)] = field(default_factory=lambda: ["raw"])
    max_probe_train: Annotated[int | None, POSITIVE_INT] = None  # seeded subsample of each probe's train split
    # Representation geometry (crossbert_eval.geometry_runner) of each probed checkpoint on the probed
    # layers and poolings: evaluation-split texts, the probe stage's cached features where they match.
    geometry_tasks: list[str] = field(default_factory=lambda: ["SST-2", "STS-B"])
    mteb_tasks: list[str] = field(default_factory=lambda: ["Banking77Classification", "STSBenchmark"])
    mteb_layers: Annotated[LayerSpec, LAYERS] = LayerSpec.LAST
    batch_size: Annotated[int, POSITIVE_INT] = 128  # encoding
    # Tables, plots and report are rebuilt after a run once this many seconds have passed since the last
    # rebuild (0: after every run), and always at the end (crossbert_model.defaults.REPORT_EVERY_S).
    report_every_s: Annotated[float, Range(0, words="a number of seconds >= 0", shown=">= 0 s")] = REPORT_EVERY_S
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

    @relation("run_order", "budget_s")
    def _a_wall_budget_goes_cheapest_first(self, prefix: str) -> None:
        if self.budget_s is not None and self.run_order != "cheapest_first":
            raise ConfigError(
                f"sweep field '{prefix}run_order': expected cheapest_first with a wall budget (budget_s: it predicts "
                f"the runs left from the cheapest ones, timed first), got {self.run_order}"
            )

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
