"""Encoder reliance: does a run's ENCODER carry context, or does its predictor do the work?

The plateau rule (crossbert_model.plateau) certifies the whole pre-training system: a CrossBERT can earn
its margin below the unigram entropy in its predictor, with an encoder that stays a per-token code. The
probes freeze the encoder alone, so a comparison of frozen features needs the encoder to carry context.
Measured on the run's shared-protocol validation sequences (crossbert_model.shared_loss), at its own ratio:

* `reliance_loss`: the shared-protocol loss as trained;
* `reliance_loss_order_blind`: the same with the encoder made order-blind (its rotary angles zero, its
  absolute positions removed; the predictor keeps its own positions). For flat MLM, whose encoder is
  the whole network, this is the network without word order;
* `reliance_loss_bypassed`: the encoder's blocks skipped (embeddings -> final norm);
* per layer (the encoder on the full, unmasked sequences, as the probes see it):
  `identity_share_l{i}`: the share of the states' variance that token identity explains (one-way ANOVA
  over token ids, adjusted R^2, so ids seen once do not inflate it); `swap_pooled_l{i}`: how far the
  mean-pooled state of a sequence moves when two adjacent tokens swap, as a share of the typical
  distance of a sequence's pooled state from the mean of all of them; `swap_neighbour_l{i}`: the
  relative change of the other tokens' states.

**The encoder rule** (`carries_context`): the encoder carries context when making it order-blind loses
at least ENCODER_RELIANCE_SHARE of the run's margin below the unigram entropy. A CrossBERT run that fails
it is not compared, as a run on the plateau is not; a run whose margin is under the plateau's PLATEAU_MARGIN gets
no answer (its share is a share of noise).

    encoder_reliance_for_checkpoint("runs/x/checkpoints/step_0001955")   # {"reliance_loss": ..., ...}
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .plateau import PLATEAU_MARGIN
from .shared_loss import protocol_key, protocol_selections, shared_loss_sums

# The encoder rule's threshold. A quarter of the margin: what the system learned beyond token frequencies
# is mostly context, and context that does not need word order (a bag of words) is what an order-blind
# encoder keeps; an encoder whose order-dependent computation accounts for less than a quarter of the
# margin leaves the positional work to its predictor. Chosen before the route measurements
# (results/predictor_positions/README.md), with flat MLM's value beside it.
ENCODER_RELIANCE_SHARE = 0.25
# The metrics of an ablated encoder, and how each is produced (`encoder_ablation`).
ABLATIONS = ("order_blind", "bypassed")
# Seed of the adjacent-pair swaps: fixed, so every run is asked about the same pairs.
SWAP_SEED = 4321
RELIANCE_KEYS = ("reliance_loss", "reliance_loss_order_blind", "reliance_loss_bypassed", "reliance_unigram_entropy")


class _ZeroAngles(nn.Module):
    """A rotary module at position 0 everywhere: no rotation, so attention cannot see order."""

    def __init__(self, rotary: nn.Module):
        super().__init__()
        self.rotary = rotary

    def forward(self, position_ids: torch.Tensor):
        return self.rotary(torch.zeros_like(position_ids))


class _NoPositions(nn.Module):
    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros((), device=position_ids.device)


@contextlib.contextmanager
def encoder_ablation(encoder: nn.Module, kind: str | None):
    """Within the block, `encoder` (a CrossBertModel) is order-blind ("order_blind") or has no blocks
    ("bypassed"); None leaves it as it is. Submodules are swapped and put back, the weights untouched."""
    if kind not in (None, *ABLATIONS):
        raise ValueError(f"encoder ablation: expected one of {ABLATIONS} or None, got {kind!r}")
    saved = {name: getattr(encoder, name) for name in ("rotary", "position_embeddings", "layers")}
    try:
        if kind == "order_blind":
            encoder.rotary = _ZeroAngles(saved["rotary"])
            if saved["position_embeddings"] is not None:
                encoder.position_embeddings = _NoPositions()
        elif kind == "bypassed":
            encoder.layers = nn.ModuleList()
        yield encoder
    finally:
        for name, module in saved.items():
            setattr(encoder, name, module)


def order_blind_share(loss: float, order_blind: float, unigram_entropy: float) -> float:
    """The share of the margin below the unigram entropy that the order-blind encoder loses (NaN when the
    margin is not positive: a run on or above the entropy has nothing to lose)."""
    margin = unigram_entropy - loss
    return (order_blind - loss) / margin if margin > 0 else math.nan


def carries_context(loss, order_blind, unigram_entropy) -> bool | None:
    """The encoder rule: True when the order-blind encoder loses at least ENCODER_RELIANCE_SHARE of the margin,
    None when a number is missing or the margin is under the plateau rule's PLATEAU_MARGIN: a share of a margin that
    small is noise (a run on the plateau has learned nothing for its encoder to carry), so it is no answer."""
    values = [loss, order_blind, unigram_entropy]
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in values):
        return None
    loss, order_blind, unigram_entropy = map(float, values)
    if unigram_entropy - loss < PLATEAU_MARGIN:
        return None
    return order_blind_share(loss, order_blind, unigram_entropy) >= ENCODER_RELIANCE_SHARE


@torch.no_grad()
def reliance_losses(model, ids: torch.Tensor, ratio: float, batch_size: int) -> dict[str, float]:
    """The shared-protocol loss at `ratio` with the encoder as trained, order-blind and bypassed."""
    selections = {ratio: protocol_selections(torch.ones_like(ids), (ratio,))[ratio]}
    out = {}
    for kind in (None, *ABLATIONS):
        with encoder_ablation(model.encoder, kind):
            total, count = shared_loss_sums(model, model.config, ids, selections, batch_size, torch.device("cpu"))[ratio]
        out["reliance_loss" + (f"_{kind}" if kind else "")] = total / max(count, 1)
    return out


def identity_share(states: torch.Tensor, ids: torch.Tensor) -> float:
    """Adjusted R^2 of one-way ANOVA of `states` (N, d) on the token ids (N,): the variance share token identity explains."""
    x = states.double()
    n = len(x)
    groups, inverse = torch.unique(ids, return_inverse=True)
    k = len(groups)
    if n - k < 1:
        return math.nan
    sums = torch.zeros(k, x.shape[1], dtype=x.dtype).index_add_(0, inverse, x)
    counts = torch.bincount(inverse, minlength=k).double()
    grand = x.mean(0)
    between = float((counts[:, None] * (sums / counts[:, None] - grand) ** 2).sum())
    total = float(((x - grand) ** 2).sum())
    if total == 0:
        return math.nan
    r2 = between / total
    return 1.0 - (1.0 - r2) * (n - 1) / (n - k)


def adjacent_swaps(ids: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row with one pair of adjacent, different tokens swapped (never the first or last position), and
    the swapped pair's first index per row (-1 where the row has no such pair)."""
    n, t = ids.shape
    different = ids[:, 1 : t - 2] != ids[:, 2 : t - 1]  # candidate i in [1, t - 2): swap i, i + 1
    scores = torch.rand(different.shape, generator=generator).masked_fill(~different, -1.0)
    first = scores.argmax(dim=1) + 1
    first = torch.where(different.any(dim=1), first, torch.full_like(first, -1))
    swapped = ids.clone()
    rows = torch.nonzero(first >= 0).squeeze(1)
    i = first[rows]
    swapped[rows, i], swapped[rows, i + 1] = ids[rows, i + 1], ids[rows, i]
    return swapped, first


@torch.no_grad()
def layer_reliance(encoder: nn.Module, ids: torch.Tensor, batch_size: int) -> dict[str, float]:
    """Per layer: token-identity share of the states' variance, and the pooled and neighbour change under one
    adjacent swap per sequence (module docstring)."""
    swapped, first = adjacent_swaps(ids, torch.Generator().manual_seed(SWAP_SEED))

    def states(batch_ids):
        hidden = [encoder(b, output_hidden_states=True).hidden_states for b in batch_ids.split(batch_size)]
        return [torch.cat(layer).float() for layer in zip(*hidden)]  # per layer (N, T, d)

    before, after = states(ids), states(swapped)
    keep = first >= 0
    neighbours = torch.ones(ids.shape, dtype=torch.bool)
    rows = torch.nonzero(keep).squeeze(1)
    neighbours[rows, first[rows]] = False
    neighbours[rows, first[rows] + 1] = False
    neighbours &= keep[:, None]
    out = {}
    for layer, (h, g) in enumerate(zip(before, after)):
        out[f"identity_share_l{layer}"] = identity_share(h.reshape(-1, h.shape[-1]), ids.reshape(-1))
        pooled, pooled_swapped = h.mean(1), g.mean(1)
        spread = (pooled - pooled.mean(0)).norm(dim=1).median()
        moved = (pooled_swapped - pooled).norm(dim=1)[keep]
        out[f"swap_pooled_l{layer}"] = float(moved.median() / spread) if spread > 0 and len(moved) else math.nan
        change = (g - h).norm(dim=-1) / h.norm(dim=-1).clamp(min=1e-12)
        out[f"swap_neighbour_l{layer}"] = float(change[neighbours].mean()) if neighbours.any() else math.nan
    return out


def encoder_reliance(model, ids: torch.Tensor, unigram_entropy: float | None, batch_size: int = 32) -> dict[str, float]:
    """Every reliance metric of a pre-training model (eval mode, CPU) on the sequences `ids` (N, T), at its own
    mask ratio, with the rule's inputs (`reliance_unigram_entropy`, `reliance_share`, `encoder_carries_context`)."""
    ratio = model.config.mask_ratio
    out = reliance_losses(model, ids, ratio, batch_size)
    entropy = math.nan if unigram_entropy is None else float(unigram_entropy)
    out["reliance_unigram_entropy"] = entropy
    out["reliance_share"] = order_blind_share(out["reliance_loss"], out["reliance_loss_order_blind"], entropy)
    carries = carries_context(out["reliance_loss"], out["reliance_loss_order_blind"], entropy)
    out["encoder_carries_context"] = carries
    out.update(layer_reliance(model.encoder, ids, batch_size))
    return out


def encoder_reliance_for_checkpoint(
    path: str | Path, eval_sequences: int | None = None, overrides: list[str] | None = None
) -> dict:
    """The encoder reliance of a checkpoint folder (runs/<name>/checkpoints/step_N) on its run's validation
    sequences (the first `eval_sequences`, default the run's own), against the unigram entropy of the same
    targets (recorded by the trainer, else computed)."""
    from .checkpoint import pretraining_model_from_pretrained, read_trainer_state
    from .data.sequences import prepare_data, unigram_counts
    from .plateau import protocol_unigram_entropies, unigram_entropy_key
    from .train_config import checkpoint_train_config

    path = Path(path)
    cfg = checkpoint_train_config(path, overrides)
    data = prepare_data(cfg.data)
    model = pretraining_model_from_pretrained(path).eval()
    n = min(eval_sequences if eval_sequences is not None else cfg.eval_sequences, len(data.val))
    ids = data.val.get(np.arange(n))
    ratio = model.config.mask_ratio
    key = unigram_entropy_key(ratio)
    entropy = (read_trainer_state(path).get("metrics") or {}).get(key)
    if entropy is None:
        entropy = protocol_unigram_entropies(unigram_counts(data.train, model.config.vocab_size), ids, ratio)[key]
    return {
        "reliance_sequences": n,
        "reliance_ratio_key": protocol_key("shared_loss", ratio),
        **encoder_reliance(model, ids, entropy, cfg.batch_size),
    }
