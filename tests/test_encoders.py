"""Loading frozen encoders: hub ids from the Hugging Face cache, the sentence-transformers layout,
refused pickles and broken weights, fp32 by default."""

import json
import shutil

import numpy as np
import pytest

from crossbert_eval.encoders import FrozenEncoder
from crossbert_eval.model_names import EncoderError
from crossbert_eval.model_sources import read_sentence_transformers_layout, resolve_model
from crossbert_eval.layer_spec import LayerSpec
from crossbert_model.checkpoint import CheckpointError
from crossbert_model.data.tokenizer import minilm_path

TEXTS = ["A man is playing a guitar.", "The cat sat on the mat, quite still.", "Stocks fell sharply on Monday."]


@pytest.fixture(scope="module")
def minilm():
    return FrozenEncoder.load("minilm", dtype="fp32")


def offline_cache(monkeypatch, root):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(root))


def linked_copy(src, dst, skip=()):
    """A copy of a model folder whose big files are symlinks (cheap), except the names in `skip`."""
    dst.mkdir(parents=True)
    for path in src.iterdir():
        if path.name in skip:
            continue
        if path.is_dir():
            shutil.copytree(path, dst / path.name)
        else:
            (dst / path.name).symlink_to(path)
    return dst


def features(encoder):
    return encoder.encode(TEXTS, layers=encoder.layer_indices(LayerSpec.ALL), poolings=["mean", "cls", "max"])


# ------------------------------------------------------------------------------------------------
# Hub ids
# ------------------------------------------------------------------------------------------------


def test_a_hub_id_loads_offline_from_the_hugging_face_cache(minilm, minilm_hub_cache, monkeypatch, no_network):
    minilm_hub_cache.use(monkeypatch)
    hub_id = minilm_hub_cache.repo_id
    hub = FrozenEncoder.load(hub_id, dtype="fp32")
    assert hub.name == hub_id and hub.source.hub_id == hub_id
    assert (
        hub.source.folder
        == minilm_hub_cache.root / f"models--{hub_id.replace('/', '--')}" / "snapshots" / minilm_hub_cache.revision
    )
    assert hub.fingerprint == minilm.fingerprint and hub.source.kind == "sentence-transformers"
    assert hub.default_pooling == "mean" and hub.pooling_source == "sentence-transformers:1_Pooling/config.json" and hub.normalize
    ours, theirs = features(minilm), features(hub)
    assert all(np.array_equal(ours[k], theirs[k]) for k in ours)


def test_a_hub_id_at_a_revision_resolves_that_snapshot(minilm_hub_cache, monkeypatch, no_network):
    minilm_hub_cache.use(monkeypatch)
    hub_id, rev = minilm_hub_cache.repo_id, minilm_hub_cache.revision
    source = resolve_model(f"{hub_id}@{rev}")
    assert source.folder.name == rev and source.hub_id == hub_id and source.name == f"{hub_id}@{rev}"
    with pytest.raises(EncoderError, match=f"model '{hub_id}@v9': not a local folder, and this hub id is not in the local"):
        resolve_model(f"{hub_id}@v9")


def test_an_unknown_hub_id_offline_says_where_it_looked_and_how_to_go_online(tmp_path, monkeypatch, no_network):
    offline_cache(monkeypatch, tmp_path / "empty-hub")
    spec = "google/bert_uncased_L-2_H-128_A-2"
    with pytest.raises(EncoderError) as caught:
        FrozenEncoder.load(spec)
    message = str(caught.value)
    assert "\n" not in message
    assert message == (
        f"model {spec!r}: not a local folder, and this hub id is not in the local Hugging Face cache {tmp_path / 'empty-hub'}; "
        "set CROSSBERT_ONLINE=1 to download it, or give a local model folder"
    )


def test_a_missing_path_that_is_no_hub_id_is_a_missing_folder(tmp_path):
    with pytest.raises(EncoderError, match=r"no such folder \(give a checkpoint or run folder"):
        resolve_model(str(tmp_path / "runs" / "nowhere" / "at-all"))


# ------------------------------------------------------------------------------------------------
# The sentence-transformers layout and the model's own pooling
# ------------------------------------------------------------------------------------------------


def test_the_pooling_config_sets_the_default_pooling(tmp_path):
    folder = linked_copy(minilm_path(), tmp_path / "cls-model")
    config = folder / "1_Pooling" / "config.json"
    settings = json.loads(config.read_text()) | {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}
    config.write_text(json.dumps(settings))
    encoder = FrozenEncoder.load(str(folder), dtype="fp32")
    assert encoder.default_pooling == "cls" and encoder.pooling_source == "sentence-transformers:1_Pooling/config.json"
    config.write_text(json.dumps({"embedding_dimension": 384, "pooling_mode": "max"}))  # sentence-transformers >= 5
    assert resolve_model(str(folder)).default_pooling == "max"


def test_a_plain_hugging_face_folder_pools_by_mean_by_default(tmp_path):
    folder = linked_copy(minilm_path(), tmp_path / "plain", skip={"modules.json", "1_Pooling"})
    source = resolve_model(str(folder))
    assert (source.kind, source.default_pooling, source.pooling_source, source.normalize) == ("hf", "mean", "default", False)


def test_a_transformer_in_a_subfolder_keeps_pooling_and_normalize(tmp_path):
    """The layout sentence-transformers writes itself (0_Transformer/): the Normalize module still counts."""
    root = tmp_path / "st"
    linked_copy(minilm_path(), root / "0_Transformer", skip={"modules.json", "1_Pooling"})
    shutil.copytree(minilm_path() / "1_Pooling", root / "1_Pooling")
    modules = json.loads((minilm_path() / "modules.json").read_text())
    modules[0]["path"] = "0_Transformer"
    (root / "modules.json").write_text(json.dumps(modules))
    layout = read_sentence_transformers_layout(root)
    assert layout.transformer_folder == root / "0_Transformer" and layout.normalize and layout.pooling == "mean"
    source = resolve_model(str(root))
    assert source.folder == root / "0_Transformer" and source.normalize and source.kind == "sentence-transformers"


@pytest.mark.parametrize(
    "config, shown",
    [
        ({"pooling_mode_weightedmean_tokens": True}, "weightedmean"),
        ({"pooling_mode": "lasttoken"}, "lasttoken"),
        ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}, "cls\\+mean"),
    ],
    ids=["weightedmean", "lasttoken", "concatenation"],
)
def test_an_unsupported_pooling_mode_is_no_default_but_explicit_poolings_work(tmp_path, config, shown):
    folder = linked_copy(minilm_path(), tmp_path / "odd", skip={"1_Pooling"})
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))
    encoder = FrozenEncoder.load(str(folder), dtype="fp32")
    expected = f"1_Pooling/config.json: the model pools by {shown}, which is not supported; give an explicit pooling \\(mean, cls"
    with pytest.raises(EncoderError, match=expected):
        encoder.default_pooling
    assert encoder.encode(TEXTS[:1], layers=[6], poolings=["cls"])[(6, "cls")].shape == (1, 384)


# ------------------------------------------------------------------------------------------------
# Weights: safetensors only, unless pickles are allowed; broken files named
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A tiny BERT saved twice: safetensors, and pickle only (pytorch_model.bin)."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    model = BertModel(config)
    folders = {}
    for kind in ("safe", "pickle"):
        folder = tmp_path_factory.mktemp(kind)
        if kind == "safe":
            model.save_pretrained(folder)
        else:  # transformers 5 only writes safetensors: the pickle is written the way old checkpoints were
            model.config.save_pretrained(folder)
            torch.save(model.state_dict(), folder / "pytorch_model.bin")
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
            shutil.copy(minilm_path() / name, folder / name)
        folders[kind] = folder
    assert not list(folders["pickle"].glob("*.safetensors"))
    return folders


def test_pickle_weights_are_refused_unless_allowed(tiny_bert):
    folder = tiny_bert["pickle"]
    with pytest.raises(EncoderError) as caught:
        FrozenEncoder.load(str(folder))
    assert str(caught.value) == (
        f"{folder / 'pytorch_model.bin'}: pickle weights are refused (they can run code when loaded); "
        "convert them to safetensors, or allow pickles (allow_pickle) if you trust the file"
    )
    trusted = FrozenEncoder.load(str(folder), allow_pickle=True, dtype="fp32")
    safe = FrozenEncoder.load(str(tiny_bert["safe"]), dtype="fp32")
    a, b = features(trusted), features(safe)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_a_truncated_safetensors_file_is_named(tmp_path):
    folder = linked_copy(minilm_path(), tmp_path / "truncated", skip={"model.safetensors"})
    with open(minilm_path() / "model.safetensors", "rb") as f:
        (folder / "model.safetensors").write_bytes(f.read(1_000_000))
    with pytest.raises(
        CheckpointError, match=r"truncated/model.safetensors: not a readable safetensors file \(truncated or corrupt\?\)"
    ):
        FrozenEncoder.load(str(folder))


def test_a_folder_without_weights_says_so(tmp_path):
    folder = linked_copy(minilm_path(), tmp_path / "empty", skip={"model.safetensors"})
    with pytest.raises(EncoderError, match=r"empty: no weights \(expected model.safetensors\)"):
        FrozenEncoder.load(str(folder))


# ------------------------------------------------------------------------------------------------
# Precision
# ------------------------------------------------------------------------------------------------


def test_frozen_features_are_fp32_unless_bf16_is_asked_for(minilm):
    assert minilm.amp is None and minilm.identity["features_dtype"] == "float32"
    default = FrozenEncoder.load("minilm")  # no dtype given: fp32, never a measured 'auto'
    assert default.amp is None
    with pytest.raises(EncoderError, match="dtype 'fp16': expected one of auto, fp32, bf16 \\(fp32 is the default"):
        FrozenEncoder.load("minilm", dtype="fp16")


def test_the_default_max_length_fits_the_models_positions_and_an_asked_one_must(nano_checkpoint):
    folder = str(nano_checkpoint(0, max_position_embeddings=64))  # as our trainer saves a run at seq_len 64
    assert FrozenEncoder.load(folder).max_length == 64  # the default 128, cut to the positions it was trained on
    assert FrozenEncoder.load(folder, max_length=32).max_length == 32
    with pytest.raises(EncoderError, match=r"^max_length 65: .* has positions for at most 64 tokens"):
        FrozenEncoder.load(folder, max_length=65)
