"""Local mteb tasks: mteb's own task classes reading our task files.

A local task is the task class mteb itself ships (`type(mteb.get_task(name))`) with LocalData mixed in,
which overrides `load_data` only: it builds the dataset with the adapter registered for the task file's
`mteb.type` and then runs mteb's own `dataset_transform`; evaluation and metrics stay mteb's. A new task
type is one `@dataset_adapter("Type")` function.

* TrecQA answer selection has no MTEB task: `TrecQAReranking` is an mteb reranking task (AbsTaskRetrieval
  with top-ranked candidates) of our own, the base class of every local `Reranking` task.
* A task file that declares `mteb.variant_of: NAME` runs under mteb's class for NAME (its evaluator and
  metrics) but keeps its own name, so its scores never pass for MTEB's (TwitterURLCorpus-lowercasedtrain).
* How a task's local data stands to MTEB's is one fact, `data_status` ("mteb": MTEB's exact data;
  "differs": a named difference, `mteb.data_differs` or `mteb.partial`; "variant"). A task whose data is
  not MTEB's carries `local-<digest>` as its dataset revision (a sha256 of the data it evaluated, 16 hex
  digits) instead of MTEB's hub revision: mteb writes it into the task's result JSON (`dataset_revision`),
  so the file itself says the scores are not on MTEB's data, and mteb refuses to merge it with results
  on MTEB's revision. Tasks with MTEB's data keep MTEB's revision.

Private mteb members used here (mteb 2.26): `_calculate_scores` of AbsTaskClassification, overridden by
MaterialisedLabels; mteb has no public hook for the labels it scores (its `_run_experiment` reads them
from the dataset and passes a lazy Column). tests/test_mteb.py fails if the override stops being called.
Eval splits are set through mteb's public `filter_eval_splits`, subsets through the public `hf_subsets`.
"""

from __future__ import annotations

import hashlib
import json
import random
from functools import lru_cache
from typing import Callable

import numpy as np

from crossbert_model.errors import CrossbertError

from .tasks import Task

# MTEB's legacy TwentyNewsgroupsClustering has 10 cluster sets; the 20news-bydate test set (the one it
# clusters) has 7,532 posts. Our copy merged train and test, so each set is a seeded sample of that size.
CLUSTER_SETS = 10
CLUSTER_SET_SIZE = 7532


class MtebError(CrossbertError, ValueError):
    pass


# How a local task's data stands to MTEB's: the key goes into every row and every result file, the
# words into tables.
DATA_STATUS = {"mteb": "with MTEB's data", "differs": "with a named data difference", "variant": "as marked variants"}


def data_status(task: Task | None) -> str:
    """'mteb' (MTEB's exact data), 'differs' (mteb.data_differs or mteb.partial) or 'variant' (mteb.variant_of)."""
    spec = task.mteb if task else None
    if spec is None:
        return "mteb"
    if spec.variant_of:
        return "variant"
    return "differs" if (spec.data_differs or spec.partial) else "mteb"


def data_digest(data) -> str:
    """sha256 (16 hex digits) of a local task's dataset as its adapter built it: splits, subsets and
    columns, in order (Arrow tables are hashed from their IPC stream, so no row is turned into Python)."""
    from datasets import Dataset

    digest = hashlib.sha256()

    def feed(node) -> None:
        if isinstance(node, Dataset):
            digest.update(dataset_bytes(node))
        elif isinstance(node, dict):  # DatasetDict, subsets, RetrievalSplitData, qrels
            for key in sorted(node, key=str):
                digest.update(json.dumps(str(key)).encode())
                feed(node[key])
        else:
            digest.update(json.dumps(node, sort_keys=True, default=str).encode())

    feed(data)
    return digest.hexdigest()[:16]


def dataset_bytes(dataset) -> bytes:
    import pyarrow as pa

    table = dataset.data.table if hasattr(dataset.data, "table") else dataset.data
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table.combine_chunks())
    return sink.getvalue().to_pybytes()


def local_revision(data) -> str:
    """The dataset revision of a task whose data is not MTEB's (see the module docstring)."""
    return f"local-{data_digest(data)}"


# ------------------------------------------------------------------------------------------------
# Dataset adapters: a task file's splits in the layout mteb's task class of that type reads
# ------------------------------------------------------------------------------------------------

DatasetAdapter = Callable[[Task, object], object]
DATASET_ADAPTERS: dict[str, DatasetAdapter] = {}


def dataset_adapter(task_type: str):
    """Register the decorated function as the dataset of local tasks whose `mteb.type` is `task_type`."""

    def register(fn: DatasetAdapter) -> DatasetAdapter:
        DATASET_ADAPTERS[task_type] = fn
        return fn

    return register


def _in_subset(task: Task, data):
    """mteb's multilingual layout ({subset: splits}) when the task file names its subset (STS17: en-en)."""
    return {task.mteb.subset: data} if task.mteb.subset else data


@dataset_adapter("STS")
def sts_dataset(task: Task, root):
    from datasets import Dataset, DatasetDict

    out = {}
    for split in task.mteb.splits_to_read:
        s = task.load_split(split, root)
        out[split] = Dataset.from_dict({"sentence1": s.texts, "sentence2": s.texts_pair, "score": s.labels.tolist()})
    return _in_subset(task, DatasetDict(out))


@dataset_adapter("Classification")
def classification_dataset(task: Task, root):
    from datasets import Dataset, DatasetDict

    out = {}
    for split in [task.mteb.train_split or "train"] + task.mteb.splits_to_read:
        s = task.load_split(split, root)
        out[split] = Dataset.from_dict({"text": s.texts, "label": s.labels.tolist()})
    return _in_subset(task, DatasetDict(out))


@dataset_adapter("PairClassification")
def pair_classification_dataset(task: Task, root):
    """MTEB's pair-classification layout (sent1, sent2, labels; mteb's dataset_transform renames the
    sentence columns). `mteb.from_splits`: MTEB's one split is several of ours, concatenated."""
    from datasets import Dataset, DatasetDict

    out = {}
    for split in task.mteb.splits_to_read:
        parts = [task.load_split(name, root) for name in task.mteb.from_splits or [split]]
        out[split] = Dataset.from_dict(
            {
                "sent1": [t for p in parts for t in p.texts],
                "sent2": [t for p in parts for t in p.texts_pair],
                "labels": [int(y) for p in parts for y in p.labels],
            }
        )
    return DatasetDict(out)


@dataset_adapter("Retrieval")
def retrieval_dataset(task: Task, root):
    """A BEIR-format task file as mteb's retrieval split data (corpus id/title/text, queries id/text, qrels)."""
    from datasets import Dataset
    from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData

    out = {}
    for split in task.mteb.splits_to_read:
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


@dataset_adapter("Clustering")
def clustering_dataset(task: Task, root):
    from datasets import Dataset, DatasetDict

    s = task.load_split("test", root)
    rng = random.Random(task.mteb.seed or 0)
    size = min(task.mteb.set_size or CLUSTER_SET_SIZE, len(s))
    sets = [rng.sample(range(len(s)), size) for _ in range(task.mteb.sets or CLUSTER_SETS)]
    return DatasetDict(
        {
            "test": Dataset.from_dict(
                {
                    "sentences": [[s.texts[i] for i in idx] for idx in sets],
                    "labels": [[int(s.labels[i]) for i in idx] for idx in sets],
                }
            )
        }
    )


@dataset_adapter("Reranking")
def reranking_dataset(task: Task, root):
    """Answer selection as mteb reranking: a query per question, its candidates as top-ranked documents.
    Questions without a correct candidate are dropped (the "clean" TrecQA protocol)."""
    from datasets import Dataset
    from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData

    out = {}
    for split in task.mteb.splits_to_read:
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


# ------------------------------------------------------------------------------------------------
# Task classes: mteb's, with our loading mixed in
# ------------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def trecqa_reranking_class():
    """TrecQA answer selection as an mteb reranking task of our own (mteb has none); made on first use,
    since mteb is imported only after the runner has set up the offline caches."""
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.task_metadata import TaskMetadata

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
    return type("TrecQAReranking", (AbsTaskRetrieval,), {"metadata": metadata, "__module__": __name__})


class LocalData:
    """Mixed into mteb's own task class: loading reads the local data root (`crossbert_task`, `data_root`)
    through the dataset adapter of its type; evaluation and metrics stay mteb's."""

    crossbert_task: Task
    data_root = None

    def load_data(self, num_proc=None, **kwargs):
        if self.data_loaded:
            return
        spec = self.crossbert_task.mteb
        self.dataset = DATASET_ADAPTERS[spec.type](self.crossbert_task, self.data_root)
        if data_status(self.crossbert_task) != "mteb":
            # mteb writes metadata.revision into the result file: it must not claim MTEB's data
            dataset = {**self.metadata.dataset, "revision": local_revision(self.dataset)}
            self.metadata = self.metadata.model_copy(update={"dataset": dataset})
        if spec.subset:
            self.hf_subsets = [spec.subset]
        self.dataset_transform()
        self.data_loaded = True


class MaterialisedLabels:
    """Mixed into local classification tasks: mteb hands sklearn a lazy `datasets` Column, which sklearn
    converts row by row once per metric: 60% of a Banking77 evaluation (profiled). Same labels,
    materialised once."""

    def _calculate_scores(self, y_test, y_pred):
        return super()._calculate_scores(column_array(y_test), y_pred)


def column_array(values) -> np.ndarray:
    """A `datasets` Column (or any sequence) as a numpy array, through Arrow rather than row by row."""
    from datasets.arrow_dataset import Column

    if isinstance(values, Column) and hasattr(values.source, "select_columns"):
        return values.source.select_columns([values.column_name]).to_pandas()[values.column_name].to_numpy()
    return np.asarray(values)


def local_mteb_task(task: Task, root=None, materialise_labels: bool = True):
    """An mteb task object for one of our task files (its `mteb:` section says how).
    `materialise_labels=False` keeps mteb's own label handling (the benchmark's baseline)."""
    import mteb

    spec = task.mteb
    if spec is None:
        raise MtebError(f"{task.source_file}: task {task.name} has no `mteb:` section, so it is not an MTEB task here")
    kind = spec.type
    mteb_name = spec.variant_of or task.name
    if kind == "Reranking":
        base = trecqa_reranking_class()
    else:
        try:
            base = type(mteb.get_task(mteb_name))
        except (KeyError, ValueError):
            key = "mteb.variant_of" if spec.variant_of else "name"
            raise MtebError(f"{task.source_file}: {key} {mteb_name!r} is not a task mteb {mteb.__version__} knows") from None
    if base.metadata.type != kind:
        raise MtebError(f"{task.source_file}: mteb.type is {kind}, but mteb's {mteb_name} is a {base.metadata.type} task")
    if kind not in DATASET_ADAPTERS:
        raise MtebError(f"{task.source_file}: mteb.type {kind!r} is not supported locally")
    mixins = (MaterialisedLabels,) if kind == "Classification" and materialise_labels else ()
    attributes = {"crossbert_task": task, "__doc__": LocalData.__doc__, "__module__": __name__}
    if spec.variant_of:
        # mteb's evaluator and metrics, our name: results, rows and tables say this is not MTEB's data
        attributes["metadata"] = base.metadata.model_copy(
            update={
                "name": task.name,
                "description": f"{base.metadata.description} LOCAL VARIANT: {spec.data_differs}.",
                "adapted_from": [mteb_name],
            }
        )
    instance = type(f"Local{base.__name__}", (*mixins, LocalData, base), attributes)()
    instance.data_root = root
    if spec.subset:
        instance.hf_subsets = [spec.subset]
    if spec.eval_splits:
        instance.filter_eval_splits(list(spec.eval_splits))
    return instance
