"""The results store: one JSON row per (model, step, layer, pooling, probe, task, split, metric, seed).

    store = ResultsStore("results/minilm")
    store.append(rows)            # one locked, fsync'ed append per completed unit of work
    store.done(unit_key)          # was this (model, task, layer, pooling, probe, protocol) finished?
    df = store.dataframe()        # pandas

A unit's rows are appended in one write under an exclusive lock; a torn tail left by a killed
writer is cut off before the next append, so the file always parses.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from crossbert_model.utils import atomic_write_text, git_revision, package_versions, stable_hash

RESULTS_FILE = "results.jsonl"


def unit_key(**fields) -> str:
    """Identity of one unit of work; rows carry it so reruns can skip what is complete."""
    return stable_hash(fields, 20)


class ResultsStore:
    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.path = self.folder / RESULTS_FILE
        self._done: set[str] | None = None

    def _read(self) -> list[dict]:
        if not self.path.exists():
            return []
        rows = []
        with open(self.path) as f:
            for line in f:
                if line.endswith("\n"):
                    rows.append(json.loads(line))
        return rows

    def rows(self) -> list[dict]:
        return self._read()

    def done(self, key: str) -> bool:
        if self._done is None:
            self._done = {r["unit"] for r in self._read() if "unit" in r}
        return key in self._done

    def append(self, rows: list[dict]) -> None:
        if not rows:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        stamp = {**_provenance(), "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        payload = "".join(json.dumps({**r, **stamp}, default=_json_default) + "\n" for r in rows)
        with open(self.path, "a+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                _cut_torn_tail(f)
                f.write(payload.encode())
                f.flush()
                os.fsync(f.fileno())
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
        if self._done is not None:
            self._done.update(r["unit"] for r in rows if "unit" in r)

    def remove_units(self, keys: set[str]) -> None:
        """Drop the rows of these units (a forced rerun replaces them)."""
        if not keys or not self.path.exists():
            return
        kept = [r for r in self._read() if r.get("unit") not in keys]
        atomic_write_text(self.path, "".join(json.dumps(r, default=_json_default) + "\n" for r in kept))
        self._done = None

    def dataframe(self) -> pd.DataFrame:
        return pd.DataFrame(self._read())


def _cut_torn_tail(f) -> None:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    if size == 0:
        return
    f.seek(-1, os.SEEK_END)
    if f.read(1) == b"\n":
        return
    # find the last complete line and truncate after it
    pos = size - 1
    while pos > 0:
        step = min(4096, pos)
        f.seek(pos - step)
        chunk = f.read(step)
        nl = chunk.rfind(b"\n")
        if nl >= 0:
            f.truncate(pos - step + nl + 1)
            return
        pos -= step
    f.truncate(0)


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


@functools.lru_cache(maxsize=1)
def _provenance() -> dict:
    return {"git_revision": git_revision(), "versions": package_versions()}
