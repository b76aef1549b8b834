"""`crossbert` command line: thin wrappers over the library.

    crossbert train CONFIG [key=value ...]     pre-train a flat MLM or a CrossBERT
    crossbert presets [--seq-len 128]          size presets with parameter counts and FLOPs
"""

from __future__ import annotations

import argparse
import logging
import sys


def _train(args: argparse.Namespace) -> None:
    from crossbert_model.args import load_config
    from crossbert_model.train import TrainConfig, train

    train(load_config(TrainConfig, args.config, args.overrides))


def _presets(args: argparse.Namespace) -> None:
    from crossbert_model.config import PRESETS, config_from_preset, describe, format_count

    print(f"{'preset':8} {'objective':10} {'d':>5} {'L':>3} {'H':>3} {'enc params':>11} {'non-emb':>9} {'total':>9} {'train FLOPs/tok':>16}  where")
    for name, preset in PRESETS.items():
        for objective in ("mlm", "crossbert"):
            c = config_from_preset(name, objective=objective, vocab_size=args.vocab_size)
            d = describe(c, args.seq_len)
            print(
                f"{name:8} {objective:10} {d['hidden_size']:>5} {d['layers']:>3} {d['heads']:>3} "
                f"{format_count(d['params_encoder']):>11} {format_count(d['params_encoder_non_embedding']):>9} "
                f"{format_count(d['params_total']):>9} {format_count(d['train_flops_per_token']):>16}  {preset.device_hint}"
            )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="crossbert", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="pre-train one model (resumes from the run folder's latest checkpoint)")
    p.add_argument("config", help="YAML config (see configs/train/)")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. model.preset=mini steps=2000")
    p.set_defaults(func=_train)

    p = sub.add_parser("presets", help="list the size presets with computed parameter counts and FLOPs")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.set_defaults(func=_presets)
    return parser


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    args = build_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
