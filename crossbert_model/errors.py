"""The one base class of the tool's own errors.

A `CrossbertError` is a mistake in what the user gave (a config key, an option, a data file, a
checkpoint): its message names the file, field or option and what was expected. The command line
prints that message alone and exits 2; `--debug` (or CROSSBERT_DEBUG=1) shows the traceback too.
Anything else is a bug in the tool and keeps its traceback.
"""

from __future__ import annotations

DEBUG_ENV = "CROSSBERT_DEBUG"
USER_ERROR_EXIT = 2


class CrossbertError(Exception):
    """A user-facing error: one clear line, exit code 2."""
