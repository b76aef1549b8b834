"""What `train.deterministic=true` costs a compiled tiny CrossBERT step on this machine: corpus tokens/s over
100 steps after 20 of compilation and warm-up, with and without it.

    python bench/deterministic_cost.py 0    # default
    python bench/deterministic_cost.py 1    # deterministic
Run them alternately, twice each, and quote the ratio pair by pair (one process per setting: the flag is
process-wide).
"""

import sys
import time

from crossbert_model.data_args import DataArgs
from crossbert_model.train import Trainer
from crossbert_model.train_config import ModelArgs, OptimArgs, TrainConfig
from crossbert_model.utils import data_root

WARMUP, TIMED, BATCH, SEQ = 20, 100, 32, 128


def main(deterministic: bool) -> None:
    cfg = TrainConfig(
        name=f"deterministic-{int(deterministic)}-{time.time_ns()}",
        out_dir="runs/bench/deterministic",
        seed=0,
        steps=WARMUP + TIMED,
        batch_size=BATCH,
        compile=True,
        deterministic=deterministic,
        dtype="bf16",
        resume=False,
        model=ModelArgs(preset="tiny", objective="crossbert"),
        optim=OptimArgs(lr=2e-3, warmup_steps=5),
        data=DataArgs(
            corpus=str(data_root() / "wikipedia_en_2015"), tokenizer="train", vocab_size=4096, seq_len=SEQ, cache_dir="runs/cache"
        ),
    )
    trainer = Trainer(cfg)
    for step in range(WARMUP):
        trainer.train_step(step, trainer.host_batch(step))
    start = time.perf_counter()
    for step in range(WARMUP, WARMUP + TIMED):
        trainer.train_step(step, trainer.host_batch(step))
    print(f"deterministic={deterministic} {TIMED * BATCH * SEQ / (time.perf_counter() - start):,.0f} tokens/s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] == "1")
