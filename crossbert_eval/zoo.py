"""The collapse plot for any set of pretrained encoders: `crossbert zoo`.

    crossbert zoo configs/zoo/offline.yaml [key=value ...]
    CROSSBERT_ONLINE=1 crossbert zoo configs/zoo/bert_miniatures.yaml
    crossbert report runs/zoo/offline                 # rebuild the zoo's tables, plots and report

A zoo is a list of frozen encoders, each a local folder (Hugging Face or sentence-transformers), one of
our checkpoints or run folders, 'minilm', or a hub id (from the Hugging Face cache offline, downloaded
online), with a display name and a family label. Each is evaluated by the sweep's pipeline (crossbert_eval.evaluation):
linear and kNN probes on every layer (probe_runner), per-layer geometry (geometry_runner) and the local mteb
tasks (mteb_runner), into one results store. The zoo folder holds what a sweep folder holds:

    zoo.yaml                 the resolved config
    checkpoints.jsonl        one row per model (evaluation.ModelRecord): family as its plot line (column `objective`),
                             name as its point (column `size`), pooling and where it came from, parameters counted
                             from the loaded torch model, layers, ...
    results/results.jsonl    every score row (units already there are skipped: a rerun resumes)
    features/, mteb/         the feature cache and mteb's own result cache
    timings.jsonl, tables/, plots/, report.md, report.html   (crossbert_eval.report.zoo_report)

Models that trained with us and models that did not share one plot: score against non-embedding
parameters with one line per family (last layer, and the best layer dashed), layer-wise curves by relative
depth, last layer vs best layer. Rows join the models on (weights fingerprint, pooling), so one model
entered twice with two poolings gives two points, and two entries with the same weights and pooling share
their units (computed once).

Pooling per model: the entry's `pooling` if given, else the model's sentence-transformers Pooling config,
else mean; recorded in every row (`pooling`, `pooling_source`) and in checkpoints.jsonl.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Annotated

from crossbert_model.args import config_main, dump_yaml
from crossbert_model.checkpoint import read_trainer_state
from crossbert_model.defaults import DTYPES, FEATURE_TRANSFORM_NAMES, POOLINGS, PROBES, REPORT_EVERY_S
from crossbert_model.limits import (
    FOLDER_NAME_LIMIT,
    POSITIVE_INT,
    NonEmpty,
    OneOf,
    OutsideDataRoot,
    SameAs,
    SomeOf,
    Text,
    Unique,
    check_limits,
    check_relations,
)
from crossbert_model.errors import CrossbertError, report_crashes_in
from crossbert_model.shared_loss import SHARED_LOSS_KEYS
from crossbert_model.utils import atomic_write_text, data_root, set_offline_env, sha256_file
from crossbert_model.run_layout import CheckpointDir

from .evaluation import EvaluationPlan, ModelRecord, ModelRecords, evaluate_baselines, evaluate_encoder, timed_stage
from .folder_layout import ZooDir
from .layer_spec import LAYERS, LayerSpec
from .report.zoo_report import build_zoo_report

log = logging.getLogger("crossbert.zoo")


class ZooError(CrossbertError, ValueError):
    """A zoo entry or setting is wrong; the message names the entry and what was expected."""


@dataclass
class ZooModel:
    ITEM_LABEL = ("name", "model")  # how a message names an entry: models[1] (its name, else its model)

    # a model folder, one of our checkpoint / run folders, 'minilm', or a hub id org/name[@revision]
    model: Annotated[str, Text("a model folder, checkpoint, 'minilm' or hub id")]
    name: Annotated[str | None, Text("a display name")] = (
        None  # display name (default: the model argument); unique within the zoo
    )
    family: Annotated[str | None, Text("a family name")] = (
        None  # the line this model belongs to in the size plots (default: its name)
    )
    # default: the sentence-transformers config, else mean
    pooling: Annotated[str | None, OneOf(*POOLINGS)] = None
    # run the Python the model folder carries (auto_map) to load it: only for a folder you trust (recorded in its rows)
    trust_remote_code: bool = False
    made_by: Annotated[str | None, Text("a command")] = (
        None  # the command that makes this model where it is missing (said when it is)
    )


@dataclass
class ZooConfig:
    FIELD_KIND = "zoo field"  # how messages name a field (crossbert_model.limits)

    name: Annotated[str, FOLDER_NAME_LIMIT] = "zoo"  # the zoo's folder is out_dir/name
    out_dir: Annotated[str, OutsideDataRoot()] = "runs/zoo"
    # display names unique: each is a point of the plots
    models: Annotated[
        list[ZooModel],
        NonEmpty("a list of models ({model: ..., name: ..., family: ...})", "none"),
        Unique(lambda entry: entry.name or entry.model, "display name"),
    ] = field(default_factory=list)
    probe_tasks: list[str] = field(default_factory=lambda: ["SST-2", "STS-B"])
    probes: Annotated[list[str], SomeOf(*PROBES)] = field(default_factory=lambda: ["linear", "knn"])
    probe_layers: Annotated[LayerSpec, LAYERS] = LayerSpec.ALL  # all | last | N | N,M,... (crossbert_eval.layer_spec)
    max_probe_train: Annotated[int | None, POSITIVE_INT] = None  # seeded subsample of each probe's train split
    # seeded subsample of each evaluation split, the same texts for probes, geometry and baselines (mteb tasks run whole)
    max_probe_eval: Annotated[int | None, POSITIVE_INT] = None
    # features of the cosine and kNN probes: raw, centred, whitened (crossbert_eval.probes.FEATURE_TRANSFORMS)
    feature_transforms: Annotated[list[str], SomeOf(*FEATURE_TRANSFORM_NAMES)] = field(default_factory=lambda: ["raw"])
    geometry_tasks: list[str] = field(default_factory=lambda: ["SST-2", "STS-B"])
    mteb_tasks: list[str] = field(default_factory=lambda: ["STSBenchmark"])
    mteb_layers: Annotated[LayerSpec, LAYERS] = LayerSpec.LAST  # layers mteb evaluates (features of every layer are cached)
    batch_size: Annotated[int, POSITIVE_INT] = 128  # encoding
    max_length: Annotated[int | None, POSITIVE_INT] = (
        None  # tokens per text, at most each model's positions (unset: 128, or fewer where a model has fewer)
    )
    dtype: Annotated[str, OneOf(*DTYPES)] = "fp32"  # as FrozenEncoder.load
    features_dir: str | None = None  # feature cache (default: <root>/features); zoos may share one
    data_root: str | None = None
    # The report is rebuilt after a model once this many seconds have passed since the last rebuild (0: after every
    # model), and always at the end, as a sweep's.
    report_every_s: Annotated[float, SameAs("crossbert_eval.sweep_config:SweepConfig.report_every_s")] = REPORT_EVERY_S

    @property
    def root(self) -> Path:
        return Path(self.out_dir) / self.name

    @property
    def features(self) -> Path:
        return Path(self.features_dir) if self.features_dir else ZooDir(self.root).features


# ------------------------------------------------------------------------------------------------
# Parameters counted from the loaded model
# ------------------------------------------------------------------------------------------------


def count_parameters(model) -> dict[str, int]:
    """Parameters of a loaded encoder (what `AutoModel` returns), by part, each tensor once:

    * params_embedding: the nn.Embedding tables (token, position, token-type);
    * params_pooler: a BERT-style `pooler` (dense + tanh over [CLS], for next-sentence prediction): it
      is part of the checkpoint but computes none of the hidden states the probes read;
    * params_non_embedding: the rest, i.e. what turns embeddings into the probed hidden states
      (blocks, norms): the size axis of the plots. For our models it equals
      crossbert_model.objectives.parameter_counts()['encoder_non_embedding'];
    * params_total: everything the loaded model holds (the figure model cards quote)."""
    import torch.nn as nn

    seen: set[int] = set()

    def total(params) -> int:
        n = 0
        for p in params:
            if id(p) not in seen:
                seen.add(id(p))
                n += p.numel()
        return n

    embedding = total(p for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters(recurse=False))
    pooler = total(p for name, p in model.named_parameters() if name.split(".", 1)[0] == "pooler")
    rest = total(model.parameters())
    return {
        "params_total": embedding + pooler + rest,
        "params_embedding": embedding,
        "params_pooler": pooler,
        "params_non_embedding": rest,
    }


# ------------------------------------------------------------------------------------------------
# An offline Hugging Face cache (air-gapped machines, tests)
# ------------------------------------------------------------------------------------------------


def seed_hub_cache(cache_dir: str | os.PathLike, repo_id: str, folder: str | os.PathLike, revision: str) -> Path:
    """Put a local model folder into a Hugging Face hub cache as `repo_id` at commit `revision`, in the
    hub's own layout (blobs/<sha256>, snapshots/<revision>/ of relative links, refs/main), so that the
    hub id loads offline exactly as a downloaded model would. Files are copied, not moved. Returns the snapshot."""
    if len(revision) != 40 or any(c not in "0123456789abcdef" for c in revision):
        raise ZooError(f"revision {revision!r}: expected a 40-hex commit id (the hub cache is keyed by it)")
    folder, repo = Path(folder), Path(cache_dir) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest = sha256_file(path)
        blob = repo / "blobs" / digest
        if not blob.exists():
            blob.parent.mkdir(parents=True, exist_ok=True)
            tmp = blob.with_name(f".{digest}.tmp")
            shutil.copyfile(path, tmp)
            os.replace(tmp, blob)
        link = snapshot / path.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    atomic_write_text(repo / "refs" / "main", revision)  # no newline: huggingface_hub reads the file verbatim
    return snapshot


# ------------------------------------------------------------------------------------------------
# Checking a zoo before anything is written
# ------------------------------------------------------------------------------------------------


def entry_name(entry: ZooModel) -> str:
    return entry.name or entry.model


def entry_family(entry: ZooModel) -> str:
    return entry.family or entry_name(entry)


def check_zoo_config(cfg: ZooConfig) -> None:
    """Everything that needs no model load: the fields' declared limits (entries, poolings, probes, layers; again, for
    a config built or changed in code), then the task names. One ZooError / ConfigError."""
    from crossbert_eval.tasks import resolve_tasks

    check_limits(cfg)
    check_relations(cfg)
    if cfg.probe_tasks:
        resolve_tasks(cfg.probe_tasks)
    if cfg.geometry_tasks:
        resolve_tasks(cfg.geometry_tasks)


def preflight(cfg: ZooConfig) -> None:
    """Every model can be found (offline: in a folder or the Hugging Face cache; online: a well-formed hub
    id) and has a pooling, and every mteb task exists, before anything is written."""
    from crossbert_eval.model_names import HUB_ID, cache_only
    from crossbert_eval.model_sources import resolve_model

    problems = []  # every entry that cannot run, all named at once: one fix-and-rerun, not one per entry
    for i, entry in enumerate(cfg.models):
        where = f"models[{i}] ({entry_name(entry)})"
        local = entry.model == "minilm" or Path(entry.model).exists()
        try:
            if local or cache_only():
                source = resolve_model(entry.model)
                if entry.pooling is None and source.default_pooling is None:
                    raise ZooError(f"{source.pooling_problem}; set pooling: mean|cls|max on this entry")
            elif HUB_ID.match(entry.model) is None:
                resolve_model(entry.model)  # raises its one-line 'no such folder' message
        except CrossbertError as e:
            problems.append(f"{where}: {e}" + (f"; made by: {entry.made_by}" if entry.made_by else ""))
    if problems:
        raise ZooError(f"zoo {cfg.name}: {len(problems)} of {len(cfg.models)} models cannot run: " + " | ".join(problems))
    if cfg.mteb_tasks:
        from crossbert_eval.mteb_benchmark import resolve_mteb_tasks

        resolve_mteb_tasks(cfg.mteb_tasks, None, cfg.data_root)


# ------------------------------------------------------------------------------------------------
# Running a zoo
# ------------------------------------------------------------------------------------------------


def evaluation_plan(cfg: ZooConfig, folder: ZooDir) -> EvaluationPlan:
    """The zoo's tasks, at each model's own pooling (entry_plan puts an entry's in). The config's keys become the
    settings' fields here, once (probe_layers -> layers, a LayerSpec since the config was loaded; max_probe_train -> max_train;
    max_probe_eval -> max_eval, of the probes and the geometry alike; features_dir -> cache_dir)."""
    from .geometry_runner import GeometrySettings
    from .mteb_runner import MtebSettings
    from .probe_runner import ProbeSettings

    stores = {"results_dir": str(folder.results), "cache_dir": str(cfg.features), "data_root": cfg.data_root}
    layers = cfg.probe_layers
    return EvaluationPlan(
        who=f"zoo {cfg.name}",
        probe=ProbeSettings(
            tasks=cfg.probe_tasks,
            probes=cfg.probes,
            layers=layers,
            feature_transforms=cfg.feature_transforms,
            max_train=cfg.max_probe_train,
            max_eval=cfg.max_probe_eval,
            **stores,
        ),
        geometry=GeometrySettings(tasks=cfg.geometry_tasks, layers=layers, max_eval=cfg.max_probe_eval, **stores),
        mteb=MtebSettings(tasks=cfg.mteb_tasks, layers=cfg.mteb_layers, out_dir=str(ZooDir(cfg.root).mteb), **stores),
    )


def entry_plan(plan: EvaluationPlan, entry: ZooModel) -> EvaluationPlan:
    """The zoo's plan at an entry's pooling; an entry without one: the model's own (recorded as such)."""
    if entry.pooling is None:
        return plan
    return replace(
        plan,
        probe=replace(plan.probe, poolings=[entry.pooling]),
        geometry=replace(plan.geometry, poolings=[entry.pooling]),
        mteb=replace(plan.mteb, pooling=entry.pooling),
    )


class Zoo:
    def __init__(self, cfg: ZooConfig):
        check_zoo_config(cfg)
        self.cfg = cfg
        self.root = cfg.root
        self.folder = ZooDir(cfg.root)
        self.results_dir = self.folder.results
        self.models = ModelRecords(self.folder.models)
        self.plan = evaluation_plan(cfg, self.folder)  # built here once; an entry's pooling put in by entry_plan

    def timed(self, stage: str, name: str | None, **extra):
        return timed_stage(self.folder.timings, stage, name or "(zoo)", **extra)

    def write_manifest(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.folder.config, dump_yaml(self.cfg))

    def evaluate_model(self, index: int, entry: ZooModel) -> None:
        """Load one model, record its row, then probes, geometry and mteb (units already done are skipped)."""
        import torch

        from crossbert_eval.encoders import FrozenEncoder

        cfg, name = self.cfg, entry_name(entry)
        log.info("zoo %s: model %d/%d %s (%s)", cfg.name, index + 1, len(cfg.models), name, entry.model)
        with self.timed("load", name):
            try:
                encoder = FrozenEncoder.load(
                    entry.model,
                    max_length=cfg.max_length,
                    batch_size=cfg.batch_size,
                    dtype=cfg.dtype,
                    trust_remote_code=entry.trust_remote_code,
                )
            except CrossbertError as e:  # a loader's setting said as the zoo's field that sets it
                entry_field = e.setting in {f.name for f in fields(ZooModel)}
                said = e.said_with(f"models[{index}].{e.setting}") if entry_field else str(e)
                raise ZooError(f"zoo models[{index}] ({name}): {said}") from None
        requested = [entry.pooling] if entry.pooling else None  # None: the model's own, recorded as such
        (pooling,), pooling_source = encoder.poolings_and_source(requested)
        self._record(entry, encoder, pooling, pooling_source)
        evaluate_encoder(encoder, entry_plan(self.plan, entry), lambda stage, **extra: self.timed(stage, name, **extra))
        del encoder
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _record(self, entry: ZooModel, encoder, pooling: str, pooling_source: str) -> None:
        """The model's row in checkpoints.jsonl: a finished model (step == total_steps), its family the plot line
        and its name the point on it. A row of the same name that describes other weights, pooling or family is replaced."""
        name, source, config = entry_name(entry), encoder.source, encoder.model.config
        state = (
            read_trainer_state(source.folder)
            if source.kind == "crossbert" and CheckpointDir(source.folder).trainer_state.is_file()
            else {}
        )
        metrics = state.get("metrics") or {}
        counts = count_parameters(encoder.model)
        step = state.get("step", 0)
        details = {
            "resolved_folder": str(source.folder),
            "hub_id": source.hub_id,
            "hub_revision": source.folder.name if source.hub_id else None,
            "model_kind": source.kind,
            "model_fingerprint": encoder.fingerprint,
            "model_type": getattr(config, "model_type", None),
            "pooling": pooling,
            "pooling_source": pooling_source,
            "normalize": encoder.normalize,
            **counts,
            "params_encoder": counts["params_embedding"] + counts["params_non_embedding"],
            "hidden_size": config.hidden_size,
            "layers": encoder.num_layers,
            "max_length": encoder.max_length,
            "corpus_tokens": state.get("corpus_tokens"),
            "train_flops": state.get("train_flops"),
            "train_total_steps": state.get("total_steps"),
            "val_loss": metrics.get("val_loss"),
            "val_ppl": metrics.get("val_ppl"),
            **{key: metrics.get(key) for key in SHARED_LOSS_KEYS.values()},
        }
        record = ModelRecord(
            run=name,
            line=entry_family(entry),
            point=name,
            seed=0,
            step=step,
            total_steps=step,
            checkpoint=entry.model,
            details=details,
        )
        if self.models.put(record, key=("run",), identity=("model_fingerprint", "pooling", "objective", "checkpoint")):
            log.info(
                "zoo %s: %s changed (model, pooling or family); its row in %s is replaced",
                self.cfg.name,
                name,
                self.folder.models.name,
            )

    def report(self) -> Path | None:
        with self.timed("report", None):
            return build_zoo_report(self.root)

    def run(self) -> Path:
        preflight(self.cfg)  # a missing model or task fails here, with nothing written
        self.write_manifest()
        # the baselines depend on the tasks and their splits, not on a model or its pooling: the zoo's plan gives them
        evaluate_baselines(self.plan, self.root, lambda stage, **extra: self.timed(stage, "(baselines)", **extra))
        last_report = time.monotonic()
        for i, entry in enumerate(self.cfg.models):
            self.evaluate_model(i, entry)
            if i == len(self.cfg.models) - 1 or time.monotonic() - last_report >= self.cfg.report_every_s:
                self.report()
                last_report = time.monotonic()
        log.info("zoo %s complete: %s", self.cfg.name, self.folder.report)
        return self.root


def run_zoo(cfg: ZooConfig) -> Path:
    set_offline_env()
    cfg.data_root = str(data_root(cfg.data_root))  # resolved once
    zoo = Zoo(cfg)
    report_crashes_in(cfg.root)
    return zoo.run()


def main(argv: list[str] | None = None) -> None:
    """`python -m crossbert_eval.zoo CONFIG [key=value ...]` (the same as `crossbert zoo`)."""
    config_main("crossbert_eval.zoo", ZooConfig, run_zoo, argv)


if __name__ == "__main__":
    main()
