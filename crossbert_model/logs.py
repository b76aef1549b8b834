"""The one logging set-up of every entry point (`crossbert`, `python -m crossbert_model.train`, cluster jobs).

Log records go out through `tqdm.write`, which lifts the progress bars drawn on the same stream, prints the
line, and draws the bars again below it: a log line never lands in the middle of a bar, and a bar is never
left half-drawn above a log line (plain logging.StreamHandler did both).
"""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


class ProgressBarSafeHandler(logging.StreamHandler):
    """A StreamHandler that writes through tqdm.write (tqdm imported at the first record, not at start-up)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # logging must never raise into the caller
            self.handleError(record)


def setup_logging(level: int = logging.INFO, stream=None) -> None:
    """INFO and above to stderr through ProgressBarSafeHandler. As logging.basicConfig, nothing changes when the
    root logger already has handlers (a host program's, pytest's capture)."""
    handler = ProgressBarSafeHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    logging.basicConfig(level=level, handlers=[handler])


def duration(seconds: float) -> str:
    """12s, 4m05s, 2h03m: a time left, to read at a glance."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
