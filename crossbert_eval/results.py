"""The results store: one JSON row per (model, step, layer, pooling, probe, task, split, metric, seed).

    store = ResultsStore("results/minilm")
    if store.claim(unit_key) == CLAIMED:   # no other live process is computing it, and it is not done
        ...compute...
        store.append(rows)                 # rows of a unit already done are skipped, never written twice
        store.release(unit_key)
    store.done(unit_key)                   # was this (model, task, layer, pooling, probe, protocol) finished?
    df = store.dataframe()                 # pandas

Several processes may share one store (two `crossbert probe` runs, a sweep and a probe). Claims
(crossbert_model.claims) are files under `claims/`, one per unit in progress, taken and dropped under an
exclusive lock on the store (`.store.lock`), so each unit is computed and written once. A claim whose
process died (same host, pid gone) or that is older than the claim timeout is stale and is taken over. Beside each probe
unit's rows its labels and predictions are kept (`predictions/<unit>.npz`) for paired comparisons.

Rows are appended by crossbert_model.utils.append_jsonl (one locked, fsync'ed write; a torn tail left
by a killed writer is cut off first), so the file always parses.
"""

from __future__ import annotations

import functools
import logging
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from crossbert_model.claims import BUSY, CLAIMED, DONE, Claims, timestamp  # noqa: F401  (claim() outcomes, re-exported)
from crossbert_model.utils import (
    append_jsonl,
    json_text,
    atomic_path,
    atomic_write_text,
    provenance,
    stable_hash,
)
from crossbert_model.readers import jsonl_row, read_arrays, read_jsonl

log = logging.getLogger(__name__)

RESULTS_FILE = "results.jsonl"
# Per unit: the evaluation labels and the probe's predictions (<unit>.npz), for paired comparisons of two
# units on one evaluation set (probes.bootstrap_diff_ci, report.comparisons).
PREDICTIONS_DIR = "predictions"
CLAIMS_DIR = "claims"
LOCK_FILE = ".store.lock"
CLAIM_TIMEOUT_S = 6 * 3600  # a unit takes minutes; a claim this old belongs to a hung or lost run


def unit_key(**fields) -> str:
    """Identity of one unit of work; rows carry it so reruns can skip what is complete."""
    return stable_hash(fields, 20)


class ResultsStore:
    def __init__(self, folder: str | os.PathLike, claim_timeout: float = CLAIM_TIMEOUT_S):
        self.folder = Path(folder)
        self.path = self.folder / RESULTS_FILE
        self.claims = self.folder / CLAIMS_DIR
        # the claims share the store's lock: a claim and the check that its unit is not done are one step
        self._claims = Claims(self.claims, self.folder / LOCK_FILE, claim_timeout)
        self._done: set[str] = set()
        self._seen: tuple[int, int] | None = None  # (inode, bytes) of the results file read into _done

    # -- predictions -------------------------------------------------------------------------------

    def _predictions_path(self, unit: str) -> Path:
        return self.folder / PREDICTIONS_DIR / f"{unit}.npz"

    def save_predictions(self, unit: str, y_true, y_pred) -> None:
        with atomic_path(self._predictions_path(unit)) as tmp, open(tmp, "wb") as f:
            np.savez(f, y_true=np.asarray(y_true), y_pred=np.asarray(y_pred))

    def load_predictions(self, unit: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(labels, predictions) of a unit, or None where none were kept (mteb rows, older stores)."""
        path = self._predictions_path(unit)
        if not path.exists():
            return None
        return read_arrays(path, ("y_true", "y_pred"), "a unit's labels and predictions")

    # -- reading -----------------------------------------------------------------------------------

    def rows(self) -> list[dict]:
        return [normalise_row(r) for r in read_jsonl(self.path)]

    def dataframe(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows())

    def done(self, key: str) -> bool:
        self._refresh_done()
        return key in self._done

    def _refresh_done(self) -> None:
        """Read the units of rows appended since the last look (by anyone), not the whole file again."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._done, self._seen = set(), None
            return
        inode, offset = self._seen or (st.st_ino, 0)
        if inode != st.st_ino or st.st_size < offset:  # rewritten (remove_units): start over
            self._done, offset = set(), 0
        with open(self.path, "rb") as f:
            f.seek(offset)
            chunk = f.read(st.st_size - offset)
        whole = chunk[: chunk.rfind(b"\n") + 1]  # a torn tail is not a row (yet)
        for line in whole.splitlines():
            unit = jsonl_row(line, f"{self.path} (a line after byte {offset})").get("unit")
            if unit:
                self._done.add(unit)
        self._seen = (st.st_ino, offset + len(whole))

    # -- claims ------------------------------------------------------------------------------------

    def claim(self, key: str) -> str:
        """CLAIMED (compute it), DONE (already in the store) or BUSY (a live process holds it)."""
        return self._claims.claim(key, is_done=lambda: self.done(key))

    def release(self, key: str) -> None:
        """Drop our claim of a unit (done or failed); another process's claim is left alone."""
        self._claims.release(key)

    @property
    def last_owner(self) -> dict | None:
        """Who holds the unit of the last BUSY claim (for the log)."""
        return self._claims.last_owner

    # -- writing -----------------------------------------------------------------------------------

    def append(self, rows: list[dict]) -> list[dict]:
        """Append rows, stamped with provenance and time; returns those written. Under the store lock,
        rows of a unit that is already in the store are dropped, so no unit is ever written twice."""
        if not rows:
            return []
        with self._claims.locked():
            self._refresh_done()
            fresh = [r for r in rows if r.get("unit") not in self._done]
            dropped = {r["unit"] for r in rows if r.get("unit") in self._done}
            if dropped:
                log.warning(
                    "%d unit(s) already in %s, not written again: %s", len(dropped), self.path, ", ".join(sorted(dropped))
                )
            stamp = {**_row_provenance(), "timestamp": timestamp()}
            append_jsonl(self.path, [{**r, **stamp} for r in fresh], default=_json_default)
            self._refresh_done()
        return fresh

    def remove_units(self, keys: set[str]) -> None:
        """Drop the rows of these units (a forced rerun replaces them)."""
        if not keys:
            return
        with self._claims.locked():
            if not self.path.exists():
                return
            kept = [r for r in read_jsonl(self.path) if r.get("unit") not in keys]
            atomic_write_text(self.path, "".join(json_text(r, _json_default) + "\n" for r in kept))
            self._done, self._seen = set(), None


# ------------------------------------------------------------------------------------------------
# Rows as readers see them
# ------------------------------------------------------------------------------------------------


def stored_file(plain: Path) -> Path:
    """`plain`, or its xz-compressed copy where only that is there (a committed reference, `make reference`)."""
    packed = plain.with_name(plain.name + ".xz")
    return packed if packed.is_file() and not plain.is_file() else plain


def normalise_row(row: dict) -> dict:
    """Rows of every version in today's shape: `packages` (older rows said `versions`), `layer` an int."""
    if "versions" in row and "packages" not in row:
        row = {**row, "packages": row["versions"]}
        del row["versions"]
    layer = row.get("layer")
    if isinstance(layer, str) and layer.lstrip("-").isdigit():
        row = {**row, "layer": int(layer)}
    elif isinstance(layer, float) and layer.is_integer():
        row = {**row, "layer": int(layer)}
    return row


def probe_variant(probe: str, transform) -> str:
    """How tables name a probe on transformed features (probes.FEATURE_TRANSFORMS): `knn` on raw features (and
    rows written before transforms existed), `knn (centred)`, `cosine (whitened)`."""
    return probe if transform is None or pd.isna(transform) or transform == "raw" else f"{probe} ({transform})"


def duplicate_units(rows: list[dict]) -> dict[str, int]:
    """{unit: times written} for units whose rows are in the store more than once (the same unit and
    metric on several lines: two runs computed it)."""
    counts = Counter((r.get("unit"), r.get("metric")) for r in rows if r.get("unit"))
    out: dict[str, int] = {}
    for (unit, _), n in counts.items():
        if n > 1:
            out[unit] = max(out.get(unit, 0), n)
    return out


# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


@functools.lru_cache(maxsize=1)
def _row_provenance() -> dict:
    """utils.provenance without the machine block (it would repeat on every row); once per process."""
    return provenance(machine=False)
