"""The command line's contract with a user who made a mistake: one line naming the file, field or
option and what was expected, exit code 2, and nothing left behind that would block the corrected
command. One table, one row per mistake; then every entry point walked with a bad input, where a
traceback fails the test."""

import contextlib
import errno
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from unittest import mock

import pytest

from crossbert_eval.cli import build_parser, main
from crossbert_model.claims import FOLDER_OWNER, exclusive_folder
from crossbert_model.data.tokenizer import load_tokenizer, minilm_path
from crossbert_model.errors import TERMINATE_EXIT, USER_ERROR_EXIT
from own_code import folder_with_own_code

REPO = Path(__file__).resolve().parent.parent


# -- fixtures the rows need ------------------------------------------------------------------------


def _train_argv(corpus_args, out_dir: Path, *overrides: str) -> list[str]:
    """`crossbert train` on the test corpus (its tokenized cache is already built by the fixture)."""
    return [
        "train",
        str(REPO / "configs/train/tiny_mlm.yaml"),
        f"out_dir={out_dir}",
        "name=cli",
        "model.preset=nano",
        f"data.corpus={corpus_args.corpus}",
        f"data.vocab_size={corpus_args.vocab_size}",
        f"data.seq_len={corpus_args.seq_len}",
        f"data.max_documents={corpus_args.max_documents}",
        f"data.val_fraction={corpus_args.val_fraction}",
        f"data.cache_dir={corpus_args.cache_dir}",
        "dtype=fp32",
        "batch_size=8",
        "eval_sequences=16",
        "log_every=1",
        "checkpoint_steps=[]",
        "checkpoint_every=0",
        *overrides,
    ]


def _sweep_argv(out_dir: Path, *options: str) -> list[str]:
    return ["sweep", str(REPO / "configs/sweep/cpu_small.yaml"), f"out_dir={out_dir / 'runs'}", *options]


def _probe_argv(t: Path, model: str, *options: str, tasks: str = "TREC") -> list[str]:
    return ["probe", model, "--tasks", tasks, "--results", str(t / "r"), "--cache", str(t / "f"), *options]


def _tasks_dir_with(tmp_path: Path, name: str, edit) -> Path:
    """A copy of tasks/ in which the file of task `name` is rewritten by `edit(text) -> text`."""
    folder = tmp_path / "tasks"
    shutil.copytree(REPO / "tasks", folder)
    (path,) = [p for p in folder.rglob("*.yaml") if p.stem == name]
    path.write_text(edit(path.read_text()))
    return folder


def _real_data_root() -> Path:
    from crossbert_model.utils import data_root

    return data_root()


def _minilm_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(minilm_path(), folder)
    return folder


def _pickle_only_model(tmp_path: Path) -> Path:
    import torch

    folder = _minilm_copy(tmp_path)
    from safetensors.torch import load_file

    state = load_file(folder / "model.safetensors")
    torch.save(state, folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    return folder


class _Payload:
    """A pickle that would create `marker` when unpickled (torch's weights_only must refuse it)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.makedirs, (str(self.marker),)


def _pickle_payload_model(tmp_path: Path) -> Path:
    """A model folder whose only weights are a pickle carrying a payload."""
    import torch

    folder = _pickle_only_model(tmp_path)
    torch.save({"weights": _Payload(tmp_path / "code-ran")}, folder / "pytorch_model.bin")
    return folder


def _run_with_payload_optimizer(tmp_path: Path, corpus_args) -> list[str]:
    """A trained run whose latest checkpoint's optimizer.pt was replaced by a pickle carrying a payload; resuming reads it."""
    import torch

    argv = _train_argv(corpus_args, tmp_path / "runs", "steps=4", "checkpoint_every=2")
    assert main(argv) is None
    first, last = sorted((tmp_path / "runs" / "cli" / "checkpoints").glob("step_*"))
    shutil.rmtree(last)  # as if killed before its last save: a rerun resumes from the first
    torch.save({"state": _Payload(tmp_path / "code-ran")}, first / "optimizer.pt")
    return argv


def _truncated_model(tmp_path: Path) -> Path:
    folder = _minilm_copy(tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4096])
    return folder


def _nano_model(tmp_path: Path, **config) -> str:
    """One of our (untrained) nano checkpoints with MiniLM's vocabulary: loads and encodes in a second."""
    import crossbert_model as cm
    from crossbert_model.data.tokenizer import special_token_config

    folder = tmp_path / "nano"
    tokenizer = load_tokenizer("minilm")
    cm.pretraining_model_for(cm.config_from_preset("nano", **special_token_config(tokenizer), **config)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def _zoo_of(tmp_path: Path, entries: list[str]) -> Path:
    path = tmp_path / "zoo.yaml"
    path.write_text(
        "name: z\nprobe_tasks: [TREC]\nmteb_tasks: []\ngeometry_tasks: []\nmodels:\n" + "".join(f"  - {e}\n" for e in entries)
    )
    return path


def _nan_model(tmp_path: Path) -> str:
    """A nano checkpoint one of whose weights is NaN (a diverged run's last save)."""
    from safetensors.torch import load_file, save_file

    folder = Path(_nano_model(tmp_path))
    weights = load_file(folder / "model.safetensors")
    name = next(k for k in sorted(weights) if weights[k].is_floating_point())
    weights[name][0] = float("nan")
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return str(folder)


def _bad_utf8_corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"A first document of plain text.\n\nA second line " + b"\xff\xfe" + b" with a bad byte.\n")
    return corpus


def _results_with(tmp_path: Path, make) -> Path:
    """A results folder whose results.jsonl `make(path)` creates."""
    (tmp_path / "r").mkdir()
    make(tmp_path / "r" / "results.jsonl")
    return tmp_path / "r"


def _data_root_with_long_field(tmp_path: Path) -> dict:
    """A data root and task file where one TSV line holds a field over the csv module's size limit (128 KiB)."""
    root = tmp_path / "data"
    (root / "long").mkdir(parents=True)
    (root / "MANIFEST.md").write_text("test data\n")
    (root / "long" / "train.tsv").write_text("sentence\tlabel\n" + "word " * 30_000 + "\t0\nshort\t1\n")
    (root / "long" / "dev.tsv").write_text("sentence\tlabel\nfine\t0\n")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "LONG.yaml").write_text(
        "name: LONG\nfamily: classification\ninput: single\ntarget: class\nmetrics: [accuracy]\n"
        "data: {local: long, format: tsv}\nsplits: {train: train.tsv, validation: dev.tsv}\n"
        "columns: {text: sentence, label: label}\nlabels: ['0', '1']\n"
    )
    return {"CROSSBERT_TASKS_DIR": str(tasks), "CROSSBERT_DATA_ROOT": str(root)}


@contextlib.contextmanager
def _stdin_says_yes():
    """transformers asks on stdin before running a folder's code: answer yes, as a piped `yes` would."""
    with mock.patch.object(sys, "stdin", io.StringIO("y\n" * 20)):
        yield


@contextlib.contextmanager
def _files_at(*paths: Path):
    """Empty files at `paths`, as if some work had left them there."""
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    yield


@contextlib.contextmanager
def _read_only(folder: Path):
    """`folder` refuses every new entry: mode 0555, or for root (whom mode bits do not stop) the immutable flag."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("running as root on a file system without the immutable flag: no read-only folder to test with")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def _disk_full(error=None):
    """The disk fills up while the command writes: as safetensors and numpy report it."""
    error = error or OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def write(*args, **kwargs):
        raise error

    return write


def _checkpoint_disk_full():
    from safetensors import SafetensorError

    message = "Error while serializing: I/O error: No space left on device (os error 28)"
    return mock.patch("transformers.modeling_utils.safe_save_file", _disk_full(SafetensorError(message)))


# -- the table -------------------------------------------------------------------------------------


@dataclass
class Case:
    argv: Callable  # (tmp_path, corpus_args) -> argv
    says: list[str]  # what the one line must hold
    env: Callable = lambda t: {}  # (tmp_path) -> environment
    around: Callable = lambda t: contextlib.nullcontext()  # (tmp_path) -> the context the command runs in
    untouched: tuple[str, ...] = ()  # paths under tmp_path that hold no file afterwards


EVERY_OUTPUT = ("runs", "r", "f", "m", "code-ran")
_TREC = lambda edit: lambda t: {"CROSSBERT_TASKS_DIR": str(_tasks_dir_with(t, "TREC", edit))}  # noqa: E731

CASES = {
    # data root, task files, options
    "data root from env missing": Case(
        lambda t, c: ["tasks"], ["/nonexistent", "CROSSBERT_DATA_ROOT"], env=lambda t: {"CROSSBERT_DATA_ROOT": "/nonexistent"}
    ),
    "data root option missing": Case(lambda t, c: ["tasks", "--data-root", "/nonexistent"], ["/nonexistent", "--data-root"]),
    "typo in a nested task key": Case(
        lambda t, c: _probe_argv(t, "minilm", tasks="STS13"),
        ["STS13.yaml", "heder"],
        env=lambda t: {"CROSSBERT_TASKS_DIR": str(_tasks_dir_with(t, "STS13", lambda s: s.replace("header:", "heder:")))},
        untouched=EVERY_OUTPUT,
    ),
    "malformed task file, used": Case(
        lambda t, c: _probe_argv(t, "minilm", tasks="STS13"),
        ["STS13.yaml"],
        env=lambda t: {"CROSSBERT_TASKS_DIR": str(_tasks_dir_with(t, "STS13", lambda s: s + "\n  - : [\n"))},
    ),
    "task data at an absolute path": Case(
        lambda t, c: _probe_argv(t, "minilm"),
        ["TREC.yaml", "splits.test", "/etc/passwd", "outside the data root"],
        env=_TREC(lambda s: s.replace("test: TREC.test.all", "test: /etc/passwd")),
        untouched=EVERY_OUTPUT,
    ),
    "task data up and out with ..": Case(
        lambda t, c: _probe_argv(t, "minilm"),
        ["TREC.yaml", "../../../../etc/passwd", "outside the data root"],
        env=_TREC(lambda s: s.replace("test: TREC.test.all", "test: ../../../../etc/passwd")),
        untouched=EVERY_OUTPUT,
    ),
    "task trained on its test file": Case(
        lambda t, c: _probe_argv(t, "minilm"),
        ["TREC.yaml", "'train'", "'test'", "the same data", "TREC.train.all.xz"],
        env=_TREC(lambda s: s.replace("test: TREC.test.all", "test: TREC.train.all.xz")),
        untouched=EVERY_OUTPUT,
    ),
    "a task line over the CSV field limit": Case(
        lambda t, c: _probe_argv(t, _nano_model(t), tasks="LONG"),
        ["long/train.tsv:2", "field larger than field limit"],
        env=_data_root_with_long_field,
        untouched=("r",),
    ),
    "unknown task": Case(lambda t, c: _probe_argv(t, "minilm", tasks="SST2x"), ["SST2x"], untouched=EVERY_OUTPUT),
    "--tasks ''": Case(lambda t, c: _probe_argv(t, "minilm", tasks=""), ["--tasks", "one or more"], untouched=EVERY_OUTPUT),
    "--temperature 0": Case(lambda t, c: ["probe", "minilm", "--tasks", "TREC", "--temperature", "0"], ["--temperature", "0"]),
    "--k 0": Case(lambda t, c: ["probe", "minilm", "--tasks", "TREC", "--k", "0"], ["--k", "0"]),
    "--pooling avg": Case(lambda t, c: ["probe", "minilm", "--tasks", "TREC", "--pooling", "avg"], ["--pooling", "avg"]),
    "--batch-size 0": Case(lambda t, c: ["probe", "minilm", "--tasks", "TREC", "--batch-size", "0"], ["--batch-size", "0"]),
    "probe --layers abc": Case(
        lambda t, c: _probe_argv(t, "minilm", "--layers", "abc"), ["--layers", "'abc'"], untouched=EVERY_OUTPUT
    ),
    "geometry --layers abc": Case(
        lambda t, c: [
            "geometry",
            "minilm",
            "--tasks",
            "TREC",
            "--layers",
            "abc",
            "--results",
            str(t / "r"),
            "--cache",
            str(t / "f"),
        ],
        ["--layers", "'abc'"],
        untouched=EVERY_OUTPUT,
    ),
    "mteb --layers abc": Case(
        lambda t, c: ["mteb", "minilm", "--tasks", "STSBenchmark", "--layers", "abc", "--out", str(t / "m")],
        ["--layers: expected all, last or layer numbers", "'abc'"],
        untouched=EVERY_OUTPUT,
    ),
    "mteb --layer abc (the deprecated alias)": Case(
        lambda t, c: ["mteb", "minilm", "--tasks", "STSBenchmark", "--layer", "abc", "--out", str(t / "m")],
        ["--layer: expected all, last or layer numbers", "'abc'"],
        untouched=EVERY_OUTPUT,
    ),
    "mteb --layer and --layers": Case(
        lambda t, c: ["mteb", "minilm", "--tasks", "STSBenchmark", "--layer", "1", "--layers", "2", "--out", str(t / "m")],
        ["--layers only", "deprecated alias"],
        untouched=EVERY_OUTPUT,
    ),
    "mteb --layers beyond the model": Case(
        lambda t, c: [
            "mteb",
            "minilm",
            "--tasks",
            "STSBenchmark",
            "--layers",
            "0,9",
            "--out",
            str(t / "m"),
            "--cache",
            str(t / "f"),
            "--results",
            str(t / "r"),
        ],
        ["layers [9] out of range", "0 (embeddings) to 6"],
        untouched=EVERY_OUTPUT,
    ),
    # models
    "model folder that needs its own code (stdin says y)": Case(
        lambda t, c: _probe_argv(t, str(folder_with_own_code(t / "in", t / "code-ran"))),
        ["auto_map", "--trust-remote-code"],
        around=lambda t: _stdin_says_yes(),
        untouched=EVERY_OUTPUT,
    ),
    "--max-length beyond MiniLM's positions": Case(
        lambda t, c: _probe_argv(t, "minilm", "--max-length", "1000"),
        ["--max-length 1000", "at most 512"],
        untouched=EVERY_OUTPUT,
    ),
    "--max-length beyond what our model was trained on": Case(
        lambda t, c: _probe_argv(t, _nano_model(t, max_position_embeddings=64), "--max-length", "100"),
        ["--max-length 100", "at most 64"],
        untouched=EVERY_OUTPUT,
    ),
    "pickle weights": Case(
        lambda t, c: _probe_argv(t, str(_pickle_only_model(t))), ["pytorch_model.bin", "--allow-pickle"], untouched=("r", "f")
    ),
    "truncated safetensors": Case(
        lambda t, c: _probe_argv(t, str(_truncated_model(t))), ["model.safetensors"], untouched=("r", "f")
    ),
    "hub id offline, not cached": Case(
        lambda t, c: _probe_argv(t, "google/bert_uncased_L-2_H-128_A-2"),
        ["google/bert_uncased_L-2_H-128_A-2", "CROSSBERT_ONLINE"],
        env=lambda t: {"HF_HUB_CACHE": str(t / "empty-hub-cache")},
        untouched=("r", "f"),
    ),
    # results store and output folders
    "a results line that is JSON but no object": Case(
        lambda t, c: _probe_argv(t, _nano_model(t)),
        ["results.jsonl", "a JSON array, not a row"],
        around=lambda t: contextlib.nullcontext(_results_with(t, lambda p: p.write_text('{"unit": "a"}\n[1, 2]\n'))),
    ),
    "results.jsonl that is a folder": Case(
        lambda t, c: _probe_argv(t, _nano_model(t)),
        ["results.jsonl", "expected a file, found a folder"],
        around=lambda t: contextlib.nullcontext(_results_with(t, Path.mkdir)),
        untouched=("f",),
    ),
    "read-only results folder": Case(
        lambda t, c: _probe_argv(t, _nano_model(t)),
        ["/r/", "point the command at another folder"],
        around=lambda t: _read_only(t / "r"),
        untouched=("r", "f"),
    ),
    "disk full during a feature write": Case(
        lambda t, c: _probe_argv(t, _nano_model(t)),
        ["/f/", "No space left on device", "run the same command again"],
        around=lambda t: mock.patch("crossbert_eval.feature_cache.np.save", _disk_full()),
        untouched=("f", "r/claims"),
    ),
    "pickle weights carrying a payload, allowed": Case(
        lambda t, c: _probe_argv(t, str(_pickle_payload_model(t)), "--allow-pickle"),
        ["ask to run code", "os.makedirs", "refused"],
        untouched=("r", "f", "code-ran"),
    ),
    "an optimizer state carrying a payload, resumed": Case(
        _run_with_payload_optimizer, ["no usable checkpoint to resume from", "damaged"], untouched=("code-ran",)
    ),
    "zoo with several missing models": Case(
        lambda t, c: [
            "zoo",
            str(_zoo_of(t, ["{model: minilm}", f"{{model: {t}/gone1, made_by: make gone1}}", f"{{model: {t}/gone2}}"])),
            f"out_dir={t / 'zoo'}",
        ],
        ["2 of 3 models cannot run", "models[1]", "gone1", "made by: make gone1", "models[2]", "gone2"],
        untouched=("zoo",),
    ),
    "NaN weights, probed": Case(
        lambda t, c: _probe_argv(t, _nan_model(t)), ["/nano", "hold NaN or Inf", "refused"], untouched=("r", "f")
    ),
    "NaN weights, exported": Case(
        lambda t, c: ["export", _nan_model(t), str(t / "exported")],
        ["model.safetensors", "hold NaN or Inf", "refused"],
        untouched=("exported",),
    ),
    "report of a missing folder": Case(lambda t, c: ["report", str(t / "nonexistent")], ["nonexistent"], untouched=("r",)),
    "plateau of a folder that is no sweep": Case(lambda t, c: ["plateau", str(t)], ["not a sweep folder"]),
    "reliance of a model folder that is no training checkpoint": Case(
        lambda t, c: ["reliance", _nano_model(t)], ["/nano: expected a checkpoint folder runs/<name>/checkpoints/step_N"]
    ),
    # names that become folders stay one segment inside the folder given; nothing is written into the data root
    "run name that climbs out of out_dir": Case(
        lambda t, c: _train_argv(c, t / "runs", "name=../../ESCAPED"),
        ["config field 'name'", "one folder name", "'../../ESCAPED'"],
        untouched=("runs",),
    ),
    "absolute run name": Case(
        lambda t, c: _train_argv(c, t / "runs", f"name={t}/abs"),
        ["config field 'name'", "one folder name"],
        untouched=("runs", "abs"),
    ),
    "sweep name that climbs out": Case(
        lambda t, c: [*_sweep_argv(t), "name=../up"], ["sweep field 'name'", "one folder name"], untouched=("runs", "up")
    ),
    "zoo named ..": Case(
        lambda t, c: ["zoo", str(REPO / "configs/zoo/offline.yaml"), f"out_dir={t / 'zoo'}", "name=.."],
        ["zoo field 'name'", "one folder name", "'..'"],
        untouched=("zoo", "results", "tables", "report.md"),
    ),
    "run folder inside the data root": Case(
        lambda t, c: _train_argv(c, _real_data_root() / "runs"), ["config field 'out_dir'", "outside the data root"]
    ),
    "probe results inside the data root": Case(
        lambda t, c: _probe_argv(t, "minilm")[:4] + ["--results", str(_real_data_root() / "r")],
        ["--results", "outside the data root"],
    ),
    # training
    "steps=0": Case(lambda t, c: _train_argv(c, t / "runs", "steps=0"), ["steps", "0"], untouched=("runs",)),
    "steps=-5": Case(lambda t, c: _train_argv(c, t / "runs", "steps=-5"), ["steps", "-5"], untouched=("runs",)),
    "batch_size=0": Case(lambda t, c: _train_argv(c, t / "runs", "batch_size=0"), ["batch_size", "0"], untouched=("runs",)),
    "negative seed": Case(lambda t, c: _train_argv(c, t / "runs", "seed=-1"), ["'seed'", "-1"], untouched=("runs",)),
    "unknown config key": Case(
        lambda t, c: _train_argv(c, t / "runs", "optim.learning_rate=1"), ["optim.learning_rate"], untouched=("runs",)
    ),
    "CMS at r=0.6": Case(
        lambda t, c: _train_argv(c, t / "runs", "model.objective=crossbert", "model.mask_ratio=0.6"),
        ["mask_ratio", "0.6", "whole number", "complementary_masking"],
        untouched=("runs",),
    ),
    "odd head dimension": Case(
        lambda t, c: _train_argv(c, t / "runs", "model.hidden_size=66", "model.num_attention_heads=2"),
        ["head dimension of 33", "rotary", "even"],
        untouched=("runs",),
    ),
    "tokenizer folder that needs its own code (stdin says y)": Case(
        lambda t, c: _train_argv(c, t / "runs", f"data.tokenizer={folder_with_own_code(t / 'in', t / 'code-ran')}"),
        ["auto_map", "set data.trust_remote_code,"],
        around=lambda t: _stdin_says_yes(),
        untouched=("runs", "code-ran"),
    ),
    "a run folder another trainer holds": Case(
        lambda t, c: _train_argv(c, t / "runs"),
        ["runs/cli", "being trained by another process", f"pid {os.getpid()}"],
        around=lambda t: exclusive_folder(t / "runs" / "cli", "being trained"),
        untouched=("runs",),
    ),
    "corpus too small for a validation split": Case(
        lambda t, c: _train_argv(
            c, t / "runs", "data.max_documents=40", "data.val_fraction=0.02", "eval_every=5", f"data.cache_dir={t / 'cache'}"
        ),
        ["no validation sequence", "data.val_fraction", "eval_sequences=0"],
        untouched=("runs",),
    ),
    "read-only output folder": Case(
        lambda t, c: _train_argv(c, t / "runs"),
        ["/runs", "point the command at another folder"],
        around=lambda t: _read_only(t / "runs"),
        untouched=("runs",),
    ),
    "disk full during a checkpoint": Case(
        lambda t, c: _train_argv(c, t / "runs", "steps=2"),
        ["checkpoints/step_0000002", "No space left on device"],
        around=lambda t: _checkpoint_disk_full(),
        untouched=("runs/cli/checkpoints",),
    ),
    "hub corpus offline": Case(
        lambda t, c: _train_argv(c, t / "runs", "data.corpus=hf:wikitext:wikitext-2-raw-v1", f"data.cache_dir={t / 'cache'}"),
        ["hf:wikitext:wikitext-2-raw-v1", "CROSSBERT_ONLINE=1"],
        untouched=("runs",),
    ),  # cache: the tokenizer lock alone
    "non-UTF-8 corpus": Case(
        lambda t, c: _train_argv(c, t / "runs", f"data.corpus={_bad_utf8_corpus(t)}", f"data.cache_dir={t / 'cache'}"),
        ["corpus.txt:3", "UTF-8"],
        untouched=("runs",),
    ),
    "divergence": Case(lambda t, c: _train_argv(c, t / "runs", "steps=12", "optim.lr=1e4", "optim.warmup_steps=1"), ["optim.lr"]),
    # sweeps: every field checked before the first run trains
    "sweep: two objectives of one name": Case(
        lambda t, c: _sweep_argv(t, "objectives=[{name: mlm, objective: mlm}, {name: mlm, objective: crossbert}]"),
        ["'objectives'", "'mlm' is given twice"],
        untouched=("runs",),
    ),
    "sweep: a seed twice": Case(
        lambda t, c: _sweep_argv(t, "seeds=[0, 0]"), ["'seeds'", "0 is given twice"], untouched=("runs",)
    ),
    "sweep: no sizes": Case(lambda t, c: _sweep_argv(t, "sizes=[]"), ["'sizes'", "empty"], untouched=("runs",)),
    "sweep: no seeds": Case(lambda t, c: _sweep_argv(t, "seeds=[]"), ["'seeds'", "empty"], untouched=("runs",)),
    "sweep: checkpoint fraction 2.0": Case(
        lambda t, c: _sweep_argv(t, "checkpoint_fractions=[2.0]"),
        ["checkpoint_fractions[0]", "(0, 1]", "2.0"],
        untouched=("runs",),
    ),
    "sweep: negative seed": Case(lambda t, c: _sweep_argv(t, "seeds=[-1]"), ["seeds[0]", "-1"], untouched=("runs",)),
    "sweep: unknown objective": Case(
        lambda t, c: _sweep_argv(t, "objectives=[{name: x, objective: bert}]"),
        ["sweep field 'objectives[0] (x).objective'", "'bert'"],  # the entry named by its name
        untouched=("runs",),
    ),
    "sweep: unknown size": Case(lambda t, c: _sweep_argv(t, "sizes=[huge]"), ["sizes[0]", "'huge'"], untouched=("runs",)),
    "sweep: unknown probe task": Case(
        lambda t, c: _sweep_argv(t, "probe_tasks=[SST2x]"), ["probe_tasks", "SST2x"], untouched=("runs",)
    ),
    "sweep: unknown mteb task": Case(
        lambda t, c: _sweep_argv(t, "mteb_tasks=[NoSuchTask]"), ["mteb_tasks", "NoSuchTask"], untouched=("runs",)
    ),
    "sweep: max_probe_train 0": Case(
        lambda t, c: _sweep_argv(t, "max_probe_train=0"), ["max_probe_train", "positive integer", "0"], untouched=("runs",)
    ),
    "sweep: layers abc": Case(lambda t, c: _sweep_argv(t, "probe_layers=abc"), ["probe_layers", "'abc'"], untouched=("runs",)),
    "sweep: unknown submitit cluster": Case(
        lambda t, c: _sweep_argv(t, "--submitit", "submitit.cluster=sge"),
        ["submitit.cluster", "expected one of", "sge"],
        untouched=("runs",),
    ),
    "sweep: submitit.timeout_min=0": Case(
        lambda t, c: _sweep_argv(t, "--submitit", "submitit.timeout_min=0"),
        ["submitit.timeout_min", "expected a positive number", "0"],
        untouched=("runs",),
    ),
    "sweep: claim_lease_s=0": Case(
        lambda t, c: _sweep_argv(t, "claim_lease_s=0"), ["claim_lease_s", "expected a positive number", "0"], untouched=("runs",)
    ),
    "sweep: --restore from a folder that is no reference": Case(
        lambda t, c: _sweep_argv(t, "--restore", str(t / "r")),
        ["--restore:", "is not a reference of a sweep", "sweep.yaml is missing"],
        untouched=("runs",),
    ),
    "sweep: --restore into a sweep folder with runs of its own": Case(
        lambda t, c: _sweep_argv(t, "--restore", str(t / "reference")),
        ["--restore:", "runs/cpu_small already holds runs of its own", "or run the sweep without --restore"],
        around=lambda t: _files_at(
            t / "runs/cpu_small/runs/mlm-nano-s0/config.yaml", t / "reference/sweep.yaml", t / "reference/checkpoints.jsonl"
        ),
    ),
    "misspelt SLURM parameter": Case(
        lambda t, c: _sweep_argv(t, "--submitit", "submitit.cluster=local", "submitit.slurm={acount: x}"),
        ["sweep section 'submitit'", "acount"],
        untouched=("runs",),
    ),
}


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code, capsys.readouterr().err


def holds_no_file(path: Path) -> bool:
    return not path.exists() or (path.is_dir() and not any(p.is_file() or p.is_symlink() for p in path.rglob("*")))


@pytest.mark.parametrize("case", list(CASES))
def test_a_mistake_gets_one_line_and_exit_2(case, tmp_path, monkeypatch, capsys, corpus, corpus_args):
    row = CASES[case]
    monkeypatch.delenv("CROSSBERT_DEBUG", raising=False)
    for key, value in row.env(tmp_path).items():
        monkeypatch.setenv(key, value)
    argv = row.argv(tmp_path, corpus_args)
    with row.around(tmp_path):
        code, err = run_cli(argv, capsys)
    assert code == USER_ERROR_EXIT, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err  # no usage block, no library's extra lines
    assert re.match(r"^crossbert \w+: error: ", err), err
    for fragment in row.says:
        assert fragment in err, err
    for path in row.untouched:
        assert holds_no_file(tmp_path / path), f"{path} left behind: {sorted(map(str, (tmp_path / path).rglob('*')))}"


def test_a_diverged_run_keeps_only_usable_checkpoints(tmp_path, capsys, corpus, corpus_args):
    code, err = run_cli(
        _train_argv(corpus_args, tmp_path / "runs", "steps=12", "optim.lr=1e4", "optim.warmup_steps=1", "checkpoint_every=2"),
        capsys,
    )
    assert code == USER_ERROR_EXIT
    for state_file in (tmp_path / "runs" / "cli" / "checkpoints").glob("step_*/trainer_state.json"):
        val = json.loads(state_file.read_text())["metrics"].get("val_loss")
        assert val is None or val < 50, (state_file, val)


def test_a_refused_command_then_corrected_runs(tmp_path, capsys, corpus, corpus_args):
    """What a refused command leaves never blocks the corrected one: a full disk at the final checkpoint, then
    the same command resumes and finishes."""
    argv = _train_argv(corpus_args, tmp_path / "runs", "steps=4", "checkpoint_steps=[2]")
    with _checkpoint_disk_full():
        assert run_cli(argv, capsys)[0] == USER_ERROR_EXIT
    main(argv)
    assert sorted(p.name for p in (tmp_path / "runs" / "cli" / "checkpoints").iterdir()) == ["step_0000002", "step_0000004"]


def metric_steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_second_trainer_of_a_run_folder_is_refused_and_each_step_is_logged_once(tmp_path, capsys, corpus, corpus_args):
    argv = _train_argv(corpus_args, tmp_path / "runs", "steps=30", "eval_every=10")
    run_dir = tmp_path / "runs" / "cli"
    first = threading.Thread(target=main, args=(argv,))  # a trainer of its own (a thread: flock is per open file)
    first.start()
    while first.is_alive() and not (run_dir / FOLDER_OWNER).exists():
        time.sleep(0.05)
    code, err = run_cli(argv, capsys)  # the second, while the first trains
    first.join()
    assert code == USER_ERROR_EXIT and "being trained by another process" in err and len(err.splitlines()) == 1, err
    assert metric_steps(run_dir) == list(range(31))  # step 0 (the untrained model), then every step, each once


def test_sigterm_stops_training_like_ctrl_c_and_the_same_command_resumes(tmp_path, capsys, monkeypatch, corpus, corpus_args):
    from crossbert_model.train import Trainer

    argv = _train_argv(corpus_args, tmp_path / "runs", "steps=6", "checkpoint_steps=[2]")
    step = Trainer.train_step

    def terminated_at_step_4(self, n, batch, read=True):
        if n == 4:
            os.kill(os.getpid(), signal.SIGTERM)  # as `kill`, a scheduler or torchrun would send it
        return step(self, n, batch, read)

    monkeypatch.setattr(Trainer, "train_step", terminated_at_step_4)
    code, err = run_cli(argv, capsys)
    assert code == TERMINATE_EXIT
    assert err.splitlines() == [
        f"crossbert train: terminated (SIGTERM): {tmp_path / 'runs' / 'cli'}: stopped; checkpoint "
        "step_0000002 is kept and the same command resumes from it"
    ]
    monkeypatch.undo()
    main(argv)  # the lock went with the stopped trainer
    assert metric_steps(tmp_path / "runs" / "cli") == list(range(7))


def test_debug_shows_the_traceback(tmp_path, capsys):
    with pytest.raises(Exception) as error:
        main(["--debug", "report", str(tmp_path / "nonexistent")])
    assert "nonexistent" in str(error.value)


def test_the_installed_command_exits_2_with_one_line(tmp_path):
    """The real entry point, in a fresh process: no traceback, no library loader noise."""
    env = {**os.environ, "CROSSBERT_DATA_ROOT": "/nonexistent"}
    done = subprocess.run([sys.executable, "-m", "crossbert_eval.cli", "tasks"], capture_output=True, text=True, env=env)
    assert done.returncode == USER_ERROR_EXIT
    assert done.stderr.strip().splitlines() == [
        "crossbert tasks: error: data root /nonexistent (from $CROSSBERT_DATA_ROOT) is not a folder; "
        "expected the folder holding MANIFEST.md"
    ]


# -- every entry point, walked with bad input ------------------------------------------------------


def _entry_points() -> dict[str, Callable[[Path], list[str]]]:
    """A bad input for each way in: the `crossbert` subcommands (each a missing input and a bad option value)
    and the modules torchrun and submitit launch."""
    missing = lambda t: str(t / "missing")  # noqa: E731
    out = lambda t: ["--results", str(t / "r"), "--cache", str(t / "f")]  # noqa: E731
    return {
        "train": lambda t: ["train", missing(t) + ".yaml"],
        "train option": lambda t: ["train", str(REPO / "configs/train/tiny_mlm.yaml"), "steps"],
        "presets": lambda t: ["presets", "--seq-len", "zero"],
        "probe": lambda t: ["probe", missing(t), "--tasks", "TREC", *out(t)],
        "probe option": lambda t: ["probe", "minilm", "--tasks", "TREC", "--pair-mode", "both", *out(t)],
        "geometry": lambda t: ["geometry", missing(t), "--tasks", "TREC", *out(t)],
        "geometry option": lambda t: ["geometry", "minilm", *out(t)],
        "geometry sample": lambda t: ["geometry", "minilm", "--tasks", "TREC", "--max-eval", "0", *out(t)],
        "tasks": lambda t: ["tasks", "--data-root", missing(t)],
        "mteb": lambda t: ["mteb", missing(t), "--tasks", "STSBenchmark", "--out", str(t / "m")],
        "mteb option": lambda t: ["mteb", "minilm", "--pooling", "sum", "--out", str(t / "m")],
        "sweep": lambda t: ["sweep", missing(t) + ".yaml"],
        "sweep option": lambda t: ["sweep", str(REPO / "configs/sweep/cpu_small.yaml"), f"out_dir={t}", "--seeds", "1"],
        "zoo": lambda t: ["zoo", missing(t) + ".yaml"],
        "zoo option": lambda t: ["zoo", str(REPO / "configs/zoo/offline.yaml"), f"out_dir={t}", "models=[]"],
        "report": lambda t: ["report", missing(t)],
        "plateau": lambda t: ["plateau", missing(t)],
        "reliance": lambda t: ["reliance", missing(t)],
        "baselines": lambda t: ["baselines", missing(t)],
        "baselines option": lambda t: ["baselines", str(t / "b"), "--tasks", "SST-2", "--max-train", "0"],
        "export": lambda t: ["export", missing(t), str(t / "exported")],
        "no command": lambda t: [],
        "unknown command": lambda t: ["trian"],
    }


MODULE_MAINS = {
    "crossbert_model.train": lambda t: [str(t / "missing.yaml")],
    "crossbert_eval.sweep": lambda t: [str(t / "missing.yaml")],
    "crossbert_eval.zoo": lambda t: [str(t / "missing.yaml")],
}


def test_the_walk_covers_every_subcommand():
    (subparsers,) = [a for a in build_parser()._actions if a.dest == "command"]
    assert set(subparsers.choices) <= set(_entry_points())


@pytest.mark.parametrize("entry", list(_entry_points()) + list(MODULE_MAINS))
def test_no_entry_point_shows_a_traceback(entry, tmp_path, monkeypatch, capsys):
    """With --debug off, a bad input at any entry point ends in one line and exit 2; any exception escaping
    (what a user would see as a traceback) fails this test."""
    import importlib

    monkeypatch.delenv("CROSSBERT_DEBUG", raising=False)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))  # `crossbert mteb` sets it when unset
    if entry in MODULE_MAINS:
        run, argv = importlib.import_module(entry).main, MODULE_MAINS[entry](tmp_path)
    else:
        run, argv = main, _entry_points()[entry](tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        run(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == USER_ERROR_EXIT and len(err.splitlines()) == 1 and "error: " in err, err


def test_a_bug_is_one_line_that_says_so_and_names_the_file_holding_its_traceback(tmp_path, monkeypatch, capsys):
    import crossbert_eval.cli as cli

    def broken(args):
        raise ZeroDivisionError("division by zero\nin a place nobody expected")

    monkeypatch.setattr(cli, "_probe", broken)
    monkeypatch.delenv("CROSSBERT_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main(_probe_argv(tmp_path, "minilm"))
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "internal error (a bug in crossbert, not in your input): ZeroDivisionError: division by zero in a place" in err
    (report,) = (tmp_path / "r").glob("crossbert-crash-*.txt")  # in the folder the command writes to, named by the line
    assert str(report) in err and "Traceback" in report.read_text() and "ZeroDivisionError" in report.read_text()
    with pytest.raises(ZeroDivisionError):  # --debug: the traceback itself
        main(["--debug", *_probe_argv(tmp_path, "minilm")])
