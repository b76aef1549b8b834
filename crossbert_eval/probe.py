"""The probe runner: frozen features of one encoder -> linear / kNN / cosine probes on tasks -> result rows.

    crossbert probe minilm --tasks SST-2,STS-B --probe linear,knn --layers all --pooling mean

Work is organised in units (model, task, split, layer, pooling, probe, protocol). A unit whose rows
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

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from . import probes as P
from .metrics import score
from crossbert_model.errors import CrossbertError
from crossbert_model.utils import stable_hash

from .encoders import POOLINGS, FeatureCache, FrozenEncoder, texts_digest
from .results import BUSY, CLAIMED, DONE, ResultsStore, unit_key
from .tasks import Split, Task, TaskDataMissing, resolve_tasks

log = logging.getLogger(__name__)

PROBES = ("linear", "knn", "cosine")
PAIR_MODES = ("joint", "senteval")


class ProbeError(CrossbertError, ValueError):
    """A probe setting is wrong; the message names the option and what was expected."""


@dataclass
class ProbeSettings:
    tasks: list[str]
    probes: list[str] = field(default_factory=lambda: ["linear", "knn", "cosine"])
    layers: str = "last"  # all | last | N | N,M,...
    poolings: list[str] | None = None  # None: the model's own pooling (encoder.default_pooling)
    pair_mode: str = "joint"  # joint: the pair as one sequence; senteval: [u, v, |u-v|, u*v]
    k: int = P.KNN_K
    temperature: float = P.KNN_TEMPERATURE
    seed: int = P.PROBE_SEED
    results_dir: str = "runs/results"
    cache_dir: str = "runs/features"
    force: bool = False
    data_root: str | None = None
    max_train: int | None = None  # seeded subsample of the probe's train split (fast sweeps)

    def __post_init__(self) -> None:
        if isinstance(self.probes, str):
            self.probes = [p.strip() for p in self.probes.split(",") if p.strip()]
        if isinstance(self.poolings, str):
            self.poolings = [p.strip() for p in self.poolings.split(",") if p.strip()]
        self.validate()

    def validate(self) -> None:
        """Every setting checked before any model is loaded; messages name the command-line option."""
        if not _is_int(self.k) or self.k < 1:
            raise ProbeError(f"--k: expected a positive integer, got {self.k!r}")
        if not _is_number(self.temperature) or not 0 < self.temperature < float("inf"):
            raise ProbeError(f"--temperature: expected a positive number, got {self.temperature!r}")
        if self.poolings is not None:
            bad = [p for p in self.poolings if p not in POOLINGS]
            if bad or not self.poolings:
                raise _choices_error("--pooling", POOLINGS, self.poolings)
        bad = [p for p in self.probes if p not in PROBES]
        if bad or not self.probes:
            raise _choices_error("--probe", PROBES, self.probes)
        if self.pair_mode not in PAIR_MODES:
            raise ProbeError(f"--pair-mode: expected one of {', '.join(PAIR_MODES)}, got {self.pair_mode!r}")
        if self.max_train is not None and (not _is_int(self.max_train) or self.max_train < 1):
            raise ProbeError(f"max_train: expected a positive integer (unset: the whole train split), got {self.max_train!r}")

    def protocol_constants(self) -> dict:
        return {
            "C_grid": list(P.C_GRID),
            "alpha_grid": list(P.ALPHA_GRID),
            "validation_fraction": P.VALIDATION_FRACTION,
            "seed": self.seed,
            "knn_k": self.k,
            "knn_temperature": self.temperature,
            **({"max_train": self.max_train} if self.max_train else {}),  # only when subsampling
        }


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _choices_error(option: str, allowed: tuple, given: list) -> ProbeError:
    got = ",".join(map(str, given))
    return ProbeError(f"{option}: expected one or more of {', '.join(allowed)} (comma-separated), got {got!r}")


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

    def _unit(self, task: Task, split: str, probe: str, layer: int, pooling: str) -> str:
        pair_mode = self.s.pair_mode if (task.is_pair and probe != "cosine") else None
        constants = self.s.protocol_constants()
        names = {
            "cosine": (),
            "knn": ("knn_k", "knn_temperature", "max_train"),
            "linear": ("C_grid", "alpha_grid", "validation_fraction", "seed", "max_train"),
        }
        protocol = {k: constants[k] for k in names[probe] if k in constants}
        return unit_key(
            model=self.encoder.fingerprint, task=task.name, split=split, probe=probe, layer=layer, pooling=pooling,
            pair_mode=pair_mode, protocol=protocol, data=self._data_digest(task, split, probe), **self.encoder.feature_signature,
        )  # fmt: skip

    def _data_digest(self, task: Task, split: str, probe: str) -> str:
        """What the unit was computed on: edited data files or task definitions give new units."""
        key = (task.name, split, probe == "cosine")
        if key not in self._digests:
            parts = [task.load_split(split, self.s.data_root)] + ([self._train_split(task)] if probe != "cosine" else [])
            self._digests[key] = stable_hash([[texts_digest(p.texts, p.texts_pair), stable_hash(p.labels.tolist())] for p in parts])
        return self._digests[key]

    def plan(self, task: Task) -> list[tuple[str, str, int, str, str]]:
        """(probe, split, layer, pooling, unit key) for every applicable unit of this task."""
        probes = [p for p in self.s.probes if p in task.default_probes]
        return [
            (probe, split, layer, pooling, self._unit(task, split, probe, layer, pooling))
            for probe in probes
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
            log.info("%s: probe(s) %s do not apply (task probes: %s)", task.name, ", ".join(skipped), ", ".join(task.default_probes))
        todo = [u for u in units if self.s.force or not self.store.done(u[-1])]
        bar.update(len(units) - len(todo))
        if not todo:
            return []
        if self.s.force:
            self.store.remove_units({u[-1] for u in todo})
        skips = {DONE: 0, BUSY: []}
        rows: list[dict] = []
        for probe in dict.fromkeys(u[0] for u in todo):
            rows.extend(self._run_probe(task, probe, [u for u in todo if u[0] == probe], bar, skips))
        if skips[DONE]:
            log.info("%s: %d unit(s) finished by another run meanwhile, skipped", task.name, skips[DONE])
        if skips[BUSY]:
            busy = skips[BUSY]
            log.info("%s: %d unit(s) being computed by another live run, skipped: %s", task.name, len(busy), ", ".join(busy))
        return rows

    def _run_probe(self, task: Task, probe: str, units: list, bar: tqdm, skips: dict) -> list[dict]:
        """Each unit is claimed just before it is fitted, so concurrent runs on one store share the work
        and never compute (or write) a unit twice; features are read only once a unit is ours."""
        layers = sorted({u[2] for u in units})
        poolings = list(dict.fromkeys(u[3] for u in units))
        inputs: dict = {}  # read lazily: None -> the probe's train (split, features); split name -> (split, features)
        rows: list[dict] = []
        for _, split_name, layer, pooling, key in units:
            status = self.store.claim(key)
            if status != CLAIMED:
                self._note_skip(status, key, skips)
                bar.update(1)
                continue
            try:
                train, train_x = self._inputs(task, probe, None, inputs, layers, poolings)
                split, eval_x = self._inputs(task, probe, split_name, inputs, layers, poolings)
                bar.set_postfix_str(f"{task.name} {probe} L{layer} {pooling}")
                started = time.perf_counter()
                out = self._fit(task, probe, train, train_x, split, eval_x, (layer, pooling))
                seconds = time.perf_counter() - started
                unit_rows = self._rows(task, split_name, probe, layer, pooling, key, split, train, out, seconds)
                self.store.save_predictions(key, split.labels, out.predictions)  # before its rows: a row implies them
                rows.extend(self.store.append(unit_rows))  # [] when another run wrote it first
            finally:  # done or failed, the unit is no longer ours (a failed one is free for the next run)
                self.store.release(key)
            bar.update(1)
        return rows

    def _inputs(self, task: Task, probe: str, which: str | None, inputs: dict, layers, poolings):
        """(split, features) of the probe's train split (which=None) or an eval split, read once per probe."""
        if which not in inputs:
            if which is None:
                split = self._train_split(task) if probe != "cosine" else None
                name = task.train_split
            else:
                split, name = task.load_split(which, self.s.data_root), which
            feats = self._probe_inputs(task, name, split, probe, layers, poolings) if split is not None else None
            inputs[which] = (split, feats)
        return inputs[which]

    def _note_skip(self, status: str, key: str, skips: dict) -> None:
        if status == DONE:
            skips[DONE] += 1
        else:
            owner = self.store.last_owner or {}
            skips[BUSY].append(f"{key} (pid {owner.get('pid')} on {owner.get('host')})")

    def _train_split(self, task: Task) -> Split:
        split = task.load_split(task.train_split, self.s.data_root)
        n = self.s.max_train
        if not n or len(split) <= n:
            return split
        idx = np.sort(np.random.default_rng(self.s.seed).choice(len(split), n, replace=False))
        return Split(
            texts=[split.texts[i] for i in idx],
            labels=split.labels[idx],
            texts_pair=[split.texts_pair[i] for i in idx] if split.texts_pair is not None else None,
        )

    def _fit(self, task: Task, probe: str, train, train_x, split: Split, eval_x, key) -> P.ProbeOutput:
        if probe == "cosine":
            u, v = eval_x[key]
            return P.ProbeOutput(P.cosine_similarity(u, v), {"similarity": "cosine"})
        if probe == "linear":
            return P.linear_probe(
                train_x[key], train.labels, eval_x[key], regression=task.is_regression,
                select_metric=_metrics_for(task, probe)[0], seed=self.s.seed,
            )  # fmt: skip
        return P.knn_probe(
            train_x[key], train.labels, eval_x[key], regression=task.is_regression,
            num_classes=None if task.is_regression else task.class_count(self.s.data_root),
            k=self.s.k, temperature=self.s.temperature,
        )  # fmt: skip

    def _rows(self, task, split_name, probe, layer, pooling, key, split, train, out, seconds) -> list[dict]:
        metrics = _metrics_for(task, probe)
        base = {
            **row_base(self.encoder, task, split_name, probe, layer, pooling, self.pooling_source),
            "pair_mode": self.s.pair_mode if (task.is_pair and probe != "cosine") else None,
            "seed": self.s.seed,
            "n_train": len(train) if train is not None else 0,
            "n_eval": len(split),
            "protocol": {**out.protocol, **P.BOOTSTRAP_PROTOCOL},
            "probe_seconds": round(seconds, 3),
            "unit": key,
        }
        rows = []
        for i, m in enumerate(metrics):
            started = time.perf_counter()
            low, high = P.bootstrap_ci(m, split.labels, out.predictions)
            rows.append({**base, "metric": m, "value": score(m, split.labels, out.predictions), "is_main": i == 0,
                         "ci_low": low, "ci_high": high, "bootstrap_seconds": round(time.perf_counter() - started, 3)})  # fmt: skip
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
        keys = {u[-1] for units in plans.values() for u in units}
        df = self.store.dataframe()
        df = df[df["unit"].isin(keys)] if len(df) else df
        log.info(
            "probed %s on %d task(s) in %.1fs: feature cache %d hit(s), %d encoded",
            self.encoder.name, len(tasks), time.perf_counter() - started, self.cache.hits, self.cache.misses,
        )  # fmt: skip
        return df


def summary_table(df: pd.DataFrame) -> str:
    """Main metric per task x probe, one column per layer, in points (x100)."""
    if df is None or not len(df):
        return "(no results)"
    main = df[df["is_main"]].copy()
    main["score"] = main["value"] * 100
    table = main.pivot_table(index=["task", "split", "probe", "metric"], columns="layer", values="score", aggfunc="mean")
    table.columns = [f"L{int(c)}" for c in table.columns]
    return table.round(2).to_string()


def probe_model(model: str, settings: ProbeSettings, **encoder_options) -> ProbeRunner:
    """`encoder_options`: FrozenEncoder.load's (max_length, batch_size, dtype, allow_pickle)."""
    settings.validate()  # a wrong option or a broken task file should not cost a model load
    tasks = resolve_tasks(settings.tasks)
    encoder = FrozenEncoder.load(model, **encoder_options)
    runner = ProbeRunner(encoder, settings)
    runner.frame = runner.run(tasks)
    return runner
