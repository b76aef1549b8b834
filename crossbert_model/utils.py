"""Small shared helpers: where the data is, atomic writes, offline mode, provenance of a run."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DATA_ROOT_ENV = "CROSSBERT_DATA_ROOT"

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_UPDATE_DOWNLOAD_COUNTS": "0",
}


def set_offline_env(force: bool = False) -> None:
    """Stay offline by default (a hub id then fails in milliseconds, not after 20-70 s of retries).
    Users who are online opt out with CROSSBERT_ONLINE=1."""
    if os.environ.get("CROSSBERT_ONLINE") == "1" and not force:
        return
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)


def quiet_transformers() -> None:
    """No per-save progress bars or load reports from transformers inside our own progress display."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def data_root(explicit: str | os.PathLike | None = None) -> Path:
    """The data root: an explicit path, else $CROSSBERT_DATA_ROOT, else ../shared/data beside the checkout."""
    candidates = [Path(explicit)] if explicit else []
    if os.environ.get(DATA_ROOT_ENV):
        candidates.append(Path(os.environ[DATA_ROOT_ENV]))
    candidates += [PROJECT_ROOT.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"]
    for c in candidates[: 1 if explicit else None]:
        if c.is_dir():
            return c.resolve()
    raise FileNotFoundError(
        f"data root not found; looked in: {', '.join(str(c) for c in candidates)}. "
        f"Pass --data-root or set {DATA_ROOT_ENV} to the folder holding MANIFEST.md."
    )


def expand_data_path(path: str, root: str | os.PathLike | None = None) -> Path:
    """`${data_root}/x` or `data_root:x` -> a path under the data root; other paths are used as given."""
    for prefix in ("${data_root}/", "data_root:"):
        if path.startswith(prefix):
            return data_root(root) / path[len(prefix) :]
    return Path(path)


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of `target`; on success rename it onto `target` (atomic on POSIX),
    on failure remove it. Readers see either the old target or the complete new one, never half."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if is_dir:
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        if is_dir and target.exists():
            old = target.with_name(f".{target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def append_jsonl(path: str | os.PathLike, rows: list[dict]) -> None:
    """Append whole lines with one write + fsync; a killed process leaves at most a torn last line,
    which `read_jsonl` skips."""
    if not rows:
        return
    payload = "".join(json.dumps(r, default=str) + "\n" for r in rows)
    with open(path, "a") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    with open(path) as f:
        for line in f:
            if not line.endswith("\n"):
                break  # torn final line of a killed writer
            rows.append(json.loads(line))
    return rows


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def stable_hash(obj: Any, length: int = 16) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:length]


def git_revision() -> str:
    """HEAD of the checkout the package runs from, with '+dirty' for uncommitted changes."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


TRACKED_PACKAGES = ("torch", "transformers", "tokenizers", "mteb", "sentence-transformers", "scikit-learn", "faiss-cpu", "numpy")


def package_versions() -> dict[str, str]:
    out = {}
    for name in TRACKED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def machine_info() -> dict[str, Any]:
    import torch

    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
    return info


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def provenance() -> dict[str, Any]:
    return {"git_revision": git_revision(), "packages": package_versions(), "machine": machine_info()}
