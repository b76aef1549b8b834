"""The mteb model wrapper: a frozen encoder at one layer and pooling, as mteb's EncoderProtocol, with a
ModelMeta that mteb's leaderboard and ResultCache read.

Where results land: `{out}/results/{org__name}/{revision}/[experiments/{experiment}/]{Task}.json`

* name: the model's id: a hub model keeps its hub id, MiniLM its real one, the rest are `crossbert/<name>`.
* revision: the weights' fingerprint, `FrozenEncoder.fingerprint` (sha256 of config.json + the weight
  files, 16 hex digits), the same key the feature cache and every result row use. Two checkpoints never
  share a revision; the same weights copied elsewhere keep theirs.
* experiment: mteb's own slot for ablations (`ModelMeta.experiment_kwargs`, folder
  `experiments/<key>_<value>__...`): the settings that differ from how the model runs by itself.
  The model as it is (its last layer, its own pooling, normalisation and max length, fp32 features)
  has no experiment, so its results sit where mteb's and the leaderboard's are (`{revision}/{Task}.json`);
  layer 3 with CLS pooling is `experiments/layer_3__pooling_cls/`. mteb's `ResultCache.load_results`
  returns experiments only when asked (`load_experiments="match_name"` or `experiment_kwargs=...`).

ModelMeta fields and where each comes from (the one place this is said; unknown stays None):

| field | our checkpoints | any other encoder |
|---|---|---|
| n_parameters, n_embedding_parameters | crossbert_model.parameter_counts (encoder, embedding) | the loaded weights; the input embedding matrix |
| memory_usage_mb | fp32 size of n_parameters (mteb's convention) | same |
| embed_dim | config hidden_size | same |
| max_tokens | config max_position_embeddings (the trained sequence length) | sentence_bert_config.json max_seq_length, else the positions |
| similarity_fn_name | cosine (what the probes and MTEB score with) | config_sentence_transformers.json similarity_fn_name, else cosine |
| use_instructions | False | True when config_sentence_transformers.json declares prompts |
| framework | PyTorch, Transformers, safetensors | + Sentence Transformers for a sentence-transformers folder |
| languages | eng-Latn (English corpus and tasks) | model card `language` (README.md YAML header), else mteb's registry |
| license | model card `license`, else "not specified" | model card `license`, else mteb's registry |
| release_date | the checkpoint's date (when its model.safetensors was written, UTC) | mteb's registry (same name), else None |
| training_datasets | empty: pre-trained on a corpus that is no MTEB dataset | mteb's registry (same name), else None |
| public_training_data | the corpus folder of the run (run_info.json / trainer_state) | mteb's registry, else None |
| reference, citation, public_training_code | None | mteb's registry; a hub id's page |
| adapted_from | None | model card `base_model` |

mteb's registry is `mteb.get_model_meta(name)`, offline: it knows hub models by name (MiniLM's
release date, licence and training data come from it); a folder that is not a registered model gets
nothing from it.

Prompts: a sentence-transformers folder whose config_sentence_transformers.json declares `prompts`
(e.g. {"query": "query: ", "document": "passage: "}) gets them when mteb asks with a prompt_type: the
prompt is chosen by mteb's public `get_prompt` (task name, task type, prompt type, in mteb's order),
else the folder's `default_prompt_name` as sentence-transformers does, and prefixed to every text.
Each task's prompts are recorded in its rows (`protocol.prompts`).

Several layers in one run: mteb scores one model (one ModelMeta, one result folder) per call, so a run makes one
wrapper per layer; they share one LayerFeatures, which encodes each text set once at every layer asked for and
hands each wrapper its layer (crossbert_eval.mteb_runner.run_mteb).

mteb is imported only when a wrapper is made (after crossbert_eval.mteb_runner.configure_offline), so the
wrapper's class is mteb's AbsEncoder with the methods of MtebEncoderMethods mixed in.
"""

from __future__ import annotations

import datetime
import logging
import time
import typing
from pathlib import Path

import numpy as np

from crossbert_model.readers import ReadError, parse_yaml, read_json, read_text
from crossbert_model.utils import texts_digest
from crossbert_model.run_layout import CheckpointDir

from .encoders import FrozenEncoder
from .feature_cache import FeatureCache
from .model_sources import fitted_max_length, read_sentence_transformers_layout
from .mteb_tasks import MtebError

log = logging.getLogger(__name__)

MODEL_CARD = "README.md"
ST_CONFIG = "config_sentence_transformers.json"
# ISO 639-1 codes of model cards -> mteb's language-script codes (the tasks here are English)
CARD_LANGUAGES = {"en": "eng-Latn"}
CHECKPOINT_SIMILARITY = "cosine"


def meta_name(encoder: FrozenEncoder) -> str:
    """mteb's 'org/name': a hub model keeps its id; the rest are crossbert/<name> (MiniLM keeps its real one)."""
    if encoder.source.hub_id:
        return encoder.source.hub_id
    name = encoder.name.split("@")[0].replace("/", "__")
    if name.startswith("sentence-transformers__"):
        return f"sentence-transformers/{name.removeprefix('sentence-transformers__')}"
    return f"crossbert/{name}"


# ------------------------------------------------------------------------------------------------
# What a model folder declares
# ------------------------------------------------------------------------------------------------


def sentence_transformers_root(folder: Path) -> Path | None:
    """The sentence-transformers folder around a model's transformer folder (modules.json is there or one
    level up, naming this folder as its Transformer module); None for a plain Hugging Face folder."""
    for candidate in (folder, folder.parent):
        layout = read_sentence_transformers_layout(candidate)
        if layout is not None and layout.transformer_folder.resolve() == folder.resolve():
            return candidate
    return None


def read_card_header(folder: Path) -> dict:
    """The YAML metadata header of the folder's model card (README.md between '---' lines); {} without one."""
    path = folder / MODEL_CARD
    if not path.is_file():
        return {}
    text = read_text(path, "a model card (README.md)", MtebError)
    if not text.startswith("---"):
        return {}
    header, sep, _ = text[3:].partition("\n---")
    if not sep:
        return {}
    data = parse_yaml(header, f"{path} (the model card's YAML header)", MtebError)
    return data if isinstance(data, dict) else {}


def read_st_config(st_root: Path | None) -> dict:
    """config_sentence_transformers.json of a sentence-transformers folder ({} when there is none)."""
    path = st_root / ST_CONFIG if st_root is not None else None
    if path is None or not path.is_file():
        return {}
    return read_json(path, "a sentence-transformers config", MtebError)


def declared_prompts(st_config: dict, where: Path | None = None) -> tuple[dict[str, str], str | None]:
    """(prompts, default prompt name) a sentence-transformers config declares."""
    prompts = st_config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise MtebError(f"{where}: `prompts` must map prompt names to prompt texts, got {prompts!r}")
    default = st_config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise MtebError(f"{where}: default_prompt_name {default!r} is none of its prompts ({', '.join(prompts) or 'none'})")
    return {k: v for k, v in prompts.items() if v}, default


def card_license(card: dict) -> str | None:
    """The card's licence when mteb knows it (its Licenses list, or a URL); 'other' and unknown ones: None."""
    from mteb.types import Licenses

    value = card.get("license")
    if isinstance(value, str) and (value.lower() in typing.get_args(Licenses) or value.startswith(("http://", "https://"))):
        return value.lower() if not value.startswith("http") else value
    if value is not None:
        log.info("model card licence %r is not one mteb lists; ModelMeta.license left empty", value)
    return None


def card_languages(card: dict) -> list[str] | None:
    codes = card.get("language")
    codes = [codes] if isinstance(codes, str) else codes
    if not codes or not all(c in CARD_LANGUAGES for c in codes):
        return None
    return [CARD_LANGUAGES[c] for c in codes]


def registry_meta(name: str):
    """mteb's own ModelMeta for a registered model name (offline, no hub call), else None."""
    import mteb

    try:
        return mteb.get_model_meta(name)
    except (KeyError, ValueError):
        return None


# ------------------------------------------------------------------------------------------------
# ModelMeta
# ------------------------------------------------------------------------------------------------


def experiment_settings(encoder: FrozenEncoder, layer: int, pooling: str, normalize: bool) -> dict:
    """The settings of this run that differ from how the model runs by itself (mteb's experiment_kwargs)."""
    own_length = fitted_max_length(encoder.source, encoder.tokenizer, None, True)
    settings = {
        "layer": (layer, encoder.num_layers),
        "pooling": (pooling, encoder.source.default_pooling),
        "normalize": (normalize, encoder.normalize),
        "max_length": (encoder.max_length, own_length),
        "features_dtype": (encoder.identity["features_dtype"], "float32"),
    }
    return {key: value for key, (value, own) in settings.items() if value != own}


def checkpoint_facts(encoder: FrozenEncoder) -> dict:
    """ModelMeta fields of one of our checkpoints: its config, trainer state and run metadata."""
    from crossbert_model import parameter_counts

    folder = encoder.source.folder
    counts = parameter_counts(encoder.model.config)
    card = read_card_header(folder)
    return {
        "n_parameters": counts["encoder"],
        "n_embedding_parameters": counts["embedding"],
        "max_tokens": encoder.source.positions,
        "languages": card_languages(card) or ["eng-Latn"],
        "license": card_license(card) or "not specified",
        "release_date": weights_date(folder),
        "training_datasets": set(),  # pre-trained on its corpus only: zero-shot on every MTEB task
        "public_training_data": training_corpus(folder),
        "similarity_fn_name": CHECKPOINT_SIMILARITY,
        "use_instructions": False,
        "framework": ["PyTorch", "Transformers", "safetensors"],
    }


def weights_date(folder: Path) -> str | None:
    """The checkpoint's date: when its weights were written (UTC; the newest *.safetensors file)."""
    times = [p.stat().st_mtime for p in folder.glob("*.safetensors")]
    if not times:
        return None
    return datetime.datetime.fromtimestamp(max(times), datetime.timezone.utc).date().isoformat()


def training_corpus(checkpoint: Path) -> str | None:
    """The corpus folder a checkpoint was trained on (the run's run_info.json), e.g. 'wikipedia_en_2015'."""
    run = CheckpointDir(checkpoint).run
    run_info = run.run_info if run else None
    if run_info is None or not run_info.is_file():
        return None
    try:
        corpus = read_json(run_info, "a run's run_info.json").get("data", {}).get("corpus")
    except (ReadError, AttributeError):  # a damaged run_info names no corpus
        return None
    return Path(corpus).name if isinstance(corpus, str) else None


def encoder_facts(encoder: FrozenEncoder, st_root: Path | None, st_config: dict, prompts: dict) -> dict:
    """ModelMeta fields of any other encoder: its weights and configs, its model card, mteb's registry."""
    model = encoder.model
    n_parameters = sum(p.numel() for p in model.parameters())
    embeddings = model.get_input_embeddings()
    card = read_card_header(st_root or encoder.source.folder)
    similarity = st_config.get("similarity_fn_name") or "cosine"
    if similarity not in ("cosine", "dot"):
        log.info("%s: similarity %r is not one mteb's ModelMeta takes; cosine recorded", encoder.name, similarity)
        similarity = "cosine"
    facts = {
        "n_parameters": n_parameters,
        "n_embedding_parameters": embeddings.weight.numel() if embeddings is not None else None,
        "max_tokens": encoder.source.max_seq_length or encoder.source.positions,
        "languages": card_languages(card),
        "license": card_license(card),
        "adapted_from": card.get("base_model") if isinstance(card.get("base_model"), str) else None,
        "similarity_fn_name": similarity,
        "use_instructions": bool(prompts),
        "framework": ["PyTorch", "Transformers", "safetensors"] + (["Sentence Transformers"] if st_root else []),
        "reference": f"https://huggingface.co/{encoder.source.hub_id}" if encoder.source.hub_id else None,
    }
    known = registry_meta(meta_name(encoder))
    if known is not None:  # fill what the folder does not say
        for field in (
            "languages",
            "license",
            "release_date",
            "training_datasets",
            "public_training_code",
            "public_training_data",
            "reference",
            "citation",
        ):
            if facts.get(field) is None:
                facts[field] = getattr(known, field)
    return facts


def model_meta(
    encoder: FrozenEncoder,
    layer: int,
    pooling: str,
    normalize: bool,
    prompts: dict | None = None,
    st_root: Path | None = None,
    st_config: dict | None = None,
):
    """The ModelMeta mteb writes beside the results (model_meta.json): see the module docstring."""
    from mteb.models.model_meta import ModelMeta

    if encoder.source.kind == "crossbert":
        facts = checkpoint_facts(encoder)
    else:
        facts = encoder_facts(encoder, st_root, st_config or {}, prompts or {})
    defaults = {
        "release_date": None,
        "languages": None,
        "license": None,
        "training_datasets": None,
        "public_training_code": None,
        "public_training_data": None,
    }
    return ModelMeta(
        loader=None,
        name=meta_name(encoder),
        revision=encoder.fingerprint,
        experiment_kwargs=experiment_settings(encoder, layer, pooling, normalize) or None,
        embed_dim=encoder.model.config.hidden_size,
        memory_usage_mb=round(facts["n_parameters"] * 4 / 2**20),
        open_weights=True,
        modalities=["text"],
        model_type=["dense"],
        **{**defaults, **facts},
    )


# ------------------------------------------------------------------------------------------------
# The wrapper
# ------------------------------------------------------------------------------------------------


class LayerFeatures:
    """The features of one or more layers (one pooling) that the wrappers of those layers share: a text set is
    encoded ONCE, at every layer of `layers` (one forward pass gives every hidden state), through the feature
    cache when there is one; with several layers the result stays in memory, so the other layers' wrappers read
    it instead of encoding again. `forget()` drops it (the runner calls it after each task: memory holds one
    task's texts at every layer). `passes` counts the text sets encoded or read from the feature cache."""

    def __init__(self, encoder: FrozenEncoder, layers: list[int], pooling: str, cache: FeatureCache | None):
        self.encoder, self.layers, self.pooling, self.cache = encoder, sorted(set(layers)), pooling, cache
        self.remember = len(self.layers) > 1  # one layer: nothing another wrapper could reuse
        self.passes = 0
        self._memory: dict[str, dict] = {}

    def features(self, texts: list[str], label: str) -> tuple[dict[tuple[int, str], np.ndarray], int]:
        """({(layer, pooling): array} at every layer, how many texts were encoded now: 0 from memory or the feature cache)."""
        digest = texts_digest(texts, None)
        if digest in self._memory:
            return self._memory[digest], 0
        self.passes += 1
        if self.cache is not None:
            misses = self.cache.misses
            feats = self.cache.features(self.encoder, texts, None, self.layers, [self.pooling], label)
            encoded = len(texts) if self.cache.misses > misses else 0
        else:
            feats = self.encoder.encode(texts, layers=self.layers, poolings=[self.pooling], desc=label)
            encoded = len(texts)
        if self.remember:
            self._memory[digest] = feats
        return feats, encoded

    def forget(self) -> None:
        self._memory.clear()


class MtebEncoderMethods:
    """What the wrapper adds to mteb's AbsEncoder. `costs` keeps, per task, the texts it asked for, how
    many were encoded (not from the feature cache or another layer's pass), the seconds spent and the prompts used."""

    def __init__(self, encoder: FrozenEncoder, layer: int, pooling: str, normalize: bool, features: LayerFeatures):
        self.encoder, self.layer, self.pooling, self.normalize, self.shared = encoder, layer, pooling, normalize, features
        self.costs: dict[str, dict] = {}
        st_root = sentence_transformers_root(encoder.source.folder)
        st_config = read_st_config(st_root)
        prompts, self.default_prompt_name = declared_prompts(st_config, st_root / ST_CONFIG if st_root else None)
        self.model_prompts = prompts or None  # AbsEncoder's attribute, read by mteb's prompt lookup
        self.mteb_model_meta = model_meta(encoder, layer, pooling, normalize, prompts, st_root, st_config)

    def prompt_for(self, task_metadata, prompt_type) -> str:
        """The prompt for this task and prompt type (mteb's lookup), else the model's default prompt."""
        from mteb.models.abs_encoder import get_prompt

        prompt = get_prompt(self.model_prompts, task_metadata, prompt_type)
        if prompt is None and self.default_prompt_name:
            prompt = self.model_prompts[self.default_prompt_name]
        return prompt or ""

    def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
        prompt = self.prompt_for(task_metadata, prompt_type)
        texts = [prompt + t for batch in inputs for t in batch["text"]]
        # mteb encodes every occurrence (TwitterURLCorpus pairs one source tweet with many others):
        # each distinct text is encoded once and its vector copied
        unique = list(dict.fromkeys(texts))
        label = f"mteb/{task_metadata.name}/{hf_subset}/{hf_split}"
        start = time.perf_counter()
        feats, encoded = self.shared.features(unique, label)
        cost = self.costs.setdefault(task_metadata.name, {"texts": 0, "encoded": 0, "encode_s": 0.0, "prompts": {}})
        cost["texts"] += len(texts)
        cost["encoded"] += encoded
        cost["encode_s"] += time.perf_counter() - start
        if prompt:
            cost["prompts"][prompt_type.value if prompt_type else "default"] = prompt
        x = feats[(self.layer, self.pooling)]
        if len(unique) < len(texts):
            position = {t: i for i, t in enumerate(unique)}
            x = x[[position[t] for t in texts]]
        if self.normalize:
            x = x / np.clip(np.linalg.norm(x, axis=1, keepdims=True), 1e-12, None)
        return x


def make_mteb_encoder(
    encoder: FrozenEncoder,
    layer: int,
    pooling: str | None,
    cache: FeatureCache | None = None,
    normalize: bool | None = None,
    features: LayerFeatures | None = None,
):
    """`pooling` None: the model's own (encoder.default_pooling). `normalize` None: as the model itself
    does (sentence-transformers' Normalize module). `features`: the LayerFeatures this layer's wrapper shares
    with the wrappers of other layers (mteb_runner.run_mteb makes one per run; its pooling must be this
    pooling); None: one of its own, for this layer alone, through `cache`."""
    from mteb.models.abs_encoder import AbsEncoder

    pooling = pooling or encoder.default_pooling
    if features is None:
        features = LayerFeatures(encoder, [layer], pooling, cache)
    elif layer not in features.layers or features.pooling != pooling:
        raise ValueError(f"layer {layer} / {pooling} pooling: the shared features hold {features.layers} / {features.pooling}")
    wrapper = type("MtebEncoder", (MtebEncoderMethods, AbsEncoder), {"__doc__": MtebEncoderMethods.__doc__})
    return wrapper(encoder, layer, pooling, encoder.normalize if normalize is None else normalize, features)
