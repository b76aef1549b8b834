"""MTEB through mteb's own task classes and evaluators, on the local data root.

    crossbert mteb minilm --benchmark local-eng
    crossbert mteb minilm --benchmark "MTEB(eng, v2)"     # mteb's own benchmark: what local data allows
    crossbert mteb runs/tiny_crossbert --tasks STSBenchmark,Banking77Classification --layer last

* Tasks keep their real MTEB names, metadata, splits and preprocessing: a local task is a subclass of
  the task class mteb itself ships (`type(mteb.get_task(name))`) that overrides `load_data` only; it
  reads the files named by the task's YAML file in `tasks/` and then runs mteb's own
  `dataset_transform`. The metrics are mteb's.
* TrecQA answer selection has no MTEB task: `TrecQAReranking` is an mteb reranking task
  (AbsTaskRetrieval with top-ranked candidates) of our own, declared in tasks/reranking/.
* A task file whose data is not MTEB's exact data says so (`mteb.data_differs`, shown in every row and
  table). One that declares `mteb.variant_of: NAME` runs under mteb's class for NAME (its evaluator and
  metrics) but keeps its own name, so its scores never pass for MTEB's (TwitterURLCorpus-lowercasedtrain).
* `--benchmark NAME` with any benchmark mteb defines runs each of its tasks that a task file stands for
  (by name, or as a marked variant) with the benchmark's splits and subsets, and reports the others as
  skipped with where their data was looked for; the table states the coverage and averages only what ran.
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
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from .encoders import EncoderError, FeatureCache, FrozenEncoder, parse_layers
from .report.text_tables import mteb_text_table
from .results import ResultsStore, unit_key
from .tasks import Task, TaskDataMissing, TaskError, all_tasks, tasks_dir
from crossbert_model.errors import CrossbertError

log = logging.getLogger(__name__)

# Our own benchmark; any other name is looked up among mteb's benchmarks (mteb.get_benchmark).
BENCHMARKS = {"local-eng": "every task file with an `mteb:` section"}
# A task name ending in a version (STS22.v2, Touche2020Retrieval.v3): mteb's revised edition of a task.
_VERSIONED = re.compile(r"\.v\d+$")
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
        """A frozen encoder at one layer and pooling, as mteb's EncoderProtocol. `costs` keeps, per task,
        the texts it asked for, how many were encoded (not from the feature cache) and the seconds spent."""

        def __init__(self):
            self.encoder, self.layer, self.pooling, self.cache, self.normalize = encoder, layer, pooling, cache, normalize
            self.costs: dict[str, dict] = {}
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
            # mteb encodes every occurrence (TwitterURLCorpus pairs one source tweet with many others):
            # each distinct text is encoded once and its vector copied
            unique = list(dict.fromkeys(texts))
            label = f"mteb/{task_metadata.name}/{hf_subset}/{hf_split}"
            start, misses = time.perf_counter(), self.cache.misses if self.cache is not None else 0
            if self.cache is not None:
                layers = sorted(set(cache_layers or []) | {self.layer})
                feats = self.cache.features(self.encoder, unique, None, layers, [self.pooling], label)
                encoded = len(unique) if self.cache.misses > misses else 0
            else:
                feats = self.encoder.encode(unique, layers=[self.layer], poolings=[self.pooling], desc=label)
                encoded = len(unique)
            cost = self.costs.setdefault(task_metadata.name, {"texts": 0, "encoded": 0, "encode_s": 0.0})
            cost["texts"] += len(texts)
            cost["encoded"] += encoded
            cost["encode_s"] += time.perf_counter() - start
            x = feats[(self.layer, self.pooling)]
            if len(unique) < len(texts):
                position = {t: i for i, t in enumerate(unique)}
                x = x[[position[t] for t in texts]]
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


def _pair_classification_dataset(task: Task, root):
    """MTEB's pair-classification layout (sent1, sent2, labels; mteb's dataset_transform renames the
    sentence columns). `mteb.from_splits`: MTEB's one split is several of ours, concatenated."""
    from datasets import Dataset, DatasetDict

    out = {}
    for split in task.mteb.get("eval_splits", ["test"]):
        parts = [task.load_split(name, root) for name in task.mteb.get("from_splits", [split])]
        out[split] = Dataset.from_dict(
            {
                "sent1": [t for p in parts for t in p.texts],
                "sent2": [t for p in parts for t in p.texts_pair],
                "labels": [int(y) for p in parts for y in p.labels],
            }
        )
    return DatasetDict(out)


def _retrieval_dataset(task: Task, root):
    """A BEIR-format task file as mteb's retrieval split data (corpus id/title/text, queries id/text, qrels)."""
    from datasets import Dataset
    from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData

    out = {}
    for split in task.mteb.get("eval_splits", ["test"]):
        beir = task.load_beir(split, root)
        ids = list(beir.corpus)
        out[split] = RetrievalSplitData(
            corpus=Dataset.from_dict(
                {"id": ids, "title": [beir.corpus[i][0] for i in ids], "text": [beir.corpus[i][1] for i in ids]}
            ),
            queries=Dataset.from_dict({"id": list(beir.queries), "text": list(beir.queries.values())}),
            relevant_docs=beir.qrels,
            top_ranked=None,
        )
    return {"default": out}


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
    mteb_name = spec.get("variant_of") or task.name
    if kind == "Reranking":
        base = _reranking_task_class()
    else:
        try:
            base = type(mteb.get_task(mteb_name))
        except (KeyError, ValueError):
            key = "mteb.variant_of" if spec.get("variant_of") else "name"
            raise MtebError(f"{task.source_file}: {key} {mteb_name!r} is not a task mteb {mteb.__version__} knows") from None
    if base.metadata.type != kind:
        raise MtebError(f"{task.source_file}: mteb.type is {kind}, but mteb's {mteb_name} is a {base.metadata.type} task")

    def builder():
        if kind == "STS":
            data = _sts_dataset(task, root)
        elif kind == "Classification":
            data = _classification_dataset(task, root, [spec.get("train_split", "train")] + list(spec.get("eval_splits", ["test"])))
        elif kind == "Clustering":
            return _clustering_dataset(task, root)
        elif kind == "Reranking":
            return _reranking_dataset(task, root)
        elif kind == "PairClassification":
            return _pair_classification_dataset(task, root)
        elif kind == "Retrieval":
            return _retrieval_dataset(task, root)
        else:
            raise MtebError(f"{task.source_file}: mteb.type {kind!r} is not supported locally")
        return {spec["subset"]: data} if spec.get("subset") else data

    class LocalTask(base):
        """mteb's own task reading the local data root: loading is ours, evaluation and metrics mteb's."""

        if spec.get("variant_of"):
            # mteb's evaluator and metrics, our name: results, rows and tables say this is not MTEB's data
            metadata = base.metadata.model_copy(
                update={
                    "name": task.name,
                    "description": f"{base.metadata.description} LOCAL VARIANT: {spec['data_differs']}.",
                    "adapted_from": [mteb_name],
                }
            )

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


@dataclass
class BenchmarkPlan:
    """What of an mteb benchmark runs here. `ran`: benchmark task -> the task file that stands for it
    (itself, or a marked variant); `skipped`: benchmark task -> why, naming where its data was looked for;
    `versions`: benchmark task with a version suffix (.v2, .v3) -> whether the local data reproduces it."""

    name: str
    size: int
    ran: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)

    def coverage_line(self) -> str:
        tasks = {t.name: t for t in all_tasks().values()}
        kinds = [data_status(tasks.get(local)) for local in self.ran.values()]
        counts = ", ".join(f"{kinds.count(k)} {DATA_STATUS[k]}" for k in DATA_STATUS if kinds.count(k))
        return (f"coverage: {len(self.ran)} of {self.size} {self.name} tasks ran on local data ({counts or 'none'}); "
                f"{len(self.skipped)} skipped")  # fmt: skip

    def report(self) -> str:
        """The coverage line, the skipped tasks with where each was looked for, and the .vN notes."""
        lines = [self.coverage_line(), "", f"skipped ({len(self.skipped)}):"]
        lines += [f"  {name}: {why}" for name, why in self.skipped.items()]
        if self.versions:
            lines += ["", f"versioned tasks of {self.name} (.v2/.v3) and the local data:"]
            lines += [f"  {name}: {note}" for name, note in self.versions.items()]
        return "\n".join(lines)


# How a local task's data stands to MTEB's: the key goes into every row, the words into tables.
DATA_STATUS = {"mteb": "with MTEB's data", "differs": "with a named data difference", "variant": "as marked variants"}


def data_status(task: Task | None) -> str:
    spec = (task.mteb if task else None) or {}
    if spec.get("variant_of"):
        return "variant"
    return "differs" if (spec.get("data_differs") or spec.get("partial")) else "mteb"


def _hub_source(mteb_task) -> str:
    dataset = mteb_task.metadata.dataset
    revision = dataset.get("revision") or ""
    return f"{dataset.get('path')}@{revision[:8]}" if revision else str(dataset.get("path"))


def _standing_for(local: dict[str, Task]) -> dict[str, Task]:
    """mteb task name -> the task file that stands for it: a file of that name, else a marked variant."""
    out = {t.mteb["variant_of"]: t for t in local.values() if t.mteb.get("variant_of")}
    out.update({name: t for name, t in local.items() if not t.mteb.get("variant_of")})
    return out


def _get_benchmark(name: str):
    import mteb

    try:
        return mteb.get_benchmark(name)
    except (KeyError, ValueError):
        known = [b.name for b in mteb.get_benchmarks() if "eng" in b.name.lower()]
        raise MtebError(
            f"unknown benchmark {name!r}: neither ours ({', '.join(BENCHMARKS)}) nor mteb's (English ones: {', '.join(known)})"
        ) from None


def plan_benchmark(name: str, root=None) -> tuple[list, BenchmarkPlan]:
    """mteb's own definition of benchmark `name`: every task a task file stands for, restricted to the
    benchmark's splits and subsets, with its data read now (a task whose files are missing is skipped,
    naming them); the others are skipped, or fetched from the hub when CROSSBERT_ONLINE=1."""
    bench = _get_benchmark(name)
    standing = _standing_for({t.name: t for t in all_tasks().values() if t.mteb})
    plan = BenchmarkPlan(bench.name, len(bench.tasks))
    objects = []
    online = os.environ.get("CROSSBERT_ONLINE") == "1"
    for hub_task in bench.tasks:
        mteb_name = hub_task.metadata.name
        task = standing.get(mteb_name)
        why = None
        if task is None:
            why = (f"no task file in {tasks_dir()} declares it (as its name or mteb.variant_of); mteb's data: "
                   f"{_hub_source(hub_task)} on the Hugging Face hub")  # fmt: skip
        else:
            local = local_mteb_task(task, root)
            splits = [s for s in hub_task.eval_splits if s in local.eval_splits]
            subsets = [s for s in hub_task.hf_subsets if s in local.hf_subsets]
            if not splits or not subsets:
                why = (f"{task.source_file} has splits {local.eval_splits} / subsets {local.hf_subsets}; the benchmark "
                       f"asks for {hub_task.eval_splits} / {hub_task.hf_subsets}")  # fmt: skip
            else:
                local._eval_splits, local.hf_subsets = splits, subsets
                try:
                    local.load_data()
                except TaskDataMissing as e:
                    why = str(e)
        if why is None:
            plan.ran[mteb_name] = task.name
            objects.append(local)
        elif online:
            plan.ran[mteb_name] = mteb_name
            objects.append(hub_task)
        else:
            plan.skipped[mteb_name] = why
        if _VERSIONED.search(mteb_name):
            plan.versions[mteb_name] = _version_note(mteb_name, task, mteb_name in plan.ran)
    return objects, plan


def _version_note(mteb_name: str, task: Task | None, ran: bool) -> str:
    if not ran:
        return "not reproduced: no local data"
    if task is not None and task.mteb.get("variant_of"):
        return f"not reproduced by the local data ({task.mteb['data_differs']}); ran as the marked variant {task.name}"
    if task is not None and data_status(task) == "differs":
        return f"ran, with a named data difference: {task.mteb.get('data_differs')}"
    return "reproduced: the local data is MTEB's"


def resolve_mteb_tasks(names: list[str], benchmark: str | None, root=None) -> tuple[list, BenchmarkPlan | None]:
    """The mteb task objects for `names` (and `benchmark`); for an mteb benchmark also its plan."""
    import mteb

    local = {t.name: t for t in all_tasks().values() if t.mteb}
    out, plan = [], None
    if benchmark in BENCHMARKS:
        names = list(names) + sorted(local)
    elif benchmark:
        out, plan = plan_benchmark(benchmark, root)
    taken = {t.metadata.name for t in out}
    variants = {t.mteb["variant_of"]: t.name for t in local.values() if t.mteb.get("variant_of")}
    for name in dict.fromkeys(n for n in names if n not in taken):
        if name in local:
            out.append(local_mteb_task(local[name], root))
            continue
        try:
            hub_task = mteb.get_task(name)
        except (KeyError, ValueError):
            raise MtebError(f"mteb has no task named {name!r}, and no task file in tasks/ declares it (local: {', '.join(sorted(local))})") from None
        if os.environ.get("CROSSBERT_ONLINE") != "1":
            variant = f"; the local variant {variants[name]} stands for it (not MTEB's exact data)" if name in variants else ""
            raise TaskDataMissing(
                f"task {name} is an mteb task without local data in the data root{variant}; set CROSSBERT_ONLINE=1 to let "
                f"mteb fetch {hub_task.metadata.dataset.get('path')} from the hub"
            )
        out.append(hub_task)
    return out, plan


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
    batch_size: int = 256, max_length: int | None = None, overwrite: bool = False, data_root=None, normalize: bool | None = None,
    cache_layers: list[int] | None = None, dtype: str = "fp32", allow_pickle: bool = False, trust_remote_code: bool = False,
):  # fmt: skip
    """Run mteb on `model`; return (rows, table text). Rows also go to the results store.
    `pooling` None: the model's own (its sentence-transformers Pooling module, else mean); `max_length`
    None: the model's own (sentence-transformers' max_seq_length, which MTEB's runs truncate at), else
    128, at most the model's positions; `dtype`, `allow_pickle` and `trust_remote_code` as FrozenEncoder.load
    (fp32, safetensors only, none of the folder's code) when `model` is a name."""
    check_one_layer(layer)  # before a model is loaded
    started = time.perf_counter()
    out_dir = Path(out_dir)
    configure_offline(out_dir)
    import mteb

    if isinstance(model, FrozenEncoder):
        encoder = model
    else:
        encoder = FrozenEncoder.load(model, max_length=max_length, own_length=True, batch_size=batch_size, dtype=dtype,
                                     allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)  # fmt: skip
    # recorded as the probe runner records it: "user", or where the model's own pooling came from
    (pooling,), pooling_source = encoder.poolings_and_source([pooling] if pooling else None)
    (layer_index,) = encoder.layer_indices(layer)
    task_objects, plan = resolve_mteb_tasks(tasks, benchmark, data_root)
    if not task_objects:
        raise MtebError("no task given: use --tasks NAME[,NAME] or --benchmark local-eng" if plan is None else
                        f"no task of {plan.name} has local data here\n{plan.report()}")  # fmt: skip
    if plan is not None:
        log.info("%s", plan.report())
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
                       pooling_source, wrapped.costs)  # fmt: skip
    store = ResultsStore(results_dir or out_dir / "results")
    new = [r for r in rows if not store.done(r["unit"])]
    store.remove_units({r["unit"] for r in rows} if overwrite else set())
    store.append(rows if overwrite else new)
    log.info("mteb results: %s", out_dir / "results" / meta.name.replace("/", "__") / meta.revision)
    return rows, mteb_text_table(rows, plan, wall_s=time.perf_counter() - started)


def check_one_layer(layer: str | int) -> None:
    """mteb scores one layer per run: 'last' or one layer number (--layer)."""
    try:
        items = parse_layers(layer)
    except EncoderError as e:
        raise MtebError(f"--layer: {e}") from None
    if items == "all" or (isinstance(items, list) and len(items) != 1):
        raise MtebError(f"--layer: expected last or one layer number N (mteb scores one layer per run), got {layer!r}")


def result_rows(
    result, encoder: FrozenEncoder, layer: int, pooling: str, normalize: bool, task_objects: dict, pooling_source: str = "user",
    costs: dict | None = None,
) -> list[dict]:  # fmt: skip
    """One row per (task, split, subset, metric). `costs` (the wrapper's, per task) adds what encoding took
    in this run; a task mteb answered from its result cache has none."""
    rows = []
    ident = encoder.identity
    for task_result in result.task_results:
        task = task_objects[task_result.task_name]
        main = task.metadata.main_score
        local_task = all_tasks().get(task_result.task_name)
        local_spec = (local_task.mteb if local_task else None) or {}
        cost = (costs or {}).get(task_result.task_name)
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
                                 "partial": bool(local_spec.get("partial")),
                                 "local_data": type(task).__name__.startswith("Local"),
                                 "data": data_status(local_task) if local_task else "mteb",
                                 "data_differs": local_spec.get("data_differs"),
                                 "variant_of": local_spec.get("variant_of")},  # fmt: skip
                    # what the task cost: mteb's evaluation time (encoding + scoring), and our encoding in this
                    # run (0 texts: every feature came from the feature cache)
                    "eval_time_s": task_result.evaluation_time,
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


__all__ = ["run_mteb", "local_mteb_task", "make_mteb_encoder", "MtebError", "TaskError"]
