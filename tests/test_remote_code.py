"""No code from a model or tokenizer folder runs unless the user passes --trust-remote-code, even when stdin
answers transformers' question with "y"; our own checkpoints load with the registered classes, never with
code they carry."""

import io
import os
import subprocess
import sys

import pytest

from crossbert_eval.encoders import FrozenEncoder
from crossbert_model import CrossBertModel
from crossbert_model.checkpoint import pretraining_model_from_pretrained
from crossbert_model.data.tokenizer import load_tokenizer
from crossbert_model.errors import USER_ERROR_EXIT
from crossbert_model.remote_code import RemoteCodeError
from own_code import add_own_code, folder_with_own_code


@pytest.fixture
def stdin_says_yes(monkeypatch):
    """What a user piping `yes` (or typing y) answers when transformers asks whether to run a folder's code."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 20))


def test_probe_runs_no_code_of_a_model_folder_with_stdin_answering_yes(tmp_path):
    marker = tmp_path / "code-ran"
    folder = folder_with_own_code(tmp_path, marker)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "crossbert_eval.cli",
            "probe",
            str(folder),
            "--tasks",
            "TREC",
            "--results",
            str(tmp_path / "r"),
            "--cache",
            str(tmp_path / "f"),
        ],
        input="y\n" * 20,
        capture_output=True,
        text=True,
        env={**os.environ, "CROSSBERT_DEBUG": "0"},
    )
    assert done.returncode == USER_ERROR_EXIT, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"crossbert probe: error: {folder}: loading it needs the Python code the folder carries (auto_map in its config.json "
        "or tokenizer_config.json, for a model type transformers does not know); that code is not run unless you set "
        "--trust-remote-code, for a folder you trust"
    ]
    assert not marker.exists() and not (tmp_path / "r").exists()


def test_a_tokenizer_folder_for_training_runs_no_code_without_the_config_key(tmp_path, stdin_says_yes):
    marker = tmp_path / "code-ran"
    with pytest.raises(RemoteCodeError, match="unless you set data.trust_remote_code, "):
        load_tokenizer(folder_with_own_code(tmp_path, marker))
    assert not marker.exists()


def test_our_checkpoint_carrying_an_auto_map_loads_with_the_registered_classes(nano_checkpoint, tmp_path, stdin_says_yes):
    marker = tmp_path / "code-ran"
    folder = add_own_code(nano_checkpoint(0), marker)
    encoder = FrozenEncoder.load(str(folder), trust_remote_code=True)  # asked for, and still not run: ours need none
    assert type(encoder.model) is CrossBertModel and encoder.identity["trust_remote_code"] is False
    assert type(pretraining_model_from_pretrained(folder)).__module__ == "crossbert_model.model"
    assert not marker.exists()


def test_trust_remote_code_runs_the_folders_code_and_every_row_says_so(tmp_path):
    marker = tmp_path / "code-ran"
    folder = folder_with_own_code(tmp_path, marker)
    encoder = FrozenEncoder.load(str(folder), trust_remote_code=True)
    assert marker.exists() and type(encoder.model).__name__ == "OwnModel"
    assert encoder.identity["trust_remote_code"] is True  # identity starts every result row (probe.row_base, mteb rows)
