"""Task data formats: reading one data file as text (compressed, or a member of a zip archive) and the
row readers, registered by name. `data.format: NAME` in a task file picks the reader registered as NAME;
a new format is one `register_format` call, in any module imported before the task files are read:

    @register_format("pipe")
    def read_pipe(text: str, path: Path, options: ReadOptions) -> list[Row]:
        return [(n, dict(zip(options.fields, line.split("|")))) for n, line in enumerate(text.split("\\n"), 1) if line]

A reader gets the file's whole text (line ends normalised to "\\n"), its path for messages, and what the
task file says about reading it (ReadOptions); it returns (line number, {field: value}) per row and
raises TaskError naming the file and line of a bad one.

`beir` is not a row format but a layout of three files (corpus, queries, qrels) that Task.load_beir reads
with the jsonl and tsv readers.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import lzma
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from .errors import TaskError

Row = tuple[int, dict]

# A retrieval set in the BEIR layout (data.corpus, data.queries, a qrels file per split): read by Task.load_beir.
BEIR = "beir"


@dataclass(frozen=True)
class ReadOptions:
    """How to read one file: the task's data.* settings, or its split entry's own fields."""

    format: str
    header: bool = True
    fields: list | None = None
    optional_fields: list | None = None
    delimiter: str | None = None
    quoting: str | None = None  # none | minimal (default: none for tsv, minimal for csv)


def delimiter_for(fmt: str, given: str | None) -> str:
    """The field separator of delimited text: data.delimiter, else a tab for tsv and a comma otherwise."""
    return given if given is not None else "\t" if fmt == "tsv" else ","


Reader = Callable[[str, Path, ReadOptions], list[Row]]
READERS: dict[str, Reader] = {}


def register_format(name: str, reader: Reader | None = None):
    """Register `reader` as `data.format: name` (also usable as a decorator: `@register_format(name)`)."""

    def register(fn: Reader) -> Reader:
        if name in READERS or name == BEIR:
            raise ValueError(f"data format {name!r} is already registered")
        READERS[name] = fn
        return fn

    return register(reader) if reader is not None else register


def format_names() -> tuple[str, ...]:
    """Every valid `data.format`, in registration order."""
    return (*READERS, BEIR)


def read_rows(path: Path, options: ReadOptions, encoding: str) -> list[Row]:
    """Rows of one file as (line number, {field: value}), by the reader registered as options.format."""
    return READERS[options.format](read_text(path, encoding), path, options)


# ------------------------------------------------------------------------------------------------
# The readers
# ------------------------------------------------------------------------------------------------


def _read_delimited(text: str, path: Path, options: ReadOptions) -> list[Row]:
    """TSV / CSV; GLUE / STS TSVs contain bare quotes, so TSV reads with quoting disabled (MANIFEST.md)."""
    fmt = options.format
    quoting = options.quoting or ("none" if fmt == "tsv" else "minimal")
    reader = csv.reader(
        io.StringIO(text),
        delimiter=delimiter_for(fmt, options.delimiter),
        quoting=csv.QUOTE_NONE if quoting == "none" else csv.QUOTE_MINIMAL,
    )
    header = options.header
    fields = list(options.fields or [])
    optional = list(options.optional_fields or [])
    rows = []
    for lineno, record in _csv_records(reader, path, fmt):
        if not record or (len(record) == 1 and not record[0].strip()):
            continue
        if header and not fields:
            fields = [f.strip() for f in record]
            continue
        if header and lineno == 1:
            continue
        if not fields:
            raise TaskError(f"{path}: a file without a header line needs data.fields (or its split entry's fields)")
        if not (len(fields) <= len(record) <= len(fields) + len(optional)):
            expected = f"{len(fields)}" + (f" to {len(fields) + len(optional)}" if optional else "")
            raise TaskError(f"{path}:{lineno}: expected {expected} {fmt.upper()} fields ({', '.join(fields)}), got {len(record)}")
        rows.append((lineno, dict(zip(fields + optional, record))))
    return rows


register_format("tsv", _read_delimited)
register_format("csv", _read_delimited)


@register_format("jsonl")
def _read_jsonl(text: str, path: Path, options: ReadOptions) -> list[Row]:
    rows = []
    # "\n" only: str.splitlines() also breaks at U+2028, U+0085 and others, which JSON strings may hold
    # unescaped (IMDB reviews do)
    for lineno, line in enumerate(text.split("\n"), 1):
        if line.strip():
            try:
                rows.append((lineno, json.loads(line)))
            except json.JSONDecodeError as e:
                raise TaskError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
    return rows


@register_format("label_first")
def _read_label_first(text: str, path: Path, options: ReadOptions) -> list[Row]:
    """ "label text ..." per line (SentEval's TREC files): fields `label` and `text`."""
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            label, _, sentence = line.strip().partition(" ")
            if not sentence:
                raise TaskError(f"{path}:{lineno}: expected '<label> <text>', got {line!r}")
            rows.append((lineno, {"label": label, "text": sentence}))
    return rows


def _csv_records(reader, path: Path, fmt: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of a csv reader; a line the csv module refuses (a field over its size limit, an
    unclosed quote running on) is a TaskError naming it."""
    while True:
        try:
            record = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise TaskError(
                f"{path}:{reader.line_num}: not a valid {fmt.upper()} line ({e}); check the file, data.delimiter and data.quoting"
            ) from None
        yield reader.line_num, record


# ------------------------------------------------------------------------------------------------
# Files: compressed, or members of a zip archive
# ------------------------------------------------------------------------------------------------


def text_lines(text: str) -> list[str]:
    """Lines split at "\\n" only (text from read_text has no "\\r"), without the empty one after a final newline."""
    out = text.split("\n")
    return out[:-1] if out and out[-1] == "" else out


def _zip_member(path: Path) -> tuple[Path, str] | None:
    """(archive, member name) when `path` runs through a zip archive (`archive.zip/dir/file.txt`)."""
    for parent in path.parents:
        if parent.suffix == ".zip" and parent.is_file():
            return parent, path.relative_to(parent).as_posix()
    return None


def is_file(path: Path) -> bool:
    """A file, or a member of a zip archive on the path."""
    if path.is_file():
        return True
    member = _zip_member(path)
    if member is None:
        return False
    with zipfile.ZipFile(member[0]) as archive:
        return member[1] in archive.namelist()


def read_text(path: Path, encoding: str) -> str:
    """Whole file as text with line ends normalised (SICK has CRLF). The default utf-8-sig drops the
    BOM that MRPC's dev.tsv starts with. A path through a zip archive reads the member in place."""
    try:
        member = None if path.is_file() else _zip_member(path)
        if member is not None:
            with zipfile.ZipFile(member[0]) as archive:
                text = archive.read(member[1]).decode(encoding)
        else:
            opener = lzma.open if path.name.endswith(".xz") else gzip.open if path.name.endswith(".gz") else open
            with opener(path, "rt", encoding=encoding, newline="") as f:
                text = f.read()
    except UnicodeDecodeError as e:
        raise TaskError(f"{path}: not valid {encoding} at byte {e.start} (set data.encoding in the task file)") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")
