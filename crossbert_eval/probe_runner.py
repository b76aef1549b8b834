"""The probe runner: frozen features of one encoder -> linear / kNN / cosine probes on tasks -> result rows.

    crossbert probe minilm --tasks SST-2,STS-B --probe linear,knn --layers all --pooling mean

Work is organised in units (model, task, split, layer, pooling, probe, feature transform, protocol). A unit whose rows
are in the results store is skipped (unless forced), and so is one another live run has claimed
(results.ResultsStore.claim): concurrent runs on one store share the work and write each unit once.
Features come from the on-disk cache, so a re-run, or a new probe on the same features, encodes nothing.
Every score row carries ci_low / ci_high: the percentile bootstrap over evaluation examples of
probes.bootstrap_ci (its constants are in the row's protocol; they are not part of the unit key, since
the point score they describe is unchanged).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Annotated, NamedTuple

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from . import probes as P
from .metrics import score
from crossbert_model.utils import stable_hash, texts_digest

from crossbert_model.defaults import FEATURE_TRANSFORM_NAMES, FEATURES_DIR, POOLINGS, PROBES, RESULTS_DIR
from crossbert_model.limits import POSITIVE, POSITIVE_INT, SEED, OneOf, SomeOf

from .encoders import FrozenEncoder
from .feature_cache import FeatureCache
from .layer_spec import LAYERS, LayerSpec
from .results import BUSY, CLAIMED, DONE, ResultsStore, unit_key
from .settings import SettingError, check_settings
from .tasks import Split, Task, TaskDataMissing, resolve_tasks

log = logging.getLogger(__name__)

PAIR_MODES = ("joint", "senteval")


@dataclass
class ProbeSettings:
    """What a probe run computes and where its rows go. Each field's limit is declared here (crossbert_model.limits) and
    checked on construction: SettingError names the field ("probe setting 'k': ..."), `crossbert probe` its option."""

    FIELD_KIND = "probe setting"  # how a refusal names a field (crossbert_eval.settings)

    tasks: list[str]
    probes: Annotated[list[str], SomeOf(*PROBES)] = field(default_factory=lambda: ["linear", "knn", "cosine"])
    layers: Annotated[LayerSpec, LAYERS] = LayerSpec.LAST  # parsed where the user gave it (LayerSpec.parse)
    poolings: Annotated[list[str] | None, SomeOf(*POOLINGS)] = None  # None: the model's own pooling (encoder.default_pooling)
    # joint: the pair as one sequence; senteval: [u, v, |u-v|, u*v]
    pair_mode: Annotated[str, OneOf(*PAIR_MODES)] = "joint"
    k: Annotated[int, POSITIVE_INT] = P.KNN_K
    temperature: Annotated[float, POSITIVE] = P.KNN_TEMPERATURE
    seed: Annotated[int, SEED] = P.PROBE_SEED
    results_dir: str = RESULTS_DIR
    cache_dir: str = FEATURES_DIR
    force: bool = False
    data_root: str | None = None
    max_train: Annotated[int | None, POSITIVE_INT] = (
        None  # seeded subsample of the probe's train split (fast sweeps); None: all of it
    )
    # seeded subsample of each evaluation split (smoke runs: `crossbert sweep --limit`); None: every evaluation example
    max_eval: Annotated[int | None, POSITIVE_INT] = None
    # probes.FEATURE_TRANSFORMS of the cosine and kNN probes, each its own units; fitted on the task's training split
    feature_transforms: Annotated[list[str], SomeOf(*FEATURE_TRANSFORM_NAMES)] = field(default_factory=lambda: ["raw"])

    def __post_init__(self) -> None:
        self.probes, self.poolings, self.feature_transforms = (
            [p.strip() for p in value.split(",") if p.strip()] if isinstance(value, str) else value
            for value in (self.probes, self.poolings, self.feature_transforms)
        )
        self.validate()

    def validate(self) -> None:
        """Every setting within its declared limit, before any model is loaded (SettingError naming the field)."""
        check_settings(self)

    def protocol_constants(self) -> dict:
        return {
            "C_grid": list(P.C_GRID),
            "alpha_grid": list(P.ALPHA_GRID),
            "validation_fraction": P.VALIDATION_FRACTION,
            "seed": self.seed,
            "knn_k": self.k,
            "knn_temperature": self.temperature,
            **({"max_train": self.max_train} if self.max_train else {}),  # only when subsampling
            **({"max_eval": self.max_eval} if self.max_eval else {}),
        }


def row_base(encoder: FrozenEncoder, task: Task, split: str, probe: str, layer: int, pooling: str, pooling_source: str) -> dict:
    """The fields every result row of one unit starts with (probe and geometry rows alike)."""
    ident = encoder.identity
    return {
        **ident,
        "task": task.name,
        "family": task.family,
        "split": split,
        "probe": probe,
        "layer": int(layer),
        "relative_depth": layer / ident["num_layers"],
        "pooling": pooling,
        "pooling_source": pooling_source,
    }


def transform_key(transform: str) -> dict:
    """What a feature transform adds to a unit's protocol key: nothing for raw (units computed before transforms
    existed keep their keys), its name and constants otherwise."""
    if transform == "raw":
        return {}
    return {"feature_transform": transform, **({"whiten_rtol": P.WHITEN_RTOL} if transform == "whitened" else {})}


class Unit(NamedTuple):
    """One unit of probe work and its key in the results store."""

    probe: str
    transform: str  # probes.FEATURE_TRANSFORMS
    split: str
    layer: int
    pooling: str
    key: str


def _metrics_for(task: Task, probe: str) -> list[str]:
    """Supervised probes on score tasks report pearson/spearman; the cosine probe cosine_*."""
    bare = [m.removeprefix("cosine_") for m in task.metrics]
    return [f"cosine_{m}" for m in bare] if probe == "cosine" else bare


class ProbeRunner:
    def __init__(self, encoder: FrozenEncoder, settings: ProbeSettings):
        self.encoder, self.s = encoder, settings
        self.store = ResultsStore(settings.results_dir)
        self.missing: dict[str, str] = {}  # task -> why its data could not be read
        self._digests: dict[tuple, str] = {}
        self.cache = FeatureCache(settings.cache_dir)
        settings.validate()  # again: fields may have been set after construction
        self.layers = encoder.layer_indices(settings.layers)
        self.poolings, self.pooling_source = encoder.poolings_and_source(settings.poolings)

    # -- units -------------------------------------------------------------------------------------

    def _unit(self, task: Task, split: str, probe: str, layer: int, pooling: str, transform: str = "raw") -> str:
        pair_mode = self.s.pair_mode if (task.is_pair and probe != "cosine") else None
        constants = self.s.protocol_constants()
        names = {
            "cosine": ("max_eval",),
            "knn": ("knn_k", "knn_temperature", "max_train", "max_eval"),
            "linear": ("C_grid", "alpha_grid", "validation_fraction", "seed", "max_train", "max_eval"),
        }
        protocol = {**{k: constants[k] for k in names[probe] if k in constants}, **transform_key(transform)}
        return unit_key(
            model=self.encoder.fingerprint,
            task=task.name,
            split=split,
            probe=probe,
            layer=layer,
            pooling=pooling,
            pair_mode=pair_mode,
            protocol=protocol,
            data=self._data_digest(task, split, _reads_train(probe, transform)),
            **self.encoder.feature_signature,
        )

    def _data_digest(self, task: Task, split: str, reads_train: bool) -> str:
        """What the unit was computed on: edited data files or task definitions give new units."""
        key = (task.name, split, reads_train)
        if key not in self._digests:
            parts = [self._eval_split(task, split)] + ([self._train_split(task)] if reads_train else [])
            self._digests[key] = stable_hash(
                [[texts_digest(p.texts, p.texts_pair), stable_hash(p.labels.tolist())] for p in parts]
            )
        return self._digests[key]

    def transforms_for(self, task: Task, probe: str) -> list[str]:
        """The requested feature transforms this probe of this task takes: raw only for the linear probe (it
        standardises its features itself) and for a task without a training split to fit a transform on."""
        if probe == "linear" or not (task.train_split or task.holdout):
            return [t for t in self.s.feature_transforms if t == "raw"]
        return list(self.s.feature_transforms)

    def plan(self, task: Task) -> list[Unit]:
        """Every applicable unit of this task."""
        probes = [p for p in self.s.probes if p in task.default_probes]
        return [
            Unit(probe, transform, split, layer, pooling, self._unit(task, split, probe, layer, pooling, transform))
            for probe in probes
            for transform in self.transforms_for(task, probe)
            for split in task.eval_splits
            for layer in self.layers
            for pooling in self.poolings
        ]

    # -- features ----------------------------------------------------------------------------------

    def _features(self, task: Task, split_name: str, split: Split, view: str, layers, poolings):
        """view: 'text' (single), 'joint' (pair as one sequence), 'a' / 'b' (each side alone)."""
        label = f"{task.name}/{split_name}/{view}"
        if view == "b":
            return self.cache.features(self.encoder, split.texts_pair, None, layers, poolings, label)
        pair = split.texts_pair if view == "joint" else None
        return self.cache.features(self.encoder, split.texts, pair, layers, poolings, label)

    def _probe_inputs(self, task: Task, split_name: str, split: Split, probe: str, layers, poolings):
        if not task.is_pair:
            return self._features(task, split_name, split, "text", layers, poolings)
        if probe != "cosine" and self.s.pair_mode == "joint":
            return self._features(task, split_name, split, "joint", layers, poolings)
        a = self._features(task, split_name, split, "a", layers, poolings)
        b = self._features(task, split_name, split, "b", layers, poolings)
        if probe == "cosine":
            return {k: (a[k], b[k]) for k in a}
        return {k: P.senteval_pair_features(a[k], b[k]) for k in a}

    # -- running -----------------------------------------------------------------------------------

    def run_task(self, task: Task, bar: tqdm) -> list[dict]:
        units = self.plan(task)
        skipped = [p for p in self.s.probes if p not in task.default_probes]
        if skipped:
            log.info(
                "%s: probe(s) %s do not apply (task probes: %s)", task.name, ", ".join(skipped), ", ".join(task.default_probes)
            )
        self._log_untransformed(task)
        todo = [u for u in units if self.s.force or not self.store.done(u.key)]
        bar.update(len(units) - len(todo))
        if not todo:
            return []
        if self.s.force:
            self.store.remove_units({u.key for u in todo})
        skips = {DONE: 0, BUSY: []}
        rows: list[dict] = []
        for probe in dict.fromkeys(u.probe for u in todo):
            rows.extend(self._run_probe(task, probe, [u for u in todo if u.probe == probe], bar, skips))
        if skips[DONE]:
            log.info("%s: %d unit(s) finished by another run meanwhile, skipped", task.name, skips[DONE])
        if skips[BUSY]:
            busy = skips[BUSY]
            log.info("%s: %d unit(s) being computed by another live run, skipped: %s", task.name, len(busy), ", ".join(busy))
        return rows

    def _log_untransformed(self, task: Task) -> None:
        for probe in [p for p in self.s.probes if p in task.default_probes]:
            left_out = [t for t in self.s.feature_transforms if t not in self.transforms_for(task, probe)]
            if left_out:
                why = "it standardises its features" if probe == "linear" else "the task has no training split to fit them on"
                log.info(
                    "%s: feature transform(s) %s not applied to the %s probe: %s", task.name, ", ".join(left_out), probe, why
                )

    def _run_probe(self, task: Task, probe: str, units: list[Unit], bar: tqdm, skips: dict) -> list[dict]:
        """Each unit is claimed just before it is fitted, so concurrent runs on one store share the work
        and never compute (or write) a unit twice; features are read only once a unit is ours."""
        layers = sorted({u.layer for u in units})
        poolings = list(dict.fromkeys(u.pooling for u in units))
        reads_train = any(_reads_train(probe, u.transform) for u in units)
        inputs: dict = {}  # read lazily: None -> the probe's train (split, features); split name -> (split, features)
        rows: list[dict] = []
        for unit in units:
            status = self.store.claim(unit.key)
            if status != CLAIMED:
                self._note_skip(status, unit.key, skips)
                bar.update(1)
                continue
            try:
                train, train_x = self._inputs(task, probe, None, inputs, layers, poolings, reads_train)
                split, eval_x = self._inputs(task, probe, unit.split, inputs, layers, poolings)
                bar.set_postfix_str(f"{task.name} {probe} {unit.transform} L{unit.layer} {unit.pooling}")
                started = time.perf_counter()
                out = self._fit(task, probe, unit.transform, train, train_x, split, eval_x, (unit.layer, unit.pooling))
                seconds = time.perf_counter() - started
                unit_rows = self._rows(task, unit, split, train, out, seconds)
                self.store.save_predictions(unit.key, split.labels, out.predictions)  # before its rows: a row implies them
                rows.extend(self.store.append(unit_rows))  # [] when another run wrote it first
            finally:  # done or failed, the unit is no longer ours (a failed one is free for the next run)
                self.store.release(unit.key)
            bar.update(1)
        return rows

    def _inputs(self, task: Task, probe: str, which: str | None, inputs: dict, layers, poolings, reads_train: bool = False):
        """(split, features) of the probe's train split (which=None; (None, None) unless `reads_train`) or an
        eval split, read once per probe."""
        if which not in inputs:
            if which is None:
                split = self._train_split(task) if reads_train else None
                name = task.train_split
            else:
                split, name = self._eval_split(task, which), which
            feats = self._probe_inputs(task, name, split, probe, layers, poolings) if split is not None else None
            inputs[which] = (split, feats)
        return inputs[which]

    def _note_skip(self, status: str, key: str, skips: dict) -> None:
        if status == DONE:
            skips[DONE] += 1
        else:
            owner = self.store.last_owner or {}
            skips[BUSY].append(f"{key} (pid {owner.get('pid')} on {owner.get('host')})")

    def _eval_split(self, task: Task, name: str) -> Split:
        return task.load_split(name, self.s.data_root).subsample(self.s.max_eval, self.s.seed)

    def _train_split(self, task: Task) -> Split:
        return task.load_split(task.train_split, self.s.data_root).subsample(self.s.max_train, self.s.seed)

    def _fit(self, task: Task, probe: str, transform: str, train, train_x, split: Split, eval_x, key) -> P.ProbeOutput:
        x_train, x_eval, fitted = transformed(transform, train_x[key] if train_x is not None else None, eval_x[key])
        if probe == "cosine":
            out = P.ProbeOutput(P.cosine_similarity(*x_eval), {"similarity": "cosine"})
        elif probe == "linear":
            out = P.linear_probe(
                x_train,
                train.labels,
                x_eval,
                regression=task.is_regression,
                select_metric=_metrics_for(task, probe)[0],
                seed=self.s.seed,
            )
        else:
            out = P.knn_probe(
                x_train,
                train.labels,
                x_eval,
                regression=task.is_regression,
                num_classes=None if task.is_regression else task.class_count(self.s.data_root),
                k=self.s.k,
                temperature=self.s.temperature,
            )
        return P.ProbeOutput(out.predictions, {**out.protocol, **fitted.protocol})

    def _rows(self, task: Task, unit: Unit, split: Split, train, out: P.ProbeOutput, seconds: float) -> list[dict]:
        probe = unit.probe
        metrics = _metrics_for(task, probe)
        base = {
            **row_base(self.encoder, task, unit.split, probe, unit.layer, unit.pooling, self.pooling_source),
            "feature_transform": unit.transform,
            "pair_mode": self.s.pair_mode if (task.is_pair and probe != "cosine") else None,
            "seed": self.s.seed,
            "n_train": len(train) if train is not None else 0,
            "n_eval": len(split),
            # the cap of the train split (`--max-train`, sweeps' max_probe_train) in the row, as in the unit's key
            "protocol": {
                **out.protocol,
                **P.BOOTSTRAP_PROTOCOL,
                **({"max_train": self.s.max_train} if self.s.max_train and train is not None else {}),
                **({"max_eval": self.s.max_eval} if self.s.max_eval else {}),
            },
            "probe_seconds": round(seconds, 3),
            "unit": unit.key,
        }
        rows = []
        for i, m in enumerate(metrics):
            started = time.perf_counter()
            low, high = P.bootstrap_ci(m, split.labels, out.predictions)
            rows.append(
                {
                    **base,
                    "metric": m,
                    "value": score(m, split.labels, out.predictions),
                    "is_main": i == 0,
                    "ci_low": low,
                    "ci_high": high,
                    "bootstrap_seconds": round(time.perf_counter() - started, 3),
                }
            )
        return rows

    def run(self, tasks: list[Task]) -> pd.DataFrame:
        plans = {}
        for task in tasks:
            try:
                plans[task.name] = self.plan(task)
            except TaskDataMissing as e:  # reported, never silently skipped
                log.error("%s", e)
                self.missing[task.name] = str(e)
        bar = tqdm(total=sum(map(len, plans.values())), desc=f"probing {self.encoder.name}", unit="unit", disable=None)
        started = time.perf_counter()
        for task in tasks:
            if task.name in plans:
                self.run_task(task, bar)
        bar.close()
        keys = {u.key for units in plans.values() for u in units}
        df = self.store.dataframe()
        df = df[df["unit"].isin(keys)] if len(df) else df
        log.info(
            "probed %s on %d task(s) in %.1fs: feature cache %d hit(s), %d encoded",
            self.encoder.name,
            len(tasks),
            time.perf_counter() - started,
            self.cache.hits,
            self.cache.misses,
        )
        return df


def _reads_train(probe: str, transform: str) -> bool:
    """Whether a unit reads the task's training split: every supervised probe, and a transformed cosine probe (its fit)."""
    return probe != "cosine" or transform != "raw"


def transformed(transform: str, x_train, x_eval):
    """(train, eval, fitted transform): a unit's features under its feature transform, fitted on the training
    features alone. Pair sides (a, b) of the cosine probe are transformed each; both sides of the training
    pairs, stacked, are the fit's unlabelled sentences."""
    if transform == "raw":
        return x_train, x_eval, P.fit_feature_transform("raw", None)
    fitted = P.fit_feature_transform(transform, np.concatenate(x_train) if isinstance(x_train, tuple) else x_train)

    def apply(x):
        return tuple(fitted(side) for side in x) if isinstance(x, tuple) else fitted(x)

    return apply(x_train), apply(x_eval), fitted


def probe_model(model: str, settings: ProbeSettings, **encoder_options) -> ProbeRunner:
    """`encoder_options`: FrozenEncoder.load's (max_length, batch_size, dtype, allow_pickle)."""
    settings.validate()  # a wrong option or a broken task file should not cost a model load
    tasks = resolve_tasks(settings.tasks)
    if not tasks:
        raise SettingError(
            settings.FIELD_KIND,
            "tasks",
            f"expected one or more task names, a family or all (comma-separated), got {','.join(settings.tasks)!r}",
        )
    encoder = FrozenEncoder.load(model, **encoder_options)
    runner = ProbeRunner(encoder, settings)
    runner.frame = runner.run(tasks)
    return runner
