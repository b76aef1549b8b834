"""A masked-token loss that flat MLM and CrossBERT answer identically (the "shared protocol").

Each objective's native validation loss answers its own task: BERT's 80/10/10 corruption lets the
model copy its 10% kept targets from the input, CrossBERT's encoder never sees a masked token, and
the mask ratios differ. Those numbers must not be compared. The shared protocol asks both models the
same question:

* the same fixed held-out sequences (the trainer's validation split, its first `eval_sequences`);
* the same selected positions: exactly round(r * n) of each sequence's n real tokens, drawn from a
  generator seeded by `SHARED_LOSS_SEED` alone (never by the run seed, the model or the objective);
* flat MLM: every selected token -> [MASK] (no random, no kept token), loss on the selected ones;
* CrossBERT: one view whose visible tokens are exactly the unselected ones; the predictor answers
  the selected ones;
* loss = sum of cross-entropies / number of selected tokens, over the whole set.

    from crossbert_model.shared_loss import shared_losses_for_checkpoint
    shared_losses_for_checkpoint("runs/tiny_mlm/checkpoints/step_0000300")
    # {"shared_loss_r15": ..., "shared_loss_r50": ..., "shared_targets_r15": ..., ...}

A run whose own mask ratio is not one of SHARED_LOSS_RATIOS is also scored at that ratio
(`protocol_ratios`; a flat MLM at 0.3 records `shared_loss_r30`), so the loss at its own ratio, which
decides whether it is off the unigram plateau (crossbert_model.plateau), is always measured exactly.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import torch

from .errors import CrossbertError
from .masking import random_ranks
from .objectives import objective_of
from .run_layout import CheckpointDir
from .train_config import checkpoint_train_config

# The protocol's mask ratios: 0.15 is BERT's training ratio, 0.5 CrossBERT's default (and where CMS
# gives K = 2 exact complements), so each objective is also scored at the other's working point. A run
# trained at another ratio is scored at its own ratio too (`protocol_ratios`).
SHARED_LOSS_RATIOS = (0.15, 0.5)
# The one seed of the protocol's selections. Fixed forever: changing it changes every shared loss
# ever recorded, so runs scored before and after would no longer be comparable.
SHARED_LOSS_SEED = 1234


def protocol_key(quantity: str, ratio: float) -> str:
    """The one naming of a per-ratio metric (metrics.jsonl, trainer_state.json, sweep tables):
    protocol_key("shared_loss", 0.15) == "shared_loss_r15"; a ratio that is not a whole percent keeps
    two decimals of it, with 'p' for the point (2/3 -> "r66p67")."""
    return f"{quantity}_r{round(100 * ratio, 2):g}".replace(".", "p")


def protocol_ratios(own_ratio: float | None = None) -> tuple[float, ...]:
    """The ratios a run is scored at: SHARED_LOSS_RATIOS, plus its own training ratio when that is not
    one of them, so that its loss at its own ratio is always measured exactly."""
    return tuple(sorted(set(SHARED_LOSS_RATIOS) | ({own_ratio} if own_ratio is not None else set())))


# The metric names of the protocol's fixed ratios: the loss, and how many tokens it averages.
SHARED_LOSS_KEYS = {ratio: protocol_key("shared_loss", ratio) for ratio in SHARED_LOSS_RATIOS}
SHARED_TARGETS_KEYS = {ratio: protocol_key("shared_targets", ratio) for ratio in SHARED_LOSS_RATIOS}
SHARED_LOSS_R15, SHARED_LOSS_R50 = SHARED_LOSS_KEYS[0.15], SHARED_LOSS_KEYS[0.5]


class SharedLossError(CrossbertError, ValueError):
    """A bad argument of the shared protocol (a ratio, a checkpoint folder)."""


def protocol_generator() -> torch.Generator:
    """The protocol's selection RNG. The same for every ratio, so that (rank-based) selections nest:
    the r = 0.15 positions of a sequence are a subset of its r = 0.5 positions."""
    return torch.Generator().manual_seed(SHARED_LOSS_SEED)


def protocol_selection(attention_mask: torch.Tensor, ratio: float, generator: torch.Generator) -> torch.Tensor:
    """(B, T) bool: exactly round(ratio * n) of each row's n real tokens, uniformly at random.

    At most n - 1 are selected, so CrossBERT's encoder always has a visible token to read; a row that
    would lose its last visible token would otherwise count for flat MLM and not for CrossBERT.
    Drawn on the CPU from `generator` only, so the selection does not depend on device or model."""
    if not (isinstance(ratio, (int, float)) and 0.0 < ratio < 1.0):
        raise SharedLossError(f"shared-protocol field 'ratio': expected a number in (0, 1), got {ratio!r}")
    real = attention_mask.detach().cpu().bool()
    n_real = real.sum(dim=1, keepdim=True)
    # in float64, as Python's round(ratio * n): float32's ratio can land on the other side of an x.5
    n_select = torch.round(n_real.double() * ratio).long()
    n_select = torch.minimum(n_select, (n_real - 1).clamp(min=0))
    return (random_ranks(real, generator) < n_select) & real


def protocol_batch(config, input_ids: torch.Tensor, attention_mask: torch.Tensor, selected: torch.Tensor) -> dict:
    """The model inputs that ask the model of `config` to predict exactly the `selected` tokens, as its
    objective puts them (crossbert_model.objectives). Flat MLM: every selected token -> [MASK], nothing
    else changed; labels at the selected ones. CrossBERT: one view (B, 1, T) in which the visible tokens
    are the real, unselected ones."""
    selected = selected.to(input_ids.device) & attention_mask.bool()
    return objective_of(config).protocol_batch(config, input_ids, attention_mask, selected)


def shared_protocol_loss(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, ratio: float, generator: torch.Generator, config=None
) -> tuple[torch.Tensor, int]:
    """(sum of cross-entropies, number of selected tokens) of one batch under the shared protocol.

    `config` defaults to `model.config` (pass it for a wrapped model); the objective decides how the
    selection is put to the model. The caller divides summed sums by summed counts, never averages
    per-batch means."""
    config = config if config is not None else model.config
    selected = protocol_selection(attention_mask, ratio, generator)
    out = model(**protocol_batch(config, input_ids, attention_mask, selected))
    return out.loss_sum, int(out.num_predicted)


def protocol_selections(attention_mask: torch.Tensor, ratios=SHARED_LOSS_RATIOS) -> dict[float, torch.Tensor]:
    """The selection of every ratio for a whole evaluation set (N, T), drawn at once: the masks do not
    depend on the batch size, the number of processes, or which other ratios are evaluated."""
    return {ratio: protocol_selection(attention_mask, ratio, protocol_generator()) for ratio in ratios}


def shared_loss_sums(
    model,
    config,
    input_ids: torch.Tensor,
    selections: dict[float, torch.Tensor],
    batch_size: int,
    device,
    autocast=None,
    rows=None,
    attention_mask: torch.Tensor | None = None,
) -> dict[float, tuple[float, int]]:
    """(loss sum, count) per ratio over an evaluation set (N, T); `attention_mask` defaults to none
    padded (packed pre-training sequences).

    `rows(batch_rows) -> (lo, hi)` picks this process's share of each batch (DDP: the caller
    all-reduces the sums); `autocast` is a context-manager factory (the run's precision)."""
    attention_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    totals = {ratio: [0.0, 0] for ratio in selections}
    for start in range(0, len(input_ids), batch_size):
        stop = min(start + batch_size, len(input_ids))
        lo, hi = rows(stop - start) if rows is not None else (0, stop - start)
        ids = input_ids[start + lo : start + hi].to(device)
        mask = attention_mask[start + lo : start + hi].to(device)
        for ratio, selected in selections.items():
            batch = protocol_batch(config, ids, mask, selected[start + lo : start + hi])
            with autocast() if autocast is not None else contextlib.nullcontext():
                out = model(**batch)
            totals[ratio][0] += float(out.loss_sum)
            totals[ratio][1] += int(out.num_predicted)
    return {ratio: (total, count) for ratio, (total, count) in totals.items()}


def shared_loss_metrics(sums: dict[float, tuple[float, int]]) -> dict:
    """Metric rows: `shared_loss_r15` = sum / count over the whole set, and its token count
    (`shared_targets_r15`), for every ratio of `sums` (names: protocol_key)."""
    metrics = {}
    for ratio, (total, count) in sums.items():
        metrics[protocol_key("shared_loss", ratio)] = total / max(count, 1)
        metrics[protocol_key("shared_targets", ratio)] = int(count)
    return metrics


def shared_losses_for_checkpoint(
    path: str | Path,
    overrides: list[str] | None = None,
    eval_sequences: int | None = None,
    batch_size: int | None = None,
    dtype: str = "fp32",
    device: str = "cpu",
) -> dict:
    """The shared-protocol losses of an existing checkpoint folder (runs/<name>/checkpoints/step_N),
    on the validation sequences of its run (data settings from the run's config.yaml, see
    `checkpoint_train_config`), at every ratio of `protocol_ratios` (the model's own included).

    The same numbers `Trainer.evaluate` records for runs trained since, given the same eval_sequences
    and dtype; also scores runs trained before the protocol existed. (The unigram entropies of the
    same targets: crossbert_model.validation.unigram_entropies_for_checkpoint.)"""
    from .checkpoint import pretraining_model_from_pretrained, read_trainer_state
    from .data.sequences import prepare_data
    from .data.tokenizer import check_tokenizer_matches
    from .hardware import torch_autocast_dtype
    from .utils import set_offline_env

    set_offline_env()
    if dtype not in ("fp32", "bf16"):
        raise SharedLossError(f"shared-protocol field 'dtype': expected fp32 or bf16, got {dtype!r}")
    path = Path(path)
    cfg, config_file = checkpoint_train_config(path, overrides), CheckpointDir(path).run.config  # a run's: checked above
    data = prepare_data(cfg.data)
    model = pretraining_model_from_pretrained(path).to(device).eval()
    check_tokenizer_matches(model.config, data.tokenizer, f"tokenizer of {config_file}")
    n = min(eval_sequences if eval_sequences is not None else cfg.eval_sequences, len(data.val))
    if n == 0:
        raise SharedLossError(f"{config_file}: the run's validation split is empty (data.val_fraction): nothing to score")
    ids = data.val.get(np.arange(n))
    selections = protocol_selections(torch.ones_like(ids), protocol_ratios(model.config.mask_ratio))
    amp = torch_autocast_dtype(dtype)
    with torch.no_grad():
        sums = shared_loss_sums(
            model,
            model.config,
            ids,
            selections,
            batch_size or cfg.batch_size,
            torch.device(device),
            autocast=lambda: torch.autocast(torch.device(device).type, dtype=amp or torch.float32, enabled=amp is not None),
        )
    step = read_trainer_state(path).get("step")
    return {"checkpoint": str(path), "step": step, "eval_sequences": n, "dtype": dtype, **shared_loss_metrics(sums)}
