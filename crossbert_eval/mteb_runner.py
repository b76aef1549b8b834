"""MTEB through mteb's own task classes and evaluators, on the local data root: the run, its rows, its table.

    crossbert mteb minilm --benchmark local-eng
    crossbert mteb minilm --benchmark "MTEB(eng, v2)"     # mteb's own benchmark: what local data allows
    crossbert mteb runs/tiny_crossbert --tasks STSBenchmark,Banking77Classification --layers all

* Tasks keep their real MTEB names, metadata, splits and preprocessing: local tasks are mteb's own task
  classes reading the files named by our task files (mteb_tasks.py); the metrics are mteb's.
* Which tasks run, for names and benchmarks: mteb_benchmark.py. The model wrapper: mteb_encoder.py.
* A task file whose data is not MTEB's exact data says so (`mteb.data_differs`, shown in every row and
  table, and as a `local-<digest>` dataset revision in mteb's own result file); a marked variant
  (`mteb.variant_of`) keeps its own name, so its scores never pass for MTEB's.
* mteb's result folder (`{out}/results/{org__name}/{revision}/...`, with model_meta.json) is what
  `mteb.ResultCache(out).load_results(...)` reads: revision = the weights' fingerprint, non-default layer /
  pooling / normalisation / length in mteb's experiment folders (mteb_encoder.py says how).
* `--layers all` (or N,M,...): every text set is encoded once, at every layer asked for, and each layer is scored
  as its own mteb experiment; published scores are compared with the model's published setting only (its
  last layer with its own pooling: `protocol.published_setting` in every row).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from crossbert_model.defaults import FEATURES_DIR, MTEB_DIR, POOLINGS
from crossbert_model.limits import OneOf
from crossbert_model.utils import atomic_write_text, sha256_file
from crossbert_model.readers import read_text

from .feature_cache import FeatureCache
from .layer_spec import LAYERS, LayerSpec
from .mteb_benchmark import check_local_data, resolve_mteb_tasks
from .mteb_tasks import MtebError, data_status
from .results import ResultsStore, unit_key
from .settings import SettingError, check_settings
from .tasks import all_tasks

if TYPE_CHECKING:
    from .encoders import FrozenEncoder

log = logging.getLogger(__name__)


def configure_offline(run_dir: Path) -> None:
    """No network, and every cache mteb / datasets write inside the run folder (call before importing mteb)."""
    from crossbert_model.utils import set_offline_env

    set_offline_env()
    # inside the run folder whatever the environment names: every write lands in the folder the user gave
    os.environ["MTEB_CACHE"] = str(run_dir / "mteb_cache")
    os.environ["HF_DATASETS_CACHE"] = str(run_dir / "hf_datasets_cache")


# ------------------------------------------------------------------------------------------------
# Running
# ------------------------------------------------------------------------------------------------


# mteb warns that a legacy task is superseded twice per evaluation (a log record and a Python warning,
# from AbsTask.check_if_dataset_is_superseded); we run the legacy versions on purpose (our local data is
# theirs), so we say so once per task ourselves and drop mteb's two copies.
_SUPERSEDED_PATTERN = r"The task '.*' is superseded by"


class _DropSuperseded(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "is superseded by" not in record.getMessage()


def note_superseded(task_objects: list) -> None:
    for task in task_objects:
        newer = getattr(task, "superseded_by", None)
        if newer:
            name = task.metadata.name
            log.info("mteb task %s is superseded by %s; running %s as asked (mteb's own warning is silenced)", name, newer, name)


@contextlib.contextmanager
def _without_superseded_warnings():
    """Inside a warnings.catch_warnings() block: mute mteb's superseded warning and log record."""
    warnings.filterwarnings("ignore", message=_SUPERSEDED_PATTERN)
    source = logging.getLogger("mteb.abstasks.abstask")
    drop = _DropSuperseded()
    source.addFilter(drop)
    try:
        yield
    finally:
        source.removeFilter(drop)


@dataclass(frozen=True)
class MtebRun:
    """What a run measured beside its rows (a table of them: report.text_tables.mteb_text_table): the benchmark's plan
    (its coverage) when a benchmark was asked, and the wall time."""

    plan: object | None  # mteb_benchmark.BenchmarkPlan
    wall_s: float


@dataclass
class MtebSettings:
    """What an mteb run scores and where its results go (the model and how it loads are run_mteb's). Each field's
    limit is declared here and checked on construction: SettingError names the field ("mteb setting 'pooling': ...")."""

    FIELD_KIND = "mteb setting"  # how a refusal names a field (crossbert_eval.settings)

    tasks: list[str] = field(default_factory=list)  # mteb task names (local task files' or mteb's own)
    benchmark: str | None = None  # local-eng, or an mteb benchmark: its tasks that have local data
    layers: Annotated[LayerSpec, LAYERS] = LayerSpec.LAST  # every layer scored, the texts encoded once
    pooling: Annotated[str | None, OneOf(*POOLINGS)] = (
        None  # None: the model's own (its sentence-transformers Pooling module, else mean)
    )
    out_dir: str | Path = MTEB_DIR  # mteb's result folder and caches
    results_dir: str | None = None  # the results store (None: out_dir/results)
    cache_dir: str | None = FEATURES_DIR  # the feature cache (None: none)
    overwrite: bool = False  # re-run tasks mteb has cached results for
    data_root: str | None = None
    normalize: bool | None = None  # None: the model's own (sentence-transformers' Normalize module)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_settings(self)


def run_mteb(model: str | FrozenEncoder, settings: MtebSettings, **encoder_options):
    """Run mteb on `model` at every layer of `settings.layers`; return (rows, MtebRun). Rows also go to the results store.
    Each text set is encoded ONCE for all the layers (LayerFeatures), then mteb scores each layer as its own model
    (its own ModelMeta experiment: mteb_encoder.py). Tasks run one after the other, every layer of a task before
    the next task, so memory holds one task's features.
    `encoder_options` when `model` is a name: FrozenEncoder.load's (max_length, batch_size, dtype, allow_pickle,
    trust_remote_code); `max_length` None: the model's own (sentence-transformers' max_seq_length, which MTEB's runs
    truncate at), else crossbert_model.defaults.MAX_LENGTH, at most the model's positions.
    A refused run (a bad name, layer, task or model) leaves no folder it created behind (nothing_left_on_refusal)."""
    settings.validate()  # again (fields may have been set after construction), before a model is loaded
    if not settings.tasks and settings.benchmark is None:
        raise SettingError(settings.FIELD_KIND, "tasks", "expected one or more mteb task names (or a benchmark), got none")
    out_dir = Path(settings.out_dir)
    store_dir = Path(settings.results_dir) if settings.results_dir else out_dir / "results"
    written = [out_dir / "mteb_cache", out_dir / "hf_datasets_cache", out_dir / "results", store_dir]
    with nothing_left_on_refusal(written + ([Path(settings.cache_dir)] if settings.cache_dir else [])):
        return _run_mteb(model, settings, out_dir, store_dir, encoder_options)


def _run_mteb(model, s: MtebSettings, out_dir: Path, store_dir: Path, encoder_options: dict):
    started = time.perf_counter()
    configure_offline(out_dir)
    import mteb
    from sklearn.exceptions import ConvergenceWarning

    # the tasks and their data first (mteb alone): a mistyped name is refused before the encoder stack is imported
    task_objects, plan = resolve_mteb_tasks(s.tasks, s.benchmark, s.data_root)
    if not task_objects:  # a benchmark none of whose tasks has local data here
        raise MtebError(
            f"no task of {plan.name} has local data here\n{plan.report()}"
            if plan is not None
            else f"benchmark {s.benchmark}: no task file in tasks/ declares an mteb task"
        )
    if plan is not None:
        log.info("%s", plan.report())
    check_local_data(task_objects, s.data_root)
    from .encoders import FrozenEncoder

    if isinstance(model, FrozenEncoder):
        encoder = model
    else:
        encoder = FrozenEncoder.load(model, own_length=True, **encoder_options)
    # recorded as the probe runner records it: "user", or where the model's own pooling came from
    (pooling,), pooling_source = encoder.poolings_and_source([s.pooling] if s.pooling else None)
    layer_indices = list(dict.fromkeys(encoder.layer_indices(s.layers)))  # '6,-1' on a 6-layer model: layer 6 once
    cache = FeatureCache(s.cache_dir) if s.cache_dir else None
    from .mteb_encoder import LayerFeatures, make_mteb_encoder  # imports mteb: after configure_offline

    shared = LayerFeatures(encoder, layer_indices, pooling, cache)
    wrapped = {
        layer: make_mteb_encoder(encoder, layer, pooling, normalize=s.normalize, features=shared) for layer in layer_indices
    }
    published = {layer: layer == encoder.num_layers and pooling == encoder.source.default_pooling for layer in layer_indices}
    note_superseded(task_objects)
    rows = []
    with warnings.catch_warnings(), _without_superseded_warnings():
        # mteb's logistic regression (max_iter=100, its protocol) warns on every fit for unnormalised
        # features of small models; the warning changes nothing and buries the log.
        warnings.simplefilter("ignore", ConvergenceWarning)
        result_cache = mteb.ResultCache(cache_path=out_dir)
        result_files = {
            (t.metadata.name, layer): Path(result_cache.get_task_result_path(t.metadata.name, w.mteb_model_meta))
            for t in task_objects
            for layer, w in wrapped.items()
        }
        drop_unverified_results(list(result_files.values()))
        for task in task_objects:
            name = task.metadata.name
            loaded_here = len(layer_indices) > 1 and not task.data_loaded  # a hub task: loaded once for every layer
            if loaded_here:
                task.load_data()
            for layer in layer_indices:
                if len(layer_indices) > 1:
                    log.info("mteb %s at layer %d (%s)", name, layer, ", ".join(map(str, layer_indices)))
                result = mteb.evaluate(
                    wrapped[layer],
                    [task],
                    cache=result_cache,
                    overwrite_strategy="always" if s.overwrite else "only-missing",
                    encode_kwargs={"batch_size": encoder.batch_size},
                    co2_tracker=False,
                    show_progress_bar=False,
                )
                stamp_results([result_files[(name, layer)]])
                w = wrapped[layer]
                rows += result_rows(
                    result,
                    encoder,
                    layer,
                    pooling,
                    w.normalize,
                    {name: task},
                    pooling_source,
                    w.costs,
                    published_setting=published[layer],
                )
            shared.forget()  # the next task's texts are others
            if loaded_here:
                task.unload_data()
    store = ResultsStore(store_dir)
    new = [r for r in rows if not store.done(r["unit"])]
    store.remove_units({r["unit"] for r in rows} if s.overwrite else set())
    store.append(rows if s.overwrite else new)
    folder = result_files[(task_objects[0].metadata.name, layer_indices[0])].parent
    if len(layer_indices) > 1:
        folder = (
            folder.parents[1] if folder.parent.name == "experiments" else folder
        )  # the revision's folder (mteb's cache layout)
        log.info(
            "mteb: %d text set(s), each encoded (or read from the feature cache) once for the %d layers",
            shared.passes,
            len(layer_indices),
        )
    others = " (layers other than the model's own setting: its experiments/ folder)" if len(layer_indices) > 1 else ""
    log.info("mteb results: %s%s", folder, others)
    return rows, MtebRun(plan, time.perf_counter() - started)


@contextlib.contextmanager
def nothing_left_on_refusal(paths: list[Path]):
    """On any exception in the block, remove the EMPTY folders the block created at or under `paths` (the run
    folder, mteb's and datasets' caches inside it, the results store, the feature cache): importing mteb alone
    creates its cache folder, so a refused run would leave an empty run folder behind. Files are never removed:
    a run that failed after writing results keeps them."""
    created = set()
    for path in paths:
        top = Path(os.path.abspath(path))
        while not top.parent.exists():
            top = top.parent
        if not top.exists():
            created.add(top)
    try:
        yield
    except BaseException:
        for top in created:
            if top.is_dir():
                for folder, _, _ in os.walk(top, topdown=False):  # the deepest first
                    with contextlib.suppress(OSError):
                        os.rmdir(folder)  # only an empty folder: never a file
        raise


# Beside each mteb result file this tool wrote: the SHA-256 of its content. mteb answers a task from its result cache
# by file name alone; a file without this stamp, or whose content changed since, is not trusted but evaluated again.
RESULT_STAMP_SUFFIX = ".crossbert-sha256"


def _stamp_of(path: Path) -> Path:
    return path.with_name(path.name + RESULT_STAMP_SUFFIX)


def drop_unverified_results(paths: list[Path]) -> None:
    """Remove the cached result files this tool did not write or that changed since (mteb then recomputes them)."""
    for path in paths:
        if not path.is_file():
            continue
        stamp = _stamp_of(path)
        if stamp.is_file() and read_text(stamp, "a result's SHA-256 stamp").strip() == sha256_file(path):
            continue
        log.warning(
            "%s: a cached mteb result %s: not trusted, evaluated again",
            path,
            "that changed since this tool wrote it" if stamp.is_file() else "this tool did not write",
        )
        path.unlink()


def stamp_results(paths: list[Path]) -> None:
    """Stamp the result files of this run (computed now, or cached and verified above)."""
    for path in paths:
        if path.is_file():
            atomic_write_text(_stamp_of(path), sha256_file(path) + "\n")


def result_rows(
    result,
    encoder: FrozenEncoder,
    layer: int,
    pooling: str,
    normalize: bool,
    task_objects: dict,
    pooling_source: str = "user",
    costs: dict | None = None,
    published_setting: bool | None = None,
) -> list[dict]:
    """One row per (task, split, subset, metric). `costs` (the wrapper's, per task) adds what encoding took
    in this run; a task mteb answered from its result cache has none. `published_setting`: whether this is the
    layer and pooling a published score of the model is for (its last layer, its own pooling); None: the last
    layer is. Tables compare published scores with these rows only."""
    if published_setting is None:
        published_setting = layer == encoder.num_layers
    rows = []
    ident = encoder.identity
    for task_result in result.task_results:
        task = task_objects[task_result.task_name]
        main = task.metadata.main_score
        local_task = all_tasks().get(task_result.task_name)
        local_spec = local_task.mteb if local_task else None
        cost = (costs or {}).get(task_result.task_name)
        for split, subsets in task_result.scores.items():
            for scores in subsets:
                key = unit_key(
                    model=encoder.fingerprint,
                    task=task_result.task_name,
                    split=split,
                    subset=scores["hf_subset"],
                    probe="mteb",
                    layer=layer,
                    pooling=pooling,
                    normalize=normalize,
                    **encoder.feature_signature,
                )
                base = {
                    **ident,
                    "task": task_result.task_name,
                    "family": f"mteb:{task.metadata.type}",
                    "task_type": task.metadata.type,
                    "split": split,
                    "hf_subset": scores["hf_subset"],
                    "probe": "mteb",
                    "layer": layer,
                    "relative_depth": layer / ident["num_layers"],
                    "pooling": pooling,
                    "pooling_source": pooling_source,
                    "seed": task.seed,
                    "protocol": {
                        "mteb_version": task_result.mteb_version,
                        "normalize": normalize,
                        "partial": bool(local_spec and local_spec.partial),
                        "local_data": type(task).__name__.startswith("Local"),
                        "data": data_status(local_task) if local_task else "mteb",
                        "data_differs": local_spec.data_differs if local_spec else None,
                        "variant_of": local_spec.variant_of if local_spec else None,
                        "dataset_revision": task_result.dataset_revision,
                        "prompts": (cost or {}).get("prompts") or None,
                        "published_setting": published_setting,
                    },
                    # what the task cost: mteb's evaluation time (encoding + scoring), and our encoding in this
                    # run (0 texts: every feature came from the feature cache)
                    "eval_time_s": task_result.evaluation_time,
                    # computed in this run, or read from mteb's result cache (verified against this tool's stamp)
                    "result_source": "computed" if cost else "mteb result cache (verified)",
                    "encode_s": round(cost["encode_s"], 3) if cost else None,
                    "encoded_texts": cost["encoded"] if cost else None,
                    "unit": key,
                }
                metrics = {m: v for m, v in scores.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
                for metric, value in metrics.items():
                    if metric == "main_score":
                        continue
                    rows.append({**base, "metric": metric, "value": float(value), "is_main": metric == main})
    return rows


__all__ = ["run_mteb", "MtebSettings", "configure_offline", "result_rows", "nothing_left_on_refusal", "MtebError"]
