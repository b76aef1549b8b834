"""Named size presets: an encoder shape by name. Only the standard library, so that a command checks a preset's name
before torch or transformers load (crossbert_eval.cli.check_names_early); crossbert_model.config builds configs from them."""

from __future__ import annotations

from dataclasses import dataclass

# Named size presets. Shapes follow the BERT family (Turc et al. 2019 "Well-Read Students" for the
# small ones, Devlin et al. 2019 for base/large): hidden = 64 * heads, intermediate = 4 * hidden.


@dataclass(frozen=True)
class SizePreset:
    """An encoder shape; the predictor follows from it (`default_predictor_shape`)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    device_hint: str

    def as_config_kwargs(self) -> dict:
        return {
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
        }


PRESETS: dict[str, SizePreset] = {
    "nano": SizePreset(64, 2, 1, "cpu, seconds"),
    "tiny": SizePreset(128, 2, 2, "cpu, minutes"),
    "tiny4": SizePreset(128, 4, 2, "cpu, minutes"),  # BERT miniature L-4 H-128: tiny twice as deep
    "mini": SizePreset(256, 4, 4, "cpu, tens of minutes"),
    "small": SizePreset(512, 4, 8, "cpu, hours / gpu, minutes"),
    "medium": SizePreset(512, 8, 8, "gpu"),
    "base": SizePreset(768, 12, 12, "gpu (BERT-base shape)"),
    "large": SizePreset(1024, 24, 16, "gpu, FSDP (BERT-large shape)"),
}
