"""Small shared helpers: where the data is, atomic writes, offline mode, provenance of a run."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from filelock import FileLock, Timeout

from .errors import SETTING, CrossbertError, named_as_final
from .readers import ReadError, read_text

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the checkout (a plain install: site-packages)
DATA_ROOT_ENV = "CROSSBERT_DATA_ROOT"

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_UPDATE_DOWNLOAD_COUNTS": "0",
}
# The offline switches libraries keep as module constants, read from the environment when first imported.
OFFLINE_CONSTANTS = {
    "huggingface_hub.constants": ("HF_HUB_OFFLINE",),
    "datasets.config": ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"),
}


ONLINE_ENV = "CROSSBERT_ONLINE"


def online() -> bool:
    """Whether the user opted into the network (CROSSBERT_ONLINE=1); every command is offline otherwise."""
    return os.environ.get(ONLINE_ENV) == "1"


def set_offline_env(force: bool = False) -> None:
    """Offline unless the user opted in with CROSSBERT_ONLINE=1, whatever the environment held: a HF_HUB_OFFLINE=0 (or
    empty) left in a shell does not turn the network on. Libraries imported before this call read their switch at
    import time, so theirs is set too. (A hub id then fails in milliseconds, not after 20-70 s of retries.)"""
    if online() and not force:
        return
    for key, value in OFFLINE_ENV.items():
        os.environ[key] = value
    for module, names in OFFLINE_CONSTANTS.items():
        if module in sys.modules:
            for name in names:
                setattr(sys.modules[module], name, True)


def quiet_transformers() -> None:
    """No per-save progress bars or load reports from transformers inside our own progress display."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


class DataRootError(CrossbertError, FileNotFoundError):
    pass


def core_share(processes: int) -> int:
    """Threads for one of `processes` processes sharing this machine's cores (at least one): a thread per core in
    every process oversubscribes the CPU (the trainer under torchrun, the Makefile's sweep workers, test workers)."""
    return max(1, (os.cpu_count() or 1) // max(1, processes))


def data_root(explicit: str | os.PathLike | None = None) -> Path:
    """The one resolver of the data root: an explicit path, else $CROSSBERT_DATA_ROOT, else
    ../shared/data beside the checkout. A root that is named (option or variable) but missing is an
    error, never a silent fall-back to the default. Entry points resolve it once and pass it down."""
    if explicit:
        return _existing_root(Path(explicit), SETTING, "data_root")
    if os.environ.get(DATA_ROOT_ENV):
        return _existing_root(Path(os.environ[DATA_ROOT_ENV]), f"${DATA_ROOT_ENV}")
    candidates = [PROJECT_ROOT.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"]
    for c in candidates:
        if c.is_dir():
            return c.resolve()
    raise DataRootError(
        f"data root not found; looked in: {', '.join(str(c) for c in candidates)}. "
        f"Set {SETTING} or {DATA_ROOT_ENV} to the folder holding MANIFEST.md.",
        setting="data_root",
    )


def check_outside_data_root(path: str | os.PathLike, name: str) -> None:
    """Outputs never land inside the data root (it is shared and read-only by contract): refuse `path` (named by
    `name`, a config field or option) when it resolves inside it. No data root found: nothing to protect."""
    try:
        root = data_root()
    except DataRootError:
        return
    target = Path(path).expanduser().resolve()
    if target == root or root in target.parents:
        raise CrossbertError(f"{name} {str(path)!r}: expected a folder outside the data root {root} (outputs never go there)")


def _existing_root(path: Path, given_by: str, setting: str | None = None) -> Path:
    if not path.is_dir():
        raise DataRootError(
            f"data root {path} (from {given_by}) is not a folder; expected the folder holding MANIFEST.md", setting=setting
        )
    return path.resolve()


def expand_data_path(path: str, root: str | os.PathLike | None = None) -> Path:
    """`${data_root}/x` or `data_root:x` -> a path under the data root; other paths are used as given."""
    for prefix in ("${data_root}/", "data_root:"):
        if path.startswith(prefix):
            return data_root(root) / path[len(prefix) :]
    return Path(path)


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


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
    # mkstemp / mkdtemp create 0600 / 0700 whatever the umask: give the result the mode a plain
    # open() / mkdir() would have, so run folders are as readable as the user's umask says.
    tmp.chmod((0o777 if is_dir else 0o666) & ~_UMASK)
    try:
        with named_as_final(tmp, target):  # a failed write names the target, not its temporary sibling
            yield tmp
        if is_dir:
            _plain_modes(tmp)
        if is_dir and target.exists():
            old = target.with_name(f".{target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno and e.filename is None:  # a write to an open file names none: name it
            raise OSError(e.errno, e.strerror, str(target)) from e
        raise


def _plain_modes(folder: Path) -> None:
    """Files a library wrote into `folder` private (transformers writes model.safetensors 0600) get the mode a
    plain open() gives, the mode of their siblings."""
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink() and not path.stat().st_mode & 0o077:
            path.chmod(path.stat().st_mode | (0o666 & ~_UMASK))


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def finite_or_null(obj: Any) -> Any:
    """`obj` with every NaN or infinite float made None: what this tool writes is strict JSON (a bare NaN is not),
    and a number that is not one is recorded as missing."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_null(v) for v in obj]
    return obj


def json_text(obj: Any, default=str, **kwargs) -> str:
    """The one JSON writer: strict JSON (finite_or_null), `default` for what json cannot serialise (numpy scalars, ...)."""

    def serialise(o):
        if type(o).__module__ == "numpy" and hasattr(o, "item") and getattr(o, "ndim", 0) == 0:
            return finite_or_null(o.item())  # a numpy scalar is the number it holds
        return finite_or_null(default(o))

    return json.dumps(finite_or_null(obj), default=serialise, allow_nan=False, **kwargs)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json_text(obj, indent=2, sort_keys=True) + "\n")


def append_jsonl(path: str | os.PathLike, rows: list[dict], default=str) -> None:
    """The one JSONL appender. All rows go in one write + fsync under an exclusive lock (`.NAME.lock`
    beside the file), so concurrent writers never interleave lines; a torn tail left by a killed writer
    is cut off first, so the file always parses. `default` serialises what json cannot (numpy scalars, ...)."""
    if not rows:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = "".join(json_text(r, default) + "\n" for r in rows).encode()
    with exclusive_lock(lock_file_of(path)), open(path, "a+b") as f:
        _cut_torn_tail(f)
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())


def lock_file_of(path: Path) -> Path:
    """The lock file of a file that several processes append to: a hidden sibling. (The file itself is not
    locked: on Windows a lock on a file's bytes stops other processes reading them.)"""
    return path.with_name(f".{path.name}.lock")


@contextlib.contextmanager
def exclusive_lock(lock_file: Path, waiting: str | None = None) -> Iterator[None]:
    """An exclusive lock on `lock_file` across processes (created if missing), on every platform
    (filelock: flock on POSIX, LockFileEx on Windows; the system drops it when its holder dies). Two
    holders in one process (threads) exclude each other too. `waiting`: a message logged when another
    holder has it and this one has to wait."""
    lock = FileLock(lock_file)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if waiting:
            logging.getLogger(__name__).info(waiting)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _cut_torn_tail(f) -> None:
    """Truncate an opened binary file after its last newline (a killed writer's partial line goes)."""
    f.seek(0, os.SEEK_END)
    size = f.tell()
    if size == 0:
        return
    f.seek(-1, os.SEEK_END)
    if f.read(1) == b"\n":
        return
    pos = size - 1
    while pos > 0:  # scan back in blocks for the last complete line
        step = min(4096, pos)
        f.seek(pos - step)
        nl = f.read(step).rfind(b"\n")
        if nl >= 0:
            f.truncate(pos - step + nl + 1)
            return
        pos -= step
    f.truncate(0)


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
        for line in read_text("/proc/cpuinfo", "the CPU's description").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, ReadError):
        pass
    return platform.processor() or "unknown"


def texts_digest(texts: list[str], texts_pair: list[str] | None) -> str:
    """Identity of a list of texts (and their pair sides): what feature caches and result units are keyed by."""
    h = hashlib.sha256("\x1e".join(texts).encode())
    if texts_pair is not None:
        h.update(b"\x1d" + "\x1e".join(texts_pair).encode())
    return h.hexdigest()[:16]


def provenance(machine: bool = True) -> dict[str, Any]:
    """What produced a result: code revision, package versions and (unless `machine=False`, as for the
    per-row stamp of result rows, where it would repeat on every line) the machine."""
    out: dict[str, Any] = {"git_revision": git_revision(), "packages": package_versions()}
    if machine:
        out["machine"] = machine_info()
    return out
