"""The input embeddings of a tiny model during its first steps: do they collapse, and does keeping them large take
CrossBERT off the unigram plateau? (results/escape_scan/README.md, "Mechanism")

    python experiments/escape_scan/embedding_variants.py [--objective crossbert|mlm] [--preset tiny] [--seed 1] [--steps 400]
        [--embedding-std S | --embedding-lr-scale F | --embedding-multiplier M] [--out-dir runs/embedding_variants]

As configs/sweep/escape_scan.yaml otherwise (tiny, batch 32 x 128, lr 2e-3 with 50 warm-up steps and cosine to
0.1, WordPiece 4,096 on the 4M-word Wikipedia sample, bf16 autocast, eager; CrossBERT r = 0.5 with CMS and the
light default predictor, flat MLM 15% with 80/10/10). One change at most:

* `--embedding-std S`: the input embeddings (tied to the output decoder) drawn at std S instead of 0.02;
* `--embedding-lr-scale F`: every optimizer step moves the embeddings by F times AdamW's update;
* `--embedding-multiplier M`: the encoder multiplies its token embeddings by M before the first block (as Gemma
  does with sqrt(d)); the tied decoder reads the unscaled matrix.

Prints one JSON line: the shared-protocol losses after the last step, the unigram entropies of the same
targets, and (step, training loss, centred participation ratio of the embedding matrix) every 25 steps (the
ratio is (sum s^2)^2 / sum s^4 over the singular values of the mean-centred 4,096 x 128 matrix: about 124 at
initialisation, 1 when one direction holds all its variance).
"""

import argparse
import json

import torch

from crossbert_model.data_args import DataArgs
from crossbert_model.train import Trainer, make_optimizer
from crossbert_model.train_config import ModelArgs, OptimArgs, TrainConfig
from crossbert_model.utils import data_root

TRAJECTORY_EVERY = 25


def participation_ratio(weight: torch.Tensor) -> float:
    s = torch.linalg.svdvals(weight.float() - weight.float().mean(0))
    return float((s**2).sum() ** 2 / (s**4).sum())


def scale_embedding_updates(optimizer: torch.optim.Optimizer, embeddings: torch.Tensor, scale: float) -> None:
    """After each optimizer step the embeddings keep `scale` of the step's change (AdamW's update, decay included)."""
    adam_step = optimizer.step

    def step(*args, **kwargs):
        before = embeddings.detach().clone()
        adam_step(*args, **kwargs)
        with torch.no_grad():
            embeddings.copy_(before + scale * (embeddings - before))

    optimizer.step = step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objective", choices=["crossbert", "mlm"], default="crossbert")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=400)
    change = parser.add_mutually_exclusive_group()
    change.add_argument("--embedding-std", type=float)
    change.add_argument("--embedding-lr-scale", type=float)
    change.add_argument("--embedding-multiplier", type=float)
    parser.add_argument("--out-dir", default="runs/embedding_variants")
    args = parser.parse_args()
    changed = {k: v for k, v in vars(args).items() if k.startswith("embedding_") and v is not None}
    label = "-".join(f"{k.removeprefix('embedding_').replace('_', '-')}{v:g}" for k, v in changed.items()) or "default"
    cfg = TrainConfig(
        name=f"{args.objective}-{args.preset}-{label}-{args.steps}-s{args.seed}",
        out_dir=args.out_dir,
        seed=args.seed,
        steps=args.steps,
        batch_size=32,
        model=ModelArgs(preset=args.preset, objective=args.objective, mask_ratio=0.5 if args.objective == "crossbert" else 0.15),
        optim=OptimArgs(lr=2e-3, warmup_steps=50),
        data=DataArgs(
            corpus=str(data_root() / "wikipedia_en_2015"), tokenizer="train", vocab_size=4096, seq_len=128, cache_dir="runs/cache"
        ),
        dtype="bf16",
        resume=False,
    )
    trainer = Trainer(cfg)
    model = trainer.hf_model
    embedding = model.encoder.get_input_embeddings()
    if args.embedding_std is not None:
        with torch.no_grad():
            embedding.weight.normal_(std=args.embedding_std)
    if args.embedding_multiplier is not None:
        embedding.register_forward_hook(lambda module, inputs, output: output * args.embedding_multiplier)
    trainer.optimizer = make_optimizer(model, cfg.optim)
    trainer.step_model = model  # eager: the hook and the patched step stay in force
    if args.embedding_lr_scale is not None:
        scale_embedding_updates(trainer.optimizer, embedding.weight, args.embedding_lr_scale)
    trajectory = []
    for step in range(args.steps):
        out = trainer.train_step(step, trainer.host_batch(step))
        if step % TRAJECTORY_EVERY == 0 or step == args.steps - 1:
            trajectory.append((step, round(float(out["loss"]), 3), round(participation_ratio(embedding.weight.detach()), 1)))
    losses = {
        k: round(v, 4)
        for k, v in {**trainer.evaluate(), **trainer.unigram_entropies}.items()
        if k.startswith(("shared_loss_r", "unigram_entropy_r"))
    }
    preset = {} if args.preset == "tiny" else {"preset": args.preset}  # the first lines, all tiny, carry none
    print(
        json.dumps(
            {
                "objective": args.objective,
                **preset,
                "seed": args.seed,
                "steps": args.steps,
                **changed,
                **losses,
                "step_loss_embedding_pr": trajectory,
            }
        )
    )


if __name__ == "__main__":
    main()
