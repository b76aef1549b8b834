"""The mteb model wrapper: a frozen encoder at one layer and pooling, as mteb's EncoderProtocol.

Its ModelMeta name is the model, its revision the weights' fingerprint + layer + pooling, so two
checkpoints (or two layers) never share mteb's cached results. mteb is imported only when a wrapper is
made (after crossbert_eval.mteb_runner.configure_offline), so the wrapper's class is mteb's AbsEncoder
with the methods of MtebEncoderMethods mixed in.
"""

from __future__ import annotations

import time

import numpy as np

from .encoders import FeatureCache, FrozenEncoder


def meta_name(encoder: FrozenEncoder) -> str:
    """mteb's 'org/name': a hub model keeps its id; the rest are crossbert/<name> (MiniLM keeps its real one)."""
    if encoder.source.hub_id:
        return encoder.source.hub_id
    name = encoder.name.split("@")[0].replace("/", "__")
    if name.startswith("sentence-transformers__"):
        return f"sentence-transformers/{name.removeprefix('sentence-transformers__')}"
    return f"crossbert/{name}"


class MtebEncoderMethods:
    """What the wrapper adds to mteb's AbsEncoder. `costs` keeps, per task, the texts it asked for, how
    many were encoded (not from the feature cache) and the seconds spent."""

    def __init__(self, encoder: FrozenEncoder, layer: int, pooling: str, cache: FeatureCache | None, normalize: bool,
                 cache_layers: list[int] | None):  # fmt: skip
        from mteb.models.model_meta import ModelMeta

        self.encoder, self.layer, self.pooling, self.cache, self.normalize = encoder, layer, pooling, cache, normalize
        self.cache_layers = cache_layers
        self.costs: dict[str, dict] = {}
        step = f"-step{encoder.source.step}" if encoder.source.step is not None else ""
        self.mteb_model_meta = ModelMeta(
            loader=None,
            name=meta_name(encoder),
            revision=f"{encoder.fingerprint}{step}-L{layer}-{pooling}{'-norm' if normalize else ''}",
            release_date=None,
            languages=["eng-Latn"],
            n_parameters=sum(p.numel() for p in encoder.model.parameters()),
            memory_usage_mb=None,
            max_tokens=encoder.max_length,
            embed_dim=encoder.model.config.hidden_size,
            license=None,
            open_weights=True,
            public_training_code=None,
            public_training_data=None,
            framework=["PyTorch"],
            similarity_fn_name="cosine",
            use_instructions=False,
            training_datasets=None,
        )

    def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
        texts = [t for batch in inputs for t in batch["text"]]
        # mteb encodes every occurrence (TwitterURLCorpus pairs one source tweet with many others):
        # each distinct text is encoded once and its vector copied
        unique = list(dict.fromkeys(texts))
        label = f"mteb/{task_metadata.name}/{hf_subset}/{hf_split}"
        start, misses = time.perf_counter(), self.cache.misses if self.cache is not None else 0
        if self.cache is not None:
            layers = sorted(set(self.cache_layers or []) | {self.layer})
            feats = self.cache.features(self.encoder, unique, None, layers, [self.pooling], label)
            encoded = len(unique) if self.cache.misses > misses else 0
        else:
            feats = self.encoder.encode(unique, layers=[self.layer], poolings=[self.pooling], desc=label)
            encoded = len(unique)
        cost = self.costs.setdefault(task_metadata.name, {"texts": 0, "encoded": 0, "encode_s": 0.0})
        cost["texts"] += len(texts)
        cost["encoded"] += encoded
        cost["encode_s"] += time.perf_counter() - start
        x = feats[(self.layer, self.pooling)]
        if len(unique) < len(texts):
            position = {t: i for i, t in enumerate(unique)}
            x = x[[position[t] for t in texts]]
        if self.normalize:
            x = x / np.clip(np.linalg.norm(x, axis=1, keepdims=True), 1e-12, None)
        return x


def make_mteb_encoder(
    encoder: FrozenEncoder, layer: int, pooling: str | None, cache: FeatureCache | None, normalize: bool | None = None,
    cache_layers: list[int] | None = None,
):  # fmt: skip
    """`pooling` None: the model's own (encoder.default_pooling). `normalize` None: as the model itself
    does (sentence-transformers' Normalize module). `cache_layers`: encode (and cache) these layers
    whenever texts are encoded, so that running mteb again at another layer of the same checkpoint
    encodes nothing."""
    from mteb.models.abs_encoder import AbsEncoder

    wrapper = type("MtebEncoder", (MtebEncoderMethods, AbsEncoder), {"__doc__": MtebEncoderMethods.__doc__})
    return wrapper(encoder, layer, pooling or encoder.default_pooling, cache,
                   encoder.normalize if normalize is None else normalize, cache_layers)  # fmt: skip
