"""Where a report is written: a staging folder inside the report's folder, whose files are moved into place once
every one of them is whole.

A report writes tables/, plots/, report.md, report.html (a sweep's also summary.json) into its folder, which also
holds what the runs wrote: the folder itself cannot be swapped, so the report is built in `.report-staging.*.tmp/`
beside them and only when its last file is written are its files renamed onto the report's, tables and plots first,
the page last. A rename needs no room on the disk, so a full disk (or any other failure) while the report is built
leaves the previous report as it was, every file of it, and no partial or temporary file: the staging folder goes
with the failure. Files of an earlier build that this one does not write (a plot not drawn this time) stay, as they
always did. A file system error names the file the report was writing at its place in the folder
(<folder>/tables/scores.csv), never the staging name nor "a file".
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pandas as pd

from crossbert_model.errors import named_as_final, naming_written_file

from ..folder_layout import EvaluationFolder

STAGING_PREFIX = ".report-staging."


@contextlib.contextmanager
def staged_report(folder: EvaluationFolder) -> Iterator[EvaluationFolder]:
    """Yield an empty staging folder laid out as `folder` (a SweepDir, a ZooDir, ...); once the body returns, move every
    file written there to the same place under `folder`. On any failure nothing under `folder` changes and the staging
    folder is removed."""
    root = folder.path
    try:
        stage = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, suffix=".tmp", dir=root))
    except OSError as e:  # no room for even a folder: it is the report's folder that is full
        if e.errno is None:
            raise
        raise OSError(e.errno, e.strerror, os.fspath(root)) from e
    try:
        with named_as_final(stage, root):
            yield type(folder)(stage)
            move_into_place(stage, root, {page.name for page in folder.pages()})
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def move_into_place(stage: Path, root: Path, pages: set[str]) -> None:
    """Every file under `stage` renamed onto its place under `root` (folders made first; the `pages` last: a page never
    shows before the tables and plots it names)."""
    files = sorted(
        (p for p in stage.rglob("*") if not p.is_dir()),
        key=lambda p: (p.parent == stage, p.name in pages, p.relative_to(stage).as_posix()),
    )
    for folder in sorted({p.parent for p in files} - {stage}):
        (root / folder.relative_to(stage)).mkdir(parents=True, exist_ok=True)
    for path in files:
        os.replace(path, root / path.relative_to(stage))


def write_table(df: pd.DataFrame, folder: Path, name: str, parquet: bool = True) -> None:
    """folder/name.csv (and .parquet); a failed write names the file."""
    folder.mkdir(parents=True, exist_ok=True)
    with naming_written_file(folder / f"{name}.csv"):
        df.to_csv(folder / f"{name}.csv", index=False)
    if parquet:
        with naming_written_file(folder / f"{name}.parquet"):
            df.to_parquet(folder / f"{name}.parquet", index=False)
