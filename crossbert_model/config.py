"""Model configuration, named size presets, and the shape arithmetic of parameters and FLOPs.

One config class serves every objective so that a flat-MLM and a CrossBERT checkpoint of the same
preset share every encoder hyper-parameter; `objective` says which pre-training model wrote it. What an
objective adds (its default mask ratio, its checks, its head's parameters and FLOPs) is the objective's
own, in crossbert_model.objectives, which builds configs (`config_from_preset`) and counts them
(`parameter_counts`, `training_flops_by_part`): this module knows no objective by name.

This file, model.py and masking.py are copied as they are into every checkpoint (crossbert_model.portable),
so that `AutoModel.from_pretrained(checkpoint, trust_remote_code=True)` works without this package: they
import only the standard library, numpy, torch, transformers and each other.
"""

from __future__ import annotations

import math

from transformers import PretrainedConfig


class CrossBertConfig(PretrainedConfig):
    """Encoder shape + pre-training objective. Saved as `config.json` with every checkpoint."""

    model_type = "crossbert"

    def __init__(
        self,
        vocab_size: int = 8192,
        hidden_size: int = 128,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 2,
        intermediate_size: int | None = None,
        mlp_type: str = "gelu",  # "gelu" | "swiglu"
        norm_type: str = "layernorm",  # "layernorm" | "rmsnorm"
        norm_eps: float = 1e-6,
        max_position_embeddings: int = 8192,
        rope_theta: float = 10000.0,
        initializer_range: float = 0.02,
        # The token embeddings' std at initialisation; None: initializer_range (what checkpoints saved before
        # this field hold). Larger draws keep a tiny CrossBERT's tokens apart (results/escape_scan/README.md).
        embedding_init_std: float | None = None,
        objective: str = "mlm",  # a name of crossbert_model.objectives, which checks it when it builds or loads a model
        # The class default is a flat MLM's (BERT's 15%); builders take each objective's own default
        # (crossbert_model.objectives.config_from_preset), and a saved config.json holds the value.
        mask_ratio: float = 0.15,
        # Flat MLM corruption of the selected positions (BERT: 80% [MASK], 10% random, 10% kept).
        mlm_mask_prob: float = 0.8,
        mlm_random_prob: float = 0.1,
        # CrossBERT predictor (defaults: `default_predictor_shape`, light at every size).
        predictor_layers: int | None = None,
        predictor_hidden_size: int | None = None,
        predictor_heads: int | None = None,
        predictor_intermediate_size: int | None = None,
        complementary_masking: bool = True,
        # Where the predictor gets positions (PREDICTOR_POSITION_ROUTES): "rotary" turns its queries and keys by their
        # positions (it can find a masked token's neighbours by itself); "encoder" gives its keys none, so every position it
        # uses comes out of the encoder, which then needs `absolute_positions` (CrossMAE's route).
        predictor_positions: str = "rotary",
        # Learned absolute position embeddings added to the encoder's input, beside its rotary attention (BERT's table,
        # drawn like the token embeddings): what lets the encoder's output say where a token is.
        absolute_positions: bool = False,
        # Rows of the vocabulary head's loss computed at a time (model._vocab_loss): above this many predicted tokens the
        # fused, chunked head runs and the full logits never exist; None: always full logits. Computation only: the
        # loss and gradients are the same within the matmul dtype's rounding.
        vocab_chunk_rows: int | None = 4096,
        pad_token_id: int = 0,
        mask_token_id: int = 4,
        cls_token_id: int = 2,
        sep_token_id: int = 3,
        num_special_tokens: int = 5,
        **kwargs,
    ):
        check_model_values(
            mask_ratio,
            mlm_mask_prob,
            mlm_random_prob,
            mlp_type,
            norm_type,
            embedding_init_std,
            predictor_positions=predictor_positions,
            absolute_positions=absolute_positions,
        )
        sizes = {
            "vocab_size": vocab_size,
            "hidden_size": hidden_size,
            "num_hidden_layers": num_hidden_layers,
            "num_attention_heads": num_attention_heads,
            "max_position_embeddings": max_position_embeddings,
            "intermediate_size": intermediate_size,
            "predictor_layers": predictor_layers,
            "predictor_hidden_size": predictor_hidden_size,
            "predictor_heads": predictor_heads,
            "predictor_intermediate_size": predictor_intermediate_size,
        }
        for name, value in sizes.items():  # None: the default shape (intermediate and predictor sizes)
            if value is not None or name in SHAPE_FIELDS:
                _require(isinstance(value, int) and not isinstance(value, bool) and value > 0, name, "a positive integer", value)
        for name, value in {
            "pad_token_id": pad_token_id,
            "mask_token_id": mask_token_id,
            "cls_token_id": cls_token_id,
            "sep_token_id": sep_token_id,
        }.items():
            ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab_size
            _require(ok, name, f"a token id in [0, {vocab_size})", value)
        _require(
            isinstance(num_special_tokens, int)
            and not isinstance(num_special_tokens, bool)
            and 0 <= num_special_tokens <= vocab_size,
            "num_special_tokens",
            "an integer from 0 to vocab_size",
            num_special_tokens,
        )
        if vocab_chunk_rows is not None:
            ok = isinstance(vocab_chunk_rows, int) and not isinstance(vocab_chunk_rows, bool) and vocab_chunk_rows > 0
            _require(ok, "vocab_chunk_rows", "a positive integer or null", vocab_chunk_rows)
        for name, value in {"norm_eps": norm_eps, "rope_theta": rope_theta, "initializer_range": initializer_range}.items():
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
            _require(ok, name, "a positive number", value)
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"config field 'hidden_size' ({hidden_size}) must be divisible by 'num_attention_heads' ({num_attention_heads})"
            )
        if (hidden_size // num_attention_heads) % 2:  # rotary embeddings turn pairs of dimensions
            raise ValueError(
                f"config fields 'hidden_size' ({hidden_size}) / 'num_attention_heads' ({num_attention_heads}) give a head "
                f"dimension of {hidden_size // num_attention_heads}; rotary position embeddings need an even one"
            )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size or 4 * hidden_size
        self.mlp_type = mlp_type
        self.norm_type = norm_type
        self.norm_eps = norm_eps
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.initializer_range = initializer_range
        self.embedding_init_std = embedding_init_std
        self.objective = objective
        self.mask_ratio = mask_ratio
        self.mlm_mask_prob = mlm_mask_prob
        self.mlm_random_prob = mlm_random_prob
        self.complementary_masking = complementary_masking
        self.predictor_positions = predictor_positions
        self.absolute_positions = absolute_positions
        self.vocab_chunk_rows = vocab_chunk_rows
        default_layers, default_width = default_predictor_shape(hidden_size, num_hidden_layers, self.intermediate_size, mlp_type)
        self.predictor_layers = predictor_layers or default_layers
        self.predictor_hidden_size = predictor_hidden_size or default_width
        self.predictor_heads = predictor_heads or max(1, self.predictor_hidden_size // (hidden_size // num_attention_heads))
        if self.predictor_hidden_size % self.predictor_heads:
            raise ValueError(
                f"config field 'predictor_hidden_size' ({self.predictor_hidden_size}) must be divisible by "
                f"'predictor_heads' ({self.predictor_heads})"
            )
        if (self.predictor_hidden_size // self.predictor_heads) % 2:
            raise ValueError(
                f"config fields 'predictor_hidden_size' ({self.predictor_hidden_size}) / 'predictor_heads' ({self.predictor_heads}) "
                "give an odd head dimension; rotary position embeddings need an even one"
            )
        self.predictor_intermediate_size = predictor_intermediate_size or 4 * self.predictor_hidden_size
        self.mask_token_id = mask_token_id
        self.num_special_tokens = num_special_tokens
        super().__init__(pad_token_id=pad_token_id, cls_token_id=cls_token_id, sep_token_id=sep_token_id, **kwargs)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


MLP_TYPES = ("gelu", "swiglu")
# The shape fields a config must give as positive integers (the others may be None: a default shape).
SHAPE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings")
NORM_TYPES = ("layernorm", "rmsnorm")
# The routes by which positions reach CrossBERT's predictor (config field `predictor_positions`), and what each needs of
# the encoder. results/predictor_positions/README.md measures them side by side.
PREDICTOR_POSITION_ROUTES = {
    "rotary": "rotary on the predictor's queries and on the encoder outputs as its keys (keys carry positions of their own)",
    "encoder": "queries = mask embedding + a learned query position; keys carry no position of their own, so positions "
    "reach the predictor only through the encoder (CrossMAE); needs absolute_positions",
}


def check_model_values(
    mask_ratio,
    mlm_mask_prob,
    mlm_random_prob,
    mlp_type,
    norm_type,
    embedding_init_std=None,
    section: str = "",
    predictor_positions: str = "rotary",
    absolute_positions: bool = False,
) -> None:
    """The checks of the values a CrossBertConfig holds and a run's model section sets, defined once for both:
    a ValueError naming the field with `section` in front ("model." for the model section, where
    crossbert_model.train_config makes it a ConfigError). A mask_ratio of None is the objective's default,
    checked where it is chosen."""
    if mask_ratio is not None:
        _number_in(f"{section}mask_ratio", mask_ratio, 0.0, 1.0, True, True)
    _number_in(f"{section}mlm_mask_prob", mlm_mask_prob, 0.0, 1.0, False, False)
    _number_in(f"{section}mlm_random_prob", mlm_random_prob, 0.0, 1.0, False, False)
    # The kept share is what is left over: the two given shares cannot exceed the whole.
    expected = f"at most 1 - {section}mlm_mask_prob ({1.0 - mlm_mask_prob:g})"
    _require(mlm_mask_prob + mlm_random_prob <= 1.0 + 1e-9, f"{section}mlm_random_prob", expected, mlm_random_prob)
    _require(mlp_type in MLP_TYPES, f"{section}mlp_type", "one of " + ", ".join(MLP_TYPES), mlp_type)
    _require(norm_type in NORM_TYPES, f"{section}norm_type", "one of " + ", ".join(NORM_TYPES), norm_type)
    if embedding_init_std is not None:
        ok = isinstance(embedding_init_std, (int, float)) and math.isfinite(embedding_init_std) and embedding_init_std > 0
        _require(ok, f"{section}embedding_init_std", "a positive number or null", embedding_init_std)
    routes = tuple(PREDICTOR_POSITION_ROUTES)
    _require(predictor_positions in routes, f"{section}predictor_positions", "one of " + ", ".join(routes), predictor_positions)
    _require(isinstance(absolute_positions, bool), f"{section}absolute_positions", "true or false", absolute_positions)
    # keys without positions of their own read positions from the encoder's output: a purely rotary encoder has none to give
    expected = f"true when {section}predictor_positions is 'encoder' (the encoder's output must carry positions)"
    _require(absolute_positions or predictor_positions != "encoder", f"{section}absolute_positions", expected, absolute_positions)


# The wording of crossbert_model.args.require, written out here because this file may not import the package
# (it travels alone inside checkpoints).
def _require(ok: bool, name: str, expected: str, value) -> None:
    if not ok:
        raise ValueError(f"config field {name!r}: expected {expected}, got {value!r}")


def _number_in(name: str, value, low: float, high: float, low_open: bool, high_open: bool) -> None:
    ok = isinstance(value, (int, float)) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    _require(ok, name, f"a number in {interval}", value)


# How far r may sit from 1 - 1/K and still mean K views: r written to three decimals (0.667 for 2/3).
CMS_RATIO_TOLERANCE = 5e-4


def cms_num_views(mask_ratio: float) -> int:
    """K = 1 / (1 - r) disjoint visible groups per sequence (DESIGN.md, CMS): each view shows one group
    and masks the other K - 1, so every token is predicted K - 1 times per step. Only ratios with a whole
    K are realisable (r = 1/2, 2/3, 3/4, ...); any other is refused rather than rounded to a K whose
    effective ratio 1 - 1/K differs from the one asked for."""
    views = max(2, round(1.0 / (1.0 - mask_ratio)))
    if abs(mask_ratio - (1.0 - 1.0 / views)) > CMS_RATIO_TOLERANCE:
        raise ValueError(
            f"config field 'mask_ratio': the complementary masking strategy needs 1/(1-r) to be a whole number "
            f"(r = 0.5, 0.667, 0.75, 0.8, ...), got r = {mask_ratio:g} (1/(1-r) = {1.0 / (1.0 - mask_ratio):.3g}); "
            "choose such a ratio or set complementary_masking to false"
        )
    return views


# DESIGN.md: the predictor has "M light blocks (M small, e.g. 1-2)" and at every preset at most a quarter
# of the encoder's non-embedding parameters (MAE's decoder is about a tenth of its encoder).
PREDICTOR_MAX_SHARE = 0.25
# Two blocks: with one, every query of a view is the same vector before it reads the encoder (only its
# rotary position differs), and such predictors were seen to stall on the unigram plateau.
PREDICTOR_LAYERS = 2
PREDICTOR_MIN_WIDTH = 16


def default_predictor_shape(hidden_size: int, num_layers: int, intermediate_size: int, mlp_type: str) -> tuple[int, int]:
    """(layers, width) of the default predictor: two blocks at the widest of d/2, d/4, ... (not below 16)
    whose parameters stay within PREDICTOR_MAX_SHARE of the encoder's blocks (4x MLP, as the encoder's)."""
    encoder = num_layers * (4 * hidden_size**2 + mlp_params(hidden_size, intermediate_size, mlp_type))
    width = hidden_size // 2
    while width > PREDICTOR_MIN_WIDTH:
        block = 2 * width**2 + 2 * hidden_size * width + mlp_params(width, 4 * width, mlp_type)
        if PREDICTOR_LAYERS * block <= PREDICTOR_MAX_SHARE * encoder:
            break
        width //= 2
    return PREDICTOR_LAYERS, max(width, PREDICTOR_MIN_WIDTH)


# Named size presets: crossbert_model.presets (no heavy import, so a command checks a preset's name at once).


# --------------------------------------------------------------------------------------------------
# The shape arithmetic of parameter and FLOP accounting (matmul FLOPs; 1 multiply-add = 2 FLOPs). The
# counts by part, which depend on the objective, are crossbert_model.objectives'.
# --------------------------------------------------------------------------------------------------


def mlp_params(d: int, ff: int, mlp_type: str) -> int:
    return (3 if mlp_type == "swiglu" else 2) * d * ff


def norm_params(d: int, norm_type: str) -> int:
    return 2 * d if norm_type == "layernorm" else d


def encoder_block_params(c: CrossBertConfig) -> int:
    d = c.hidden_size
    attn = 4 * d * d
    return attn + mlp_params(d, c.intermediate_size, c.mlp_type) + 2 * norm_params(d, c.norm_type)


def predictor_block_params(c: CrossBertConfig) -> int:
    d, p = c.hidden_size, c.predictor_hidden_size
    attn = 2 * p * p + 2 * d * p  # q, out on predictor width; k, v read the encoder width
    return attn + mlp_params(p, c.predictor_intermediate_size, c.mlp_type) + 2 * norm_params(p, c.norm_type)


def encoder_forward_flops(c: CrossBertConfig, tokens: float, context: float) -> float:
    """Forward matmul FLOPs of the encoder for `tokens` tokens each attending to `context` keys."""
    d = c.hidden_size
    per_token_layer = 2 * encoder_block_params(c) + 2 * 2 * context * d  # weights + (QK^T, AV)
    return tokens * c.num_hidden_layers * per_token_layer


def format_count(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.{1 if n / scale < 100 else 0}f}{unit}"
    return str(int(n)) if float(n).is_integer() else f"{n:.3g}"
