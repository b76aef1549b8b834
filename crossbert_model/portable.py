"""What lets a checkpoint folder load where this package is not installed.

Every checkpoint carries, beside its weights and tokenizer:

* the package's own model code, `config.py`, `model.py` and `masking.py`, copied byte for byte (they import
  only the standard library, numpy, torch, transformers and each other), and an `auto_map` in config.json
  naming them: `AutoModel.from_pretrained(folder, trust_remote_code=True)` then builds the encoder
  (`CrossBertModel`) from that code, with no copy to keep in step by hand;
* sentence-transformers' files: `modules.json` (a Transformer module on the folder itself, then a Pooling
  module), `sentence_bert_config.json` (truncation length) and `1_Pooling/config.json` (mean over real tokens,
  the probes' default pooling), so that `SentenceTransformer(folder, trust_remote_code=True)` gives the
  mean-pooled last layer, which is what `crossbert probe` computes at that layer.

Inside this package the copied code never runs: our checkpoints load with the registered classes whatever
`trust_remote_code` says (crossbert_model.remote_code).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .readers import read_json
from .config import CrossBertConfig
from .defaults import MAX_LENGTH
from .utils import atomic_write_json

PACKAGE_DIR = Path(__file__).resolve().parent
# The model code a checkpoint carries: model.py imports the other two (relative imports, which transformers
# resolves inside the folder).
CODE_FILES = ("config.py", "masking.py", "model.py")
AUTO_MAP = {"AutoConfig": "config.CrossBertConfig", "AutoModel": "model.CrossBertModel"}
# sentence-transformers' module types as every release since v2 reads them (v6 maps them to its new paths).
ST_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
]
ST_POOLING = "mean"  # = crossbert_eval's default pooling of our checkpoints (crossbert_model.defaults.POOLINGS[0])
ST_FILES = ("modules.json", "sentence_bert_config.json", "1_Pooling")


def package_code_file(name: str) -> Path:
    """The package's own source file that a checkpoint carries under the same name."""
    return PACKAGE_DIR / name


def sentence_length(config: CrossBertConfig) -> int:
    """Tokens per text sentence-transformers keeps: the probes' default (MAX_LENGTH), or the positions the
    model was trained with where fewer (as crossbert_eval.model_sources.fitted_max_length decides for the probes)."""
    return min(MAX_LENGTH, config.max_position_embeddings)


def pooling_config(hidden_size: int) -> dict:
    """1_Pooling/config.json in the keys every sentence-transformers release reads: mean over real tokens."""
    modes = {
        "cls_token": False,
        "mean_tokens": True,
        "max_tokens": False,
        "mean_sqrt_len_tokens": False,
        "weightedmean_tokens": False,
        "lasttoken": False,
    }
    return {"word_embedding_dimension": hidden_size, **{f"pooling_mode_{k}": v for k, v in modes.items()}, "include_prompt": True}


def write_portable_files(folder: str | Path, config: CrossBertConfig) -> None:
    """Add the model code, the auto_map and sentence-transformers' files to a checkpoint folder that
    save_pretrained has written (config.json already there)."""
    folder = Path(folder)
    for name in CODE_FILES:
        shutil.copyfile(package_code_file(name), folder / name)
    config_file = folder / "config.json"
    saved = read_json(config_file, "the config.json save_pretrained wrote")
    if saved.get("auto_map") != AUTO_MAP:  # rewritten only when needed: config.json is part of the weights' fingerprint
        atomic_write_json(config_file, {**saved, "auto_map": AUTO_MAP})
    atomic_write_json(folder / "modules.json", ST_MODULES)
    atomic_write_json(folder / "sentence_bert_config.json", {"max_seq_length": sentence_length(config), "do_lower_case": False})
    atomic_write_json(folder / "1_Pooling" / "config.json", pooling_config(config.hidden_size))
