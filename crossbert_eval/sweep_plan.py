"""A sweep's plan: every run's resolved training config (in the config's run_order), what its checkpoints are evaluated on,
when a run counts as complete, and what is checked before anything is written (tasks, the machine, optional packages)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from crossbert_model.args import ConfigError, deep_merge, from_dict, to_dict
from crossbert_model.objectives import training_flops_per_token
from crossbert_model.train_config import TrainConfig, model_config, validate_config
from crossbert_model.limits import (
    check_limits,
    check_relations,
)
from crossbert_model.errors import CrossbertError
from crossbert_model.utils import (
    data_root,
    set_offline_env,
    stable_hash,
)

from .evaluation import EvaluationPlan
from .folder_layout import SweepDir
from .sweep_config import LIMIT_SEEDS, LIMIT_STEPS, ObjectiveSpec, SweepConfig

log = logging.getLogger("crossbert.sweep")


def split_caps(max_probe_train: int | None, limit: int | None) -> tuple[int | None, int | None]:
    """(max_train, max_eval) of a sweep's probes: its max_probe_train, and a limited sweep's limit capping both."""
    max_train = max_probe_train if limit is None else min(max_probe_train or limit, limit)
    return max_train, limit


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
    """Every (objective, size, seed) with its resolved training config, in the order workers claim them (run_order: by
    training cost, cheapest or costliest first; equal costs in config order). The sweep's fields are checked
    first (their declared limits, again for a config built or changed in code, then their relations), every run's
    training config as it is resolved."""
    check_limits(cfg)
    check_relations(cfg)
    seeds = cfg.seeds[:LIMIT_SEEDS] if cfg.limit is not None else cfg.seeds
    runs = [_plan_run(cfg, obj, size, seed) for size in cfg.sizes for obj in cfg.objectives for seed in seeds]
    costliest_first = cfg.run_order == "costliest_first"
    return sorted(runs, key=lambda r: r.flops_per_token * r.train.steps * (-1 if costliest_first else 1))


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
    of the earlier ones. The config's keys become the settings' fields here, once (probe_layers -> layers, a LayerSpec since the config was loaded;
    max_probe_train -> max_train, capped by a limited sweep's limit, which also caps the probes' and the geometry's
    evaluation splits (max_eval); the sweep's features folder -> cache_dir)."""
    from .geometry_runner import GeometrySettings
    from .mteb_runner import MtebSettings
    from .probe_runner import ProbeSettings

    stores = {"results_dir": str(folder.results), "cache_dir": str(folder.features), "data_root": cfg.data_root}
    layers = cfg.probe_layers if final else cfg.intermediate_layers
    max_train, max_eval = split_caps(cfg.max_probe_train, cfg.limit)
    probe = ProbeSettings(
        tasks=cfg.probe_tasks,
        probes=cfg.probes,
        layers=layers,
        poolings=cfg.poolings,
        feature_transforms=cfg.feature_transforms,
        max_train=max_train,
        max_eval=max_eval,
        **stores,
    )
    geometry = GeometrySettings(tasks=cfg.geometry_tasks, layers=layers, poolings=cfg.poolings, max_eval=max_eval, **stores)
    mteb = MtebSettings(
        tasks=cfg.mteb_tasks,
        layers=cfg.mteb_layers if final else layers,
        pooling=cfg.poolings[0],
        out_dir=str(folder.mteb),
        **stores,
    )
    return EvaluationPlan(who=f"sweep {cfg.name}", probe=probe, geometry=geometry, mteb=mteb)


def planned_flops_per_token(tc: TrainConfig) -> float:
    """Training FLOPs per corpus token of the model `tc` trains: the trainer's own model-args translation,
    so shape overrides (hidden_size, mlp_type, ...) count; the vocabulary is data.vocab_size."""
    return training_flops_per_token(model_config(tc.model, tc.data), tc.data.seq_len)


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
