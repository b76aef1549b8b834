"""Claims: which process is doing a piece of shared work, so that processes sharing a filesystem split
the work and none does a piece twice.

    claims = Claims(folder / "claims", folder / ".claims.lock", timeout_s=600)
    if claims.claim(key, is_done=lambda: ...) == CLAIMED:  # not done, and no live process holds it
        with claims.held(key, heartbeat_s=60):              # renewed while the work runs, released after
            ...work...

A claim is a file `<key>.json` (pid, host, since, heartbeat), taken, renewed and dropped under an
exclusive lock (utils.exclusive_lock), so the check "done? held by a live process?" and the take are one
step. A claim is stale, and taken over, when its process is gone (same host: the pid no longer exists)
or when it has not been renewed for `timeout_s` (the only sign a process on another host can give:
it may have died, or its host may be down). Used by the results store (probe units) and by sweeps
(runs, held by a heartbeat while they train and probe).

A folder that one process at a time may work in (a training run) is held whole instead:

    with exclusive_folder(run_dir, "being trained"):   # a second process gets one line naming the holder
        ...train...

an exclusive `filelock` on `<folder>/.lock`, which the kernel drops when its process dies (nothing goes
stale), with the holder (pid, host, since) beside it in `.lock.owner.json` for the refusal's message.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

from filelock import FileLock, Timeout

from .readers import ReadError, read_json
from .errors import CrossbertError
from .utils import atomic_write_text, exclusive_lock

log = logging.getLogger(__name__)

# claim() outcomes
CLAIMED = "claimed"  # ours now: do it
DONE = "done"  # already done (is_done said so)
BUSY = "busy"  # a live process holds it

FOLDER_LOCK = ".lock"
FOLDER_OWNER = ".lock.owner.json"


class FolderBusy(CrossbertError):
    """Another live process holds the folder (exclusive_folder)."""


class Claims:
    def __init__(self, folder: str | os.PathLike, lock_file: str | os.PathLike, timeout_s: float):
        self.folder = Path(folder)
        self.lock_file = Path(lock_file)
        self.timeout_s = timeout_s
        self.last_owner: dict | None = None  # who holds the key of the last BUSY claim (for the log)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.lock_file.parent.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(self.lock_file):
            yield

    def claim(self, key: str, is_done: Callable[[], bool] = lambda: False) -> str:
        """CLAIMED (do it), DONE (`is_done()`, asked under the lock) or BUSY (a live process holds it)."""
        with self.locked():
            if is_done():
                return DONE
            owner = self.owner(key)
            if owner and not is_ours(owner) and not self.is_stale(owner):
                self.last_owner = owner
                return BUSY
            if owner and not is_ours(owner):
                log.warning(
                    "taking over the stale claim of %s (pid %s on %s since %s)",
                    key,
                    owner.get("pid"),
                    owner.get("host"),
                    owner.get("time"),
                )
            now = time.time()
            self._write(key, {**this_process(), "key": key, "since": now, "heartbeat": now, "time": timestamp()})
            return CLAIMED

    def release(self, key: str) -> None:
        """Drop our claim of `key` (done or failed); another process's claim is left alone."""
        with self.locked():
            owner = self.owner(key)
            if owner and is_ours(owner):
                self._path(key).unlink(missing_ok=True)

    def renew(self, key: str) -> bool:
        """Renew our claim's heartbeat; False when it is no longer ours (taken over as stale meanwhile)."""
        with self.locked():
            owner = self.owner(key)
            if not (owner and is_ours(owner)):
                return False
            self._write(key, {**owner, "heartbeat": time.time()})
            return True

    @contextlib.contextmanager
    def held(self, key: str, heartbeat_s: float) -> Iterator[None]:
        """Run the body under our claim of `key`: renewed every `heartbeat_s` by a thread (processes on other
        hosts cannot see our pid; a fresh heartbeat tells them we are alive), released when the body ends."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(heartbeat_s):
                if not self.renew(key):
                    owner = self.owner(key) or {}
                    log.error(
                        "the claim of %s was taken over by pid %s on %s (this process looked dead for %.0f s): "
                        "both may now be doing it",
                        key,
                        owner.get("pid"),
                        owner.get("host"),
                        self.timeout_s,
                    )
                    return

        thread = threading.Thread(target=beat, name=f"claim-heartbeat-{key}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            self.release(key)

    def owner(self, key: str) -> dict | None:
        """The claim file of `key` (None: unclaimed); an unreadable one reads as stale rather than block forever."""
        path = self._path(key)
        if not path.exists():
            return None
        try:
            return read_json(path, "a claim")
        except (ReadError, OSError):  # a claim file removed or half-replaced under us reads as stale
            return {"pid": -1, "host": socket.gethostname(), "since": 0}

    def is_stale(self, owner: dict) -> bool:
        renewed = max(float(owner.get("since", 0)), float(owner.get("heartbeat", 0)))
        if time.time() - renewed > self.timeout_s:
            return True
        return owner.get("host") == socket.gethostname() and not pid_alive(int(owner.get("pid", -1)))

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def _write(self, key: str, owner: dict) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self._path(key), json.dumps(owner))


@contextlib.contextmanager
def exclusive_folder(folder: str | os.PathLike, doing: str) -> Iterator[None]:
    """Hold `folder` (created if missing) while the body runs; FolderBusy at once, naming the holder, when
    another process holds it. A folder this call created and left holding nothing but the lock is removed
    again, so a command refused later (a bad input found after the lock) leaves nothing behind."""
    folder = Path(folder)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    lock, owner_file = FileLock(folder / FOLDER_LOCK), folder / FOLDER_OWNER
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise FolderBusy(
            f"{folder}: {doing} by another process ({_holder(owner_file)}); wait for it to end, "
            "or stop it: the next start resumes"
        ) from None
    try:
        atomic_write_text(owner_file, json.dumps({**this_process(), "time": timestamp()}))
        yield
    finally:
        owner_file.unlink(missing_ok=True)
        lock.release()
        if created and [p.name for p in folder.iterdir()] == [FOLDER_LOCK]:
            (folder / FOLDER_LOCK).unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # another process may have just put something there
                folder.rmdir()


def _holder(owner_file: Path) -> str:
    try:
        owner = read_json(owner_file, "a folder's owner")
        return f"pid {owner['pid']} on {owner['host']} since {owner['time']}"
    except (ReadError, OSError, KeyError):
        return "it has not said who it is yet"


def this_process() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname()}


def is_ours(owner: dict) -> bool:
    return owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname()


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    if os.name == "nt":  # os.kill(pid, 0) there sends Ctrl-C (signal 0 is CTRL_C_EVENT): ask the kernel instead
        return _windows_pid_alive(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _windows_pid_alive(pid: int) -> bool:
    """Whether `pid` runs, on Windows (untested here: no Windows machine; the logic is the documented Win32 one)."""
    import ctypes

    kernel32 = ctypes.windll.kernel32
    handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
    if not handle:
        return kernel32.GetLastError() == 5  # ERROR_ACCESS_DENIED: it exists, owned by someone else
    try:
        code = ctypes.c_ulong()
        return bool(kernel32.GetExitCodeProcess(handle, ctypes.byref(code))) and code.value == 259  # STILL_ACTIVE
    finally:
        kernel32.CloseHandle(handle)


def timestamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
