"""What a run's validation scores, in one place for the trainer and for runs trained before it recorded everything: the
fixed validation batches `val_loss` scores, and the run's unigram plateau (crossbert_model.plateau) on the same targets.
No trainer here: `crossbert plateau` fills old sweep folders with it without loading one."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from .config import CrossBertConfig
from .data.sequences import CorpusData, prepare_data, unigram_counts
from .masking import RowRandom, target_ids
from .objectives import pretraining_batch
from .plateau import UNIGRAM_ENTROPY_VAL, protocol_unigram_entropies, unigram_cross_entropy
from .train_config import TrainConfig, checkpoint_train_config, model_config
from .utils import data_root, set_offline_env

# The masking randomness of validation: stream 1 of step 0, apart from training's stream 0 (train.step_generator)
VALIDATION_STREAM = 1


def validation_batches(data: CorpusData, n: int, config: CrossBertConfig, seed: int, batch_size: int) -> Iterator[dict]:
    """The fixed batches `val_loss` scores: the first n validation sequences in batches of `batch_size`,
    with the objective's own masks drawn per sequence from the run seed (stream 1): the same at every
    evaluation, whatever the batch size. Whole batches: under DDP each process scores its share of each."""
    masks = RowRandom(seed, 0, VALIDATION_STREAM)
    for start in range(0, n, batch_size):
        ids = data.val.get(np.arange(start, min(n, start + batch_size)))
        yield pretraining_batch(ids, torch.ones_like(ids), config, masks.from_row(start))


def unigram_entropies(data: CorpusData, config: CrossBertConfig, cfg: TrainConfig) -> dict[str, float]:
    """The unigram plateau of a run (crossbert_model.plateau): the cross-entropy, under the unigram
    distribution of its training sequences, of the targets `val_loss` scores (`unigram_entropy_val`)
    and of those the shared protocol scores at each of the run's ratios (`unigram_entropy_r15`, ...)."""
    n = min(cfg.eval_sequences, len(data.val))
    if n == 0:
        return {}
    counts = unigram_counts(data.train, config.vocab_size)
    val_targets = torch.cat([target_ids(b) for b in validation_batches(data, n, config, cfg.seed, cfg.batch_size)])
    shared = protocol_unigram_entropies(counts, data.val.get(np.arange(n)), config.mask_ratio)
    return {UNIGRAM_ENTROPY_VAL: unigram_cross_entropy(counts, val_targets), **shared}


def unigram_entropies_for_run(cfg: TrainConfig, tokenizer: str | Path | None = None) -> dict[str, float]:
    """The unigram entropies the trainer records, for a run trained before it recorded them: from the
    run's config (its config.yaml, or a sweep's plan) and the tokenizer it was trained with (a folder;
    default: the config's data.tokenizer). The corpus is read from the token cache, or tokenized once."""
    set_offline_env()
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data))
    cfg.data.tokenizer = str(tokenizer) if tokenizer is not None else cfg.data.tokenizer
    if "data_root" in cfg.data.corpus:
        cfg.data.data_root = str(data_root(cfg.data.data_root))
    data = prepare_data(cfg.data)
    return unigram_entropies(data, model_config(cfg.model, cfg.data, data.tokenizer), cfg)


def unigram_entropies_for_checkpoint(path: str | Path, overrides: list[str] | None = None) -> dict[str, float]:
    """The unigram entropies of the run a checkpoint folder (runs/<name>/checkpoints/step_N) belongs to,
    with the checkpoint's tokenizer: the numbers the trainer records in runs trained since."""
    return unigram_entropies_for_run(checkpoint_train_config(path, overrides))
