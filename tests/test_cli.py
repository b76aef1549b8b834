"""The command line's contract with a user who made a mistake: one line naming the file, field or
option and what was expected, exit code 2, and nothing written. One table, one row per mistake."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from crossbert_eval.cli import main
from crossbert_model.data import minilm_path
from crossbert_model.errors import USER_ERROR_EXIT

REPO = Path(__file__).resolve().parent.parent


# -- fixtures the rows need ------------------------------------------------------------------------


def _train_argv(corpus_args, out_dir: Path, *overrides: str) -> list[str]:
    """`crossbert train` on the test corpus (its tokenized cache is already built by the fixture)."""
    return [
        "train", str(REPO / "configs/train/tiny_mlm.yaml"), f"out_dir={out_dir}", "name=cli", "model.preset=nano",
        f"data.corpus={corpus_args.corpus}", f"data.vocab_size={corpus_args.vocab_size}", f"data.seq_len={corpus_args.seq_len}",
        f"data.max_documents={corpus_args.max_documents}", f"data.val_fraction={corpus_args.val_fraction}",
        f"data.cache_dir={corpus_args.cache_dir}", "dtype=fp32", "batch_size=8", "eval_sequences=16", "log_every=1",
        "checkpoint_steps=[]", "checkpoint_every=0", *overrides,
    ]  # fmt: skip


def _sweep_argv(out_dir: Path, *options: str) -> list[str]:
    return ["sweep", str(REPO / "configs/sweep/cpu_small.yaml"), f"out_dir={out_dir / 'runs'}", *options]


def _tasks_dir_with(tmp_path: Path, name: str, edit) -> Path:
    """A copy of tasks/ in which the file of task `name` is rewritten by `edit(text) -> text`."""
    folder = tmp_path / "tasks"
    shutil.copytree(REPO / "tasks", folder)
    (path,) = [p for p in folder.rglob("*.yaml") if p.stem == name]
    path.write_text(edit(path.read_text()))
    return folder


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


def _truncated_model(tmp_path: Path) -> Path:
    folder = _minilm_copy(tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4096])
    return folder


def _bad_utf8_corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"A first document of plain text.\n\nA second line " + b"\xff\xfe" + b" with a bad byte.\n")
    return corpus


# -- the table -------------------------------------------------------------------------------------
# id -> (argv builder, environment builder, substrings the one-line message must hold)

CASES = {
    "data root from env missing": (
        lambda t, c: ["tasks"], lambda t: {"CROSSBERT_DATA_ROOT": "/nonexistent"}, ["/nonexistent", "CROSSBERT_DATA_ROOT"]),
    "data root option missing": (
        lambda t, c: ["tasks", "--data-root", "/nonexistent"], lambda t: {}, ["/nonexistent", "--data-root"]),
    "typo in a nested task key": (
        lambda t, c: ["probe", "minilm", "--tasks", "STS13", "--results", str(t / "r"), "--cache", str(t / "f")],
        lambda t: {"CROSSBERT_TASKS_DIR": str(_tasks_dir_with(t, "STS13", lambda s: s.replace("header:", "heder:")))},
        ["STS13.yaml", "heder"]),
    "malformed task file, used": (
        lambda t, c: ["probe", "minilm", "--tasks", "STS13", "--results", str(t / "r"), "--cache", str(t / "f")],
        lambda t: {"CROSSBERT_TASKS_DIR": str(_tasks_dir_with(t, "STS13", lambda s: s + "\n  - : [\n"))},
        ["STS13.yaml"]),
    "steps=0": (lambda t, c: _train_argv(c, t / "runs", "steps=0"), lambda t: {}, ["steps", "0"]),
    "steps=-5": (lambda t, c: _train_argv(c, t / "runs", "steps=-5"), lambda t: {}, ["steps", "-5"]),
    "batch_size=0": (lambda t, c: _train_argv(c, t / "runs", "batch_size=0"), lambda t: {}, ["batch_size", "0"]),
    "unknown config key": (lambda t, c: _train_argv(c, t / "runs", "optim.learning_rate=1"), lambda t: {}, ["optim.learning_rate"]),
    "CMS at r=0.6": (lambda t, c: _train_argv(c, t / "runs", "model.objective=crossbert", "model.mask_ratio=0.6"), lambda t: {},
                     ["mask_ratio", "0.6", "whole number", "complementary_masking"]),
    "--temperature 0": (lambda t, c: ["probe", "minilm", "--tasks", "TREC", "--temperature", "0"], lambda t: {}, ["--temperature", "0"]),
    "--k 0": (lambda t, c: ["probe", "minilm", "--tasks", "TREC", "--k", "0"], lambda t: {}, ["--k", "0"]),
    "--pooling avg": (lambda t, c: ["probe", "minilm", "--tasks", "TREC", "--pooling", "avg"], lambda t: {}, ["--pooling", "avg"]),
    "--batch-size 0": (lambda t, c: ["probe", "minilm", "--tasks", "TREC", "--batch-size", "0"], lambda t: {}, ["--batch-size", "0"]),
    "unknown task": (
        lambda t, c: ["probe", "minilm", "--tasks", "SST2x", "--results", str(t / "r")], lambda t: {}, ["SST2x"]),
    "report of a missing folder": (lambda t, c: ["report", str(t / "nonexistent")], lambda t: {}, ["nonexistent"]),
    "plateau of a folder that is no sweep": (lambda t, c: ["plateau", str(t)], lambda t: {}, ["not a sweep folder"]),
    "pickle weights": (
        lambda t, c: ["probe", str(_pickle_only_model(t)), "--tasks", "TREC", "--results", str(t / "r")], lambda t: {},
        ["pytorch_model.bin", "--allow-pickle"]),
    "truncated safetensors": (
        lambda t, c: ["probe", str(_truncated_model(t)), "--tasks", "TREC", "--results", str(t / "r")], lambda t: {},
        ["model.safetensors"]),
    "hub id offline, not cached": (
        lambda t, c: ["probe", "google/bert_uncased_L-2_H-128_A-2", "--tasks", "TREC", "--results", str(t / "r")],
        lambda t: {"HF_HUB_CACHE": str(t / "empty-hub-cache")}, ["google/bert_uncased_L-2_H-128_A-2", "CROSSBERT_ONLINE"]),
    "non-UTF-8 corpus": (
        lambda t, c: _train_argv(c, t / "runs", f"data.corpus={_bad_utf8_corpus(t)}", f"data.cache_dir={t / 'cache'}"),
        lambda t: {}, ["corpus.txt:3", "UTF-8"]),
    "sweep: unknown submitit cluster": (
        lambda t, c: _sweep_argv(t, "--submitit", "submitit.cluster=sge"), lambda t: {},
        ["submitit.cluster", "expected one of", "sge"]),
    "sweep: submitit.timeout_min=0": (
        lambda t, c: _sweep_argv(t, "--submitit", "submitit.timeout_min=0"), lambda t: {},
        ["submitit.timeout_min", "expected a positive number", "0"]),
    "sweep: claim_lease_s=0": (
        lambda t, c: _sweep_argv(t, "claim_lease_s=0"), lambda t: {}, ["claim_lease_s", "expected a positive number", "0"]),
    "misspelt SLURM parameter": (
        lambda t, c: _sweep_argv(t, "--submitit", "submitit.cluster=local", "submitit.slurm={acount: x}"), lambda t: {},
        ["sweep section 'submitit'", "acount"]),
    "divergence": (
        lambda t, c: _train_argv(c, t / "runs", "steps=12", "optim.lr=1e4", "optim.warmup_steps=1"), lambda t: {},
        ["optim.lr"]),
}


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code, capsys.readouterr().err


@pytest.mark.parametrize("case", list(CASES))
def test_a_mistake_gets_one_line_and_exit_2(case, tmp_path, monkeypatch, capsys, corpus, corpus_args):
    argv_of, env_of, must_say = CASES[case]
    for key, value in env_of(tmp_path).items():
        monkeypatch.setenv(key, value)
    argv = argv_of(tmp_path, corpus_args)
    code, err = run_cli(argv, capsys)
    message = [line for line in err.splitlines() if "error:" in line]
    assert code == USER_ERROR_EXIT, err
    assert len(message) == 1 and "Traceback" not in err, err
    for fragment in must_say:
        assert fragment in message[0], message[0]
    if case.startswith(("steps", "batch_size", "unknown config", "CMS", "sweep:")):  # refused before anything is written
        assert not (tmp_path / "runs").exists()
    if case in ("report of a missing folder", "pickle weights", "truncated safetensors"):
        assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


def test_a_diverged_run_keeps_only_usable_checkpoints(tmp_path, capsys, corpus, corpus_args):
    code, err = run_cli(_train_argv(corpus_args, tmp_path / "runs", "steps=12", "optim.lr=1e4", "optim.warmup_steps=1",
                                    "checkpoint_every=2"), capsys)  # fmt: skip
    assert code == USER_ERROR_EXIT
    for state_file in (tmp_path / "runs" / "cli" / "checkpoints").glob("step_*/trainer_state.json"):
        val = json.loads(state_file.read_text())["metrics"].get("val_loss")
        assert val is None or val < 50, (state_file, val)


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
