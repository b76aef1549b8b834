"""The collapse plot for any set of pretrained encoders: `crossbert zoo`.

    crossbert zoo configs/zoo/offline.yaml [key=value ...]
    CROSSBERT_ONLINE=1 crossbert zoo configs/zoo/bert_miniatures.yaml
    crossbert report runs/zoo/offline                 # rebuild the zoo's tables, plots and report

A zoo is a list of frozen encoders, each a local folder (Hugging Face or sentence-transformers), one of
our checkpoints or run folders, 'minilm', or a hub id (from the Hugging Face cache offline, downloaded
online), with a display name and a family label. Each is probed with the sweep's machinery: linear and
kNN probes on every layer (crossbert_eval.probe), per-layer geometry (geometry_runner) and the local mteb
tasks (mteb_runner), into one results store. The zoo folder holds what a sweep folder holds:

    zoo.yaml                 the resolved config
    checkpoints.jsonl        one row per model: family (as `objective`), name (as `size`), pooling and where
                             it came from, parameters counted from the loaded torch model, layers, ...
    results/results.jsonl    every score row (units already there are skipped: a rerun resumes)
    features/, mteb/         the feature cache and mteb's own result cache
    timings.jsonl, tables/, plots/, report.md, report.html

Models that trained with us and models that did not share one plot: score against non-embedding
parameters with one line per family (last layer, and the best layer dashed), layer-wise curves by relative
depth, last layer vs best layer. Rows join the models on (weights fingerprint, pooling), so one model
entered twice with two poolings gives two points, and two entries with the same weights and pooling share
their units (computed once).

Pooling per model: the entry's `pooling` if given, else the model's sentence-transformers Pooling config,
else mean; recorded in every row (`pooling`, `pooling_source`) and in checkpoints.jsonl.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from crossbert_model.args import ConfigError, config_main, dump_yaml
from crossbert_model.errors import CrossbertError
from crossbert_model.shared_loss import SHARED_LOSS_KEYS
from crossbert_model.utils import append_jsonl, atomic_write_text, data_root, provenance, read_jsonl, set_offline_env

from . import report as R
from .results import ResultsStore

log = logging.getLogger("crossbert.zoo")

from crossbert_model.defaults import DTYPES, POOLINGS  # noqa: E402
ZOO_FILE = "zoo.yaml"
MODELS_FILE = "checkpoints.jsonl"  # the sweep's name and columns, so report.py's pieces read it


class ZooError(CrossbertError, ValueError):
    """A zoo entry or setting is wrong; the message names the entry and what was expected."""


@dataclass
class ZooModel:
    model: str  # a model folder, one of our checkpoint / run folders, 'minilm', or a hub id org/name[@revision]
    name: str | None = None  # display name (default: the model argument); unique within the zoo
    family: str | None = None  # the line this model belongs to in the size plots (default: its name)
    pooling: str | None = None  # mean | cls | max; default: the sentence-transformers config, else mean
    # run the Python the model folder carries (auto_map) to load it: only for a folder you trust (recorded in its rows)
    trust_remote_code: bool = False


@dataclass
class ZooConfig:
    name: str = "zoo"
    out_dir: str = "runs/zoo"
    models: list[ZooModel] = field(default_factory=list)
    probe_tasks: list[str] = field(default_factory=lambda: ["SST-2", "STS-B"])
    probes: list[str] = field(default_factory=lambda: ["linear", "knn"])
    probe_layers: str = "all"
    max_probe_train: int | None = None  # seeded subsample of each probe's train split
    # features of the cosine and kNN probes: raw, centred, whitened (crossbert_eval.probes.FEATURE_TRANSFORMS)
    feature_transforms: list[str] = field(default_factory=lambda: ["raw"])
    geometry_tasks: list[str] = field(default_factory=lambda: ["SST-2", "STS-B"])
    mteb_tasks: list[str] = field(default_factory=lambda: ["STSBenchmark"])
    mteb_layers: str = "last"  # all | last | N,M,...: layers mteb evaluates (features of every layer are cached)
    batch_size: int = 128  # encoding
    max_length: int | None = None  # tokens per text, at most each model's positions (unset: 128, or fewer where a model has fewer)
    dtype: str = "fp32"  # fp32 | bf16 | auto: as FrozenEncoder.load
    features_dir: str | None = None  # feature cache (default: <root>/features); zoos may share one
    data_root: str | None = None

    @property
    def root(self) -> Path:
        return Path(self.out_dir) / self.name

    @property
    def features(self) -> Path:
        return Path(self.features_dir) if self.features_dir else self.root / "features"


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
      crossbert_model.config.parameter_counts()['encoder_non_embedding'];
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
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
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


def validate_config(cfg: ZooConfig) -> None:
    """Everything that needs no model load: entries, poolings, probes, task names. One ZooError / ConfigError."""
    from crossbert_eval.probe import ProbeSettings
    from crossbert_eval.tasks import resolve_tasks

    if not cfg.name or "/" in cfg.name:
        raise ConfigError(f"zoo field 'name': expected a folder name, got {cfg.name!r}")
    if not cfg.models:
        raise ConfigError("zoo field 'models': expected a list of models ({model: ..., name: ..., family: ...}), got none")
    names: dict[str, int] = {}
    for i, entry in enumerate(cfg.models):
        where = f"zoo models[{i}] ({entry_name(entry)})"
        if not entry.model or not str(entry.model).strip():
            raise ConfigError(f"zoo models[{i}].model: expected a model folder, checkpoint, 'minilm' or hub id, got {entry.model!r}")
        if entry.pooling is not None and entry.pooling not in POOLINGS:
            raise ConfigError(f"{where}.pooling: expected one of {', '.join(POOLINGS)} (or unset: the model's own), got {entry.pooling!r}")
        name = entry_name(entry)
        if name in names:
            raise ConfigError(f"{where}.name: {name!r} is also the name of models[{names[name]}]; display names must be unique")
        names[name] = i
    if cfg.dtype not in DTYPES:
        raise ConfigError(f"zoo field 'dtype': expected fp32, bf16 or auto, got {cfg.dtype!r}")
    for key, optional in (("batch_size", False), ("max_length", True)):
        value = getattr(cfg, key)
        if not (optional and value is None) and value < 1:
            raise ConfigError(f"zoo field {key!r}: expected a positive integer{' (or unset)' * optional}, got {value!r}")
    for key in ("probe_layers", "mteb_layers"):
        _check_layers(key, getattr(cfg, key))
    if cfg.probe_tasks:
        try:
            ProbeSettings(tasks=cfg.probe_tasks, probes=cfg.probes, max_train=cfg.max_probe_train,
                          feature_transforms=cfg.feature_transforms)  # validates probes / max_train / feature_transforms
        except CrossbertError as e:
            raise ConfigError(f"zoo fields 'probes' / 'max_probe_train' / 'feature_transforms': {str(e).removeprefix('--probe: ')}") from None
        resolve_tasks(cfg.probe_tasks)
    if cfg.geometry_tasks:
        resolve_tasks(cfg.geometry_tasks)


def _check_layers(key: str, spec) -> None:
    from crossbert_eval.encoders import EncoderError, parse_layers

    try:
        parse_layers(spec)
    except EncoderError as e:
        raise ConfigError(f"zoo field {key!r}: {e}") from None


def preflight(cfg: ZooConfig) -> None:
    """Every model can be found (offline: in a folder or the Hugging Face cache; online: a well-formed hub
    id) and has a pooling, and every mteb task exists, before anything is written."""
    from crossbert_eval.encoders import _HUB_ID, _hub_offline, resolve_model

    for i, entry in enumerate(cfg.models):
        where = f"zoo models[{i}] ({entry_name(entry)})"
        local = entry.model == "minilm" or Path(entry.model).exists()
        try:
            if local or _hub_offline():
                source = resolve_model(entry.model)
                if entry.pooling is None and source.default_pooling is None:
                    raise ZooError(f"{source.pooling_problem}; set pooling: mean|cls|max on this entry")
            elif _HUB_ID.match(entry.model) is None:
                resolve_model(entry.model)  # raises its one-line 'no such folder' message
        except CrossbertError as e:
            raise ZooError(f"{where}: {e}") from None
    if cfg.mteb_tasks:
        from crossbert_eval.mteb_benchmark import resolve_mteb_tasks

        resolve_mteb_tasks(cfg.mteb_tasks, None, cfg.data_root)


# ------------------------------------------------------------------------------------------------
# Running a zoo
# ------------------------------------------------------------------------------------------------


class Zoo:
    def __init__(self, cfg: ZooConfig):
        validate_config(cfg)
        self.cfg = cfg
        self.root = cfg.root
        self.results_dir = self.root / "results"
        self.models_file = self.root / MODELS_FILE

    @contextlib.contextmanager
    def timed(self, stage: str, name: str | None, **extra):
        started = time.perf_counter()
        yield
        row = {"stage": stage, "run": name or "(zoo)", "seconds": round(time.perf_counter() - started, 2), **extra}
        append_jsonl(self.root / "timings.jsonl", [row])

    def write_manifest(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.root / ZOO_FILE, dump_yaml(self.cfg))

    def probe_model(self, index: int, entry: ZooModel) -> None:
        """Load one model, record its row, then probes, geometry and mteb (units already done are skipped)."""
        import torch

        from crossbert_eval.encoders import FrozenEncoder
        from crossbert_eval.geometry_runner import GeometryRunner, GeometrySettings
        from crossbert_eval.mteb_runner import run_mteb
        from crossbert_eval.probe import ProbeRunner, ProbeSettings
        from crossbert_eval.tasks import TaskDataMissing, resolve_tasks

        cfg, name = self.cfg, entry_name(entry)
        log.info("zoo %s: model %d/%d %s (%s)", cfg.name, index + 1, len(cfg.models), name, entry.model)
        with self.timed("load", name):
            try:
                encoder = FrozenEncoder.load(entry.model, max_length=cfg.max_length, batch_size=cfg.batch_size, dtype=cfg.dtype,
                                             trust_remote_code=entry.trust_remote_code)  # fmt: skip
            except CrossbertError as e:
                raise ZooError(f"zoo models[{index}] ({name}): {e}") from None
        requested = [entry.pooling] if entry.pooling else None  # None: the model's own, recorded as such
        (pooling,), pooling_source = encoder.poolings_and_source(requested)
        self._record(entry, encoder, pooling, pooling_source)
        features, results = str(cfg.features), str(self.results_dir)
        if cfg.probe_tasks:
            settings = ProbeSettings(
                tasks=cfg.probe_tasks, probes=cfg.probes, layers=cfg.probe_layers, poolings=requested, results_dir=results,
                cache_dir=features, max_train=cfg.max_probe_train, data_root=cfg.data_root, feature_transforms=cfg.feature_transforms,
            )  # fmt: skip
            runner = ProbeRunner(encoder, settings)
            with self.timed("probe", name):
                runner.run(resolve_tasks(cfg.probe_tasks))
            if runner.missing:
                raise TaskDataMissing(f"zoo {cfg.name}: probe task data missing: {'; '.join(runner.missing.values())}")
        if cfg.geometry_tasks:
            geometry = GeometryRunner(encoder, GeometrySettings(
                tasks=cfg.geometry_tasks, layers=cfg.probe_layers, poolings=requested, results_dir=results, cache_dir=features,
                data_root=cfg.data_root,
            ))  # fmt: skip
            with self.timed("geometry", name):
                geometry.run(resolve_tasks(cfg.geometry_tasks))
            if geometry.missing:
                raise TaskDataMissing(f"zoo {cfg.name}: geometry task data missing: {'; '.join(geometry.missing.values())}")
        layers = encoder.layer_indices(cfg.mteb_layers)
        for layer in layers if cfg.mteb_tasks else []:
            with self.timed("mteb", name, layer=layer):
                run_mteb(encoder, tasks=cfg.mteb_tasks, benchmark=None, layer=layer, pooling=entry.pooling, out_dir=self.root / "mteb",
                         results_dir=results, feature_cache=features, batch_size=cfg.batch_size, data_root=cfg.data_root,
                         cache_layers=layers)  # fmt: skip
        del encoder
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _record(self, entry: ZooModel, encoder, pooling: str, pooling_source: str) -> None:
        """The model's row in checkpoints.jsonl (the sweep's columns: family as `objective`, name as `size`).
        A row of the same name that describes other weights, pooling or family is replaced."""
        name, source, config = entry_name(entry), encoder.source, encoder.model.config
        state_file = source.folder / "trainer_state.json"
        state = json.loads(state_file.read_text()) if source.kind == "crossbert" and state_file.is_file() else {}
        metrics = state.get("metrics") or {}
        counts = count_parameters(encoder.model)
        step = state.get("step", 0)
        row = {
            # every zoo model is a finished model: step == total_steps (the report's "final")
            "run": name, "objective": entry_family(entry), "size": name, "seed": 0, "step": step, "total_steps": step,
            "checkpoint": entry.model, "resolved_folder": str(source.folder), "hub_id": source.hub_id,
            "hub_revision": source.folder.name if source.hub_id else None, "model_kind": source.kind,
            "model_fingerprint": encoder.fingerprint, "model_type": getattr(config, "model_type", None),
            "pooling": pooling, "pooling_source": pooling_source, "normalize": encoder.normalize,
            **counts, "params_encoder": counts["params_embedding"] + counts["params_non_embedding"],
            "hidden_size": config.hidden_size, "layers": encoder.num_layers, "max_length": encoder.max_length,
            "corpus_tokens": state.get("corpus_tokens"), "train_flops": state.get("train_flops"),
            "train_total_steps": state.get("total_steps"), "val_loss": metrics.get("val_loss"), "val_ppl": metrics.get("val_ppl"),
            **{key: metrics.get(key) for key in SHARED_LOSS_KEYS.values()},
        }  # fmt: skip
        identity = ("model_fingerprint", "pooling", "objective", "checkpoint")
        rows = read_jsonl(self.models_file)
        same = [r for r in rows if r.get("run") == name]
        if same and all(all(r.get(k) == row[k] for k in identity) for r in same):
            return
        if same:  # the entry changed under the same name: its old row goes
            log.info("zoo %s: %s changed (model, pooling or family); its row in %s is replaced", self.cfg.name, name, MODELS_FILE)
            kept = [r for r in rows if r.get("run") != name]
            atomic_write_text(self.models_file, "".join(json.dumps(r, default=str) + "\n" for r in kept))
        append_jsonl(self.models_file, [row])

    def report(self) -> Path | None:
        with self.timed("report", None):
            return build_zoo_report(self.root)

    def run(self) -> Path:
        preflight(self.cfg)  # a missing model or task fails here, with nothing written
        self.write_manifest()
        for i, entry in enumerate(self.cfg.models):
            self.probe_model(i, entry)
            self.report()
        log.info("zoo %s complete: %s", self.cfg.name, self.root / "report.md")
        return self.root


def run_zoo(cfg: ZooConfig) -> Path:
    set_offline_env()
    cfg.data_root = str(data_root(cfg.data_root))  # resolved once
    return Zoo(cfg).run()


# ------------------------------------------------------------------------------------------------
# Tables, plots and report (report.py's pieces; rows join models on fingerprint AND pooling)
# ------------------------------------------------------------------------------------------------


def is_zoo(root: str | os.PathLike) -> bool:
    return (Path(root) / ZOO_FILE).is_file()


def load_models(root: Path) -> pd.DataFrame:
    models = pd.DataFrame(read_jsonl(Path(root) / MODELS_FILE))
    return models.drop_duplicates("run", keep="last") if len(models) else models


def _join(root: Path, rows: list[dict], geometry: bool) -> pd.DataFrame:
    models = load_models(root)
    results = pd.DataFrame(rows)
    if models.empty or results.empty or "probe" not in results.columns:
        return pd.DataFrame()
    results = results[(results["probe"] == R.GEOMETRY_PROBE) == geometry]
    keep = ["model_fingerprint", "task", "family", "split", "probe", "feature_transform", "layer", "relative_depth", "pooling", "metric",
            "value", "is_main", "ci_low", "ci_high", "n_eval", "unit"]  # fmt: skip
    results = R.with_probe_variants(results[[c for c in keep if c in results.columns]])
    if results.empty:
        return pd.DataFrame()
    layer = pd.to_numeric(results["layer"], errors="coerce")
    results = results[layer.notna()].assign(layer=layer.dropna().astype(int))
    out = results.merge(models, on=["model_fingerprint", "pooling"], how="inner")
    out["is_final"] = True
    out["is_last_layer"] = out["layer"] == out["layers"]
    return out


def zoo_scores(root: Path, rows: list[dict] | None = None) -> pd.DataFrame:
    """Every probe / mteb row joined with its zoo model(s); `score` in points, with the bootstrap interval."""
    scores = _join(Path(root), R.result_rows(Path(root)) if rows is None else rows, geometry=False)
    if scores.empty:
        return scores
    scores["score"] = 100 * scores["value"]
    for end in ("low", "high"):
        scores[f"score_ci_{end}"] = 100 * pd.to_numeric(scores.get(f"ci_{end}", np.nan), errors="coerce")
    return scores


def zoo_geometry(root: Path, rows: list[dict] | None = None) -> pd.DataFrame:
    geo = _join(Path(root), R.result_rows(Path(root)) if rows is None else rows, geometry=True)
    if geo.empty:
        return geo
    geo["score"] = geo["value"]
    return R._headline_split(geo)


MODEL_COLUMNS = ["objective", "size", "checkpoint", "model_kind", "pooling", "pooling_source", "layers", "hidden_size", "params_total",
                 "params_embedding", "params_non_embedding"]  # fmt: skip
DISPLAY = {"objective": "family", "size": "model"}


def models_table(root: Path) -> pd.DataFrame:
    models = load_models(root)
    if models.empty:
        return models
    table = models[[c for c in MODEL_COLUMNS if c in models.columns]].sort_values(["objective", "params_non_embedding"])
    return table.rename(columns=DISPLAY)


def summary_table(scores: pd.DataFrame) -> pd.DataFrame:
    """Per model: last-layer main score of every task x probe, and the GLUE / mteb averages."""
    summary = R.summarise(scores)
    if summary.empty:
        return summary
    cols = [c for c in summary.columns if c.startswith(("glue_", "mteb_")) or ":" in c]
    return summary[["objective", "size", "params_non_embedding", *cols]].rename(columns=DISPLAY)


def last_vs_best(scores: pd.DataFrame) -> pd.DataFrame:
    table = R._layer_best(scores)
    if table.empty:
        return table
    table = table.drop(columns=[c for c in ("last_layer_std", "best_std", "seeds") if c in table.columns])
    table["last_minus_best"] = table["last_layer"] - table["best"]
    return table.rename(columns=DISPLAY)


def geometry_table(geo: pd.DataFrame) -> pd.DataFrame:
    """Last layer: each geometry metric per model (one seed: no spread columns)."""
    table = R.geometry_table(geo)
    if table.empty:
        return table
    return table.drop(columns=["std", "seeds"]).rename(columns={**DISPLAY, "mean": "value"})


# A name may hold spaces; report._panel_grid splits its legend labels "family name" at the last space.
_NBSP = "\u00a0"


def _plot_names(df: pd.DataFrame) -> pd.DataFrame:
    return df.assign(size=df["size"].astype(str).str.replace(" ", _NBSP)) if len(df) else df


@contextlib.contextmanager
def family_colors(families):
    """One colour per family for report.py's plots (which colour by `objective`), for this build only."""
    import matplotlib

    saved = dict(R.COLORS)
    palette = [c for c in matplotlib.colormaps["tab10"].colors if c != matplotlib.colormaps["tab10"].colors[7]]  # no grey
    if len(set(families)) > len(palette):
        palette = list(matplotlib.colormaps["tab20"].colors)
    for i, family in enumerate(sorted(set(families))):
        R.COLORS[family] = matplotlib.colors.to_hex(palette[i % len(palette)])
    try:
        yield
    finally:
        R.COLORS.clear()
        R.COLORS.update(saved)


def plot_zoo_collapse(scores: pd.DataFrame, out: Path) -> list[Path]:
    """One panel per (task, probe): score against non-embedding parameters (log), one line per family; the
    last layer solid (with its bootstrap interval), the best layer of each model dashed."""
    plt = R._pyplot()
    main = R._headline_split(scores[scores["is_main"]]) if len(scores) else scores
    if main.empty:
        return []
    panels = sorted(main.groupby(["task", "probe"]).groups)
    cols = min(3, len(panels))
    rows = int(np.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.8 * cols, 3.6 * rows + 0.8), squeeze=False, layout="constrained")
    drawn: set[str] = set()
    for ax, (task, probe) in zip(axes.flat, panels):
        sub = main[(main["task"] == task) & (main["probe"] == probe)]
        for family, fam in sub.groupby("objective"):
            color = R._color(family)
            last = R.seed_bands(fam[fam["is_last_layer"]], ["params_non_embedding", "size"]).sort_values("params_non_embedding")
            per_layer = R.seed_bands(fam, ["params_non_embedding", "size", "layer"])
            best = per_layer.loc[per_layer.groupby("size")["mean"].idxmax()].sort_values("params_non_embedding")
            drawn |= set(last["band"])
            ax.errorbar(last["params_non_embedding"], last["mean"], yerr=R._yerr(last), marker="o", ms=4, capsize=2, color=color,
                        label=f"{family}: last layer")  # fmt: skip
            ax.plot(best["params_non_embedding"], best["mean"], ls="--", marker="x", ms=4, color=color, alpha=0.7,
                    label=f"{family}: best layer")  # fmt: skip
            for _, row in last.iterrows():
                ax.annotate(str(row["size"]), (row["params_non_embedding"], row["mean"]), textcoords="offset points", xytext=(4, 4),
                            fontsize=6, color="#555")  # fmt: skip
        R._log_x(ax)
        ax.margins(x=0.1, y=0.12)
        ax.set_title(f"{task} - {probe} ({sub['metric'].iloc[0]})", fontsize=9)
        ax.set_xlabel("non-embedding parameters (counted from the loaded model, log)", fontsize=8)
        ax.set_ylabel("score (%)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    legend: dict = {}
    for ax in axes.flat:
        legend.update(zip(*reversed(ax.get_legend_handles_labels())))
    labels = sorted(legend, key=lambda label: (label.rsplit(": ", 1)[0], label.endswith("best layer")))  # a family's two lines together
    fig.legend([legend[label] for label in labels], labels, loc="outside lower center", ncol=min(len(labels), 4), fontsize=8)
    caption = R.band_caption(drawn) + "; dashed: each model's best layer (chosen on the reported split)"
    fig.suptitle(f"Frozen probe score vs model size, one line per family (last layer solid, best layer dashed)\n{caption}")
    return R._save(fig, out, "collapse", caption)


def plot_zoo_layerwise(scores: pd.DataFrame, out: Path) -> list[Path]:
    main = R._headline_split(scores[scores["is_main"]]) if len(scores) else scores
    return R._panel_grid(_plot_names(main), "relative_depth", "relative depth (layer / layers; 0 = embeddings)",
                         "Layer-wise frozen probe score by relative depth (colour: family)", out, "layerwise")  # fmt: skip


def build_zoo_report(root: str | os.PathLike) -> Path | None:
    """Tables, plots, report.md and report.html of a zoo folder; None (nothing written) without scores yet."""
    root = Path(root)
    if not is_zoo(root):
        raise R.ReportError(f"{root}: not a zoo folder (no {ZOO_FILE})")
    rows = R.result_rows(root)
    scores = zoo_scores(root, rows)
    if scores.empty:
        log.info("zoo report: no scores yet under %s", root)
        return None
    geo = zoo_geometry(root, rows)
    tables = {
        "models": models_table(root), "scores": scores, "summary": summary_table(scores), "last_vs_best": last_vs_best(scores),
        "comparisons": R.comparisons(scores, None, ResultsStore(root / "results").load_predictions),  # depth only: one seed per model
        "geometry": geometry_table(geo),
    }  # fmt: skip
    (root / "tables").mkdir(parents=True, exist_ok=True)
    for name, df in tables.items():
        df.to_csv(root / "tables" / f"{name}.csv", index=False)
        df.to_parquet(root / "tables" / f"{name}.parquet", index=False)
    plots_dir = root / "plots"
    R.CAPTIONS.clear()
    with family_colors(scores["objective"]):
        plots = plot_zoo_collapse(scores, plots_dir) + plot_zoo_layerwise(scores, plots_dir)
        plots += R.plot_geometry_depth(_plot_names(geo), plots_dir) + R.plot_geometry_size(geo, plots_dir)
    md = render_zoo_markdown(root, tables, [p for p in plots if p.suffix == ".png"], R.duplicates_warning(rows))
    atomic_write_text(root / "report.md", md)
    atomic_write_text(root / "report.html", R.render_html(md).replace("<title>sweep report</title>", "<title>zoo report</title>"))
    return root / "report.md"


def render_zoo_markdown(root: Path, tables: dict, plots: list[Path], warning: str | None) -> str:
    config = (root / ZOO_FILE).read_text() if (root / ZOO_FILE).exists() else ""
    models, summary = tables["models"].copy(), tables["summary"].copy()
    for df in (models, summary):
        for col in ("params_total", "params_embedding", "params_non_embedding"):
            if col in df:
                df[col] = df[col].map(lambda n: f"{int(n):,}" if pd.notna(n) else "")
    geometry = tables["geometry"]
    parts = [
        f"# Zoo report: {root.name}",
        "",
        *([f"**{warning}**", ""] if warning else []),
        "Frozen encoders probed with the sweep's machinery. Scores are points (x100) of each task's main metric, on each task's "
        "reported split (GLUE dev, SentEval / mteb test). `family` is the zoo's label (the line in the size plots); parameters are "
        "counted from the loaded model: `params_non_embedding` (the x axis) excludes the embedding tables and a BERT pooler, "
        "which computes none of the probed hidden states; `params_total` is everything the checkpoint holds.",
        "",
        "## Models",
        "",
        R._markdown_table(models),
        "",
        "`pooling_source`: `user` = set on the zoo entry; `sentence-transformers:...` = the model's own Pooling config; "
        "`default` = mean (no sentence-transformers config).",
        "",
        "## Last layer, per model",
        "",
        R._markdown_table(summary),
        "",
        "`glue_*` averages the GLUE tasks probed; `mteb_*` averages mteb's main scores (by task type, and overall).",
        "",
        "## Last layer vs best layer",
        "",
        "The best layer is chosen on the reported split itself (an oracle: an upper bound on what a layer choice can give).",
        "",
        R._markdown_table(tables["last_vs_best"]),
        "",
        "## Which differences are beyond noise",
        "",
        "One seed per model: each model's layer 0 against its last layer, per task and probe; models are not tested against "
        "each other (one seed each: seed variance unmeasured).",
        "",
        R.methods_paragraph(tables["comparisons"]),
        "",
        R.noise_paragraph(tables["comparisons"]).replace("a sweep needs two objectives at one size, or", "a zoo needs"),
        "",
        *(["## Representation geometry (last layer)", "", *R.centring_section(geometry, "value"),
           R._markdown_table(geometry, floatfmt="{:.4f}"), ""] if len(geometry) else []),
        "## Plots",
        "",
        *[f"![{p.stem}](plots/{p.name})\n\n*{p.stem}: {R.CAPTIONS.get(p.stem, '')}*\n" for p in plots],
        "## Where the time went (wall seconds per stage)",
        "",
        R._timing_table(root),
        "",
        "## Configuration",
        "",
        "```yaml",
        config.rstrip(),
        "```",
        "",
        "## Provenance",
        "",
        "```json",
        json.dumps(provenance(), indent=2),
        "```",
        "",
        "Tables: `tables/models.csv`, `tables/scores.csv` (every score row joined with its model), `tables/summary.csv`, "
        "`tables/last_vs_best.csv`, `tables/comparisons.csv`, `tables/geometry.csv` (also as parquet).",
    ]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> None:
    """`python -m crossbert_eval.zoo CONFIG [key=value ...]` (the same as `crossbert zoo`)."""
    config_main("crossbert_eval.zoo", ZooConfig, run_zoo, argv)

if __name__ == "__main__":
    main()
