"""The unigram plateau: the loss of a model that knows token frequencies and nothing else.

A masked-token model first learns which tokens are frequent. Predicting every target from the unigram
distribution of the training split costs that distribution's cross-entropy on the targets (about 6.9
nats on the main job's corpus and tokenizer); a model whose loss is still there has learnt no context,
and comparing the frozen features of two such models compares noise. The plateau rule: a run is **off
the plateau** when its shared-protocol loss at its own training ratio is at least `PLATEAU_MARGIN`
below the unigram entropy of the same targets; a comparison that involves a run on the plateau gives
no verdict.

The trainer records, once at the start of a run (run_info.json and every evaluation row):
* `unigram_entropy_val`: over the targets `val_loss` scores (the objective's own masks);
* `unigram_entropy_r15`, `unigram_entropy_r50`, ...: over exactly the targets `shared_loss_r15`, ...
  score (crossbert_model.shared_loss: the same sequences and seeded selections, at every ratio).

    counts = unigram_counts(data.train, vocab_size)          # crossbert_model.data.sequences
    unigram_cross_entropy(counts, target_ids)                # nats
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .shared_loss import SHARED_LOSS_RATIOS, protocol_key, protocol_ratios, protocol_selections

# The plateau rule: a run is off the unigram plateau when its own-ratio shared-protocol loss is at least this
# many nats below the unigram entropy of the same targets. Half a nat is a model that puts, on average,
# e^0.5 = 1.65x the unigram probability on the right token: context is being used, beyond noise.
PLATEAU_MARGIN = 0.5
# Add-one (Laplace) smoothing over the model's vocabulary: p(t) = (count(t) + 1) / (N + V). A token the
# training split never holds (a special token, a rare piece) gets a finite loss, ln(N + V) nats.
SMOOTHING = "add-one (Laplace) over the vocabulary"

UNIGRAM_ENTROPY_VAL = "unigram_entropy_val"


def unigram_entropy_key(ratio: float) -> str:
    """`unigram_entropy_r15`: the entropy over the targets of `shared_loss_r15` (names from protocol_key)."""
    return protocol_key("unigram_entropy", ratio)


UNIGRAM_ENTROPY_KEYS = {ratio: unigram_entropy_key(ratio) for ratio in SHARED_LOSS_RATIOS}


def unigram_entropy_key_for(loss_key: str) -> str:
    """The entropy to read a loss against: val_loss -> unigram_entropy_val, shared_loss_r50 -> unigram_entropy_r50."""
    return UNIGRAM_ENTROPY_VAL if loss_key == "val_loss" else loss_key.replace("shared_loss", "unigram_entropy", 1)


def unigram_cross_entropy(counts: np.ndarray, target_ids) -> float:
    """Mean -ln p(t) over `target_ids` (any shape; each occurrence counts), in nats, under the
    add-one-smoothed unigram distribution of `counts` (one count per vocabulary id)."""
    counts = np.asarray(counts, dtype=np.float64)
    targets = np.asarray(target_ids.cpu() if torch.is_tensor(target_ids) else target_ids, dtype=np.int64).ravel()
    if targets.size == 0:
        return math.nan
    log_p = np.log(counts + 1.0) - np.log(counts.sum() + len(counts))
    return float(-log_p[targets].mean())


def protocol_unigram_entropies(counts: np.ndarray, val_ids: torch.Tensor, own_ratio: float | None = None) -> dict[str, float]:
    """`unigram_entropy_r15`, ...: over the targets the shared protocol scores on the sequences `val_ids`
    (N, T), at each of its ratios (and `own_ratio`: protocol_ratios)."""
    selections = protocol_selections(torch.ones_like(val_ids), protocol_ratios(own_ratio))
    return {unigram_entropy_key(r): unigram_cross_entropy(counts, val_ids[selected]) for r, selected in selections.items()}


def plateau_margin(own_ratio_shared_loss: float | None, unigram_entropy: float | None) -> float:
    """How many nats the loss is below the unigram entropy of its targets (NaN when either is unknown)."""
    if own_ratio_shared_loss is None or unigram_entropy is None:
        return math.nan
    return float(unigram_entropy) - float(own_ratio_shared_loss)


def off_plateau(own_ratio_shared_loss: float | None, unigram_entropy: float | None) -> bool | None:
    """The plateau rule: True when the run's shared-protocol loss at its own training ratio is at least
    PLATEAU_MARGIN below the unigram entropy of the same targets, False when it is not, None when
    either number is unknown (a run recorded before either existed)."""
    margin = plateau_margin(own_ratio_shared_loss, unigram_entropy)
    return None if math.isnan(margin) else margin >= PLATEAU_MARGIN


def plateau_metric_keys(own_ratio: float) -> list[str]:
    """The metric names a run records for the plateau: its shared losses and the unigram entropies of
    their targets at each of its protocol ratios, and the validation one."""
    ratios = protocol_ratios(own_ratio)
    return [*(protocol_key("shared_loss", r) for r in ratios), UNIGRAM_ENTROPY_VAL, *(unigram_entropy_key(r) for r in ratios)]
