"""Masking as pure functions of (tokens, padding mask, the rows' randomness).

Masks are drawn outside the models, on the host. A row's randomness is a pure function of (run seed,
stream, step, the row's index in the global batch), held by `RowRandom`, and never of the batch it is
drawn in: a process that draws only its own rows of the global batch gets exactly those rows. So N
processes reproduce one process, and a resumed run reproduces the masks of the uninterrupted one (see
`crossbert_model.train`). The draws are SplitMix64 outputs (Steele, Lea & Flood 2014) at counters,
vectorised over rows and positions in numpy: no generator per row, no state carried between rows.

Two families:
* `mlm_masking`: BERT's corruption for the flat MLM (select `ratio` of the real tokens; of those
  80% -> [MASK], 10% -> random token, 10% kept).
* `complementary_views` / `random_views`: CrossBERT visibility masks, shape (B, K, T). A view is
  what the encoder sees; everything real and not visible in a view is a prediction query of it.

How many tokens a row predicts depends on its real-token count only, never on the draw
(`mlm_targets_per_row`, `crossbert_targets_per_row`): every process knows the global batch's count
without drawing the other rows. Which builder and which count a config uses is its objective's
(crossbert_model.objectives).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from .config import cms_num_views

# Which recipe drew the training masks, recorded in every checkpoint (a resume refuses another one):
# 1 = one torch generator per step over the whole global batch; 2 = `RowRandom`.
MASKING_SCHEME = 2

_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64's counter increment (the golden ratio in 64 bits)
_LANES = 2  # independent draws per (row, position): the random order, BERT's corruption
_ORDER_LANE, _CORRUPTION_LANE = 0, 1


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function, a bijection of 64-bit words (modifies and returns `z`)."""
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


@dataclass(frozen=True)
class RowRandom:
    """The randomness of a batch's masks: row i of the batch is global row `first_row + i` of step
    `step`, and its draws depend on (seed, stream, step, global row) only."""

    seed: int
    step: int = 0
    stream: int = 0  # 0: training steps; others for fixed sets (the validation masks)
    first_row: int = 0

    def from_row(self, row: int) -> RowRandom:
        """The same step's randomness for a batch whose first row is global row `row`."""
        return replace(self, first_row=row)

    def draws(self, rows: int, width: int, lane: int) -> np.ndarray:
        """(rows, width) uint64: draw t of `lane` for each row. Global row g has its own SplitMix64 stream,
        seeded by output g + 1 of a stream seeded by (seed, stream, step); its draw t of a lane is that
        stream's output t * _LANES + lane + 1 (interleaved lanes keep each row's counters in a short range)."""
        root = np.random.SeedSequence([self.seed, self.stream, self.step]).generate_state(1, dtype=np.uint64)
        index = np.arange(self.first_row + 1, self.first_row + rows + 1, dtype=np.uint64)
        keys = _mix64(root + index * _GAMMA)
        counters = (np.arange(width, dtype=np.uint64) * np.uint64(_LANES) + np.uint64(lane + 1)) * _GAMMA
        return _mix64(keys[:, None] + counters[None, :])


def _count(n_real: np.ndarray, ratio: float) -> np.ndarray:
    """round(ratio * n) of each row's n real tokens (float64, half to even, as Python's round), at
    least 1 and at most n."""
    return np.minimum(np.maximum(np.round(n_real * ratio), 1), n_real).astype(np.int64)


def random_ranks(attention_mask: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """A uniformly random order of each row's real tokens from a torch generator: rank 0..n-1 on real
    tokens, >= n on padding. Only the shared protocol's fixed selection uses it (crossbert_model.shared_loss:
    its positions must stay those of the recorded losses); training masks use `order_keys`."""
    noise = torch.rand(attention_mask.shape, generator=generator, device=attention_mask.device)
    noise = noise.masked_fill(~attention_mask.bool(), 2.0)  # padding sorts last
    order = noise.argsort(dim=1)
    return order.argsort(dim=1)


def order_keys(real: np.ndarray, rng: RowRandom) -> np.ndarray:
    """(rows, T) keys whose order is a uniformly random order of each row's real tokens, padding after
    them. Random high bits, the position in the low bits: no two keys of a row are equal, so "the k
    smallest" is exactly k tokens. 32-bit keys up to T = 1024 (numpy partitions them with SIMD, several
    times faster than 64-bit ones): 21+ random bits, so one row in 30 at T = 512 has a tied pair, which
    then keeps its position order (a bias below 1e-4 on any token's chance); 64-bit keys beyond."""
    rows, width = real.shape
    bits = max(1, (width - 1).bit_length())
    word, dtype = (32, np.uint32) if bits <= 10 else (64, np.uint64)
    random_bits = word - 1 - bits  # the top bit is the padding's
    positions = np.arange(width, dtype=np.uint64)
    keys = (rng.draws(rows, width, _ORDER_LANE) >> np.uint64(64 - random_bits)) << np.uint64(bits) | positions
    return np.where(real, keys, np.uint64(1 << (word - 1)) | positions).astype(dtype)


def smallest(keys: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """(rows, J, T) bool: whether each key is among the counts[r, j] smallest of its row (counts: (rows, J)).
    A numpy partition per count the batch holds (linear in T; one for packed rows), where ranking every
    token takes a sort, which torch does ten times slower on the CPU."""
    threshold = np.zeros(counts.shape, dtype=keys.dtype)
    for count in np.unique(counts[counts > 0]):
        kth = np.partition(keys, count - 1, axis=1)[:, count - 1 : count]  # (rows, 1): each row's count-th smallest
        threshold = np.where(counts == count, kth, threshold)
    return (keys[:, None, :] <= threshold[:, :, None]) & (counts > 0)[:, :, None]


def mlm_masking(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    mask_ratio: float,
    mask_token_id: int,
    vocab_size: int,
    num_special_tokens: int,
    rng: RowRandom,
    mask_prob: float = 0.8,
    random_prob: float = 0.1,
) -> dict[str, torch.Tensor]:
    """BERT corruption. Exactly round(ratio * n) of each row's n real tokens are selected (at least 1),
    so the number of predicted tokens per sequence does not fluctuate.

    Returns `input_ids` (corrupted) and `labels` (original id at selected positions, -100 elsewhere).
    """
    ids, real = input_ids.cpu().numpy(), attention_mask.cpu().bool().numpy()
    selected = smallest(order_keys(real, rng), _count(real.sum(axis=1, keepdims=True), mask_ratio))[:, 0]
    # One draw per position: its high 32 bits choose [MASK] / random / kept, its low 32 bits the random id.
    draw = rng.draws(*ids.shape, _CORRUPTION_LANE)
    action = (draw >> np.uint64(32)).astype(np.float64) * 2.0**-32
    span = np.uint64(vocab_size - num_special_tokens)
    random_ids = ((draw & np.uint64(0xFFFFFFFF)) * span >> np.uint64(32)).astype(np.int64) + num_special_tokens
    to_mask = selected & (action < mask_prob)
    to_random = selected & (action >= mask_prob) & (action < mask_prob + random_prob)
    corrupted = np.where(to_mask, mask_token_id, np.where(to_random, random_ids, ids))
    labels = np.where(selected, ids, -100)
    device = input_ids.device
    return {
        "input_ids": torch.from_numpy(corrupted).to(device),
        "attention_mask": attention_mask,
        "labels": torch.from_numpy(labels).to(device),
    }


def complementary_views(attention_mask: torch.Tensor, num_views: int, rng: RowRandom) -> torch.Tensor:
    """Complementary Masking Strategy: partition each row's real tokens into `num_views` random groups
    of equal size (sizes differ by at most one); view k sees group k and masks the rest.

    Returns a bool tensor (B, K, T): visible[b, k, t]. Over k, every real token is visible exactly once.
    """
    real = attention_mask.cpu().bool().numpy()
    n = real.sum(axis=1, keepdims=True)
    # Group k takes the ceil((n - k) / K) tokens after groups 0..k-1 in the random order (sizes as
    # round-robin dealing gives them): group = how many of the K - 1 boundaries a token lies beyond.
    sizes = (n - np.arange(num_views) + num_views - 1) // num_views
    beyond = ~smallest(order_keys(real, rng), np.cumsum(sizes, axis=1)[:, :-1])
    group = beyond.sum(axis=1)
    visible = (group[:, None, :] == np.arange(num_views)[None, :, None]) & real[:, None, :]
    return torch.from_numpy(visible).to(attention_mask.device)


def random_views(attention_mask: torch.Tensor, mask_ratio: float, rng: RowRandom) -> torch.Tensor:
    """CMS off: one random mask per row, keeping round((1 - ratio) * n) tokens visible (at least 1).

    Returns a bool tensor (B, 1, T).
    """
    real = attention_mask.cpu().bool().numpy()
    visible = smallest(order_keys(real, rng), _count(real.sum(axis=1, keepdims=True), 1.0 - mask_ratio))
    return torch.from_numpy(visible).to(attention_mask.device)


def crossbert_views(attention_mask: torch.Tensor, *, mask_ratio: float, complementary: bool, rng: RowRandom) -> torch.Tensor:
    if complementary:
        return complementary_views(attention_mask, cms_num_views(mask_ratio), rng)
    return random_views(attention_mask, mask_ratio, rng)


def mlm_targets_per_row(n_real: torch.Tensor, config) -> torch.Tensor:
    """How many tokens each row of a flat MLM predicts, from its real-token count n alone (the draw
    decides which, never how many): round(r n)."""
    return torch.from_numpy(_count(n_real.cpu().numpy().astype(np.int64), config.mask_ratio))


def crossbert_targets_per_row(n_real: torch.Tensor, config) -> torch.Tensor:
    """How many tokens each row of a CrossBERT predicts, from its real-token count n alone: CMS every
    token in the K - 1 views that mask it, except that a view with no visible token (n < K) predicts
    nothing; random views n - round((1 - r) n)."""
    n = n_real.cpu().numpy().astype(np.int64)
    if config.complementary_masking:
        counts = (np.minimum(n, cms_num_views(config.mask_ratio)) - 1).clip(min=0) * n
    else:
        counts = n - _count(n, 1.0 - config.mask_ratio)
    return torch.from_numpy(counts)


def pack_positions(select: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Left-pack the True positions of each row, keeping their order.

    select: (N, T) bool. Returns (positions, valid), both (N, L) with L = max True count per row;
    positions of invalid (padding) slots point at 0; `valid` is None when every row has L (packed
    sequences: no mask to build, send or apply). L is read from the data (a host-device
    synchronisation on an accelerator): the trainer packs on the host, see `mlm_batch` / `crossbert_batch`.
    """
    n, t = select.shape
    counts = select.sum(dim=1)
    length = int(counts.max()) if n else 0
    # The k-th selected position of a row goes to column k (1-based), every other one to column 0, which
    # is cut off: a cumulative sum and one scatter, linear in T and on any device, where a sort costs T log T.
    slot = select.cumsum(dim=1) * select
    positions = torch.zeros(n, length + 1, dtype=torch.long, device=select.device)
    positions.scatter_(1, slot, torch.arange(t, device=select.device).expand(n, t))
    uniform = n == 0 or int(counts.min()) == length
    valid = None if uniform else torch.arange(length, device=select.device) < counts.unsqueeze(1)
    return positions[:, 1:], valid


def none_if_all(valid: torch.Tensor) -> torch.Tensor | None:
    """None for a mask with no False entry: the models then skip masking (SDPA's unmasked kernels)
    and boolean indexing (a data-dependent shape, so a host-device synchronisation)."""
    return None if bool(valid.all()) else valid


def mlm_targets(labels: torch.Tensor) -> dict:
    """Where the flat MLM predicts: the selected positions of each row, left-packed (B, L)."""
    positions, valid = pack_positions(labels != -100)
    return {"target_positions": positions, "target_valid": valid}


def crossbert_packing(visible: torch.Tensor, attention_mask: torch.Tensor | None) -> dict:
    """The index tensors of a CrossBERT pass, shape (B, K, L): encoder input = the visible tokens of
    each view, left-packed with their original positions; queries = its masked real tokens. A view
    with no visible token (a sequence shorter than K) has nothing to predict from: no valid query."""
    b, k, t = visible.shape
    rows = visible.reshape(b * k, t)
    masked = ~rows if attention_mask is None else attention_mask.bool().unsqueeze(1).expand(b, k, t).reshape(b * k, t) & ~rows
    enc_positions, enc_valid = pack_positions(rows)
    query_positions, query_valid = pack_positions(masked)
    if enc_valid is not None and not bool(enc_valid[:, 0].all()):  # some view sees nothing
        seeing = enc_valid[:, :1].expand_as(query_positions)
        query_valid = none_if_all(seeing if query_valid is None else query_valid & seeing)

    def views(x):
        return None if x is None else x.reshape(b, k, -1)

    return {
        "encoder_positions": views(enc_positions),
        "encoder_valid": views(enc_valid),
        "query_positions": views(query_positions),
        "query_valid": views(query_valid),
    }


# The batch builders of the objectives (crossbert_model.objectives: `pretraining_batch` picks one). Each
# builds on the host (CPU), where reading the data costs no synchronisation: every data-dependent shape
# (how many tokens each view sees, how many each row predicts) is decided here, so the step on an
# accelerator runs without waiting for the device. `attention_mask` goes to the model as None when no
# row is padded (packed pre-training sequences), and so do the validity masks when every row has the
# same count (always, for packed sequences when K divides the length).


def mlm_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor, config, rng: RowRandom) -> dict:
    """A flat MLM's inputs: BERT's corruption of the selected tokens, and where they are, left-packed."""
    batch = mlm_masking(
        input_ids,
        attention_mask,
        mask_ratio=config.mask_ratio,
        mask_token_id=config.mask_token_id,
        vocab_size=config.vocab_size,
        num_special_tokens=config.num_special_tokens,
        rng=rng,
        mask_prob=config.mlm_mask_prob,
        random_prob=config.mlm_random_prob,
    )
    return {**batch, "attention_mask": none_if_all(attention_mask.bool()), **mlm_targets(batch["labels"])}


def crossbert_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor, config, rng: RowRandom) -> dict:
    """A CrossBERT's inputs: the uncorrupted tokens, the views (CMS or random) and their packing."""
    real = none_if_all(attention_mask.bool())
    visible = crossbert_views(attention_mask, mask_ratio=config.mask_ratio, complementary=config.complementary_masking, rng=rng)
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
