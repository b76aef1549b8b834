"""The one base class of the tool's own errors.

A `CrossbertError` is a mistake in what the user gave (a config key, an option, a data file, a
checkpoint): its message names the file, field or option and what was expected. The command line
prints that message alone and exits 2; `--debug` (or CROSSBERT_DEBUG=1) shows the traceback too.
Anything else is a bug in the tool and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

DEBUG_ENV = "CROSSBERT_DEBUG"
USER_ERROR_EXIT = 2


class CrossbertError(Exception):
    """A user-facing error: one clear line, exit code 2."""


def debug_requested(argv: list[str] | None = None) -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0") or "--debug" in (argv or [])


@contextlib.contextmanager
def exit_on_user_error(prog: str, debug: bool = False) -> Iterator[None]:
    """Around a command: a CrossbertError becomes one line on stderr and exit code 2 (the traceback
    only with debug); Ctrl-C becomes one line and exit code 130. Other exceptions are bugs and
    propagate with their traceback."""
    try:
        yield
    except CrossbertError as e:
        if debug:
            raise
        print(f"{prog}: error: {e}", file=sys.stderr)
        raise SystemExit(USER_ERROR_EXIT) from None
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{prog}: interrupted (completed work is kept; run the same command again to resume)", file=sys.stderr)
        raise SystemExit(130) from None
