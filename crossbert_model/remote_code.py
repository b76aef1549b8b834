"""Code that a model or tokenizer folder carries never runs unless the user asks for it.

For a model type transformers does not know, a folder's config.json or tokenizer_config.json may name
classes of its own Python files (`auto_map`); without an explicit `trust_remote_code` transformers asks
on stdin, so a piped "y" runs them. Every loader of this package goes through `from_pretrained` below,
which always passes the flag: False unless the user passed --trust-remote-code (a training run:
data.trust_remote_code=true). Our own checkpoints carry an auto_map for users without this package;
here they load with the registered classes (crossbert_model/__init__.py) and never with their copied
code, whatever the flag. (Datasets cannot run code: `datasets` >= 3 refuses loading scripts.)
"""

from __future__ import annotations

from pathlib import Path

from .readers import ReadError, read_json
from .config import CrossBertConfig
from .errors import SETTING, CrossbertError


class RemoteCodeError(CrossbertError):
    """A folder needs its own code to load, and the user did not allow it (not a ValueError: loaders that wrap
    transformers' ValueErrors let it through as it is)."""


def is_own_checkpoint(folder: str | Path) -> bool:
    """A folder of our model type: the registered classes load it."""
    try:
        return read_json(Path(folder) / "config.json", "a model config").get("model_type") == CrossBertConfig.model_type
    except (ReadError, OSError):
        return False


def code_allowed(folder: str | Path, trust_remote_code: bool) -> bool:
    """Whether loading `folder` may run code it carries: the user asked, and it is not one of our checkpoints."""
    return bool(trust_remote_code) and not is_own_checkpoint(folder)


def from_pretrained(loader, folder: str | Path, *, trust_remote_code: bool, setting: str = "trust_remote_code", **kwargs):
    """`loader.from_pretrained(folder)` (an Auto class or a concrete one), local files only, with an
    explicit trust_remote_code. A folder that needs its own code, not trusted: one line saying so."""
    try:
        return loader.from_pretrained(
            str(folder), local_files_only=True, trust_remote_code=code_allowed(folder, trust_remote_code), **kwargs
        )
    except ValueError as e:
        if "trust_remote_code" not in str(e):
            raise
        raise RemoteCodeError(
            f"{folder}: loading it needs the Python code the folder carries (auto_map in its config.json or "
            f"tokenizer_config.json, for a model type transformers does not know); that code is not run unless you "
            f"set {SETTING}, for a folder you trust",
            setting=setting,
        ) from None
