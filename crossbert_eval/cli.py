"""`crossbert` command line: thin wrappers over the library.

crossbert train CONFIG [key=value ...]     pre-train a flat MLM or a CrossBERT
crossbert presets [--seq-len 128]          size presets with parameter counts and FLOPs
crossbert probe MODEL --tasks ...          frozen linear / kNN / cosine probes, every layer if asked
crossbert geometry MODEL --tasks ...       effective rank, anisotropy, uniformity, entropy per layer
crossbert tasks                            the task files and whether their data is present
crossbert mteb MODEL --benchmark local-eng mteb's evaluators on the local data (or the hub, online);
                                           --benchmark "MTEB(eng, v2)": what of mteb's benchmark runs here
crossbert sweep CONFIG [key=value ...]     objectives x sizes: train, probe, tables, plots, report; started
                                           again (here or on machines sharing the folder), workers split it
crossbert sweep CONFIG --submitit          a cluster job per run through submitit (SLURM; submitit.* keys)
crossbert sweep CONFIG --limit N           a smoke test: every stage, a few steps, N examples per probe split
crossbert zoo CONFIG [key=value ...]       probe a list of pretrained encoders: tables, plots, report
crossbert report PATH                      tables, plots and report of a sweep, a zoo or any results folder
crossbert plateau SWEEP_DIR                unigram entropies of runs trained before they were recorded
crossbert export RUN_OR_CHECKPOINT DIR     a clean folder that loads without this package; --push org/name
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys

# Only light modules at the top (no torch, transformers, mteb or pandas: tests/test_cli_speed.py), so that
# `crossbert --help` answers at once; each handler imports what its command needs.
from crossbert_model.errors import USER_ERROR_EXIT, debug_requested, exit_on_user_error

from crossbert_model.defaults import DTYPES, FEATURES_DIR, MAX_LENGTH, MTEB_DIR, POOLINGS, RESULTS_DIR

# Each numeric option's limit has one home, crossbert_model.limits (or the config field it mirrors): argparse refuses a
# value out of it in one line naming the option, before any model loads.
from crossbert_model.limits import POSITIVE, POSITIVE_INT, SECONDS, SEED, limit_of
from crossbert_model.limits import option as limited
from crossbert_eval.folder_layout import SweepDir, ZooDir
from crossbert_eval.layer_spec import LayerSpec, LayerSpecError

# Loggers that speak at INFO about their own set-up (faiss's loader tries CPU variants and logs a
# ModuleNotFoundError for each): quiet by default, back with --debug.
NOISY_LOGGERS = ("faiss", "faiss.loader", "httpx", "urllib3", "datasets", "mteb")


def _train(args: argparse.Namespace) -> None:
    from crossbert_model.args import load_config
    from crossbert_model.train_config import TrainConfig, validate_config

    cfg = load_config(TrainConfig, args.config, args.overrides)
    validate_config(cfg)  # here, before the trainer's imports: a mistyped preset or value is answered in a second
    if args.print_config:
        print(resolved_config_text(cfg))
        return
    from crossbert_model.train import train

    train(cfg)


def resolved_config_text(cfg) -> str:
    """`crossbert train --print-config`: the config after file, overrides and checks, as YAML a run could
    start from, then what the preset resolves to (the model's shape, parameters, FLOPs, steps). Touches no run folder."""
    from crossbert_model.args import dump_yaml
    from crossbert_model.config import format_count
    from crossbert_model.objectives import describe
    from crossbert_model.train_config import model_config

    d = describe(model_config(cfg.model, cfg.data), cfg.data.seq_len)
    steps = f"{cfg.total_steps()} (from max_tokens={cfg.max_tokens:,})" if cfg.max_tokens else str(cfg.total_steps())
    predictor = f", predictor {format_count(d['params_predictor'])}" if d["params_predictor"] else ""
    return "\n".join(
        [
            dump_yaml(cfg).rstrip(),
            f"# model.preset={cfg.model.preset} objective={cfg.model.objective} resolves to: hidden_size={d['hidden_size']} "
            f"layers={d['layers']} heads={d['heads']} mask_ratio={d['mask_ratio']:g}",
            f"# parameters: encoder non-embedding {format_count(d['params_encoder_non_embedding'])}, embedding "
            f"{format_count(d['params_embedding'])} (vocabulary {cfg.data.vocab_size:,} until the tokenizer is known){predictor}",
            f"# training FLOPs per corpus token {format_count(d['train_flops_per_token'])}; steps {steps}; "
            f"run folder {cfg.run_dir} (not created)",
        ]
    )


def _presets(args: argparse.Namespace) -> None:
    from crossbert_model.config import format_count
    from crossbert_model.presets import PRESETS
    from crossbert_model.data_args import DataArgs
    from crossbert_model.objectives import describe, objective_names
    from crossbert_model.train_config import ModelArgs, model_config

    print(
        f"Parameters and training FLOPs per corpus token (sequence length {args.seq_len}, vocabulary {args.vocab_size:,}); "
        "predictor share = predictor / encoder non-embedding parameters."
    )
    header = (
        "preset",
        "objective",
        "d",
        "L",
        "H",
        "pred LxW",
        "enc non-emb",
        "embedding",
        "predictor",
        "share",
        "head",
        "FLOPs enc",
        "FLOPs pred",
        "FLOPs head",
        "FLOPs/tok",
    )
    widths = (7, 9, 4, 3, 3, 8, 11, 9, 9, 6, 6, 9, 10, 10, 9)
    print("  ".join(f"{h:>{w}}" if i > 1 else f"{h:{w}}" for i, (h, w) in enumerate(zip(header, widths))) + "  where")
    for name, preset in PRESETS.items():
        for objective in objective_names():
            c = model_config(
                ModelArgs(preset=name, objective=objective), DataArgs(vocab_size=args.vocab_size, seq_len=args.seq_len)
            )
            d = describe(c, args.seq_len)
            has_predictor = d["params_predictor"] > 0  # "-" in the predictor's cells of an objective without one
            cells = (
                name,
                objective,
                d["hidden_size"],
                d["layers"],
                d["heads"],
                f"{c.predictor_layers}x{c.predictor_hidden_size}" if has_predictor else "-",
                format_count(d["params_encoder_non_embedding"]),
                format_count(d["params_embedding"]),
                format_count(d["params_predictor"]) if has_predictor else "-",
                f"{d['predictor_share']:.0%}" if has_predictor else "-",
                format_count(d["params_head"]),
                format_count(d["train_flops_encoder"]),
                format_count(d["train_flops_predictor"]),
                format_count(d["train_flops_head"]),
                format_count(d["train_flops_per_token"]),
            )
            print(
                "  ".join(f"{c!s:>{w}}" if i > 1 else f"{c!s:{w}}" for i, (c, w) in enumerate(zip(cells, widths)))
                + f"  {preset.device_hint}"
            )


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _poolings(value: str) -> list[str]:
    names = _csv(value)
    bad = [n for n in names if n not in POOLINGS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"expected one or more of {', '.join(POOLINGS)} (comma-separated), got {value!r}")
    return names


def _layer_spec(option: str):
    """The argparse `type=` of a layer option: the text parsed here, once, into the LayerSpec every stage below takes; a
    refused spec is one line naming the option in the parser's wording (`--layers: expected all, last or ..., got 'abc'`)."""

    def parse(text: str) -> LayerSpec:
        try:
            return LayerSpec.parse(text)
        except LayerSpecError as e:  # ArgumentError(None, ...): argparse says it as is, without its "argument --layers:" prefix
            raise argparse.ArgumentError(None, f"{option}: {e}") from None

    parse.__name__ = "layer spec"
    return parse


def _encoder_options(args: argparse.Namespace) -> dict:
    """How `crossbert probe` / `geometry` load the model (FrozenEncoder.load's options)."""
    return {
        "max_length": args.max_length,
        "batch_size": args.batch_size,
        "dtype": args.dtype,
        "allow_pickle": args.allow_pickle,
        "trust_remote_code": args.trust_remote_code,
    }


def _resolved_root(args: argparse.Namespace) -> str:
    """The data root, resolved once at the entry point; every reader below gets this path."""
    from crossbert_model.utils import data_root

    return str(data_root(args.data_root))


def check_names_early(args: argparse.Namespace) -> None:
    """What a command names (its tasks, a local model path) checked before torch, transformers or mteb are imported,
    so a typo is answered in about a second, with "did you mean" where a close name exists."""
    from pathlib import Path

    from crossbert_model.args import close_matches
    from crossbert_model.errors import CrossbertError

    if args.command == "baselines" and not args.tasks and not folder_probe_config(Path(args.folder)).get("probe_tasks"):
        raise CrossbertError(
            f"--tasks: {args.folder} is not a sweep or zoo folder with probe_tasks; name the tasks (comma-separated)"
        )
    if args.command == "probe":
        from crossbert_model.defaults import FEATURE_TRANSFORM_NAMES, PROBES

        for option, given, known in (
            ("--probe", args.probe, PROBES),
            ("--feature-transform", args.feature_transform, FEATURE_TRANSFORM_NAMES),
        ):
            for name in _csv(given):
                if name not in known:
                    hint = close_matches(name, known)
                    raise CrossbertError(
                        f"{option} {name}: expected one or more of {', '.join(known)} (comma-separated)"
                        + (f"; did you mean {' or '.join(hint)}?" if hint else "")
                    )
    if args.command in ("probe", "geometry") or (args.command == "baselines" and args.tasks):
        from crossbert_eval.tasks import resolve_tasks

        resolve_tasks(_csv(args.tasks))
    if args.command == "mteb" and args.tasks:
        from crossbert_eval.tasks import all_tasks

        local = sorted(name for name, task in all_tasks().items() if task.mteb is not None)
        for name in _csv(args.tasks):
            hint = close_matches(name, local) if name not in local else []
            if hint:  # a typo of a local task: said before mteb is imported (other names are mteb's to answer)
                raise CrossbertError(f"--tasks {name}: no local task file declares it; did you mean {' or '.join(hint)}?")
    model = getattr(args, "model", None)
    if not isinstance(model, str):
        return
    if model.startswith((".", "/", "~")) or os.sep in model and not _looks_like_hub_id(model):
        path = Path(model).expanduser()
        if not path.exists():
            siblings = [p.name for p in path.parent.iterdir()] if path.parent.is_dir() else []
            hint = close_matches(path.name, siblings)
            raise CrossbertError(
                f"model {model!r}: no such folder{'; did you mean ' + ' or '.join(str(path.parent / h) for h in hint) + '?' if hint else ''}"
            )
    elif not os.path.exists(model):
        from crossbert_eval.model_names import MODEL_ALIASES, cache_only, hub_id, hub_snapshot

        # offline: a hub id that is not in the local cache is refused now, as the model's loading would refuse it
        if model not in MODEL_ALIASES and hub_id(model) is not None and cache_only():
            hub_snapshot(model, getattr(args, "allow_pickle", False), getattr(args, "trust_remote_code", False))


def _looks_like_hub_id(name: str) -> bool:
    """org/name[@revision] with no further slash: what a hub id looks like (a local path has more parts or a dot)."""
    return name.count("/") == 1 and not name.startswith((".", "/", "~")) and not os.path.exists(name.split("/")[0])


def _probe(args: argparse.Namespace) -> None:
    from crossbert_eval.probe_runner import ProbeSettings, probe_model
    from crossbert_eval.report.text_tables import probe_text_table

    knn = {name: value for name, value in (("k", args.k), ("temperature", args.temperature)) if value is not None}
    own = dict(
        probes=_csv(args.probe),
        pair_mode=args.pair_mode,
        feature_transforms=_csv(args.feature_transform),
        max_train=args.max_train,
        **knn,  # unset: the protocol constants of crossbert_eval.probes (DINO's k=20, T=0.07)
    )
    _frozen_features_command(args, ProbeSettings, probe_model, probe_text_table, own)


def _geometry(args: argparse.Namespace) -> None:
    from crossbert_eval.geometry_runner import GeometrySettings, geometry_model
    from crossbert_eval.report.text_tables import geometry_text_table

    _frozen_features_command(args, GeometrySettings, geometry_model, geometry_text_table, {})


def _frozen_features_command(args: argparse.Namespace, settings_class, run, text_table, own: dict) -> None:
    """`crossbert probe` and `crossbert geometry`: the settings both share plus the command's `own`, the run, its table,
    where its rows are, and exit 1 where task data is missing."""
    settings = settings_class(
        tasks=_csv(args.tasks),
        layers=args.layers,
        poolings=args.pooling,
        results_dir=args.results_dir,
        cache_dir=args.cache_dir,
        force=args.force,
        data_root=_resolved_root(args),
        max_eval=args.max_eval,
        seed=args.seed,
        **own,
    )
    runner = run(args.model, settings, **_encoder_options(args))
    print(text_table(runner.frame))
    print(f"results: {settings.results_dir}/results.jsonl")
    for why in runner.missing.values():
        print(f"MISSING DATA: {why}")
    if runner.missing:
        sys.exit(1)


def _mteb_layers(args: argparse.Namespace) -> LayerSpec:
    """`crossbert mteb --layers` (or --layer, its deprecated alias for one release): each parsed by its argparse type, as
    `crossbert probe --layers` is (_layer_spec); given both, refused."""
    from crossbert_model.errors import CrossbertError

    if args.layer is not None and args.layers is not None:
        raise CrossbertError(
            f"--layer {args.layer} and --layers {args.layers}: give --layers only (--layer is its deprecated alias)"
        )
    if args.layer is not None:
        logging.getLogger(__name__).warning(
            "--layer is deprecated and goes in the next release: use --layers %s (same grammar)", args.layer
        )
        return args.layer
    return LayerSpec.LAST if args.layers is None else args.layers


def _mteb(args: argparse.Namespace) -> None:
    layers = _mteb_layers(args)  # before mteb is imported or a model loaded
    from crossbert_eval.mteb_runner import MtebSettings, run_mteb
    from crossbert_eval.report.text_tables import mteb_text_table

    settings = MtebSettings(
        tasks=_csv(args.tasks or ""),
        benchmark=args.benchmark,
        layers=layers,
        pooling=args.pooling,
        out_dir=args.out_dir,
        results_dir=args.results_dir,
        cache_dir=None if args.no_feature_cache else args.cache_dir,
        overwrite=args.overwrite,
        data_root=_resolved_root(args),
    )
    rows, run = run_mteb(args.model, settings, **_encoder_options(args))
    print(mteb_text_table(rows, run.plan, run.wall_s))


def _sweep(args: argparse.Namespace) -> None:
    from crossbert_model.args import load_config
    from crossbert_eval.sweep import run_sweep
    from crossbert_eval.sweep_config import SweepConfig

    budget = [f"budget_s={args.budget_s}"] if args.budget_s is not None else []
    limit = [f"limit={args.limit}"] if args.limit is not None else []
    cfg = load_config(SweepConfig, args.config, [*args.overrides, *budget, *limit])
    if args.reference is not None:
        from crossbert_eval.sweep_restore import restore_sweep

        restored = restore_sweep(cfg, args.reference)
        print(f"{len(restored)} run(s) complete in {args.reference}, not run again: {', '.join(restored) or 'none'}")
    if args.submitit:
        from crossbert_eval.launcher import submit_sweep  # here: only --submitit needs submitit

        root = submit_sweep(cfg)
    else:
        root = run_sweep(cfg)
    report = SweepDir(root).report
    print(f"report: {report}" if report.is_file() else f"{root}: no scores (no probe, geometry or mteb task); no report written")
    if cfg.limit is not None:
        print(f"a smoke test (--limit {cfg.limit}): its numbers mean nothing")


def _zoo(args: argparse.Namespace) -> None:
    from crossbert_model.args import load_config
    from crossbert_eval.zoo import ZooConfig, run_zoo

    root = run_zoo(load_config(ZooConfig, args.config, args.overrides))
    print(f"report: {ZooDir(root).report}")


def _reliance(args: argparse.Namespace) -> None:
    from crossbert_model.plateau import PLATEAU_MARGIN
    from crossbert_model.reliance import ENCODER_RELIANCE_SHARE, encoder_reliance_for_checkpoint

    out = encoder_reliance_for_checkpoint(args.checkpoint, args.eval_sequences, args.overrides)
    width = max(map(len, out))
    for key, value in out.items():
        print(f"{key:<{width}}  {value:.4f}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    answer = {
        True: "carries context",
        False: "does NOT carry context",
        None: f"no answer (a margin below the unigram entropy under the plateau's {PLATEAU_MARGIN:g} nats, or a number missing)",
    }
    print(
        f"\nthe encoder rule (order-blind encoder loses >= {ENCODER_RELIANCE_SHARE:g} of the margin): "
        f"{answer[out['encoder_carries_context']]}"
    )


def _plateau(args: argparse.Namespace) -> None:
    from pathlib import Path

    import pandas as pd

    from crossbert_eval.report.loading import load_checkpoints
    from crossbert_eval.report.tables import plateau_table
    from crossbert_eval.plateau_backfill import fill_unigram_entropies
    from crossbert_model.readers import read_jsonl

    path = fill_unigram_entropies(args.sweep_dir, args.tokenizer, args.overrides, args.data_root)
    rows = read_jsonl(path)
    if not rows:
        print(f"{args.sweep_dir}: no trained run in checkpoints.jsonl; nothing to fill")
        return
    print(pd.DataFrame(rows).drop(columns=["tokenizer", "smoothing"]).to_string(index=False, float_format="{:.4f}".format))
    print(f"\nsmoothing: {rows[0]['smoothing']}; tokenizer: {rows[0]['tokenizer']}\n")
    print(plateau_table(load_checkpoints(Path(args.sweep_dir))).to_string(index=False, float_format="{:.4f}".format))
    print(f"\nwritten: {path}; `crossbert report {args.sweep_dir}` redraws the report with them")


def _report(args: argparse.Namespace) -> None:
    from crossbert_eval.report.store_report import build_report  # here: the report's imports are for this command only

    report = build_report(args.sweep_dir)
    print(f"report: {report}" if report else f"{args.sweep_dir}: no scores yet; nothing written")


def _baselines(args: argparse.Namespace) -> None:
    from pathlib import Path

    from crossbert_eval.baselines import BaselineSettings, run_baselines
    from crossbert_eval.evaluation import baseline_task_names
    from crossbert_eval.report.loading import load_baselines
    from crossbert_eval.report.markdown import markdown_table
    from crossbert_eval.tasks import resolve_tasks

    folder = Path(args.folder)
    config = folder_probe_config(folder)
    tasks = _csv(args.tasks) if args.tasks else baseline_task_names(config["probe_tasks"], config.get("mteb_tasks") or [])
    max_train, max_eval = folder_split_caps(config)
    if args.max_train is not None:
        max_train = args.max_train
    settings = BaselineSettings(data_root=_resolved_root(args), max_train=max_train, max_eval=max_eval)
    run_baselines(resolve_tasks(tasks), folder, settings)
    table = load_baselines(folder)
    print(markdown_table(table[table["task"].isin(tasks)]))
    print(f"baselines: {folder}/baselines (`crossbert report {folder}` draws them)")


def folder_probe_config(folder) -> dict:
    """The probe settings a sweep or zoo folder was made with (its sweep.yaml / zoo.yaml), {} for any other folder."""
    from crossbert_model.args import read_yaml  # a config: ConfigError names its key

    for config in (SweepDir(folder).config, ZooDir(folder).config):
        if config.is_file():
            return read_yaml(config)
    return {}


def folder_split_caps(config: dict) -> tuple[int | None, int | None]:
    """(max_train, max_eval): the seeded caps of the splits a sweep or zoo folder's probes read (its config, as
    folder_probe_config reads it), so that its baselines score the same examples: max_probe_train, a limited sweep's
    limit capping both (sweep_plan.split_caps), a zoo's max_probe_eval."""
    from crossbert_eval.sweep_plan import split_caps

    max_train, max_eval = split_caps(config.get("max_probe_train"), config.get("limit"))
    return max_train, config.get("max_probe_eval", max_eval)


def _tasks(args: argparse.Namespace) -> None:
    from crossbert_eval.tasks import task_listing, tasks_dir

    root = _resolved_root(args)
    lines, broken = task_listing(root)
    print(f"task files: {tasks_dir()}   data root: {root}   (examples per split; MISSING: not under the data root)")
    print(f"{'family':15} {'task':40} {'input':6} {'probes':18} splits")
    print("\n".join(lines))
    if broken:
        sys.exit(1)


def _add_encoder_options(p: argparse.ArgumentParser, model_max_length: bool = False) -> None:
    """How a frozen encoder is loaded and run: the same options for probe, geometry and mteb.
    `model_max_length`: --max-length defaults to the model's own (mteb: MTEB truncates where the model does)."""
    if model_max_length:
        p.add_argument(
            "--max-length",
            type=limited(POSITIVE_INT),
            default=None,
            help="tokens per text, at most the model's positions (default: the model's own sentence-transformers "
            f"max_seq_length, as MTEB runs it; else {MAX_LENGTH}; fewer where the model has fewer positions)",
        )
    else:
        p.add_argument(
            "--max-length",
            type=limited(POSITIVE_INT),
            default=None,
            help=f"tokens per text, at most the model's positions (default: {MAX_LENGTH}, fewer where the model has fewer positions)",
        )
    p.add_argument(
        "--batch-size",
        type=limited(POSITIVE_INT),
        default=256,
        help="max sequences per batch (also capped at 8192 padded tokens)",
    )
    p.add_argument(
        "--dtype",
        default="fp32",
        choices=DTYPES,
        help="feature precision: fp32 (default, the same numbers on every machine), bf16 autocast, or auto (bf16 where measured faster)",
    )
    p.add_argument("--allow-pickle", action="store_true", help="load pickle weights (pytorch_model.bin) of a folder you trust")
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run the Python code a model folder carries (its auto_map) to load it: only for a folder you trust; "
        "recorded in every result row. Our own checkpoints never need it",
    )


def _add_sample_options(p: argparse.ArgumentParser) -> None:
    """The seeded sample of each evaluation split that probe and geometry share (the same texts at the same seed)."""
    p.add_argument("--seed", type=limited(SEED), default=0, help="the probes' seed, and the seed of the --max-eval sample")
    p.add_argument(
        "--max-eval",
        type=limited(POSITIVE_INT),
        default=None,
        metavar="N",
        help="a seeded sample of N examples of each evaluation split, the same texts for `crossbert probe` and "
        "`crossbert geometry` at one --seed (features encoded once); recorded as max_eval in every row (default: all)",
    )


def _add_store_options(p: argparse.ArgumentParser) -> None:
    """Where probe and geometry read data and write rows and features."""
    p.add_argument("--results", dest="results_dir", default=RESULTS_DIR, help="results store folder (results.jsonl)")
    p.add_argument(
        "--cache", dest="cache_dir", default=FEATURES_DIR, help="feature cache folder (shared by probe, geometry and mteb)"
    )
    p.add_argument("--data-root", default=None, help="data root (default: $CROSSBERT_DATA_ROOT or ../shared/data)")
    p.add_argument("--force", action="store_true", help="re-run units already in the results store")


# -- crossbert export (crossbert_eval.export; imported in the handler: --help stays fast) ------------------------
def _export(args: argparse.Namespace) -> None:
    from crossbert_eval.export import export_checkpoint

    done = export_checkpoint(args.source, args.dest, results_dir=args.results_dir, push=args.push)
    print(f"exported {done.source} -> {done.folder}: {len(done.files)} files, model card with {done.probe_rows} probe rows")
    if done.url:
        print(f"pushed: {done.url}")


def _add_export(sub) -> None:
    p = sub.add_parser(
        "export",
        help="a clean checkpoint folder that loads without this package (transformers, "
        "sentence-transformers), with a model card; --push uploads it to the Hub",
    )
    p.add_argument(
        "source", metavar="RUN_OR_CHECKPOINT", help="a checkpoint folder, or a run folder (its latest complete checkpoint)"
    )
    p.add_argument("dest", metavar="DIR", help="a new (or empty) folder to write")
    p.add_argument(
        "--results",
        dest="results_dir",
        default=RESULTS_DIR,
        help="results store whose rows of this checkpoint go into the model card",
    )
    p.add_argument(
        "--push", metavar="ORG/NAME", default=None, help="upload DIR to this Hub model repository (needs CROSSBERT_ONLINE=1)"
    )
    p.set_defaults(func=_export)


def _train_keys_help() -> str:
    """The config keys `crossbert train --help` lists: read from the config dataclasses and their comments
    (crossbert_model.args.format_config_keys), so keys, defaults and descriptions have one home."""
    from crossbert_model.args import format_config_keys
    from crossbert_model.train_config import TrainConfig

    return "config keys (key=default  (limit)  description):\n" + format_config_keys(TrainConfig)


class OneLineParser(argparse.ArgumentParser):
    """A wrong option is one line (what argparse says, and where help is), exit 2: not the usage block."""

    def error(self, message: str):
        self.exit(USER_ERROR_EXIT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="crossbert", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--debug", action="store_true", help="tracebacks for errors and verbose library logs (or CROSSBERT_DEBUG=1)"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "train",
        help="pre-train one model (resumes from the run folder's latest checkpoint)",
        description="Pre-train one model. Every config key below can be set in the YAML file or as "
        "section.key=value after it; --print-config shows the result.",
        epilog=_train_keys_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("config", help="YAML config (see configs/train/)")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. model.preset=mini steps=2000")
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved config (file + overrides, checked; the preset's shape, parameters, FLOPs) and "
        "exit without training or creating the run folder",
    )
    p.set_defaults(func=_train)

    p = sub.add_parser(
        "probe", help="probe a frozen encoder (checkpoint, run folder, HF / sentence-transformers folder, or 'minilm')"
    )
    p.add_argument("model")
    p.add_argument("--tasks", required=True, help="comma-separated task names, a family (glue, sts, ...) or all")
    p.add_argument("--probe", default="linear,knn,cosine", help="linear, knn, cosine (each task runs those that apply)")
    p.add_argument(
        "--layers", type=_layer_spec("--layers"), default=LayerSpec.LAST, help="all | last | N | N,M,... (0 = embedding output)"
    )
    p.add_argument(
        "--pooling",
        type=_poolings,
        default=None,
        help="mean, cls, max (comma-separated); default: the model's own (sentence-transformers config), else mean",
    )
    p.add_argument(
        "--pair-mode", default="joint", choices=["joint", "senteval"], help="pair tasks: one sequence, or [u,v,|u-v|,u*v]"
    )
    p.add_argument("--k", type=limited(POSITIVE_INT), default=None, help="kNN neighbours (default: probes.KNN_K, DINO's 20)")
    p.add_argument(
        "--temperature",
        type=limited(POSITIVE),
        default=None,
        help="kNN vote temperature (default: probes.KNN_TEMPERATURE, DINO's 0.07)",
    )
    p.add_argument(
        "--max-train",
        type=limited(POSITIVE_INT),
        default=None,
        metavar="N",
        help="a seeded subsample of N examples of each probe's train split, as sweeps' max_probe_train "
        "(encodes N texts, not all 67,349 of SST-2); recorded as max_train in every row (default: all)",
    )
    p.add_argument(
        "--feature-transform",
        default="raw",
        help="raw, centred, whitened (comma-separated): the cosine and kNN probes' features, each transform "
        "fitted on the task's training split (the linear probe takes raw features)",
    )
    _add_sample_options(p)
    _add_encoder_options(p)
    _add_store_options(p)
    p.set_defaults(func=_probe)

    p = sub.add_parser(
        "geometry", help="geometry of a frozen encoder's features per layer (RankMe, anisotropy, uniformity, entropy)"
    )
    p.add_argument(
        "model", help="as for `crossbert probe`: checkpoint, run folder, HF / sentence-transformers folder, or 'minilm'"
    )
    p.add_argument("--tasks", required=True, help="comma-separated task names, a family or all: their evaluation splits' texts")
    p.add_argument(
        "--layers", type=_layer_spec("--layers"), default=LayerSpec.ALL, help="all | last | N | N,M,... (0 = embedding output)"
    )
    p.add_argument(
        "--pooling",
        type=_poolings,
        default=None,
        help="mean, cls, max (comma-separated); default: the model's own (sentence-transformers config), else mean",
    )
    _add_sample_options(p)
    _add_encoder_options(p)
    _add_store_options(p)
    p.set_defaults(func=_geometry)

    p = sub.add_parser("mteb", help="run mteb's own evaluators on a frozen encoder (local data by default)")
    p.add_argument("model")
    p.add_argument("--tasks", default=None, help="comma-separated MTEB task names")
    p.add_argument(
        "--benchmark",
        default=None,
        help='local-eng: every local MTEB task; or an mteb benchmark, e.g. "MTEB(eng, v2)": its tasks that have local data',
    )
    p.add_argument(
        "--layers",
        type=_layer_spec("--layers"),
        default=None,
        help="all | last | N | N,M,... (0 = embedding output; default last): the texts are encoded once and every "
        "layer is scored; published scores are compared with the last layer at the model's own pooling only",
    )
    p.add_argument(
        "--layer",
        type=_layer_spec("--layer"),
        default=None,
        help="deprecated alias of --layers (same grammar), removed in the next release",
    )
    p.add_argument(
        "--pooling", default=None, choices=POOLINGS, help="default: the model's own (sentence-transformers config), else mean"
    )
    p.add_argument("--out", dest="out_dir", default=MTEB_DIR, help="run folder: mteb's result JSONs and caches")
    p.add_argument("--results", dest="results_dir", default=None, help="results store (default: OUT/results)")
    p.add_argument("--cache", dest="cache_dir", default=FEATURES_DIR, help="feature cache shared with `crossbert probe`")
    p.add_argument("--no-feature-cache", action="store_true")
    _add_encoder_options(p, model_max_length=True)
    p.add_argument("--overwrite", action="store_true", help="re-run tasks mteb has cached results for")
    p.add_argument("--data-root", default=None, help="data root (default: $CROSSBERT_DATA_ROOT or ../shared/data)")
    p.set_defaults(func=_mteb)

    p = sub.add_parser("sweep", help="a scale sweep: train every (objective, size, seed), probe every checkpoint, report")
    p.add_argument("config", help="YAML sweep config (see configs/sweep/)")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. budget_tokens=500000 sizes=[nano,tiny]")
    p.add_argument(
        "--submitit",
        action="store_true",
        help="submit a job per run through submitit (SLURM where sbatch is found; shape from the config's "
        "submitit section, e.g. submitit.partition=learn submitit.gpus_per_node=1)",
    )
    p.add_argument(
        "--budget-s",
        type=limited(SECONDS),
        default=None,
        metavar="SECONDS",
        help="wall-clock budget of this worker: once a run has been timed, runs predicted not to end in time "
        "are skipped (and recorded), then the report is built (the config key budget_s)",
    )
    p.add_argument(
        "--limit",
        type=limited(POSITIVE_INT),
        default=None,
        metavar="N",
        help="a smoke test of the whole pipeline: a few training steps per run and at most N examples per probe "
        "split, into the folder <name>-limitN; its numbers mean nothing (the config key limit)",
    )
    p.add_argument(
        "--restore",
        dest="reference",
        default=None,
        metavar="REFERENCE",
        help="seed a new sweep folder from a committed reference of this sweep (results/<study>, `make reference`): "
        "its finished runs, trained and probed with the same settings, are kept; only the others are run",
    )
    p.set_defaults(func=_sweep)

    p = sub.add_parser("zoo", help="probe a list of pretrained encoders (folders, checkpoints, hub ids): tables, plots, report")
    p.add_argument("config", help="YAML zoo config (see configs/zoo/)")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. name=my_zoo max_probe_train=2000")
    p.set_defaults(func=_zoo)

    p = sub.add_parser(
        "report", help="tables, plots and report of a sweep, a zoo, or any results folder (each model's layer curves)"
    )
    p.add_argument(
        "sweep_dir", metavar="PATH", help="a sweep or zoo folder, or a --results folder of crossbert probe / geometry / mteb"
    )
    p.set_defaults(func=_report)

    p = sub.add_parser("plateau", help="unigram entropies (the plateau) of a sweep's runs trained before they were recorded")
    p.add_argument("sweep_dir")
    p.add_argument("overrides", nargs="*", help="key=value overrides of its sweep.yaml, e.g. train.data.cache_dir=runs/cache")
    p.add_argument(
        "--tokenizer",
        default=None,
        help="the tokenizer its runs were trained with (default: SWEEP_DIR/tokenizer, else the run's checkpoint)",
    )
    p.add_argument("--data-root", default=None, help="data root (default: $CROSSBERT_DATA_ROOT or ../shared/data)")
    p.set_defaults(func=_plateau)

    p = sub.add_parser(
        "reliance",
        help="does a checkpoint's encoder carry context? its loss with the encoder order-blind "
        "and bypassed, and per layer how much token identity and word order explain",
    )
    p.add_argument("checkpoint", help="a training checkpoint folder (runs/<name>/checkpoints/step_N)")
    p.add_argument("overrides", nargs="*", help="key=value overrides of its run's config, e.g. data.cache_dir=runs/cache")
    p.add_argument(
        "--eval-sequences",
        type=limited(POSITIVE_INT),
        default=None,
        help="validation sequences to measure on (default: the run's own eval_sequences)",
    )
    p.set_defaults(func=_reliance)

    p = sub.add_parser(
        "baselines",
        help="chance, majority-class and TF-IDF baselines of tasks, on the probes' own splits, into "
        "FOLDER/baselines (a sweep's or zoo's report draws them beside its models)",
    )
    p.add_argument(
        "folder",
        metavar="FOLDER",
        help="a sweep or zoo folder (its probe_tasks and max_probe_train are read from its "
        "sweep.yaml / zoo.yaml), or any folder with --tasks",
    )
    p.add_argument(
        "--tasks",
        default=None,
        help="comma-separated task names, a family or all (default: the folder's probe_tasks and its local mteb_tasks)",
    )
    p.add_argument(
        "--max-train",
        type=limited(POSITIVE_INT),
        default=None,
        metavar="N",
        help="the seeded cap of each training split, as the probes' (default: the folder's max_probe_train, else all)",
    )
    p.add_argument("--data-root", default=None, help="data root (default: $CROSSBERT_DATA_ROOT or ../shared/data)")
    p.set_defaults(func=_baselines)

    p = sub.add_parser("tasks", help="list the task files and the size of each split found in the data root")
    p.add_argument("--data-root", default=None, help="data root (default: $CROSSBERT_DATA_ROOT or ../shared/data)")
    p.set_defaults(func=_tasks)

    p = sub.add_parser("presets", help="list the size presets with computed parameter counts and FLOPs")
    from crossbert_model.data_args import DataArgs  # the limits of the config fields these mirror (light: no torch)

    p.add_argument("--seq-len", type=limited(limit_of(DataArgs, "seq_len")), default=128)
    p.add_argument("--vocab-size", type=limited(limit_of(DataArgs, "vocab_size")), default=8192)
    p.set_defaults(func=_presets)
    _add_export(sub)
    return parser


def configure_logging(debug: bool) -> None:
    from crossbert_model.logs import setup_logging  # log lines through tqdm.write: progress bars stay whole

    setup_logging()
    for name in NOISY_LOGGERS if not debug else ():
        logging.getLogger(name).setLevel(logging.WARNING)


# The one table of how the command line names a setting: a ProbeSettings / GeometrySettings / MtebSettings field or a
# loader's keyword -> its option (the field is also the argparse dest: one name from the parsed arguments down). The
# library names a setting by its field (crossbert_eval.settings.SettingError: "probe setting 'k': ..."; any
# CrossbertError's `setting`: "allow pickles (allow_pickle)"); the command line says it with the option
# (settings_as_options): "--k: ...", "allow pickles (--allow-pickle)".
OPTION_OF = {
    "tasks": "--tasks",
    "probes": "--probe",
    "layers": "--layers",
    "poolings": "--pooling",
    "pooling": "--pooling",
    "pair_mode": "--pair-mode",
    "k": "--k",
    "temperature": "--temperature",
    "seed": "--seed",
    "max_train": "--max-train",
    "max_eval": "--max-eval",
    "feature_transforms": "--feature-transform",
    "force": "--force",
    "data_root": "--data-root",
    "max_length": "--max-length",
    "dtype": "--dtype",
    "allow_pickle": "--allow-pickle",
    "trust_remote_code": "--trust-remote-code",
    "push": "--push",
    "benchmark": "--benchmark",
    "overwrite": "--overwrite",
    "results_dir": "--results",
    "cache_dir": "--cache",
    "out_dir": "--out",
    "dest": "DIR",
    "folder": "FOLDER",
    "reference": "--restore",
}
# The options that name where a command writes: checked before any work (crossbert_model.utils.check_outside_data_root).
OUTPUT_OPTIONS = ("results_dir", "cache_dir", "out_dir", "dest", "folder")


@contextlib.contextmanager
def settings_as_options(args: argparse.Namespace | None = None):
    """A setting the library names (a SettingError's field, any CrossbertError's `setting`) said as the option that sets
    it: `--k: expected a positive integer, got 0`. A setting that the command (`args`, when given) has no option for is
    said as the library says it."""
    from crossbert_model.errors import CrossbertError
    from crossbert_eval.settings import SettingError

    def option(setting: str | None) -> str | None:
        if setting not in OPTION_OF or (args is not None and not hasattr(args, setting)):
            return None
        return OPTION_OF[setting]

    try:
        yield
    except SettingError as e:
        if option(e.field) is None:
            raise
        raise CrossbertError(f"{option(e.field)}: {e.problem}") from None
    except CrossbertError as e:
        if option(e.setting) is None:
            raise
        raise CrossbertError(e.said_with(option(e.setting))) from None


def check_output_options(args: argparse.Namespace) -> None:
    """Every output option outside the data root; the first one given is where a crash report goes."""
    from crossbert_model.errors import report_crashes_in
    from crossbert_model.utils import check_outside_data_root

    given = [(getattr(args, name), OPTION_OF[name]) for name in OUTPUT_OPTIONS if getattr(args, name, None) is not None]
    for path, option in given:
        check_outside_data_root(path, option)
    if given:
        report_crashes_in(given[0][0])


def main(argv: list[str] | None = None) -> None:
    from crossbert_model.utils import set_offline_env

    set_offline_env()  # first, before any library reads its switch: offline unless CROSSBERT_ONLINE=1
    argv = sys.argv[1:] if argv is None else argv
    debug = debug_requested(argv)
    configure_logging(debug)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may follow an option (`sweep CONFIG --submitit submitit.partition=learn`), where
    # argparse leaves them over: they are the command's overrides all the same
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    with exit_on_user_error(f"crossbert {args.command}", debug), settings_as_options(args):
        check_output_options(args)
        check_names_early(args)
        args.func(args)


if __name__ == "__main__":
    main()
