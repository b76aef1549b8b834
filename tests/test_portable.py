"""Portable: both packages import where POSIX-only modules do not exist (Windows), and their file locks (filelock)
keep their meaning: one holder at a time, appends that never interleave."""

import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

from crossbert_model.utils import exclusive_lock

REPO = Path(__file__).resolve().parent.parent

# Standard modules that exist on POSIX systems only (none of them has a Windows build).
POSIX_ONLY = ("fcntl", "termios", "tty", "pty", "grp", "pwd", "resource", "syslog")

IMPORT_ALL = """
import importlib, pkgutil, sys
for name in {blocked!r}:
    sys.modules[name] = None  # `import fcntl` now raises ImportError, as on Windows
failed = []
for package in ("crossbert_model", "crossbert_eval"):
    root = importlib.import_module(package)
    for module in pkgutil.walk_packages(root.__path__, package + "."):
        try:
            importlib.import_module(module.name)
        except Exception as e:
            failed.append(f"{{module.name}}: {{type(e).__name__}}: {{e}}")
print("\\n".join(failed) or "ok")
"""


def test_every_module_of_both_packages_imports_without_posix_only_modules():
    script = IMPORT_ALL.format(blocked=POSIX_ONLY)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1:] == ["ok"], done.stdout + done.stderr[-3000:]


def test_a_held_lock_makes_a_second_holder_wait_and_says_so(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    lock_file, order = tmp_path / ".lock", []
    second = threading.Thread(target=lambda: hold(lock_file, order, "second", waiting="waiting for the first"))
    with exclusive_lock(lock_file):
        second.start()
        time.sleep(0.3)  # the second holder is blocked, not inside
        order.append("first done")
    second.join(10)
    assert order == ["first done", "second"]
    assert "waiting for the first" in caplog.text


def hold(lock_file: Path, order: list, name: str, waiting: str | None = None) -> None:
    with exclusive_lock(lock_file, waiting=waiting):
        order.append(name)


APPENDER = """
import sys
from crossbert_model.utils import append_jsonl
for i in range(40):
    append_jsonl(sys.argv[1], [{{"writer": {writer}, "i": i, "pad": "x" * 20000}} for _ in range(3)])
"""


def test_concurrent_appenders_never_interleave_their_rows(tmp_path):
    path = tmp_path / "rows.jsonl"
    writers = [subprocess.Popen([sys.executable, "-c", APPENDER.format(writer=w), str(path)], cwd=REPO) for w in range(3)]
    assert [w.wait(120) for w in writers] == [0, 0, 0]
    rows = [json.loads(line) for line in path.read_text().splitlines()]  # a line of two writers would not parse
    assert len(rows) == 3 * 40 * 3
    for w in range(3):
        assert [r["i"] for r in rows if r["writer"] == w] == sorted(i for i in range(40) for _ in range(3))
    assert not any(p.name == "rows.jsonl.lock" for p in tmp_path.iterdir())  # the lock file is hidden: .rows.jsonl.lock
