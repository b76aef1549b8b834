"""Representation geometry per layer of a frozen encoder, from the feature cache: result rows, no labels.

    crossbert geometry minilm --tasks SST-2,STS-B --layers all --pooling mean

Which texts: each task's evaluation split(s) (task.eval_splits), one unit per (split, layer, pooling); with max_eval, the
probes' seeded sample of each (Split.subsample at the same seed, so the probes' cached features are read).
Single-sentence tasks give their texts; pair tasks give the first and the second sentences, each encoded
alone, stacked (2n rows): the geometry of the sentence space, not of the joint pair encoding a joint
linear / kNN probe reads. Those are the same cached features as the cosine probe's (and senteval pair
mode's), so after those probes nothing is encoded; after a joint-mode probe a pair task encodes its two
sides once. Rows go to the results store with probe="geometry", one per metric of geometry.METRICS,
and a unit key, so a rerun skips what is done and concurrent runs share the work (results.ResultsStore.claim).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Annotated

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from . import geometry as G
from . import probes as P
from crossbert_model.defaults import FEATURES_DIR, POOLINGS, RESULTS_DIR
from crossbert_model.limits import POSITIVE_INT, SEED, SomeOf
from crossbert_model.utils import texts_digest

from .encoders import FrozenEncoder
from .feature_cache import FeatureCache
from .layer_spec import LAYERS, LayerSpec
from .probe_runner import row_base
from .results import CLAIMED, ResultsStore, unit_key
from .settings import SettingError, check_settings
from .tasks import Split, Task, TaskDataMissing, resolve_tasks

log = logging.getLogger(__name__)

PROBE_NAME = "geometry"
# Recorded with the protocol constants: which rows the metrics were computed on (see the module docstring).
PAIR_TEXTS = "first and second sentences, each encoded alone, stacked"


@dataclass
class GeometrySettings:
    """What a geometry run computes and where its rows go; each field's declared limit checked on construction
    (SettingError naming the field: "geometry setting 'poolings': ...")."""

    FIELD_KIND = "geometry setting"  # how a refusal names a field (crossbert_eval.settings)

    tasks: list[str]
    layers: Annotated[LayerSpec, LAYERS] = LayerSpec.ALL  # parsed where the user gave it (LayerSpec.parse)
    poolings: Annotated[list[str] | None, SomeOf(*POOLINGS)] = None  # None: the model's own pooling (encoder.default_pooling)
    results_dir: str = RESULTS_DIR
    cache_dir: str = FEATURES_DIR
    force: bool = False
    data_root: str | None = None
    # a seeded sample of each evaluation split, drawn as the probes draw theirs (ProbeSettings.max_eval and seed: the
    # same texts, so their cached features are read); None: every evaluation example
    max_eval: Annotated[int | None, POSITIVE_INT] = None
    seed: Annotated[int, SEED] = P.PROBE_SEED

    def __post_init__(self) -> None:
        if isinstance(self.poolings, str):
            self.poolings = [p.strip() for p in self.poolings.split(",") if p.strip()]
        self.validate()

    def validate(self) -> None:
        check_settings(self)


def protocol_for(task: Task, settings: GeometrySettings) -> dict:
    sample = {"max_eval": settings.max_eval, "sample_seed": settings.seed} if settings.max_eval else {}  # only when sampling
    return {**G.GEOMETRY_PROTOCOL, "texts": PAIR_TEXTS if task.is_pair else "texts", **sample}


class GeometryRunner:
    def __init__(self, encoder: FrozenEncoder, settings: GeometrySettings):
        self.encoder, self.s = encoder, settings
        settings.validate()
        self.store = ResultsStore(settings.results_dir)
        self.cache = FeatureCache(settings.cache_dir)
        self.missing: dict[str, str] = {}
        self.layers = encoder.layer_indices(settings.layers)
        self.poolings, self.pooling_source = encoder.poolings_and_source(settings.poolings)

    def _unit(self, task: Task, split_name: str, split: Split, layer: int, pooling: str) -> str:
        return unit_key(
            model=self.encoder.fingerprint,
            task=task.name,
            split=split_name,
            probe=PROBE_NAME,
            layer=layer,
            pooling=pooling,
            pair_mode=None,
            protocol=protocol_for(task, self.s),
            data=texts_digest(split.texts, split.texts_pair),
            **self.encoder.feature_signature,
        )

    def features(self, task: Task, split_name: str, split: Split, layers, poolings) -> dict:
        """{(layer, pooling): (n or 2n, d)}: cached by content, so the probe runner's features are read, not re-encoded."""
        label = f"{task.name}/{split_name}"
        a = self.cache.features(self.encoder, split.texts, None, layers, poolings, f"{label}/{'a' if task.is_pair else 'text'}")
        if not task.is_pair:
            return a
        b = self.cache.features(self.encoder, split.texts_pair, None, layers, poolings, f"{label}/b")
        return {k: np.concatenate([a[k], b[k]]) for k in a}

    def load_split(self, task: Task, split_name: str) -> Split:
        return task.load_split(split_name, self.s.data_root).subsample(self.s.max_eval, self.s.seed)

    def run_split(self, task: Task, split_name: str, bar: tqdm) -> list[dict]:
        split = self.load_split(task, split_name)
        units = [(l, p, self._unit(task, split_name, split, l, p)) for l in self.layers for p in self.poolings]
        todo = [u for u in units if self.s.force or not self.store.done(u[-1])]
        bar.update(len(units) - len(todo))
        if self.s.force:
            self.store.remove_units({u[-1] for u in todo})
        feats, rows = None, []
        for layer, pooling, key in todo:
            if self.store.claim(key) != CLAIMED:  # done or being computed by another live run
                bar.update(1)
                continue
            try:
                if feats is None:  # read only once a unit is ours, all the layers still to do at once
                    feats = self.features(
                        task, split_name, split, sorted({u[0] for u in todo}), list(dict.fromkeys(u[1] for u in todo))
                    )
                started = time.perf_counter()
                values = G.geometry(feats[(layer, pooling)])
                unit_rows = self._rows(
                    task, split_name, layer, pooling, key, len(feats[(layer, pooling)]), values, time.perf_counter() - started
                )
                rows.extend(self.store.append(unit_rows))
            finally:
                self.store.release(key)
            bar.update(1)
        return rows

    def _rows(
        self, task: Task, split_name: str, layer: int, pooling: str, key: str, n: int, values: dict, seconds: float
    ) -> list[dict]:
        base = {
            **row_base(self.encoder, task, split_name, PROBE_NAME, layer, pooling, self.pooling_source),
            "pair_mode": None,
            "n_eval": n,  # feature rows measured (2x the pairs for a pair task)
            "protocol": protocol_for(task, self.s),
            "probe_seconds": round(seconds, 3),
            "unit": key,
        }
        return [{**base, "metric": m, "value": float(values[m]), "is_main": m == G.METRICS[0]} for m in G.METRICS]

    def run(self, tasks: list[Task]) -> pd.DataFrame:
        plans = []
        for task in tasks:
            for split_name in task.eval_splits:
                try:
                    task.load_split(split_name, self.s.data_root)
                    plans.append((task, split_name))
                except TaskDataMissing as e:  # reported, never silently skipped
                    log.error("%s", e)
                    self.missing[task.name] = str(e)
        bar = tqdm(
            total=len(plans) * len(self.layers) * len(self.poolings),
            desc=f"geometry {self.encoder.name}",
            unit="unit",
            disable=None,
        )
        keys = set()
        for task, split_name in plans:
            split = self.load_split(task, split_name)
            keys |= {self._unit(task, split_name, split, l, p) for l in self.layers for p in self.poolings}
            self.run_split(task, split_name, bar)
        bar.close()
        df = self.store.dataframe()
        return df[df["unit"].isin(keys)] if len(df) else df


def geometry_model(model: str, settings: GeometrySettings, **encoder_options) -> GeometryRunner:
    """`encoder_options`: FrozenEncoder.load's (max_length, batch_size, dtype, allow_pickle)."""
    settings.validate()
    tasks = resolve_tasks(settings.tasks)
    if not tasks:
        raise SettingError(
            settings.FIELD_KIND,
            "tasks",
            f"expected one or more task names, a family or all (comma-separated), got {','.join(settings.tasks)!r}",
        )
    encoder = FrozenEncoder.load(model, **encoder_options)
    runner = GeometryRunner(encoder, settings)
    runner.frame = runner.run(tasks)
    return runner
