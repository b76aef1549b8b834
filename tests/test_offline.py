"""Offline means offline: without CROSSBERT_ONLINE=1 no command reaches the network, whatever hub variables the
user's environment holds; with it, the network is allowed (hub variables the user sets may still restrict it).
A local HTTP server stands in for the hub and counts what reaches it."""

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def fake_hub():
    """A local server that answers 404 to everything and records each request's path."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the stdlib's name)
            seen.append(self.path)
            self.send_response(404)
            self.end_headers()

        do_HEAD = do_GET  # noqa: N815

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()


def _probe_a_hub_id(tmp_path: Path, endpoint: str, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_", "CROSSBERT_ONLINE"))}
    environ.update(PYTHONPATH=str(REPO), HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf"), **env)
    argv = [
        sys.executable,
        "-m",
        "crossbert_eval.cli",
        "probe",
        "bert-base-uncased",
        "--tasks",
        "TREC",
        "--results",
        str(tmp_path / "r"),
        "--cache",
        str(tmp_path / "f"),
    ]
    return subprocess.run(argv, env=environ, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "held",
    [{"HF_HUB_OFFLINE": "0"}, {"HF_HUB_OFFLINE": ""}, {"TRANSFORMERS_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0"}],
    ids=["HF_HUB_OFFLINE=0", "HF_HUB_OFFLINE empty", "TRANSFORMERS_OFFLINE=0"],
)
def test_hub_variables_left_in_the_environment_do_not_turn_the_network_on(tmp_path, fake_hub, held):
    endpoint, seen = fake_hub
    done = _probe_a_hub_id(tmp_path, endpoint, **held)
    assert seen == []  # not one request
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "CROSSBERT_ONLINE=1" in done.stderr  # the one line says how to go online


def test_crossbert_online_alone_lets_a_command_reach_the_hub(tmp_path, fake_hub):
    endpoint, seen = fake_hub
    _probe_a_hub_id(tmp_path, endpoint, CROSSBERT_ONLINE="1")
    assert any("bert-base-uncased" in path for path in seen)  # the same command does reach it when asked to


def test_a_library_caller_that_set_nothing_is_offline_too(tmp_path, fake_hub):
    """FrozenEncoder.load from Python, in a process where no command set the hub variables (HF_HUB_OFFLINE=0 even):
    the hub id is looked up in the local cache alone, and the refusal says how to go online."""
    endpoint, seen = fake_hub
    code = (
        "from crossbert_eval.encoders import FrozenEncoder\n"
        "from crossbert_eval.model_names import EncoderError\n"
        "try:\n    FrozenEncoder.load('bert-base-uncased')\n"
        "except EncoderError as e:\n    print(e)\n"
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_", "CROSSBERT_ONLINE"))}
    environ.update(PYTHONPATH=str(REPO), HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="0")
    done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=300)
    assert seen == []  # not one request
    assert "not in the local Hugging Face cache" in done.stdout and "CROSSBERT_ONLINE=1" in done.stdout, done.stdout + done.stderr
