"""The two pre-training models on one shared transformer block.

* `CrossBertModel`: the encoder (token embeddings -> N pre-norm blocks -> final norm). This is what
  `AutoModel.from_pretrained(checkpoint)` returns for either objective, and what the probes freeze.
* `FlatMlmForPreTraining` (BERT): the encoder over the whole corrupted sequence, then an MLM head
  whose vocabulary projection is computed at the selected positions only.
* `CrossBertForPreTraining`: the encoder over the VISIBLE tokens only (masked tokens are gathered
  out, not replaced), then a predictor of cross-attention-only blocks: learned mask-embedding queries
  at the masked positions read the encoder outputs; queries never attend to each other.

Rotary positions are always the token's position in the original sequence, so dropping tokens from
the encoder input does not shift anyone's position. Where positions reach the predictor is the config's
`predictor_positions` (config.PREDICTOR_POSITION_ROUTES): by rotary on its queries and keys, or only
through the encoder's output (learned absolute positions at the encoder's input, `absolute_positions`).

This file travels inside every checkpoint (crossbert_model.portable): it imports only torch, transformers,
config.py and masking.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils import ModelOutput

from .config import CrossBertConfig
from .masking import crossbert_packing, mlm_targets


def make_norm(config: CrossBertConfig, dim: int) -> nn.Module:
    if config.norm_type == "rmsnorm":
        return nn.RMSNorm(dim, eps=config.norm_eps)
    return nn.LayerNorm(dim, eps=config.norm_eps)


class Rotary(nn.Module):
    """Rotary position embedding (Su et al. 2021), evaluated at arbitrary integer positions."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self.register_buffer("inv_freq", self.frequencies(), persistent=False)

    def frequencies(self) -> torch.Tensor:
        return 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids.unsqueeze(-1).float() * self.inv_freq  # (B, T, hd/2)
        angles = torch.cat((freqs, freqs), dim=-1).unsqueeze(1)  # (B, 1, T, hd)
        return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


def key_mask_of(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The keys a query may attend to, or None for all. On the CPU, reading the mask costs nothing and
    an all-ones mask takes SDPA's unmasked path; on an accelerator reading it would stall the step, so
    a mask is used as given (the trainer passes None for unpadded batches)."""
    if attention_mask is None:
        return None
    mask = attention_mask.bool()
    return None if mask.device.type == "cpu" and bool(mask.all()) else mask


def select_rows(x: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """x[n, positions[n, l]] for every valid slot, flattened in row order: (num_valid, *x.shape[2:]).
    With `valid` None (every slot valid) the shape is known in advance: no synchronisation."""
    index = positions.view(*positions.shape, *([1] * (x.dim() - 2))).expand(*positions.shape, *x.shape[2:])
    picked = torch.gather(x, 1, index)
    return picked.flatten(0, 1) if valid is None else picked[valid]


def _sdpa_key_mask(key_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, Tk) bool -> SDPA boolean mask (B, 1, 1, Tk). A row with no valid key attends to all keys
    (its output is never used) so that SDPA does not produce NaN."""
    if key_mask is None:
        return None
    key_mask = key_mask | ~key_mask.any(dim=-1, keepdim=True)
    return key_mask[:, None, None, :]


class Attention(nn.Module):
    """Multi-head attention through `scaled_dot_product_attention`. `cross=True` reads keys/values
    from a context of width `kv_dim` (the predictor's cross-attention); otherwise self-attention."""

    def __init__(self, dim: int, num_heads: int, kv_dim: int | None = None, cross: bool = False):
        super().__init__()
        self.num_heads, self.head_dim, self.cross = num_heads, dim // num_heads, cross
        if cross:
            self.q_proj = nn.Linear(dim, dim, bias=False)
            self.kv_proj = nn.Linear(kv_dim or dim, 2 * dim, bias=False)
        else:
            self.qkv_proj = nn.Linear(dim, 3 * dim, bias=False)
        self.out_proj = nn.Linear(dim, dim, bias=False)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x, rope_q, context=None, rope_k=None, key_mask=None):
        if self.cross:
            q = self._heads(self.q_proj(x))
            k, v = map(self._heads, self.kv_proj(context).chunk(2, dim=-1))
        else:
            q, k, v = map(self._heads, self.qkv_proj(x).chunk(3, dim=-1))
            rope_k = rope_q
        if rope_q is not None:  # None: positions are already in the vectors (the predictor's "encoder" route)
            q = apply_rotary(q, *rope_q)
        if rope_k is not None:
            k = apply_rotary(k, *rope_k)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=_sdpa_key_mask(key_mask))
        b, _, t, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, mlp_type: str):
        super().__init__()
        self.swiglu = mlp_type == "swiglu"
        self.in_proj = nn.Linear(dim, (2 if self.swiglu else 1) * hidden, bias=False)
        self.out_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.in_proj(x)
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h)
        return self.out_proj(h)


class CheckpointableBlock(nn.Module):
    """A block that can recompute its activations in the backward instead of keeping them from the
    forward (`activation_checkpointing`, set by `set_activation_checkpointing`): memory traded for one
    more forward, with the same loss and gradients. `compute` is the block; `forward` decides."""

    activation_checkpointing = False

    def forward(self, *args):
        if self.activation_checkpointing and torch.is_grad_enabled():
            return checkpoint(self.compute, *args, use_reentrant=False)
        return self.compute(*args)


class Block(CheckpointableBlock):
    """The shared pre-norm transformer block: x + Attn(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, config: CrossBertConfig):
        super().__init__()
        d = config.hidden_size
        self.attn_norm = make_norm(config, d)
        self.attn = Attention(d, config.num_attention_heads)
        self.mlp_norm = make_norm(config, d)
        self.mlp = MLP(d, config.intermediate_size, config.mlp_type)

    def compute(self, x, rope, key_mask):
        x = x + self.attn(self.attn_norm(x), rope, key_mask=key_mask)
        return x + self.mlp(self.mlp_norm(x))


class PredictorBlock(CheckpointableBlock):
    """Cross-attention only (CrossMAE-style): queries read the encoder output, never each other."""

    def __init__(self, config: CrossBertConfig):
        super().__init__()
        p = config.predictor_hidden_size
        self.attn_norm = make_norm(config, p)
        self.attn = Attention(p, config.predictor_heads, kv_dim=config.hidden_size, cross=True)
        self.mlp_norm = make_norm(config, p)
        self.mlp = MLP(p, config.predictor_intermediate_size, config.mlp_type)

    def compute(self, queries, rope_q, context, rope_k, key_mask):
        queries = queries + self.attn(self.attn_norm(queries), rope_q, context, rope_k, key_mask)
        return queries + self.mlp(self.mlp_norm(queries))


class CrossBertPreTrainedModel(PreTrainedModel):
    config_class = CrossBertConfig
    base_model_prefix = "encoder"
    supports_gradient_checkpointing = False
    _no_split_modules = ["Block", "PredictorBlock"]
    # A checkpoint holds the pre-training head or predictor beside the encoder: loading the encoder alone (AutoModel,
    # the frozen features) leaves them out on purpose, not as a surprise to report.
    _keys_to_ignore_on_load_unexpected = [r"^head\.", r"^predictor\."]

    def set_activation_checkpointing(self, enabled: bool) -> None:
        """Recompute every block's activations in the backward (True) or keep them (False)."""
        for module in self.modules():
            if isinstance(module, CheckpointableBlock):
                module.activation_checkpointing = enabled

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        # Residual output projections shrink with depth (GPT-2 / ModernBERT "out" init).
        out_std = std / math.sqrt(2.0 * max(1, self.config.num_hidden_layers))
        if isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=self.config.embedding_init_std or std)
        elif isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
        elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
        elif isinstance(module, (Attention, MLP)):
            init.normal_(module.out_proj.weight, mean=0.0, std=out_std)
        elif isinstance(module, Rotary):
            # A non-persistent buffer: from_pretrained builds the model on the meta device, so it must
            # be recomputed here rather than trusted from __init__.
            init.copy_(module.inv_freq, module.frequencies())
        elif isinstance(module, MlmHead):
            init.zeros_(module.decoder_bias)
        elif isinstance(module, Predictor):
            init.normal_(module.mask_embedding, mean=0.0, std=std)
            init.zeros_(module.decoder_bias)


class CrossBertModel(CrossBertPreTrainedModel):
    """The encoder. `hidden_states` (when asked) holds N + 1 tensors: the embedding output (layer 0)
    and the output of every block, the last one after the final norm (= `last_hidden_state`)."""

    def __init__(self, config: CrossBertConfig):
        super().__init__(config)
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        # absolute positions beside rotary: without them the encoder is purely relative and its output says nowhere where a token is
        self.position_embeddings = (
            nn.Embedding(config.max_position_embeddings, config.hidden_size) if config.absolute_positions else None
        )
        self.rotary = Rotary(config.head_dim, config.rope_theta)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_hidden_layers))
        self.norm = make_norm(config, config.hidden_size)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings = value

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **unused,  # token_type_ids from BERT-style tokenizers: this model has no segment embedding
    ) -> BaseModelOutput:
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        key_mask = key_mask_of(attention_mask)  # None for unpadded batches: SDPA's unmasked (flash) path
        rope = self.rotary(position_ids)
        x = self.embeddings(input_ids)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(position_ids)
        hidden_states = [x] if output_hidden_states else None
        for layer in self.layers:
            x = layer(x, rope, key_mask)
            if hidden_states is not None:
                hidden_states.append(x)
        x = self.norm(x)
        if hidden_states is not None:
            hidden_states[-1] = x
            hidden_states = tuple(hidden_states)
        if return_dict is False:
            return (x, hidden_states) if hidden_states is not None else (x,)
        return BaseModelOutput(last_hidden_state=x, hidden_states=hidden_states)


@dataclass
class PreTrainingOutput(ModelOutput):
    """`loss` is the mean cross-entropy over predicted tokens; `loss_sum` / `num_predicted` let a
    trainer normalise by the token count of the whole global batch (exact under DDP / accumulation)."""

    loss: torch.Tensor | None = None
    loss_sum: torch.Tensor | None = None
    num_predicted: torch.Tensor | None = None
    logits: torch.Tensor | None = None  # (num_predicted, vocab): only the predicted positions
    labels: torch.Tensor | None = None  # (num_predicted,)


def _masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> PreTrainingOutput:
    loss_sum = F.cross_entropy(logits.float(), labels, reduction="sum")
    count = labels.new_full((), labels.numel())  # filled on the device: no host-to-device copy
    return PreTrainingOutput(
        loss=loss_sum / count.clamp(min=1), loss_sum=loss_sum, num_predicted=count, logits=logits, labels=labels
    )


def _vocab_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    labels: torch.Tensor,
    chunk_rows: int | None,
    want_logits: bool = False,
) -> PreTrainingOutput:
    """The loss of the vocabulary projection `hidden @ weight.T + bias` against `labels`: through the fused, chunked
    head (vocab_cross_entropy_sum: the logits of all rows never exist at once) when there are more than `chunk_rows`
    rows, else by full logits (kept in the output: small batches, tests)."""
    if chunk_rows is None or want_logits or hidden.shape[0] <= chunk_rows:
        return _masked_lm_loss(F.linear(hidden, weight, bias), labels)
    loss_sum = vocab_cross_entropy_sum(hidden, weight, bias, labels, chunk_rows)
    count = labels.new_full((), labels.numel())
    return PreTrainingOutput(loss=loss_sum / count.clamp(min=1), loss_sum=loss_sum, num_predicted=count, labels=labels)


def vocab_cross_entropy_sum(hidden, weight, bias, labels, chunk_rows: int) -> torch.Tensor:
    """sum_i CE(hidden_i @ weight.T + bias, labels_i) without materialising the (rows, vocab) logits: `chunk_rows` rows
    at a time, in the autocast dtype where autocast is on (bf16 matmuls), logits and every sum in fp32. With gradients,
    each chunk's gradients (softmax - one-hot) are taken in the same pass (Liger's fused linear cross-entropy), so the
    backward is a scaling and no logits are recomputed: the matmul FLOPs of the unfused head, its memory minus the logits."""
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    return _ChunkedVocabCrossEntropy.apply(hidden, weight, bias, labels, chunk_rows, dtype)


class _ChunkedVocabCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, chunk_rows, dtype):
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        with torch.autocast(hidden.device.type, enabled=False):
            h_all, w = hidden.to(dtype), weight.to(dtype)
            total = torch.zeros((), dtype=torch.float32, device=hidden.device)
            grad_h = torch.empty_like(h_all) if need_h else None
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
            grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
            for start in range(0, hidden.shape[0], chunk_rows):
                h, y = h_all[start : start + chunk_rows], labels[start : start + chunk_rows]
                logits = (h @ w.t()).float() + bias.float()
                lse = torch.logsumexp(logits, dim=-1)
                total += (lse - logits.gather(1, y[:, None]).squeeze(1)).sum()
                if need_h or need_w or need_b:
                    p = torch.exp(logits - lse[:, None])  # softmax; minus one-hot below: d(CE sum) / d logits
                    p[torch.arange(len(y), device=p.device), y] -= 1.0
                    if need_h:
                        grad_h[start : start + chunk_rows] = p.to(dtype) @ w
                    if need_w:
                        grad_w += (p.t().to(dtype) @ h).float()
                    if need_b:
                        grad_b += p.sum(0)
        ctx.grads = (grad_h, grad_w, grad_b)
        ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype)
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grads = [None if g is None else (g * grad_total.to(g.dtype)).to(d) for g, d in zip(ctx.grads, ctx.dtypes)]
        ctx.grads = None
        return (*grads, None, None, None)


def _check_objective(config: CrossBertConfig, expected: str, cls: type) -> None:
    if config.objective != expected:
        raise ValueError(
            f"{cls.__name__} needs a config with objective={expected!r}, but this one has objective={config.objective!r}: "
            "load it with `crossbert_model.pretraining_model_for` (the class of its objective) "
            "or `crossbert_model.pretraining_model_from_pretrained`, or the encoder alone with AutoModel"
        )


class MlmHead(nn.Module):
    """BERT's head: dense -> GELU -> norm -> decoder tied to the input embeddings (+ bias)."""

    def __init__(self, config: CrossBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.norm = make_norm(config, config.hidden_size)
        self.decoder_bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.logit_scale = tied_logit_scale(config)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """What the tied decoder projects onto the vocabulary."""
        features = self.norm(F.gelu(self.dense(x)))
        return features if self.logit_scale == 1.0 else features * self.logit_scale

    def forward(self, x: torch.Tensor, embedding_weight: torch.Tensor) -> torch.Tensor:
        return F.linear(self.features(x), embedding_weight, self.decoder_bias)


def tied_logit_scale(config: CrossBertConfig) -> float:
    """The factor on flat MLM's tied logits: initializer_range / embedding_init_std, 1 at the default draw.

    The head's features are normalised (entries of size 1), so against embeddings drawn at std 1.0 the first logits
    have a std of sqrt(hidden) and the first loss is 37-45 at tiny (diverged at step 0). Scaled, the first logits are
    those of the default 0.02 draw, so flat MLM trains with CrossBERT's draw and the two arms differ in the objective
    only. CrossBERT's predictor needs no factor: its output projection is drawn at initializer_range."""
    return config.initializer_range / config.embedding_init_std if config.embedding_init_std else 1.0


class FlatMlmForPreTraining(CrossBertPreTrainedModel):
    def __init__(self, config: CrossBertConfig):
        _check_objective(config, "mlm", type(self))
        super().__init__(config)
        self.encoder = CrossBertModel(config)
        self.head = MlmHead(config)
        self.post_init()

    def forward(self, input_ids, attention_mask, labels, target_positions=None, target_valid=None, **unused) -> PreTrainingOutput:
        """input_ids: corrupted tokens (B, T); labels: original id at selected positions, -100 elsewhere.
        target_positions / target_valid: the selected positions left-packed (`masking.mlm_targets`);
        computed here when not given (the trainer gives them, packed on the host)."""
        if target_positions is None:
            packed = mlm_targets(labels)
            target_positions, target_valid = packed["target_positions"], packed["target_valid"]
        hidden = self.encoder(input_ids, attention_mask=attention_mask).last_hidden_state
        # Vocabulary logits only where there is something to predict (15% of tokens by default).
        features = self.head.features(select_rows(hidden, target_positions, target_valid))
        return _vocab_loss(
            features,
            self.encoder.embeddings.weight,
            self.head.decoder_bias,
            select_rows(labels, target_positions, target_valid),
            self.config.vocab_chunk_rows,
        )


class Predictor(nn.Module):
    def __init__(self, config: CrossBertConfig):
        super().__init__()
        p, d = config.predictor_hidden_size, config.hidden_size
        self.mask_embedding = nn.Parameter(torch.zeros(p))
        # "rotary": queries and keys turned by their positions; "encoder": a learned position added to each query, and
        # the keys (the encoder's outputs) get no position here (config.PREDICTOR_POSITION_ROUTES)
        self.rotary = Rotary(p // config.predictor_heads, config.rope_theta) if config.predictor_positions == "rotary" else None
        self.query_positions = (
            nn.Embedding(config.max_position_embeddings, p) if config.predictor_positions == "encoder" else None
        )
        self.layers = nn.ModuleList(PredictorBlock(config) for _ in range(config.predictor_layers))
        self.norm = make_norm(config, p)
        self.out_proj = nn.Linear(p, d, bias=False) if p != d else nn.Identity()
        self.decoder_bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, context, context_positions, context_valid, query_positions, query_valid, embedding_weight):
        """Logits (num_valid_queries, vocab) for the queries at `query_positions` (N, Q)."""
        return F.linear(
            self.features(context, context_positions, context_valid, query_positions, query_valid),
            embedding_weight,
            self.decoder_bias,
        )

    def features(self, context, context_positions, context_valid, query_positions, query_valid) -> torch.Tensor:
        """(num_valid_queries, hidden): what the tied decoder projects onto the vocabulary."""
        n, q = query_positions.shape
        queries = self.mask_embedding.to(context.dtype).expand(n, q, -1)
        if self.rotary is not None:
            rope_q, rope_k = self.rotary(query_positions), self.rotary(context_positions)
        else:
            queries, rope_q, rope_k = queries + self.query_positions(query_positions).to(context.dtype), None, None
        for layer in self.layers:
            queries = layer(queries, rope_q, context, rope_k, key_mask_of(context_valid))
        return self.out_proj(self.norm(queries.flatten(0, 1) if query_valid is None else queries[query_valid]))


class CrossBertForPreTraining(CrossBertPreTrainedModel):
    def __init__(self, config: CrossBertConfig):
        _check_objective(config, "crossbert", type(self))
        super().__init__(config)
        self.encoder = CrossBertModel(config)
        self.predictor = Predictor(config)
        self.post_init()

    def forward(
        self,
        input_ids,
        attention_mask,
        visible,
        encoder_positions=None,
        encoder_valid=None,
        query_positions=None,
        query_valid=None,
        **unused,
    ) -> PreTrainingOutput:
        """input_ids, attention_mask: (B, T), never corrupted (attention_mask None: no padding).
        visible: (B, K, T) bool, one row per view (see `masking.crossbert_views`). The K views of a
        sequence run as K rows of one batched pass. The (B, K, L) index tensors of
        `masking.crossbert_packing` are computed here when not given (the trainer packs on the host)."""
        b, k, t = visible.shape
        if encoder_positions is None:
            packed = crossbert_packing(visible, attention_mask)
            encoder_positions, encoder_valid = packed["encoder_positions"], packed["encoder_valid"]
            query_positions, query_valid = packed["query_positions"], packed["query_valid"]

        def rows(x):  # (B, K, L) -> (B * K, L): a view is one row
            return None if x is None else x.reshape(b * k, -1)

        enc_positions, enc_valid, query_positions, query_valid = map(
            rows, (encoder_positions, encoder_valid, query_positions, query_valid)
        )
        ids = input_ids.unsqueeze(1).expand(b, k, t).reshape(b * k, t)
        # Encoder input: the visible tokens only, left-packed, with their original positions.
        context = self.encoder(
            torch.gather(ids, 1, enc_positions), attention_mask=enc_valid, position_ids=enc_positions
        ).last_hidden_state
        features = self.predictor.features(context, enc_positions, enc_valid, query_positions, query_valid)
        return _vocab_loss(
            features,
            self.encoder.embeddings.weight,
            self.predictor.decoder_bias,
            select_rows(ids, query_positions, query_valid),
            self.config.vocab_chunk_rows,
        )


# Importing the model classes registers them with transformers' Auto classes (AutoConfig / AutoModel
# .from_pretrained(checkpoint) then work offline without trust_remote_code); the package's __init__ is lazy.
def _register_auto_classes() -> None:
    from transformers import AutoConfig, AutoModel

    AutoConfig.register(CrossBertConfig.model_type, CrossBertConfig, exist_ok=True)
    AutoModel.register(CrossBertConfig, CrossBertModel, exist_ok=True)


_register_auto_classes()
