"""Masking as pure functions of (tokens, padding mask, random generator).

Masks are drawn outside the models, from a generator seeded by (run seed, step), for the whole global
batch. That makes a training step a deterministic function of the step number, so resuming and
multi-process training reproduce the same masks (see `crossbert_model.train`).

Two families:
* `mlm_masking`: BERT's corruption for the flat MLM (select `ratio` of the real tokens; of those
  80% -> [MASK], 10% -> random token, 10% kept).
* `complementary_views` / `random_views`: CrossBERT visibility masks, shape (B, K, T). A view is
  what the encoder sees; everything real and not visible in a view is a prediction query of it.
"""

from __future__ import annotations

import torch

from .config import cms_num_views


def random_ranks(attention_mask: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """A uniformly random order of each row's real tokens: rank 0..n-1 on real tokens, >= n on padding."""
    noise = torch.rand(attention_mask.shape, generator=generator, device=attention_mask.device)
    noise = noise.masked_fill(~attention_mask.bool(), 2.0)  # padding sorts last
    order = noise.argsort(dim=1)
    return order.argsort(dim=1)


def mlm_masking(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    mask_ratio: float,
    mask_token_id: int,
    vocab_size: int,
    num_special_tokens: int,
    generator: torch.Generator | None = None,
    mask_prob: float = 0.8,
    random_prob: float = 0.1,
) -> dict[str, torch.Tensor]:
    """BERT corruption. Exactly round(ratio * n) of each row's n real tokens are selected (at least 1),
    so the number of predicted tokens per sequence does not fluctuate.

    Returns `input_ids` (corrupted) and `labels` (original id at selected positions, -100 elsewhere).
    """
    real = attention_mask.bool()
    n_real = real.sum(dim=1, keepdim=True)
    n_select = torch.clamp(torch.round(n_real * mask_ratio), min=1).to(n_real.dtype)
    selected = (random_ranks(real, generator) < n_select) & real

    action = torch.rand(input_ids.shape, generator=generator, device=input_ids.device)
    to_mask = selected & (action < mask_prob)
    to_random = selected & (action >= mask_prob) & (action < mask_prob + random_prob)
    random_ids = torch.randint(num_special_tokens, vocab_size, input_ids.shape, generator=generator, device=input_ids.device)

    corrupted = torch.where(to_mask, torch.full_like(input_ids, mask_token_id), input_ids)
    corrupted = torch.where(to_random, random_ids, corrupted)
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, -100))
    return {"input_ids": corrupted, "attention_mask": attention_mask, "labels": labels}


def complementary_views(
    attention_mask: torch.Tensor, num_views: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Complementary Masking Strategy: partition each row's real tokens into `num_views` random groups
    of equal size (sizes differ by at most one); view k sees group k and masks the rest.

    Returns a bool tensor (B, K, T): visible[b, k, t]. Over k, every real token is visible exactly once.
    """
    real = attention_mask.bool()
    group = random_ranks(real, generator) % num_views  # consecutive ranks go round-robin over views
    views = torch.arange(num_views, device=real.device).view(1, num_views, 1)
    return (group.unsqueeze(1) == views) & real.unsqueeze(1)


def random_views(attention_mask: torch.Tensor, mask_ratio: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """CMS off: one random mask per row, keeping round((1 - ratio) * n) tokens visible (at least 1).

    Returns a bool tensor (B, 1, T).
    """
    real = attention_mask.bool()
    n_real = real.sum(dim=1, keepdim=True)
    n_visible = torch.clamp(torch.round(n_real * (1.0 - mask_ratio)), min=1).to(n_real.dtype)
    return ((random_ranks(real, generator) < n_visible) & real).unsqueeze(1)


def crossbert_views(
    attention_mask: torch.Tensor, *, mask_ratio: float, complementary: bool, generator: torch.Generator | None = None
) -> torch.Tensor:
    if complementary:
        return complementary_views(attention_mask, cms_num_views(mask_ratio), generator)
    return random_views(attention_mask, mask_ratio, generator)


def pack_positions(select: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pack the True positions of each row, keeping their order.

    select: (N, T) bool. Returns (positions, valid), both (N, L) with L = max True count per row;
    positions of invalid (padding) slots point at 0. L is read from the data (a host-device
    synchronisation on an accelerator): the trainer packs on the host, see `pretraining_batch`.
    """
    n, t = select.shape
    arange = torch.arange(t, device=select.device)
    key = torch.where(select, arange, arange + t)  # selected first, in position order
    length = int(select.sum(dim=1).max().item()) if n else 0
    positions = key.argsort(dim=1)[:, :length]
    valid = torch.gather(select, 1, positions)
    return positions.masked_fill(~valid, 0), valid


def none_if_all(valid: torch.Tensor) -> torch.Tensor | None:
    """None for a mask with no False entry: the models then skip masking (SDPA's unmasked kernels)
    and boolean indexing (a data-dependent shape, so a host-device synchronisation)."""
    return None if bool(valid.all()) else valid


def mlm_targets(labels: torch.Tensor) -> dict:
    """Where the flat MLM predicts: the selected positions of each row, left-packed (B, L)."""
    positions, valid = pack_positions(labels != -100)
    return {"target_positions": positions, "target_valid": none_if_all(valid)}


def crossbert_packing(visible: torch.Tensor, attention_mask: torch.Tensor | None) -> dict:
    """The index tensors of a CrossBERT pass, shape (B, K, L): encoder input = the visible tokens of
    each view, left-packed with their original positions; queries = its masked real tokens. A view
    with no visible token (a sequence shorter than K) has nothing to predict from: no valid query."""
    b, k, t = visible.shape
    rows = visible.reshape(b * k, t)
    real = torch.ones_like(rows) if attention_mask is None else attention_mask.bool().unsqueeze(1).expand(b, k, t).reshape(b * k, t)
    enc_positions, enc_valid = pack_positions(rows)
    query_positions, query_valid = pack_positions(real & ~rows)
    query_valid = query_valid & enc_valid.any(dim=1, keepdim=True)

    def views(x):
        return x.reshape(b, k, -1)

    return {
        "encoder_positions": views(enc_positions),
        "encoder_valid": none_if_all(views(enc_valid)),
        "query_positions": views(query_positions),
        "query_valid": none_if_all(views(query_valid)),
    }


def pretraining_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor, config, generator: torch.Generator | None) -> dict:
    """The model inputs of one pre-training step for `config.objective` (masks drawn from `generator`).

    Built on the host (CPU), where reading the data costs no synchronisation: every data-dependent
    shape (how many tokens each view sees, how many each row predicts) is decided here, so the step
    on an accelerator runs without waiting for the device. `attention_mask` is None when no row is
    padded (packed pre-training sequences), and so are the validity masks when every row has the
    same count (always, for packed sequences when K divides the length)."""
    real = none_if_all(attention_mask.bool())
    if config.objective == "mlm":
        batch = mlm_masking(
            input_ids,
            attention_mask,
            mask_ratio=config.mask_ratio,
            mask_token_id=config.mask_token_id,
            vocab_size=config.vocab_size,
            num_special_tokens=config.num_special_tokens,
            generator=generator,
            mask_prob=config.mlm_mask_prob,
            random_prob=config.mlm_random_prob,
        )
        return {**batch, "attention_mask": real, **mlm_targets(batch["labels"])}
    visible = crossbert_views(
        attention_mask, mask_ratio=config.mask_ratio, complementary=config.complementary_masking, generator=generator
    )
    return {"input_ids": input_ids, "attention_mask": real, "visible": visible, **crossbert_packing(visible, real)}


def num_targets(batch: dict) -> int:
    """How many tokens the batch asks the model to predict (the loss normaliser)."""
    if "labels" in batch:
        return int((batch["labels"] != -100).sum())
    packing = batch if "query_positions" in batch else crossbert_packing(batch["visible"], batch.get("attention_mask"))
    valid = packing["query_valid"]
    return packing["query_positions"].numel() if valid is None else int(valid.sum())


def target_ids(batch: dict) -> torch.Tensor:
    """The original ids of the tokens the batch asks the model to predict, one entry per prediction
    (as many as `num_targets`): a flat MLM's labels, a CrossBERT's queried tokens of every view."""
    if "labels" in batch:
        return batch["labels"][batch["labels"] != -100]
    packing = batch if "query_positions" in batch else crossbert_packing(batch["visible"], batch.get("attention_mask"))
    positions, valid = packing["query_positions"], packing["query_valid"]
    ids = batch["input_ids"].unsqueeze(1).expand(-1, positions.shape[1], -1).gather(2, positions)
    return ids.reshape(-1) if valid is None else ids[valid]
