"""CrossBERT and flat-MLM encoders, their masking, data pipeline and trainer.

Importing this package registers the `crossbert` model type with transformers, so that
`AutoConfig/AutoModel.from_pretrained(checkpoint_dir)` work offline without `trust_remote_code`.
"""

from transformers import AutoConfig, AutoModel

from .config import PRESETS, CrossBertConfig
from .model import CrossBertForPreTraining, CrossBertModel, FlatMlmForPreTraining
from .objectives import (
    config_from_preset,
    objective,
    objective_names,
    parameter_counts,
    pretraining_model_for,
    training_flops_by_part,
    training_flops_per_token,
)

AutoConfig.register(CrossBertConfig.model_type, CrossBertConfig, exist_ok=True)
AutoModel.register(CrossBertConfig, CrossBertModel, exist_ok=True)

__all__ = [
    "PRESETS",
    "CrossBertConfig",
    "CrossBertForPreTraining",
    "CrossBertModel",
    "FlatMlmForPreTraining",
    "config_from_preset",
    "objective",
    "objective_names",
    "parameter_counts",
    "pretraining_model_for",
    "training_flops_by_part",
    "training_flops_per_token",
]
