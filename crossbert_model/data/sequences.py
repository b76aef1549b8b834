"""Sequences for training: a training sequence is [CLS] + (seq_len - 2) consecutive corpus tokens + [SEP]; documents
are separated by [SEP] in the stream. Which sequences form the batch of step s is a pure function of (seed, s), so
resumed and multi-process runs read exactly the same batches. prepare_data: corpus -> tokenizer -> token cache ->
packed train / val sequences."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..data_args import DataArgs
from .errors import DataError
from .token_cache import ShardedTokens, map_shard, read_meta, tokenize_corpus
from .tokenizer import prepare_tokenizer


class PackedSequences:
    """Fixed-length [CLS] window [SEP] sequences over a memory-mapped token stream (sharded, or one array)."""

    def __init__(self, tokens: ShardedTokens | np.ndarray, seq_len: int, cls_id: int, sep_id: int):
        if seq_len < 3:
            raise DataError(f"data.seq_len must be at least 3, got {seq_len}")
        if not isinstance(tokens, ShardedTokens):
            tokens = ShardedTokens([tokens], tokens.dtype)
        self.tokens, self.seq_len, self.window = tokens, seq_len, seq_len - 2
        self.cls_id, self.sep_id = cls_id, sep_id

    def __len__(self) -> int:
        return len(self.tokens) // self.window

    def get(self, indices: np.ndarray) -> torch.Tensor:
        rows = self.tokens.windows(np.asarray(indices, dtype=np.int64) * self.window, self.window)
        out = np.empty((len(rows), self.seq_len), dtype=np.int64)
        out[:, 0], out[:, -1], out[:, 1:-1] = self.cls_id, self.sep_id, rows
        return torch.from_numpy(out)


def unigram_counts(sequences: PackedSequences, vocab_size: int, chunk: int = 1 << 24) -> np.ndarray:
    """How often each token id (0 .. vocab_size - 1) occurs in `sequences` as a model reads them: the
    tokens of every complete [CLS] window [SEP] sequence, so [CLS] and [SEP] count once per sequence
    (they are targets too) and the stream's last, partial window, which no sequence holds, not at all.
    Read in chunks of the memory-mapped stream: a billion tokens cost seconds and no extra memory."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    end = len(sequences) * sequences.window
    for start in range(0, end, chunk):
        counts += np.bincount(sequences.tokens[start : min(end, start + chunk)], minlength=vocab_size)
    counts[sequences.cls_id] += len(sequences)
    counts[sequences.sep_id] += len(sequences)
    return counts


class EpochSampler:
    """Global sample g of the run is sequence perm_{g // N}[g % N], perm_e a seeded permutation:
    the batch of any step is computable without replaying the data loader."""

    def __init__(self, num_sequences: int, seed: int):
        if num_sequences == 0:
            raise DataError("the training split holds no complete sequence; lower data.seq_len or add text")
        self.n, self.seed = num_sequences, seed
        self._epoch, self._perm = -1, None

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.n)
            self._epoch = epoch
        return self._perm

    def indices(self, step: int, batch_size: int) -> np.ndarray:
        g = np.arange(step * batch_size, (step + 1) * batch_size)
        epochs = g // self.n
        out = np.empty_like(g)
        for epoch in np.unique(epochs):
            here = epochs == epoch
            out[here] = self._permutation(int(epoch))[g[here] % self.n]
        return out


@dataclass
class CorpusData:
    tokenizer: object
    train: PackedSequences
    val: PackedSequences
    meta: dict
    token_dir: Path


def prepare_data(args: DataArgs) -> CorpusData:
    tokenizer = prepare_tokenizer(args)
    return load_tokens(tokenize_corpus(args, tokenizer), tokenizer, args.seq_len)


def load_tokens(token_dir: Path, tokenizer, seq_len: int) -> CorpusData:
    """Memory-map a complete token folder (`tokenize_corpus`) as packed train / val sequences."""
    meta = read_meta(token_dir)
    dtype = np.dtype(meta["dtype"])

    def split(name: str) -> PackedSequences:
        parts = [map_shard(token_dir, s["name"], name, s["tokens"][name], dtype) for s in meta["shards"] if s["tokens"][name]]
        return PackedSequences(ShardedTokens(parts, dtype), seq_len, tokenizer.cls_token_id, tokenizer.sep_token_id)

    # The shard list stays in meta.json: runs record this meta, and a billion-token corpus has thousands.
    summary = {k: v for k, v in meta.items() if k != "shards"} | {"num_shards": len(meta["shards"])}
    return CorpusData(tokenizer, split("train"), split("val"), summary, token_dir)
