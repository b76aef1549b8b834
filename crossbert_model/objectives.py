"""The pre-training objectives: one `Objective` per objective, and everything that differs between them.

An objective is its model class, its batch builder (how training masks are drawn), how many tokens a
row predicts, how the shared protocol puts a selection to it (crossbert_model.shared_loss), its default
mask ratio and checks, and its share of the parameter and FLOP accounting. Every other module asks this
registry instead of comparing objective names:

    objective("crossbert").model_class            # CrossBertForPreTraining
    objective_names()                             # ("mlm", "crossbert")
    objective_of(config).num_views(config)        # K of CMS, 1 for a flat MLM

A new objective is one more `Objective` in OBJECTIVES below (with its model class in crossbert_model.model
and its masks in crossbert_model.masking).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .presets import PRESETS
from .config import (
    CrossBertConfig,
    cms_num_views,
    encoder_block_params,
    encoder_forward_flops,
    mlp_params,
    norm_params,
    predictor_block_params,
)
from .masking import RowRandom, crossbert_batch, crossbert_targets_per_row, mlm_batch, mlm_targets_per_row
from .model import CrossBertForPreTraining, CrossBertPreTrainedModel, FlatMlmForPreTraining


@dataclass(frozen=True)
class Objective:
    """Everything the library asks of one objective: values, and functions of a CrossBertConfig."""

    name: str
    # its name for people: model cards and pages say "A <title> text encoder"
    title: str
    model_class: type[CrossBertPreTrainedModel]
    # DESIGN.md: 15% for BERT, 50% for CrossBERT.
    default_mask_ratio: float
    # (input_ids, attention_mask, config, rng) -> the model inputs of one pre-training batch (masking.py)
    build_batch: Callable[[torch.Tensor, torch.Tensor, CrossBertConfig, RowRandom], dict]
    # (real-token count per row, config) -> predicted tokens per row: the loss normaliser, known without the draw
    targets_per_row: Callable[[torch.Tensor, CrossBertConfig], torch.Tensor]
    # (config, input_ids, attention_mask, selected) -> the inputs that ask for exactly the selected tokens
    # (the shared protocol, crossbert_model.shared_loss: `selected` holds real tokens only)
    protocol_batch: Callable[[CrossBertConfig, torch.Tensor, torch.Tensor, torch.Tensor], dict]
    # config -> how many times the encoder runs per sequence (CMS views)
    num_views: Callable[[CrossBertConfig], int]
    # config -> parameters beside the encoder: {"predictor": ..., "head": ...}
    head_parameters: Callable[[CrossBertConfig], dict[str, int]]
    # (config, seq_len) -> training FLOPs per corpus token: {"encoder", "predictor", "head"}
    training_flops_by_part: Callable[[CrossBertConfig, int], dict[str, float]]
    # config -> None, or ValueError naming the field the objective cannot train with
    check_config: Callable[[CrossBertConfig], None] = lambda config: None


# -- flat MLM (BERT) ---------------------------------------------------------------------------------


def _mlm_protocol_batch(config, input_ids, attention_mask, selected) -> dict:
    """Every selected token -> [MASK], nothing else changed; labels at the selected ones."""
    masked_ids = input_ids.masked_fill(selected, config.mask_token_id)
    labels = input_ids.masked_fill(~selected, -100)
    return {"input_ids": masked_ids, "attention_mask": attention_mask, "labels": labels}


def _mlm_head_parameters(c: CrossBertConfig) -> dict[str, int]:
    d = c.hidden_size
    return {"predictor": 0, "head": d * d + d + norm_params(d, c.norm_type) + c.vocab_size}  # dense + norm + decoder bias (tied)


def _mlm_flops_by_part(c: CrossBertConfig, seq_len: int) -> dict[str, float]:
    """Encoder on every token, head transform + vocabulary logits on the `mask_ratio` selected tokens."""
    d, v, r = c.hidden_size, c.vocab_size, c.mask_ratio
    return {"encoder": 3.0 * encoder_forward_flops(c, 1.0, seq_len), "predictor": 0.0, "head": 3.0 * r * (2 * d * d + 2 * d * v)}


# -- CrossBERT ---------------------------------------------------------------------------------------


def _crossbert_protocol_batch(config, input_ids, attention_mask, selected) -> dict:
    """One view (B, 1, T) in which the visible tokens are the real, unselected ones."""
    visible = (attention_mask.bool() & ~selected).unsqueeze(1)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "visible": visible}


def _crossbert_num_views(c: CrossBertConfig) -> int:
    """K of the Complementary Masking Strategy: views per sequence (1 when CMS is off)."""
    return cms_num_views(c.mask_ratio) if c.complementary_masking else 1


def _crossbert_check(c: CrossBertConfig) -> None:
    if c.complementary_masking:
        cms_num_views(c.mask_ratio)  # refuses a ratio CMS cannot realise exactly


def _crossbert_head_parameters(c: CrossBertConfig) -> dict[str, int]:
    """The predictor: its blocks, query vector, norm and projection back to the encoder width; the head:
    the decoder bias (the vocabulary projection is the tied embedding)."""
    d, p = c.hidden_size, c.predictor_hidden_size
    predictor = p + c.predictor_layers * predictor_block_params(c) + norm_params(p, c.norm_type) + (p * d if p != d else 0)
    if c.predictor_positions == "encoder":  # its learned query positions
        predictor += c.max_position_embeddings * p
    return {"predictor": predictor, "head": c.vocab_size}


def _crossbert_flops_by_part(c: CrossBertConfig, seq_len: int) -> dict[str, float]:
    """Per view, the encoder runs on the visible tokens (attention context = visible count), the
    predictor on the masked queries (plus its key/value projections of the visible tokens), and the
    vocabulary logits on the queries; CMS runs K views per sequence."""
    d, v, r = c.hidden_size, c.vocab_size, c.mask_ratio
    k = _crossbert_num_views(c)
    visible_frac = 1.0 / k if k > 1 else 1.0 - r
    masked_frac = 1.0 - visible_frac
    context = visible_frac * seq_len
    p = c.predictor_hidden_size
    enc = k * encoder_forward_flops(c, visible_frac, context)
    kv = k * visible_frac * c.predictor_layers * 2 * (2 * d * p)
    per_query = c.predictor_layers * (
        2 * (2 * p * p + mlp_params(p, c.predictor_intermediate_size, c.mlp_type)) + 2 * 2 * context * p
    )
    per_query += 2 * (p * d if p != d else 0)
    queries = k * masked_frac
    return {"encoder": 3.0 * enc, "predictor": 3.0 * (queries * per_query + kv), "head": 3.0 * queries * 2 * d * v}


# -- the registry ------------------------------------------------------------------------------------

OBJECTIVES: dict[str, Objective] = {
    o.name: o
    for o in (
        Objective(
            name="mlm",
            title="flat masked-language-model (MLM)",
            model_class=FlatMlmForPreTraining,
            default_mask_ratio=0.15,
            build_batch=mlm_batch,
            targets_per_row=mlm_targets_per_row,
            protocol_batch=_mlm_protocol_batch,
            num_views=lambda config: 1,
            head_parameters=_mlm_head_parameters,
            training_flops_by_part=_mlm_flops_by_part,
        ),
        Objective(
            name="crossbert",
            title="CrossBERT",
            model_class=CrossBertForPreTraining,
            default_mask_ratio=0.5,
            build_batch=crossbert_batch,
            targets_per_row=crossbert_targets_per_row,
            protocol_batch=_crossbert_protocol_batch,
            num_views=_crossbert_num_views,
            head_parameters=_crossbert_head_parameters,
            training_flops_by_part=_crossbert_flops_by_part,
            check_config=_crossbert_check,
        ),
    )
}


def objective_names() -> tuple[str, ...]:
    return tuple(OBJECTIVES)


def objective(name: str) -> Objective:
    if name not in OBJECTIVES:
        raise ValueError(f"config field 'objective': expected one of {objective_names()}, got {name!r}")
    return OBJECTIVES[name]


def objective_of(config: CrossBertConfig) -> Objective:
    return objective(config.objective)


# -- what every caller asks of the objective of a config ---------------------------------------------


def config_from_preset(preset: str, **overrides) -> CrossBertConfig:
    """A CrossBertConfig of a size preset with `overrides` (None: the default), the objective's default
    mask ratio and checks applied. Runs build theirs from their config's model section with
    crossbert_model.train_config.model_config, which calls this."""
    if preset not in PRESETS:
        raise ValueError(f"unknown size preset {preset!r}; known presets: {', '.join(PRESETS)}")
    kwargs = PRESETS[preset].as_config_kwargs()
    kwargs.update({k: v for k, v in overrides.items() if v is not None})
    chosen = objective(kwargs.get("objective", "mlm"))
    kwargs.setdefault("mask_ratio", chosen.default_mask_ratio)
    config = CrossBertConfig(**kwargs)
    chosen.check_config(config)
    return config


def pretraining_model_for(config: CrossBertConfig) -> CrossBertPreTrainedModel:
    """The objective's pre-training model (encoder + head or predictor), freshly initialised."""
    return objective_of(config).model_class(config)


def pretraining_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor, config: CrossBertConfig, rng: RowRandom) -> dict:
    """The model inputs of one pre-training step for `config.objective`, masks drawn from `rng` (which
    global rows of which step the batch holds), built on the host (crossbert_model.masking)."""
    return objective_of(config).build_batch(input_ids, attention_mask, config, rng)


def targets_per_row(n_real: torch.Tensor, config: CrossBertConfig) -> torch.Tensor:
    """How many tokens each row predicts, from its real-token count alone (the draw decides which, never how many)."""
    return objective_of(config).targets_per_row(n_real, config)


def num_views(config: CrossBertConfig) -> int:
    """How many views of each sequence the encoder reads per step (CMS's K; 1 for a flat MLM)."""
    return objective_of(config).num_views(config)


# -- parameter and FLOP accounting (training = 3x forward, the convention of Kaplan et al. 2020 and the
# PaLM MFU definition) --------------------------------------------------------------------------------


def parameter_counts(c: CrossBertConfig) -> dict[str, int]:
    """Parameters by part. `encoder_non_embedding` is the size axis of the scaling plots.

    `predictor` is CrossBERT's cross-attention predictor (its blocks, query vector, norm and projection
    back to the encoder width), `head` what maps a hidden state to vocabulary logits besides the tied
    embedding (flat MLM: BERT's transform + bias; CrossBERT: the bias), `pretraining_head` their sum."""
    d = c.hidden_size
    embedding = (c.vocab_size + (c.max_position_embeddings if c.absolute_positions else 0)) * d
    encoder_blocks = c.num_hidden_layers * encoder_block_params(c) + norm_params(d, c.norm_type)
    head = objective_of(c).head_parameters(c)
    predictor, head = head["predictor"], head["head"]
    return {
        "embedding": embedding,
        "encoder_non_embedding": encoder_blocks,
        "encoder": embedding + encoder_blocks,
        "predictor": predictor,
        "head": head,
        "pretraining_head": predictor + head,
        "total": embedding + encoder_blocks + predictor + head,
    }


def training_flops_by_part(c: CrossBertConfig, seq_len: int) -> dict[str, float]:
    """Training FLOPs (3x forward) per corpus token at sequence length `seq_len`, by part (the objective's formula)."""
    return objective_of(c).training_flops_by_part(c, seq_len)


def training_flops_per_token(c: CrossBertConfig, seq_len: int) -> float:
    """Training FLOPs (3x forward) per corpus token: the sum of `training_flops_by_part`."""
    return sum(training_flops_by_part(c, seq_len).values())


def describe(c: CrossBertConfig, seq_len: int) -> dict:
    counts = parameter_counts(c)
    return {
        "objective": c.objective,
        "hidden_size": c.hidden_size,
        "layers": c.num_hidden_layers,
        "heads": c.num_attention_heads,
        "mask_ratio": c.mask_ratio,
        "views": num_views(c),
        **{f"params_{k}": v for k, v in counts.items()},
        "predictor_share": counts["predictor"] / counts["encoder_non_embedding"],
        **{f"train_flops_{k}": v for k, v in training_flops_by_part(c, seq_len).items()},
        "train_flops_per_token": training_flops_per_token(c, seq_len),
    }
