"""CrossBERT and flat-MLM encoders, their masking, data pipeline and trainer.

Importing a model class (`from crossbert_model import CrossBertModel`, or anything that builds or loads
one) registers the `crossbert` model type with transformers, so that
`AutoConfig/AutoModel.from_pretrained(checkpoint_dir)` work offline without `trust_remote_code`.

The package itself imports lazily (PEP 562): `import crossbert_model.errors` or `.defaults` costs no
torch or transformers import, which keeps `crossbert --help` fast (tests/test_cli_speed.py). The names
below load their module on first use; `import crossbert_model.model` registers the model type directly.
"""

from __future__ import annotations

import importlib

# public name -> the submodule that defines it
_LAZY = {
    "PRESETS": "presets",
    "CrossBertConfig": "config",
    "CrossBertForPreTraining": "model",
    "CrossBertModel": "model",
    "FlatMlmForPreTraining": "model",
    "config_from_preset": "objectives",
    "objective": "objectives",
    "objective_names": "objectives",
    "parameter_counts": "objectives",
    "pretraining_model_for": "objectives",
    "training_flops_by_part": "objectives",
    "training_flops_per_token": "objectives",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'crossbert_model' has no attribute {name!r}")
    importlib.import_module(".model", __name__)  # every public name may build a model: register the type first
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
