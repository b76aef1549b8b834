"""Reading the corpus: documents from local jsonl / txt files (plain, .xz or .gz; a folder means every such file
in it), or from a hub dataset `hf:owner/name` for users who are online; the validation split rule (documents are
held out by a seeded hash of their index); the corpus as blocks of whole documents for the tokenization workers
(crossbert_model.data.token_cache), and what a block holds."""

from __future__ import annotations

import gzip
import io
import itertools
import json
import lzma
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from ..data_args import DataArgs
from ..errors import CrossbertError, one_line
from ..utils import expand_data_path
from .errors import DataError

CORPUS_SUFFIXES = (".jsonl", ".jsonl.xz", ".jsonl.gz", ".txt", ".txt.xz", ".txt.gz")
# What to do when a hub dataset cannot be read (offline by default: crossbert_model.utils.set_offline_env)
HUB_ADVICE = "commands run offline unless CROSSBERT_ONLINE=1 is set; online, check the dataset id and the connection"


def _open_binary(path: Path):
    name = path.name
    if name.endswith(".xz"):
        return lzma.open(path, "rb")
    if name.endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


def _text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a corpus file."""
    with _open_binary(path) as f:
        yield from _decode_lines(path, f)


def _decode_lines(path: Path, raw_lines: Iterable[bytes], lineno: int = 1, offset: int = 0) -> Iterator[tuple[int, str]]:
    """(line number, text) of raw lines of `path` that start at line `lineno`, byte `offset` (a whole
    file, or one block of it in a tokenization worker). Read as bytes and decoded line by line, so that
    a byte that is not UTF-8 is reported with its file, line and offset (text mode only says
    'position N' of some internal buffer)."""
    compressed = path.name.endswith((".xz", ".gz"))
    for lineno, raw in enumerate(raw_lines, lineno):
        try:
            yield lineno, raw.decode("utf-8")
        except UnicodeDecodeError as e:
            where = " of the decompressed text" if compressed else ""
            raise DataError(
                f"{path}:{lineno}: not valid UTF-8 at byte {offset + e.start}{where} "
                f"(byte {e.start} of the line: {raw[e.start : e.start + 1]!r}); re-encode the file as UTF-8"
            ) from None
        offset += len(raw)


def corpus_files(corpus: str, root: str | None = None) -> list[Path]:
    path = expand_data_path(corpus, root)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(CORPUS_SUFFIXES))
        if not files:
            raise DataError(f"corpus folder {path} holds no corpus file (expected names ending in {', '.join(CORPUS_SUFFIXES)})")
        return files
    if path.is_file():
        if not path.name.endswith(CORPUS_SUFFIXES):
            raise DataError(f"corpus file {path}: unsupported format (expected a name ending in {', '.join(CORPUS_SUFFIXES)})")
        return [path]
    raise DataError(f"corpus {path} does not exist (from data.corpus={corpus!r}; set data.corpus or CROSSBERT_DATA_ROOT)")


def documents(args: DataArgs) -> Iterator[str]:
    return itertools.islice(iter_documents(args.corpus, args.text_field, args.data_root), args.max_documents)


def iter_documents(corpus: str, text_field: str = "text", root: str | None = None) -> Iterator[str]:
    """Yield document texts. jsonl: one document per line, text in `text_field`; txt: documents
    separated by blank lines."""
    if corpus.startswith("hf:"):
        yield from _iter_hub_documents(corpus[3:], text_field)
        return
    for path in corpus_files(corpus, root):
        if ".jsonl" in path.name:
            yield from _jsonl_documents(path, text_field)
        else:
            yield from _txt_documents(path)


def _jsonl_documents(path: Path, text_field: str, lines: Iterable[tuple[int, str]] | None = None) -> Iterator[str]:
    """Documents of `lines` (default: every line of `path`)."""
    for lineno, line in lines if lines is not None else _text_lines(path):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict) or text_field not in row:
            fields = list(row) if isinstance(row, dict) else type(row).__name__
            raise DataError(f"{path}:{lineno}: no text field {text_field!r} (fields present: {fields}); set data.text_field")
        if not isinstance(row[text_field], str):
            raise DataError(f"{path}:{lineno}: field {text_field!r} must be a string, got {type(row[text_field]).__name__}")
        if row[text_field].strip():
            yield row[text_field]


def _txt_documents(path: Path, lines: Iterable[tuple[int, str]] | None = None) -> Iterator[str]:
    """Paragraphs of `lines` (default: every line of `path`)."""
    paragraph: list[str] = []
    for _, line in lines if lines is not None else _text_lines(path):
        if line.strip():
            paragraph.append(line.rstrip("\r\n"))
        elif paragraph:
            yield "\n".join(paragraph)
            paragraph = []
    if paragraph:
        yield "\n".join(paragraph)


def _iter_hub_documents(dataset_id: str, text_field: str) -> Iterator[str]:
    import datasets

    name, _, config = dataset_id.partition(":")
    try:  # the stream opens lazily: an unreachable hub shows at the first row, or later
        for i, row in enumerate(datasets.load_dataset(name, config or None, split="train", streaming=True)):
            if text_field not in row:
                raise DataError(f"hub dataset {name} row {i}: no text field {text_field!r} (fields: {list(row)})")
            yield row[text_field]
    except (ConnectionError, FileNotFoundError) as e:
        raise DataError(f"data.corpus hf:{dataset_id}: the hub dataset cannot be read ({one_line(e)}); {HUB_ADVICE}") from None


def is_validation(doc_index: int, val_fraction: float, seed: int) -> bool:
    """The validation split rule: document `doc_index` of the corpus (counted from 0, in corpus order) is held out
    by a seeded hash of its index, the same in every process, worker count and run."""
    return zlib.crc32(f"{seed}:{doc_index}".encode()) < val_fraction * 2**32


def corpus_location(args: DataArgs) -> str:
    """The corpus as a user can find it: `${data_root}` expanded (hub ids as given)."""
    if args.corpus.startswith("hf:"):
        return args.corpus
    try:
        return str(expand_data_path(args.corpus, args.data_root))
    except FileNotFoundError:  # no data root: the error comes later, with its own message
        return args.corpus


def corpus_extent(args: DataArgs) -> str:
    """The corpus and how much of it is read, for the one-time cache messages: '<path> (3 files, 80.1 MB on disk)',
    or its first N documents when data.max_documents caps it."""
    where = corpus_location(args)
    if args.corpus.startswith("hf:"):
        return where
    try:
        files = corpus_files(args.corpus, args.data_root)
    except (CrossbertError, FileNotFoundError):  # the reader says what is wrong, with its own message
        return where
    size = sum(f.stat().st_size for f in files) / 1e6
    first = f", its first {args.max_documents:,} documents" if args.max_documents else ", the whole corpus"
    return f"{where} ({len(files)} file{'s' if len(files) != 1 else ''}, {size:,.1f} MB on disk{first})"


def once_note(out: Path, args: DataArgs) -> str:
    """Why a short run may spend minutes here: the cache is built once and every later run reuses it."""
    hint = "" if args.max_documents else "; a short trial run can set data.max_documents=N to read only the first N documents"
    return f"every later run with this corpus, tokenizer and split reuses {out}{hint}"


def corpus_fingerprint(args: DataArgs) -> dict:
    if args.corpus.startswith("hf:"):
        return {"hub": args.corpus, "text_field": args.text_field, "max_documents": args.max_documents}
    files = [(str(p.resolve()), p.stat().st_size, int(p.stat().st_mtime)) for p in corpus_files(args.corpus, args.data_root)]
    return {"files": files, "text_field": args.text_field, "max_documents": args.max_documents}


# The corpus as blocks of whole documents: the tasks of the tokenization workers (crossbert_model.data.token_cache).
BLOCK_BYTES = 1 << 20  # a worker's task: ~250k Wikipedia tokens, a quarter of a second of one core
_TXT_DOCUMENT_END = re.compile(rb"\n[ \t\r\x0b\x0c]*\n")  # a blank line (ends a txt paragraph)


@dataclass
class CorpusBlock:
    """A worker's task: whole lines of one corpus file (or texts of a hub stream), in corpus order."""

    kind: str  # "jsonl" | "txt" | "texts"
    data: bytes | list[str]
    path: Path | None = None
    lineno: int = 1  # of its first line in the file, and
    offset: int = 0  # its first byte in the decompressed file: for error messages
    max_documents: int = 0  # it holds at most this many (reading stops early under data.max_documents)
    index: int = 0


def corpus_blocks(args: DataArgs, block_bytes: int = BLOCK_BYTES) -> Iterator[CorpusBlock]:
    """The corpus as workers' tasks, read in this process, numbered in corpus order."""
    if args.corpus.startswith("hf:"):
        blocks = _text_blocks(_iter_hub_documents(args.corpus[3:], args.text_field), block_bytes)
    else:
        files = corpus_files(args.corpus, args.data_root)
        blocks = itertools.chain.from_iterable(_file_blocks(path, block_bytes) for path in files)
    for index, block in enumerate(blocks):
        block.index = index
        yield block


def _text_blocks(texts: Iterator[str], block_bytes: int) -> Iterator[CorpusBlock]:
    """A hub stream is one iterator, read here; its workers only encode."""
    batch, size = [], 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= block_bytes:
            yield CorpusBlock("texts", batch, max_documents=len(batch))
            batch, size = [], 0
    if batch:
        yield CorpusBlock("texts", batch, max_documents=len(batch))


def _file_blocks(path: Path, block_bytes: int) -> Iterator[CorpusBlock]:
    """Blocks of about `block_bytes` of a corpus file, cut where a document ends: after any line of
    jsonl, after a blank line of txt (a blank line in bytes is blank as text too)."""
    kind = "jsonl" if ".jsonl" in path.name else "txt"
    lineno, offset, rest = 1, 0, b""

    def block(raw: bytes) -> CorpusBlock:
        nonlocal lineno, offset
        nonblank = sum(1 for line in raw.split(b"\n") if line.strip())  # >= its documents, in either format
        out = CorpusBlock(kind, raw, path, lineno, offset, nonblank)
        lineno, offset = lineno + raw.count(b"\n"), offset + len(raw)
        return out

    with _open_binary(path) as f:
        while data := f.read(block_bytes):
            buf = rest + data
            cut = _last_document_end(buf, kind)
            rest = buf[cut:]
            if cut:
                yield block(buf[:cut])
    if rest:
        yield block(rest)


def _last_document_end(buf: bytes, kind: str) -> int:
    if kind == "jsonl":
        return buf.rfind(b"\n") + 1
    last = None
    for last in _TXT_DOCUMENT_END.finditer(buf):
        pass
    return last.end() if last else 0


def block_documents(block: CorpusBlock, text_field: str) -> list[str]:
    """The documents of `block`, parsed as `iter_documents` parses its file (in a tokenization worker)."""
    if block.kind == "texts":
        return block.data
    lines = _decode_lines(block.path, io.BytesIO(block.data), block.lineno, block.offset)
    docs = _jsonl_documents(block.path, text_field, lines) if block.kind == "jsonl" else _txt_documents(block.path, lines)
    return list(docs)
