"""Model and tokenizer folders whose `auto_map` points at Python that leaves a file behind when it runs:
what a folder's own code would do, made visible. Shared by the remote-code tests and the CLI error table."""

import json
import shutil
from pathlib import Path

from crossbert_model.data.tokenizer import minilm_path

# Loadable classes (MiniLM's weights fit them), and a file written the moment the module is imported.
OWN_CODE = """import pathlib
pathlib.Path({marker!r}).write_text("the folder's own code ran")
from transformers import BertConfig, BertModel, BertTokenizerFast


class OwnConfig(BertConfig):
    model_type = "ownbert"


class OwnModel(BertModel):
    config_class = OwnConfig


class OwnTokenizer(BertTokenizerFast):
    pass
"""


def folder_with_own_code(root: Path, marker: Path) -> Path:
    """MiniLM, but of a model type transformers does not know, loadable only through the folder's own.py
    (config.json and tokenizer_config.json both name its classes in an auto_map)."""
    folder, source = root / "own-code-model", minilm_path()
    folder.mkdir(parents=True)
    for name in ("tokenizer.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(source / name, folder / name)
    (folder / "model.safetensors").symlink_to(source / "model.safetensors")
    (folder / "own.py").write_text(OWN_CODE.format(marker=str(marker)))
    config = json.loads((source / "config.json").read_text())
    config.update(model_type="ownbert", auto_map={"AutoConfig": "own.OwnConfig", "AutoModel": "own.OwnModel"})
    (folder / "config.json").write_text(json.dumps(config))
    tokenizer = json.loads((source / "tokenizer_config.json").read_text())
    tokenizer.pop("tokenizer_class")
    tokenizer["auto_map"] = {"AutoTokenizer": [None, "own.OwnTokenizer"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return folder


def add_own_code(folder: Path, marker: Path) -> Path:
    """One of our checkpoints given an auto_map (as ours will carry for users without this package) whose
    code leaves `marker` behind."""
    (folder / "own.py").write_text(OWN_CODE.format(marker=str(marker)))
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "own.OwnConfig", "AutoModel": "own.OwnModel"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder
