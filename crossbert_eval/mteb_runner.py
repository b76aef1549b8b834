"""MTEB through mteb's own task classes and evaluators, on the local data root.

    crossbert mteb minilm --benchmark local-eng
    crossbert mteb runs/tiny_crossbert --tasks STSBenchmark,Banking77Classification --layer last

* Tasks keep their real MTEB names, metadata, splits and preprocessing: a local task is a subclass of
  the task class mteb itself ships (`type(mteb.get_task(name))`) that overrides `load_data` only; it
  reads the files named by the task's YAML file in `tasks/` and then runs mteb's own
  `dataset_transform`. The metrics are mteb's.
* TrecQA answer selection has no MTEB task: `TrecQAReranking` is an mteb reranking task
  (AbsTaskRetrieval with top-ranked candidates) of our own, declared in tasks/reranking/.
* Any other name mteb knows runs from the hub when CROSSBERT_ONLINE=1.
* `MtebEncoder` wraps a frozen encoder with an explicit layer and pooling; its ModelMeta name is
  the model, its revision the weights' fingerprint + layer + pooling, so two checkpoints (or two
  layers) never share mteb's cached results.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import warnings
from pathlib import Path

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from .encoders import FeatureCache, FrozenEncoder
from .results import ResultsStore, unit_key
from .tasks import Task, TaskDataMissing, TaskError, all_tasks
from crossbert_model.errors import CrossbertError

log = logging.getLogger(__name__)

BENCHMARKS = {"local-eng": "every task file with an `mteb:` section (STS, classification, clustering, reranking)"}
# MTEB's legacy TwentyNewsgroupsClustering has 10 cluster sets; the 20news-bydate test set (the one it
# clusters) has 7,532 posts. Our copy merged train and test, so each set is a seeded sample of that size.
CLUSTER_SETS = 10
CLUSTER_SET_SIZE = 7532


class MtebError(CrossbertError, ValueError):
    pass


def configure_offline(run_dir: Path) -> None:
    """No network, and every cache mteb / datasets write inside the run folder (call before importing mteb)."""
    from crossbert_model.utils import set_offline_env

    set_offline_env()
    os.environ.setdefault("MTEB_CACHE", str(run_dir / "mteb_cache"))
    os.environ.setdefault("HF_DATASETS_CACHE", str(run_dir / "hf_datasets_cache"))


# ------------------------------------------------------------------------------------------------
# The model
# ------------------------------------------------------------------------------------------------


def _meta_name(encoder: FrozenEncoder) -> str:
    """mteb's 'org/name': a hub model keeps its id; the rest are crossbert/<name> (MiniLM keeps its real one)."""
    if encoder.source.hub_id:
        return encoder.source.hub_id
    name = encoder.name.split("@")[0].replace("/", "__")
    if name.startswith("sentence-transformers__"):
        return f"sentence-transformers/{name.removeprefix('sentence-transformers__')}"
    return f"crossbert/{name}"


def make_mteb_encoder(
    encoder: FrozenEncoder, layer: int, pooling: str | None, cache: FeatureCache | None, normalize: bool | None = None,
    cache_layers: list[int] | None = None,
):  # fmt: skip
    """`pooling` None: the model's own (encoder.default_pooling). `normalize` None: as the model itself
    does (sentence-transformers' Normalize module). `cache_layers`: encode (and cache) these layers
    whenever texts are encoded, so that running mteb again at another layer of the same checkpoint
    encodes nothing."""
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.models.model_meta import ModelMeta

    pooling = pooling or encoder.default_pooling
    if normalize is None:
        normalize = encoder.normalize

    class MtebEncoder(AbsEncoder):
        """A frozen encoder at one layer and pooling, as mteb's EncoderProtocol."""

        def __init__(self):
            self.encoder, self.layer, self.pooling, self.cache, self.normalize = encoder, layer, pooling, cache, normalize
            step = f"-step{encoder.source.step}" if encoder.source.step is not None else ""
            self.mteb_model_meta = ModelMeta(
                loader=None,
                name=_meta_name(encoder),
                revision=f"{encoder.fingerprint}{step}-L{layer}-{pooling}{'-norm' if normalize else ''}",
                release_date=None,
                languages=["eng-Latn"],
                n_parameters=sum(p.numel() for p in encoder.model.parameters()),
                memory_usage_mb=None,
                max_tokens=encoder.max_length,
                embed_dim=encoder.model.config.hidden_size,
                license=None,
                open_weights=True,
                public_training_code=None,
                public_training_data=None,
                framework=["PyTorch"],
                similarity_fn_name="cosine",
                use_instructions=False,
                training_datasets=None,
            )

        def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
            texts = [t for batch in inputs for t in batch["text"]]
            label = f"mteb/{task_metadata.name}/{hf_subset}/{hf_split}"
            if self.cache is not None:
                layers = sorted(set(cache_layers or []) | {self.layer})
                feats = self.cache.features(self.encoder, texts, None, layers, [self.pooling], label)
            else:
                feats = self.encoder.encode(texts, layers=[self.layer], poolings=[self.pooling], desc=label)
            x = feats[(self.layer, self.pooling)]
            if self.normalize:
                x = x / np.clip(np.linalg.norm(x, axis=1, keepdims=True), 1e-12, None)
            return x

    return MtebEncoder()


# ------------------------------------------------------------------------------------------------
# Local tasks: mteb's classes, our files
# ------------------------------------------------------------------------------------------------


def _sts_dataset(task: Task, root):
    from datasets import Dataset, DatasetDict

    out = {}
    for split in task.mteb.get("eval_splits", ["test"]):
        s = task.load_split(split, root)
        out[split] = Dataset.from_dict({"sentence1": s.texts, "sentence2": s.texts_pair, "score": s.labels.tolist()})
    return DatasetDict(out)


def _classification_dataset(task: Task, root, splits: list[str]):
    from datasets import Dataset, DatasetDict

    return DatasetDict(
        {
            split: Dataset.from_dict({"text": (s := task.load_split(split, root)).texts, "label": s.labels.tolist()})
            for split in splits
        }
    )


def _clustering_dataset(task: Task, root):
    from datasets import Dataset, DatasetDict

    s = task.load_split("test", root)
    rng = random.Random(task.mteb.get("seed", 0))
    size = min(task.mteb.get("set_size", CLUSTER_SET_SIZE), len(s))
    sets = [rng.sample(range(len(s)), size) for _ in range(task.mteb.get("sets", CLUSTER_SETS))]
    return DatasetDict(
        {
            "test": Dataset.from_dict(
                {"sentences": [[s.texts[i] for i in idx] for idx in sets], "labels": [[int(s.labels[i]) for i in idx] for idx in sets]}
            )
        }
    )


def _reranking_dataset(task: Task, root):
    """Answer selection as mteb reranking: a query per question, its candidates as top-ranked documents.
    Questions without a correct candidate are dropped (the "clean" TrecQA protocol)."""
    from datasets import Dataset
    from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData

    out = {}
    for split in task.mteb.get("eval_splits", ["test"]):
        s = task.load_split(split, root)
        questions: dict[str, list[int]] = {}
        for i, q in enumerate(s.texts):
            questions.setdefault(q, []).append(i)
        corpus_ids, corpus_texts, query_ids, query_texts = [], [], [], []
        relevant, top_ranked = {}, {}
        for qn, (question, rows) in enumerate(questions.items()):
            if not any(s.labels[i] == 1 for i in rows):
                continue
            qid = f"q{qn}"
            query_ids.append(qid)
            query_texts.append(question)
            top_ranked[qid] = [f"d{i}" for i in rows]
            relevant[qid] = {f"d{i}": 1 for i in rows if s.labels[i] == 1}
            for i in rows:
                corpus_ids.append(f"d{i}")
                corpus_texts.append(s.texts_pair[i])
        out[split] = RetrievalSplitData(
            corpus=Dataset.from_dict({"id": corpus_ids, "title": [""] * len(corpus_ids), "text": corpus_texts}),
            queries=Dataset.from_dict({"id": query_ids, "text": query_texts}),
            relevant_docs=relevant,
            top_ranked=top_ranked,
        )
    return {"default": out}


def _reranking_task_class():
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.task_metadata import TaskMetadata

    class TrecQAReranking(AbsTaskRetrieval):
        metadata = TaskMetadata(
            name="TrecQAReranking",
            description="TrecQA answer selection (Wang et al. 2007) as reranking: rank each question's candidate answers. Not an MTEB task.",
            reference="https://aclanthology.org/D07-1003/",
            dataset={"path": "local/trecqa_answer_selection", "revision": "brmson-e1d3375f"},
            type="Reranking",
            category="t2t",
            modalities=["text"],
            eval_splits=["test"],
            eval_langs=["eng-Latn"],
            main_score="map_at_1000",
            date=("1999-01-01", "2007-12-31"),
            domains=["News", "Written"],
            task_subtypes=["Question answering"],
            license="not specified",
            annotations_creators="human-annotated",
            dialect=[],
            sample_creation="found",
            bibtex_citation="",
        )

    return TrecQAReranking


def _column_array(values) -> np.ndarray:
    """A `datasets` Column (or any sequence) as a numpy array, through Arrow rather than row by row."""
    from datasets.arrow_dataset import Column

    if isinstance(values, Column) and hasattr(values.source, "select_columns"):
        return values.source.select_columns([values.column_name]).to_pandas()[values.column_name].to_numpy()
    return np.asarray(values)


def local_mteb_task(task: Task, root=None, materialise_labels: bool = True):
    """An mteb task object for one of our task files (its `mteb:` section says how).
    `materialise_labels=False` keeps mteb's own label handling (the benchmark's baseline)."""
    import mteb

    spec = task.mteb or {}
    if not spec:
        raise MtebError(f"{task.source_file}: task {task.name} has no `mteb:` section, so it is not an MTEB task here")
    kind = spec["type"]
    base = _reranking_task_class() if kind == "Reranking" else type(mteb.get_task(task.name))

    def builder():
        if kind == "STS":
            return _sts_dataset(task, root)
        if kind == "Classification":
            data = _classification_dataset(task, root, [spec.get("train_split", "train")] + list(spec.get("eval_splits", ["test"])))
            return {spec["subset"]: data} if spec.get("subset") else data
        if kind == "Clustering":
            return _clustering_dataset(task, root)
        if kind == "Reranking":
            return _reranking_dataset(task, root)
        raise MtebError(f"{task.source_file}: mteb.type {kind!r} is not supported locally")

    class LocalTask(base):
        """mteb's own task reading the local data root: loading is ours, evaluation and metrics mteb's."""

        def load_data(self, num_proc=None, **kwargs):
            if self.data_loaded:
                return
            self.dataset = builder()
            if spec.get("subset"):
                self.hf_subsets = [spec["subset"]]
            self.dataset_transform()
            self.data_loaded = True

        if kind == "Classification" and materialise_labels:

            def _calculate_scores(self, y_test, y_pred):
                # mteb hands sklearn a lazy `datasets` Column, which sklearn converts row by row once
                # per metric: 60% of a Banking77 evaluation (profiled). Same labels, materialised once.
                return super()._calculate_scores(_column_array(y_test), y_pred)

    LocalTask.__name__ = LocalTask.__qualname__ = f"Local{base.__name__}"
    instance = LocalTask()
    if spec.get("subset"):
        instance.hf_subsets = [spec["subset"]]
    if spec.get("eval_splits"):
        instance._eval_splits = list(spec["eval_splits"])
    return instance


def resolve_mteb_tasks(names: list[str], benchmark: str | None, root=None) -> list:
    import mteb

    local = {t.name: t for t in all_tasks().values() if t.mteb}
    if benchmark:
        if benchmark not in BENCHMARKS:
            raise MtebError(f"unknown benchmark {benchmark!r}; local benchmarks: {', '.join(BENCHMARKS)} (online: any mteb benchmark)")
        names = list(names) + sorted(local)
    out = []
    for name in dict.fromkeys(names):
        if name in local:
            out.append(local_mteb_task(local[name], root))
            continue
        try:
            hub_task = mteb.get_task(name)
        except (KeyError, ValueError):
            raise MtebError(f"mteb has no task named {name!r}, and no task file in tasks/ declares it (local: {', '.join(sorted(local))})") from None
        if os.environ.get("CROSSBERT_ONLINE") != "1":
            raise TaskDataMissing(
                f"task {name} is an mteb task without local data in the data root; set CROSSBERT_ONLINE=1 to let mteb fetch "
                f"{hub_task.metadata.dataset.get('path')} from the hub"
            )
        out.append(hub_task)
    return out


def check_local_data(tasks: list, root=None) -> None:
    """Load every task's data before any model runs, so a missing file stops the run with nothing written."""
    for t in tasks:
        if hasattr(t, "load_data") and type(t).__name__.startswith("Local"):
            t.load_data()


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


def run_mteb(
    model: str | FrozenEncoder, *, tasks: list[str], benchmark: str | None, layer: str | int = "last", pooling: str | None = None,
    out_dir: str | Path = "runs/mteb", results_dir: str | None = None, feature_cache: str | None = "runs/features",
    batch_size: int = 256, max_length: int = 128, overwrite: bool = False, data_root=None, normalize: bool | None = None,
    cache_layers: list[int] | None = None, dtype: str = "fp32", allow_pickle: bool = False,
):  # fmt: skip
    """Run mteb on `model`; return (rows, table text). Rows also go to the results store.
    `pooling` None: the model's own (its sentence-transformers Pooling module, else mean); `dtype` and
    `allow_pickle` as FrozenEncoder.load (fp32, safetensors only) when `model` is a name."""
    out_dir = Path(out_dir)
    configure_offline(out_dir)
    import mteb

    if isinstance(model, FrozenEncoder):
        encoder = model
    else:
        encoder = FrozenEncoder.load(model, max_length=max_length, batch_size=batch_size, dtype=dtype, allow_pickle=allow_pickle)
    # recorded as the probe runner records it: "user", or where the model's own pooling came from
    (pooling,), pooling_source = encoder.poolings_and_source([pooling] if pooling else None)
    (layer_index,) = encoder.layer_indices(layer)
    task_objects = resolve_mteb_tasks(tasks, benchmark, data_root)
    if not task_objects:
        raise MtebError("no task given: use --tasks NAME[,NAME] or --benchmark local-eng")
    check_local_data(task_objects, data_root)
    cache = FeatureCache(feature_cache) if feature_cache else None
    wrapped = make_mteb_encoder(encoder, layer_index, pooling, cache, normalize, cache_layers)
    note_superseded(task_objects)
    with warnings.catch_warnings(), _without_superseded_warnings():
        # mteb's logistic regression (max_iter=100, its protocol) warns on every fit for unnormalised
        # features of small models; the warning changes nothing and buries the log.
        warnings.simplefilter("ignore", ConvergenceWarning)
        result = mteb.evaluate(
            wrapped,
            task_objects,
            cache=mteb.ResultCache(cache_path=out_dir),
            overwrite_strategy="always" if overwrite else "only-missing",
            encode_kwargs={"batch_size": batch_size},
            co2_tracker=False,
            show_progress_bar=False,
        )
    meta = wrapped.mteb_model_meta
    rows = result_rows(result, encoder, layer_index, pooling, wrapped.normalize, {t.metadata.name: t for t in task_objects},
                       pooling_source)  # fmt: skip
    store = ResultsStore(results_dir or out_dir / "results")
    new = [r for r in rows if not store.done(r["unit"])]
    store.remove_units({r["unit"] for r in rows} if overwrite else set())
    store.append(rows if overwrite else new)
    log.info("mteb results: %s", out_dir / "results" / meta.name.replace("/", "__") / meta.revision)
    return rows, mteb_table(rows)


def result_rows(
    result, encoder: FrozenEncoder, layer: int, pooling: str, normalize: bool, task_objects: dict, pooling_source: str = "user"
) -> list[dict]:
    rows = []
    ident = encoder.identity
    for task_result in result.task_results:
        task = task_objects[task_result.task_name]
        main = task.metadata.main_score
        local_task = all_tasks().get(task_result.task_name)
        for split, subsets in task_result.scores.items():
            for scores in subsets:
                key = unit_key(model=encoder.fingerprint, task=task_result.task_name, split=split, subset=scores["hf_subset"],
                               probe="mteb", layer=layer, pooling=pooling, normalize=normalize, **encoder.feature_signature)  # fmt: skip
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
                    "protocol": {"mteb_version": task_result.mteb_version, "normalize": normalize,
                                 "partial": bool(local_task and local_task.mteb and local_task.mteb.get("partial")),
                                 "local_data": type(task).__name__.startswith("Local")},  # fmt: skip
                    "unit": key,
                }
                metrics = {m: v for m, v in scores.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
                for metric, value in metrics.items():
                    if metric == "main_score":
                        continue
                    rows.append({**base, "metric": metric, "value": float(value), "is_main": metric == main})
    return rows


def published_score(task: str, model: str, split: str) -> float | None:
    """The published score a task file records for this model (`reference_scores`), if any."""
    local = all_tasks().get(task)
    value = ((local.reference_scores if local else {}) or {}).get(model, {}).get(split)
    return float(value) if isinstance(value, (int, float)) else None


def mteb_table(rows: list[dict]) -> str:
    import pandas as pd

    if not rows:
        return "(no results)"
    df = pd.DataFrame(rows)
    main = df[df["is_main"]]
    # A task's score: its main metric per split, averaged over subsets.
    per_task = main.groupby(["model", "task_type", "task", "split", "metric"], as_index=False)["value"].mean()
    lines = [f"{'type':15} {'task':40} {'split':11} {'metric':16} {'score':>7} {'published':>9}"]
    for r in per_task.itertuples():
        ref = published_score(r.task, r.model, r.split)
        lines.append(f"{r.task_type:15} {r.task:40} {r.split:11} {r.metric:16} {100 * r.value:7.2f} {'' if ref is None else f'{100 * ref:9.2f}'}")
    headline = per_task.groupby("task").tail(1)  # the last split in sort order (test after validation)
    by_type = headline.groupby("task_type")["value"].mean()
    lines.append("")
    for task_type, value in by_type.items():
        lines.append(f"mean {task_type:10} {100 * value:6.2f}  ({(headline['task_type'] == task_type).sum()} task(s))")
    lines.append(f"mean over types {100 * by_type.mean():6.2f}   mean over tasks {100 * headline['value'].mean():6.2f}")
    return "\n".join(lines)


__all__ = ["run_mteb", "local_mteb_task", "make_mteb_encoder", "MtebError", "TaskError"]
