"""What a task's score is read against: chance, the majority class, and a bag-of-words model.

A frozen encoder has shown something on a task only where it scores above what needs no encoder. Three baselines,
computed once per task (and per training-split cap) on the very splits the probes use, into a results store of their own:

* `chance`: guessing. Class tasks: a label drawn uniformly from the training split's classes for every evaluation
  example; score tasks: a score drawn uniformly from the training scores' range. The value is the mean over
  CHANCE_DRAWS seeded draws and its interval the draws' central 95% (how far guessing alone strays).
* `majority`: every evaluation example given the training split's most frequent class (MRPC's dev set: always
  "paraphrase", F1 81.2). Score tasks have none: a constant has no correlation.
* `tfidf`: TF-IDF of word unigrams and bigrams (TFIDF_OPTIONS), fitted on the training texts, then the project's own
  linear probe (probes.linear_probe: the same C / alpha grid, validation carve and seed; the L2-normalised sparse rows
  are not standardised) on the same capped training split; pair tasks take SentEval's [u, v, |u - v|, u * v] of the two sides' vectors. STS tasks also get its cosine
  (the cosine probe's baseline: a classic unsupervised STS baseline).

Rows look like probe rows (task, split, probe, metric, value, is_main, ci_low, ci_high, n_train, n_eval, unit) with
`model` = "baseline:<name>" and `baseline` = <name>; the interval of majority and TF-IDF rows is the probes' percentile
bootstrap over evaluation examples (probes.bootstrap_ci). One place to add a baseline: BASELINES.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from crossbert_model.utils import stable_hash, texts_digest

from . import probes as P
from .folder_layout import EvaluationFolder
from .metrics import METRICS, score
from .results import CLAIMED, RESULTS_FILE, ResultsStore, unit_key
from .tasks import Split, Task, TaskDataMissing

log = logging.getLogger(__name__)

MODEL_PREFIX = "baseline:"
CHANCE_DRAWS = 200
CHANCE_SEED = 0
# Word uni- and bigrams (the bag-of-bigrams features of Wang & Manning 2012, "Baselines and bigrams"), sublinear term
# frequency, terms in at least 2 training texts; the rest are scikit-learn's TfidfVectorizer defaults (rows L2-normalised).
TFIDF_OPTIONS = {"ngram_range": (1, 2), "min_df": 2, "sublinear_tf": True, "lowercase": True}


@dataclass(frozen=True)
class BaselineSettings:
    """The splits the baselines are computed on: the probes' (max_train: the same seeded cap of the training split, Split.subsample)."""

    data_root: str | None = None
    max_train: int | None = None
    max_eval: int | None = None  # a seeded sample of each evaluation split (smoke runs), as the probes take
    seed: int = P.PROBE_SEED


@dataclass(frozen=True)
class Prediction:
    """One baseline's output on one evaluation split: the probe it stands beside, its metrics' predictions."""

    probe: str  # the probe whose panels it is drawn on: chance / majority (every probe), linear, cosine
    predictions: np.ndarray | None  # None: chance, scored by draws
    protocol: dict


def _majority(task: Task, train: Split | None, evaluation: Split) -> list[Prediction]:
    if task.is_regression or train is None:
        return []
    classes, counts = np.unique(train.labels, return_counts=True)
    top = classes[int(np.argmax(counts))]
    return [
        Prediction(
            "majority",
            np.full(len(evaluation), top),
            {"majority_class": int(top), "share_of_train": float(counts.max() / counts.sum())},
        )
    ]


def _chance(task: Task, train: Split | None, evaluation: Split) -> list[Prediction]:
    return [
        Prediction(
            "chance",
            None,
            {
                "draws": CHANCE_DRAWS,
                "seed": CHANCE_SEED,
                "guess": "uniform over training scores' range" if task.is_regression else "uniform over training classes",
            },
        )
    ]


def _tfidf(task: Task, train: Split | None, evaluation: Split) -> list[Prediction]:
    from scipy import sparse
    from sklearn.feature_extraction.text import TfidfVectorizer

    # a zero-shot task (no training split) fits the vocabulary and IDF on its evaluation texts: label-free, as the
    # cosine it feeds
    fit_on = train if train is not None else evaluation
    vectoriser = TfidfVectorizer(**TFIDF_OPTIONS).fit(fit_on.texts + (fit_on.texts_pair or []))
    protocol = {
        "features": "tfidf",
        **{k: list(v) if isinstance(v, tuple) else v for k, v in TFIDF_OPTIONS.items()},
        "vocabulary": len(vectoriser.vocabulary_),
        "fitted_on": "train split" if train is not None else "evaluation texts, unlabelled",
    }

    def features(split: Split):
        u = vectoriser.transform(split.texts)
        if split.texts_pair is None:
            return u, None
        v = vectoriser.transform(split.texts_pair)
        return sparse.hstack([u, v, abs(u - v), u.multiply(v)]).tocsr(), (u, v)

    x_eval, sides = features(evaluation)
    metric = task.metrics[0].removeprefix("cosine_")
    out = []
    if "linear" in task.default_probes and train is not None:
        x_train, _ = features(train)
        fitted = P.linear_probe(x_train, train.labels, x_eval, regression=task.is_regression, select_metric=metric)
        out.append(Prediction("linear", fitted.predictions, {**protocol, **fitted.protocol}))
    if "cosine" in task.default_probes and sides is not None:
        u, v = sides
        dot = np.asarray(u.multiply(v).sum(1)).ravel()  # TF-IDF rows are L2-normalised: the dot is the cosine
        out.append(Prediction("cosine", dot, {**protocol, "similarity": "cosine"}))
    return out


# name -> what it computes from (task, capped training split, evaluation split)
BASELINES: dict[str, Callable[[Task, Split | None, Split], list[Prediction]]] = {
    "chance": _chance,
    "majority": _majority,
    "tfidf": _tfidf,
}


def _metrics(task: Task, probe: str) -> list[str]:
    """The metrics a baseline row reports: the task's, named as the probe it stands beside names them."""
    bare = [m.removeprefix("cosine_") for m in task.metrics]
    return [f"cosine_{m}" for m in bare] if probe == "cosine" else bare


def _chance_scores(metric: str, task: Task, train: Split | None, evaluation: Split) -> np.ndarray:
    rng = np.random.default_rng(CHANCE_SEED)
    known = train if train is not None else evaluation  # a zero-shot task: its declared score range, else its labels' range
    if task.is_regression:
        low, high = task.score_range or (float(known.labels.min()), float(known.labels.max()))
        draws = rng.uniform(low, high, size=(CHANCE_DRAWS, len(evaluation)))
    else:
        draws = rng.choice(np.unique(known.labels), size=(CHANCE_DRAWS, len(evaluation)))
    return np.asarray([score(metric, evaluation.labels, d) for d in draws])


def _rows(task: Task, name: str, split: str, train: Split | None, evaluation: Split, out: Prediction, key: str) -> list[dict]:
    base = {
        "model": MODEL_PREFIX + name,
        "model_kind": "baseline",
        "baseline": name,
        "task": task.name,
        "family": task.family,
        "split": split,
        "probe": out.probe,
        "n_train": len(train) if train is not None else 0,
        "n_eval": len(evaluation),
        "protocol": out.protocol,
        "unit": key,
    }
    rows = []
    for i, metric in enumerate(_metrics(task, out.probe)):
        if out.predictions is None:
            values = _chance_scores(metric, task, train, evaluation)
            value, (low, high) = float(values.mean()), np.percentile(values, [2.5, 97.5])
        else:
            value = score(metric, evaluation.labels, out.predictions)
            low, high = P.bootstrap_ci(metric, evaluation.labels, out.predictions)
        rows.append({**base, "metric": metric, "value": value, "is_main": i == 0, "ci_low": float(low), "ci_high": float(high)})
    return rows


def _data_digest(parts: list[Split]) -> str:
    return stable_hash([[texts_digest(p.texts, p.texts_pair), stable_hash(p.labels.tolist())] for p in parts])


def task_baselines(task: Task, store: ResultsStore, settings: BaselineSettings) -> list[dict]:
    """Every baseline of `task` on each of its evaluation splits, into `store` (units already there are skipped,
    units another live process holds are left to it); returns the rows written."""
    unscored = [m for m in task.metrics if m not in METRICS]
    if unscored:  # mteb's own metrics (v_measure, map, max_ap): mteb scores these tasks, no probe here does
        log.info("baselines: none for %s (its metric %s is mteb's own, not a probe metric)", task.name, unscored[0])
        return []
    zero_shot = not (task.train_split or task.holdout)  # chance and a TF-IDF cosine only: nothing to fit a class on
    train = (
        None if zero_shot else task.load_split(task.train_split, settings.data_root).subsample(settings.max_train, settings.seed)
    )
    written = []
    for split in task.eval_splits:
        evaluation = task.load_split(split, settings.data_root).subsample(settings.max_eval, settings.seed)
        data = _data_digest([evaluation] + ([train] if train is not None else []))
        for name, compute in BASELINES.items():
            protocol = {
                "max_train": settings.max_train,
                "max_eval": settings.max_eval,
                "seed": settings.seed,
                "chance_draws": CHANCE_DRAWS,
                "tfidf": {k: list(v) if isinstance(v, tuple) else v for k, v in TFIDF_OPTIONS.items()},
            }
            key = unit_key(model=MODEL_PREFIX + name, task=task.name, split=split, protocol=protocol, data=data)
            if store.claim(key) != CLAIMED:
                continue
            try:
                rows = [
                    row
                    for out in compute(task, train, evaluation)
                    for row in _rows(task, name, split, train, evaluation, out, key)
                ]
                written += store.append(rows)
            finally:
                store.release(key)
    return written


def run_baselines(tasks: list[Task], folder: str | Path, settings: BaselineSettings) -> pd.DataFrame:
    """The baselines of `tasks` in the folder's baselines store (computed where missing); a task whose data is missing is
    logged and left out. Returns the store's rows of these tasks."""
    from tqdm.auto import tqdm

    store = ResultsStore(EvaluationFolder(folder).baselines)
    for task in tqdm(tasks, desc="baselines", unit="task", disable=None):
        try:
            task_baselines(task, store, settings)
        except TaskDataMissing as e:
            log.error("baselines: %s", e)
    rows = store.dataframe()
    names = {t.name for t in tasks}
    return rows[rows["task"].isin(names)] if len(rows) else rows


def baselines_path(folder: str | Path) -> Path:
    """Where a folder's baseline rows are (a committed reference keeps them xz-compressed beside)."""
    return EvaluationFolder(folder).baselines / RESULTS_FILE
