"""Pooled features on disk, keyed by content (crossbert_eval.encoders makes them; the probe, geometry and mteb runners
share them)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from crossbert_model.readers import read_array
from crossbert_model.defaults import POOLINGS
from crossbert_model.errors import SETTING
from crossbert_model.utils import atomic_path, stable_hash, texts_digest

from .model_names import EncoderError

if TYPE_CHECKING:
    from .encoders import FrozenEncoder

log = logging.getLogger(__name__)


class FeatureCache:
    """Pooled features on disk, one .npy per (model weights, texts, layer, pooling, max length, dtype).

    Keyed by content, not by name: a different checkpoint (other weights) or different texts never
    hit, and the same features are never encoded twice. Files are written atomically."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.hits = self.misses = 0

    def key(self, encoder: FrozenEncoder, digest: str, layer: int, pooling: str) -> dict:
        return {
            "model_fingerprint": encoder.fingerprint,
            "texts": digest,
            "layer": layer,
            "pooling": pooling,
            **encoder.feature_signature,
        }

    def path(self, key: dict) -> Path:
        """Content-addressed: the probe runner and the mteb runner share features of the same texts."""
        return (
            self.root / key["model_fingerprint"] / f"{key['texts']}-L{key['layer']}-{key['pooling']}-{stable_hash(key, 12)}.npy"
        )

    @staticmethod
    def _cached(path: Path, label: str, rows: int) -> np.ndarray | None:
        """A cached feature file, or None where it is damaged (logged; its features are encoded again)."""
        try:
            return read_array(path, f"cached features of {label}", EncoderError, rows=rows)
        except EncoderError as e:
            log.warning("%s: encoded again", e)
            return None

    def features(
        self, encoder: FrozenEncoder, texts, texts_pair, layers: list[int], poolings: list[str], label: str
    ) -> dict[tuple[int, str], np.ndarray]:
        """Cached features, encoding (all missing layers in one pass) only what is not on disk yet.
        `label` (task/split/view) only names the work in logs and progress bars."""
        digest = texts_digest(texts, texts_pair)
        paths = {(l, p): self.path(self.key(encoder, digest, l, p)) for l in layers for p in poolings}
        out = {k: v for k, p in paths.items() if p.is_file() and (v := self._cached(p, label, len(texts))) is not None}
        self.hits += len(out)
        missing = [k for k in paths if k not in out]
        if missing:
            self.misses += len(missing)
            need_layers = sorted({l for l, _ in missing})
            need_pools = sorted({p for _, p in missing}, key=POOLINGS.index)
            log.info(
                "encoding %s with %s: %d texts, layers %s, pooling %s", label, encoder.name, len(texts), need_layers, need_pools
            )
            fresh = encoder.encode(texts, texts_pair, layers=need_layers, poolings=need_pools, desc=f"encode {label}")
            bad = [k for k in missing if not np.isfinite(fresh[k]).all()]
            if bad:  # refused before anything is cached or probed
                raise EncoderError(
                    f"{encoder.name}: its features of {label} hold NaN or Inf at layer {bad[0][0]} "
                    f"({bad[0][1]} pooling): refused, nothing cached (try {SETTING} fp32 if it ran in bf16)",
                    setting="dtype",
                )
            for k in missing:
                with atomic_path(paths[k]) as tmp:
                    with open(tmp, "wb") as f:
                        np.save(_WriteOnly(f), fresh[k])
                out[k] = fresh[k]
        return out


class _WriteOnly:
    """A file seen through write() alone. numpy writes an array to a real file with C's fwrite, whose error on a
    full disk carries no errno ('N requested and M written'); through write() it is the OSError of the disk."""

    def __init__(self, file):
        self.write = file.write
