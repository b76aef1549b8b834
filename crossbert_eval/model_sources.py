"""Where a frozen encoder comes from: a model argument (one of our run or checkpoint folders, a Hugging Face model
folder, a sentence-transformers folder, 'minilm', or a hub id) resolved to a folder and what kind of model it is, and
the checks its files pass before anything loads (weights as safetensors unless pickles are allowed, a config that
describes its weights, a length that fits its positions).

    source = resolve_model("runs/tiny_mlm")      # ModelSource: folder, kind, name, step, pooling, positions
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch

import crossbert_model.model  # noqa: F401  (registers the crossbert model type with AutoModel)
from crossbert_model.checkpoint import CheckpointError, latest_checkpoint
from crossbert_model.run_layout import CheckpointDir, RunDir
from crossbert_model.readers import check_safetensors, read_json, safetensors_shapes
from crossbert_model.data.tokenizer import minilm_path
from crossbert_model.defaults import MAX_LENGTH, POOLINGS
from crossbert_model.remote_code import code_allowed, from_pretrained
from crossbert_model.args import did_you_mean
from crossbert_model.errors import SETTING, one_line

from .model_names import MODEL_ALIASES, EncoderError, HubModelError, hub_id, hub_snapshot

log = logging.getLogger(__name__)

# tokenizer.model_max_length of a tokenizer that declares none (transformers' VERY_LARGE_INTEGER)
UNDECLARED_LENGTH = 10**12
NOT_ENCODER_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration", "ForSeq2SeqLM")


def _weight_files(folder: Path) -> tuple[list[Path], list[Path]]:
    """(safetensors files, pickle files) of model weights; sharded checkpoints have several of each.
    Only the names from_pretrained loads: a checkpoint's optimizer.pt is training state, not weights."""
    return sorted(folder.glob("*.safetensors")), sorted(folder.glob("pytorch_model*.bin"))


def weights_fingerprint(folder: Path) -> str:
    """sha256 of config + weights: two checkpoints share cached features only if they are the same model."""
    h = hashlib.sha256()
    safe, pickles = _weight_files(folder)
    for path in [folder / "config.json", *safe, *pickles]:
        if path.is_file():
            with open(path, "rb") as f:
                while block := f.read(1 << 22):
                    h.update(block)
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class StLayout:
    """What a sentence-transformers folder says about its model: where the Hugging Face encoder lives,
    how the model pools tokens, and whether it L2-normalises the sentence embedding."""

    transformer_folder: Path
    pooling: str | None  # one of POOLINGS; None when there is no Pooling module or its mode is unsupported
    normalize: bool
    pooling_config_path: Path | None
    unsupported_pooling: str | None = None  # e.g. 'weightedmean': the model's mode, which no pooling here equals
    other_modules: tuple[str, ...] = ()  # e.g. Dense: modules whose output the frozen features leave out
    max_seq_length: int | None = None  # sentence_bert_config.json: where sentence-transformers truncates (MTEB's protocol)


# sentence-transformers' Pooling modes (legacy `pooling_mode_*` booleans and the newer `pooling_mode`
# key). cls, mean and max are ours; the others (mean_sqrt_len_tokens, weightedmean, lasttoken, or a
# concatenation of several) have no equivalent here: such a model still loads, but it has no default
# pooling (asking for it is an error) rather than a silently different one.
_ST_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


def _module_class(entry: dict) -> str:
    """'sentence_transformers.models.Pooling' (or the v5+ module paths) -> 'Pooling'."""
    return str(entry.get("type", "")).rsplit(".", 1)[-1]


def _read_json(path: Path, expect: type = dict):
    return read_json(path, "a model folder's JSON file", EncoderError, expect)


def _st_pooling_mode(config_path: Path) -> str:
    """The pooling a sentence-transformers Pooling config asks for ('cls+mean' for a concatenation)."""
    config = _read_json(config_path)
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        modes = [mode] if isinstance(mode, str) else list(mode)
    else:
        modes = [name for key, name in _ST_LEGACY_POOLING_KEYS.items() if config.get(key)]
        modes = modes or ["mean"]  # what sentence-transformers itself does when no mode is set
    return "+".join(map(str, modes))


def read_sentence_transformers_layout(folder: Path) -> StLayout | None:
    """The one reader of a sentence-transformers folder (modules.json); None when `folder` is not one."""
    folder = Path(folder)
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None
    entries = _read_json(modules_file, expect=list)
    by_class: dict[str, dict] = {}
    for entry in entries:
        by_class.setdefault(_module_class(entry), entry)
    transformer = by_class.get("Transformer")
    if transformer is None:
        raise EncoderError(f"{modules_file}: no sentence_transformers Transformer module; not a text encoder")
    mode, pooling_config = None, None
    if "Pooling" in by_class:
        pooling_config = folder / by_class["Pooling"].get("path", "") / "config.json"
        if not pooling_config.is_file():
            raise EncoderError(f"{pooling_config}: missing (modules.json lists a Pooling module there)")
        mode = _st_pooling_mode(pooling_config)
    supported = mode if mode in POOLINGS else None
    unsupported = mode if mode is not None and supported is None else None
    others = tuple(name for name in by_class if name not in ("Transformer", "Pooling", "Normalize"))
    transformer_folder = folder / transformer.get("path", "")
    return StLayout(
        transformer_folder,
        supported,
        "Normalize" in by_class,
        pooling_config,
        unsupported,
        others,
        _st_max_seq_length(transformer_folder),
    )


def _st_max_seq_length(transformer_folder: Path) -> int | None:
    """sentence-transformers' truncation length (sentence_bert_config.json beside the Transformer module)."""
    config_path = transformer_folder / "sentence_bert_config.json"
    if not config_path.is_file():
        return None
    value = _read_json(config_path).get("max_seq_length")
    if value is not None and not (isinstance(value, int) and value > 0):
        raise EncoderError(f"{config_path}: max_seq_length must be a positive integer, got {value!r}")
    return value


@dataclass
class ModelSource:
    folder: Path
    kind: str  # "crossbert" | "hf" | "sentence-transformers"
    name: str
    step: int | None = None
    objective: str | None = None
    default_pooling: str | None = "mean"  # the model's own pooling (sentence-transformers Pooling), else mean
    pooling_source: str = "default"  # where default_pooling comes from
    pooling_problem: str | None = None  # why there is no default pooling (an unsupported sentence-transformers mode)
    normalize: bool = False  # the model L2-normalises its sentence embeddings (sentence-transformers Normalize)
    max_seq_length: int | None = None  # the model's own truncation length (sentence-transformers), if it declares one
    hub_id: str | None = None  # "org/name" when resolved from the Hugging Face hub cache
    positions: int | None = None  # max_position_embeddings of its config (ours: the sequence length it was trained at)


def resolve_model(spec: str, allow_pickle: bool = False, trust_remote_code: bool = False) -> ModelSource:
    """A model argument -> the folder holding config.json + weights, and what kind of model it is.
    `allow_pickle` and `trust_remote_code` only widen what is downloaded for a hub id (pytorch_model.bin,
    the repository's *.py)."""
    if spec == "minilm":
        return _classify(minilm_path(), "sentence-transformers/all-MiniLM-L6-v2")
    path = Path(spec)
    if not path.exists():
        if hub_id(spec) is None:
            raise EncoderError(
                f"model {spec!r}: no such folder (give a checkpoint or run folder, a model folder, "
                f"a hub id org/name[@revision] or name[@revision], or 'minilm'){did_you_mean(spec, MODEL_ALIASES)}"
            )
        try:
            snapshot = hub_snapshot(spec, allow_pickle, trust_remote_code)
        except HubModelError as e:
            raise EncoderError(str(e)) from None
        source = _classify(snapshot, spec)
        source.hub_id = hub_id(spec)[0]
        return source
    if RunDir(path).checkpoints.is_dir() and not (path / "config.json").exists():
        latest = latest_checkpoint(path)
        if latest is None:
            raise EncoderError(f"run folder {path} holds no complete checkpoint yet")
        log.info("model %s: using its latest checkpoint %s", path, latest[1].name)
        return _classify(latest[1], f"{path.name}")
    # a checkpoint folder of one of our runs is named by its run: runs/<run>/checkpoints/step_N -> <run>
    run = CheckpointDir(path.resolve()).run
    return _classify(path, run.name if run else path.name)


def _classify(folder: Path, name: str) -> ModelSource:
    st_root, layout = folder, read_sentence_transformers_layout(folder)
    kind = None
    if layout is not None:  # sentence-transformers: the Transformer module's folder holds the HF model
        folder, kind = layout.transformer_folder, "sentence-transformers"
        if layout.other_modules:
            log.warning(
                "%s: modules %s come after pooling in this sentence-transformers model; the frozen features "
                "are the pooled transformer output without them",
                name,
                ", ".join(layout.other_modules),
            )
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise EncoderError(f"{folder}: not a model folder (no config.json)")
    config = _read_json(config_file)
    architectures = config.get("architectures") or []
    if (
        config.get("is_decoder")
        or config.get("is_encoder_decoder")
        or any(a.endswith(NOT_ENCODER_SUFFIXES) for a in architectures)
    ):
        raise EncoderError(
            f"{config_file}: not an encoder (model_type {config.get('model_type')!r}, architectures {architectures}); "
            "the probes need a bidirectional text encoder (ours, BERT-like, or sentence-transformers)"
        )
    step, objective = None, None
    if config.get("model_type") == "crossbert":
        kind = "crossbert"
        objective = config.get("objective")
        state = CheckpointDir(folder).trainer_state
        if state.is_file():
            step = _read_json(state).get("step")
            name = f"{name}@{step}" if f"@{step}" not in name else name
    source = ModelSource(folder, kind or "hf", name, step, objective)
    positions = config.get("max_position_embeddings")
    source.positions = positions if isinstance(positions, int) and not isinstance(positions, bool) and positions > 0 else None
    if layout is not None:
        source.normalize = layout.normalize
        source.max_seq_length = layout.max_seq_length
        if layout.pooling_config_path is not None:
            source.default_pooling = layout.pooling
            source.pooling_source = f"sentence-transformers:{layout.pooling_config_path.relative_to(st_root).as_posix()}"
        if layout.unsupported_pooling:
            source.pooling_problem = (
                f"{layout.pooling_config_path}: the model pools by {layout.unsupported_pooling}, which is not supported; "
                f"give an explicit pooling ({', '.join(POOLINGS)}) to probe its transformer anyway"
            )
    return source


def model_positions(source: ModelSource, tokenizer) -> int | None:
    """The longest input the model has positions for: its config's max_position_embeddings, or fewer where
    its tokenizer declares fewer (RoBERTa-like models keep two positions for padding)."""
    declared = getattr(tokenizer, "model_max_length", None)
    limits = [n for n in (source.positions, declared) if isinstance(n, int) and 0 < n < UNDECLARED_LENGTH]
    return min(limits) if limits else None


def fitted_max_length(source: ModelSource, tokenizer, asked: int | None, own: bool) -> int:
    """Tokens per text. Asked for: taken as is, and it must fit the model's positions. Not asked for: the
    default (with `own`, the model's own sentence-transformers max_seq_length, as MTEB runs it), or the
    model's positions where it has fewer (our checkpoints: the sequence length they were trained at)."""
    limit = model_positions(source, tokenizer)
    if asked is not None:
        if limit is not None and asked > limit:
            raise EncoderError(
                f"{SETTING} {asked}: {source.name} has positions for at most {limit} tokens "
                f"(max_position_embeddings / the tokenizer's model_max_length); give at most {limit}",
                setting="max_length",
            )
        return asked
    # neither the caller nor the model (sentence-transformers' max_seq_length) says: the probes' default
    default = (source.max_seq_length if own else None) or MAX_LENGTH
    if limit is not None and default > limit:
        log.info("%s: %d tokens per text, its positions (the default is %d)", source.name, limit, default)
        return limit
    return default


def check_weights(folder: Path, allow_pickle: bool) -> None:
    """Safetensors weights, or pickles only when the user trusts them (unpickling can run any code)."""
    safe, pickles = _weight_files(folder)
    if safe:
        for path in safe:
            check_safetensors(path, CheckpointError)  # a truncated file fails here with its name, not inside from_pretrained
        return
    if not pickles:
        raise EncoderError(f"{folder}: no weights (expected model.safetensors)")
    if not allow_pickle:
        raise EncoderError(
            f"{pickles[0]}: pickle weights are refused (they can run code when loaded); "
            f"convert them to safetensors, or allow pickles ({SETTING}) if you trust the file",
            setting="allow_pickle",
        )


def folder_read_errors() -> tuple[type[BaseException], ...]:
    """What transformers and huggingface_hub raise on a damaged or edited config.json / tokenizer file: the folder's
    fault, said in one line (huggingface_hub's strict-dataclass validation errors are no ValueError)."""
    from huggingface_hub.errors import StrictDataclassError

    return (OSError, ValueError, TypeError, KeyError, StrictDataclassError)


# Layer indices in weight names (BERT's encoder.layer.N., our encoder.layers.N., GPT's h.N., ...).
LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers?|h|blocks?)\.(\d+)\.")


def weight_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in the folder's safetensors files, read from their headers (no tensor is loaded)."""
    shapes = {}
    for path in _weight_files(folder)[0]:
        shapes.update(safetensors_shapes(path, CheckpointError))
    return shapes


def check_config_matches_weights(folder: Path, trust_remote_code: bool) -> None:
    """config.json against the weights' headers, before anything is allocated: the model config.json describes is built
    on the meta device (no memory) and each of its tensors must have the shape the weights hold. A config that
    describes no model, or another model than its weights (a damaged or edited config.json), is one line, not a
    multi-gigabyte allocation or a failure deep inside transformers. Pickle weights: transformers checks after loading."""
    from transformers import AutoConfig, AutoModel

    shapes = weight_shapes(folder)
    if not shapes:
        return
    where = folder / "config.json"
    try:
        config = from_pretrained(AutoConfig, folder, trust_remote_code=trust_remote_code)
    except folder_read_errors() as e:
        raise EncoderError(f"{where}: not a usable model config ({one_line(str(e))[:200]})") from None
    layers_in_weights = len({m.group(1) for name in shapes for m in [LAYER_INDEX.search(name)] if m})
    declared = getattr(config, "num_hidden_layers", None)
    if layers_in_weights and (not isinstance(declared, int) or isinstance(declared, bool) or declared != layers_in_weights):
        raise EncoderError(f"{where}: num_hidden_layers is {declared!r}, but the weights hold {layers_in_weights} layers")
    try:
        with torch.device("meta"):
            model = AutoModel.from_config(config, trust_remote_code=code_allowed(folder, trust_remote_code))
    except Exception as e:  # whatever an impossible config makes a model class raise: the file is at fault, not this tool
        raise EncoderError(
            f"{where}: describes no model AutoModel can build ({type(e).__name__}: {one_line(str(e))[:200]})"
        ) from None
    for name, tensor in model.state_dict().items():
        found = shapes.get(name) or next((s for n, s in shapes.items() if n.endswith("." + name)), None)
        if found is not None and tuple(tensor.shape) != found:
            raise EncoderError(
                f"{where}: describes another model than its weights: {name} is {found} in the weights, "
                f"{tuple(tensor.shape)} by config.json"
            )
