"""The tiny training run the tests share: a nano model on the test corpus (conftest.corpus_args), a few fp32 steps
of 8 sequences. Used by the trainer, precision, fast-step and zoo tests."""

import dataclasses

from crossbert_model.train_config import TrainConfig


def tiny_train_config(corpus_args, out_dir, objective: str = "mlm", *, warmup_steps: int = 2, **fields) -> TrainConfig:
    """6 steps of batch 8, logged every step, evaluated every 3 on 16 sequences; `fields` override any TrainConfig
    field (name defaults to the objective)."""
    base = {
        "name": objective,
        "out_dir": str(out_dir),
        "steps": 6,
        "batch_size": 8,
        "log_every": 1,
        "eval_every": 3,
        "eval_sequences": 16,
        "dtype": "fp32",
        "peak_flops": 1e11,
    }
    cfg = TrainConfig(**{**base, **fields, "data": dataclasses.replace(corpus_args)})
    cfg.model.preset, cfg.model.objective, cfg.optim.warmup_steps = "nano", objective, warmup_steps
    return cfg
