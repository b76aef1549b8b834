"""Predictor changes that configuration cannot express, tried on the tiny CrossBERT that stays on the unigram
plateau (seed 1, 300 steps of 32 x 128, lr 2e-3, eager; as configs/sweep/escape_scan.yaml otherwise).

    python experiments/escape_scan/predictor_variants.py VARIANT [--seed 1] [--steps 300] [--lr 2e-3] [--out-dir runs/escape_variants]

VARIANT: default | norm-after-projection (a LayerNorm after the predictor's p -> d projection, as BERT's head
has before its decoder) | projection-scale (that projection drawn at std 1/sqrt(p), so its output starts at
unit scale) | key-bias (a bias on the cross-attention keys and values: a content-free key, so attention can
depend on the relative position alone from the first step) | visible-targets (the predictor also answers
10% of each view's visible positions, whose token its encoder sees: CrossBERT's analogue of the kept 10% of
BERT's 80/10/10, which flat MLM can copy; a training change only, the shared protocol asks masked tokens as
always) | untied-decoder (the predictor's logits from its own output embedding matrix, drawn at std 0.02, instead
of the encoder's input embeddings) | detached-decoder (tied, but the logits send no gradient into the input
embeddings). Prints one JSON line: the shared-protocol losses
after the last step and the unigram entropies of the same targets."""

import argparse
import json
import math

import torch
from torch import nn

from crossbert_model.data_args import DataArgs
from crossbert_model.train import Trainer, make_optimizer
from crossbert_model.train_config import ModelArgs, OptimArgs, TrainConfig
from crossbert_model.utils import data_root


def change_predictor(predictor: nn.Module, variant: str, p: int, d: int) -> None:
    if variant == "norm-after-projection":
        predictor.out_proj = nn.Sequential(nn.Linear(p, d, bias=False), nn.LayerNorm(d))
    elif variant == "projection-scale":
        nn.init.normal_(predictor.out_proj.weight, std=1 / math.sqrt(p))
    elif variant == "key-bias":
        for layer in predictor.layers:
            old = layer.attn.kv_proj
            layer.attn.kv_proj = nn.Linear(old.in_features, old.out_features, bias=True)
            with torch.no_grad():
                layer.attn.kv_proj.weight.copy_(old.weight)
                layer.attn.kv_proj.bias.zero_()
    elif variant in ("untied-decoder", "detached-decoder"):
        decode = predictor.forward
        if variant == "untied-decoder":
            predictor.output_embedding = nn.Parameter(torch.empty(predictor.decoder_bias.numel(), d).normal_(std=0.02))

        def forward(context, context_positions, context_valid, query_positions, query_valid, embedding_weight):
            weight = predictor.output_embedding if variant == "untied-decoder" else embedding_weight.detach()
            return decode(context, context_positions, context_valid, query_positions, query_valid, weight)

        predictor.forward = forward


def with_visible_targets(batch: dict, share: float, generator: torch.Generator) -> dict:
    """`batch` (packed sequences: no validity masks) whose queries also hold `share` of each view's visible
    positions, drawn at random."""
    encoder = batch["encoder_positions"]
    extra = max(1, round(share * encoder.shape[-1]))
    order = torch.rand(encoder.shape, generator=generator).argsort(dim=-1)[..., :extra]
    picked = torch.gather(encoder, -1, order)
    return {**batch, "query_positions": torch.cat([batch["query_positions"], picked], dim=-1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "variant",
        choices=[
            "default",
            "norm-after-projection",
            "projection-scale",
            "key-bias",
            "visible-targets",
            "untied-decoder",
            "detached-decoder",
        ],
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--out-dir", default="runs/escape_variants")
    args = parser.parse_args()
    corpus = data_root() / "wikipedia_en_2015"
    cfg = TrainConfig(
        name=f"{args.variant}-lr{args.lr:g}-s{args.seed}",
        out_dir=args.out_dir,
        seed=args.seed,
        steps=args.steps,
        batch_size=32,
        model=ModelArgs(preset="tiny", objective="crossbert", mask_ratio=0.5),
        optim=OptimArgs(lr=args.lr, warmup_steps=50),
        data=DataArgs(corpus=str(corpus), tokenizer="train", vocab_size=4096, seq_len=128, cache_dir="runs/cache"),
        dtype="bf16",
        resume=False,
    )
    trainer = Trainer(cfg)
    model = trainer.hf_model
    change_predictor(model.predictor, args.variant, model.config.predictor_hidden_size, model.config.hidden_size)
    trainer.optimizer = make_optimizer(model, cfg.optim)  # the new modules' parameters too
    trainer.step_model = model
    generator = torch.Generator().manual_seed(args.seed)
    for step in range(args.steps):
        batch = trainer.host_batch(step)
        if args.variant == "visible-targets":
            batch = with_visible_targets(batch, 0.1, generator)
        trainer.train_step(step, batch)
    losses = {
        k: round(v, 4)
        for k, v in {**trainer.evaluate(), **trainer.unigram_entropies}.items()
        if k.startswith(("shared_loss_", "unigram_entropy_"))
    }
    print(json.dumps({"variant": args.variant, "lr": args.lr, "seed": args.seed, "steps": args.steps, **losses}))


if __name__ == "__main__":
    main()
