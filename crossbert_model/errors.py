"""The one base class of the tool's own errors, and how every entry point ends on one.

A `CrossbertError` is a mistake in what the user gave (a config key, an option, a data file, a
checkpoint): its message names the file, field or option and what was expected. The command line
prints that message alone, on one line, and exits 2; `--debug` (or CROSSBERT_DEBUG=1) shows the
traceback too. A file system that refuses a write (read-only, full, a folder where a file belongs) is
the user's to fix as well: one line naming the path, exit 2. Ctrl-C and SIGTERM end the command with
one line saying what was kept (exit 130 / 143). Anything else is a bug in the tool and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Iterator

DEBUG_ENV = "CROSSBERT_DEBUG"
USER_ERROR_EXIT = 2
BUG_EXIT = 1  # an unexpected exception: a bug of this tool, reported in one line with its traceback in a file
# What the shell reports for a process ended by these signals (128 + signal number).
INTERRUPT_EXIT = 128 + signal.SIGINT
TERMINATE_EXIT = 128 + signal.SIGTERM
KEPT = "completed work is kept; run the same command again to resume"
_ELSEWHERE = "a read-only or protected place: point the command at another folder"
_FULL = "free some space and run the same command again; completed work is kept"

# errno of a file system the user can fix, and what to tell them
ENVIRONMENT_ERRNOS = {
    errno.EACCES: _ELSEWHERE,
    errno.EPERM: _ELSEWHERE,
    errno.EROFS: _ELSEWHERE,
    errno.ENOSPC: f"the disk is full: {_FULL}",
    errno.EDQUOT: f"the disk quota is used up: {_FULL}",
    errno.EFBIG: "the file size limit (ulimit -f) is reached: raise it and run the same command again; completed work is kept",
    errno.EISDIR: "expected a file, found a folder",
    errno.ENOTDIR: "a part of this path is a file, not a folder",
    errno.ENAMETOOLONG: "the path is too long",
}
# errno of a write that found no room: a call with two paths (a copy, a rename) names its destination second, and
# that is the path to name (shutil.copyfile's full disk names the source first)
NO_ROOM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
# How libraries with their own exception types quote the OSError under it (safetensors: "(os error 28)")
QUOTED_ERRNO = re.compile(r"os error (\d+)|\[Errno (\d+)\]")


# Where a message names the setting it tells the user to change (CrossbertError's `setting`).
SETTING = "{setting}"


class CrossbertError(Exception):
    """A user-facing error: one clear line, exit code 2.

    `setting`: the one setting the message tells the user to change, as the library names it (`allow_pickle`), written
    SETTING in the message. A caller that sets it under another name says it its own way (`said_with`): the command
    line with its option (`--allow-pickle`), a zoo with its entry's field. The library never names an option."""

    def __init__(self, *args, setting: str | None = None):
        self.setting, self.template = setting, args[0] if args else ""
        if setting is not None:
            args = (self.template.replace(SETTING, setting), *args[1:])
        super().__init__(*args)

    def said_with(self, name: str) -> str:
        """The message with the setting named `name`."""
        return self.template.replace(SETTING, name)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so that it ends as Ctrl-C does: completed work kept."""


def debug_requested(argv: list[str] | None = None) -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0") or "--debug" in (argv or [])


def one_line(message: str) -> str:
    """A message as one line: libraries' messages that we quote may span several."""
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


def environment_error(error: OSError) -> str | None:
    """The one line for a file system error the user can fix; None for any other OSError (a bug)."""
    advice = ENVIRONMENT_ERRNOS.get(error.errno)
    if advice is None:
        return None
    where = error.filename2 if error.errno in NO_ROOM_ERRNOS and error.filename2 is not None else error.filename
    where = where if where is not None else "a file"
    return f"{where}: {error.strerror or os.strerror(error.errno)} ({advice})"


@contextlib.contextmanager
def naming_written_file(path: str | os.PathLike) -> Iterator[None]:
    """Around one library call that writes `path` (pandas, pyarrow, matplotlib): a failed write to an open file names
    no file, so an OSError without a filename is raised again naming `path`, the file being written."""
    try:
        yield
    except OSError as e:
        if e.errno is None or e.filename is not None:
            raise
        raise OSError(e.errno, os.strerror(e.errno), os.fspath(path)) from e  # the OS's words (pyarrow's own say more)


@contextlib.contextmanager
def named_as_final(staging: str | os.PathLike, final: str | os.PathLike) -> Iterator[None]:
    """Around writes into `staging`, a temporary folder whose files end up under `final`: an OSError naming a path
    inside `staging` (either of its two paths) is raised again naming it inside `final`, the place the command writes
    and the user knows (the temporary name is gone once the command ends)."""
    try:
        yield
    except OSError as e:
        names = [_moved(name, Path(staging), Path(final)) for name in (e.filename, e.filename2)]
        if e.errno is None or names == [e.filename, e.filename2]:
            raise
        raise OSError(e.errno, e.strerror, names[0], None, names[1]) from e


def _moved(name, staging: Path, final: Path):
    if name is None or isinstance(name, int):  # int: a file descriptor
        return name
    try:
        return str(final / Path(os.fsdecode(name)).relative_to(staging))
    except ValueError:  # not inside staging
        return name


def quoted_os_error(error: Exception, filename) -> OSError | None:
    """The file system error a library quotes inside its own exception (safetensors' SafetensorError on a full
    disk), as an OSError about `filename`; None when it quotes none."""
    match = QUOTED_ERRNO.search(str(error))
    if match is None:
        return None
    code = int(match.group(1) or match.group(2))
    return OSError(code, os.strerror(code), str(filename))


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raises Terminated in the main thread while the body runs (the previous handler after)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def exit_on_user_error(prog: str, debug: bool = False) -> Iterator[None]:
    """Around a command: a CrossbertError or a file system error the user can fix becomes one line on
    stderr and exit code 2 (the traceback only with debug); Ctrl-C / SIGTERM become one line saying what
    was kept (the interrupted code may put it in the exception's message) and exit code 130 / 143. Any other
    exception is a bug: one line saying so, the traceback in a file the line names (report_crashes_in), exit code 1;
    with debug it propagates, traceback and all."""
    try:
        with terminate_as_interrupt():
            yield
    except CrossbertError as e:
        _exit(prog, f"error: {one_line(e)}", USER_ERROR_EXIT, debug)
    except OSError as e:
        message = environment_error(e)
        if message is None:
            _bug(prog, e, debug)
        _exit(prog, f"error: {message}", USER_ERROR_EXIT, debug)
    except KeyboardInterrupt as e:
        what = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
        _exit(prog, f"{what}: {one_line(e) or KEPT}", TERMINATE_EXIT if isinstance(e, Terminated) else INTERRUPT_EXIT, debug)
    except Exception as e:  # anything else is a bug of this tool
        _bug(prog, e, debug)


def _bug(prog: str, error: Exception, debug: bool) -> None:
    """Called in an except clause: one screen the user can act on, the traceback in a file (with debug: raised)."""
    if debug:
        raise
    where = write_crash_report(prog)
    _exit(
        prog,
        f"internal error (a bug in crossbert, not in your input): {type(error).__name__}: {one_line(str(error))[:300]}. "
        f"The traceback is in {where}; --debug shows it here. Completed work is kept.",
        BUG_EXIT,
        debug,
    )


# Where a command writes the traceback of an unexpected error: the folder it writes to, registered by the command once
# it knows it (report_crashes_in), else the system's temporary folder.
_CRASH_FOLDER: list[str] = []


def report_crashes_in(folder: str | os.PathLike) -> None:
    """The folder (a run, sweep, zoo or results folder) where this process writes crash reports from now on."""
    _CRASH_FOLDER[:] = [os.fspath(folder)]


def write_crash_report(prog: str) -> str:
    """The traceback of the exception being handled, in <folder>/crossbert-crash-<pid>.txt; returns its path."""
    import tempfile
    import time
    import traceback

    text = f"{prog} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}, pid {os.getpid()}\n\n{traceback.format_exc()}"
    for folder in [*_CRASH_FOLDER, tempfile.gettempdir()]:
        path = os.path.join(folder, f"crossbert-crash-{os.getpid()}.txt")
        try:
            os.makedirs(folder, exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
            return path
        except OSError:
            continue
    return "(nowhere: no folder could be written; rerun with --debug)"


def _exit(prog: str, line: str, code: int, debug: bool) -> None:
    """Called in an except clause: with debug, the exception being handled goes on, traceback and all."""
    if debug:
        raise
    print(f"{prog}: {line}", file=sys.stderr)
    raise SystemExit(code) from None
