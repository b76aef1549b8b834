"""Token ids on disk: the corpus tokenized once per (corpus files, text field, tokenizer, split) into a cache folder,
by worker processes on every core, as sharded files (a killed run resumes); the shards read back as one stream
(ShardedTokens)."""

from __future__ import annotations

import bisect
import contextlib
import functools
import itertools
import logging
import multiprocessing
import os
import signal
import sys
import time
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from tqdm.auto import tqdm

from ..data_args import DataArgs
from ..readers import ReadError, read_json, read_jsonl
from ..utils import append_jsonl, atomic_path, atomic_write_json, exclusive_lock, stable_hash
from .corpus import (
    BLOCK_BYTES,
    CorpusBlock,
    block_documents,
    corpus_blocks,
    corpus_extent,
    corpus_fingerprint,
    corpus_location,
    is_validation,
    once_note,
)
from .errors import DataError
from .tokenizer import tokenizer_fingerprint

log = logging.getLogger(__name__)

TOKEN_CACHE_VERSION = 2  # 2: sharded token files

# The main process reads the corpus in blocks of whole lines (decompressing a file is one thread
# anyway, and ~6% of the work on Wikipedia: done once here, not once per worker); worker processes
# decode, parse and encode a block each, which is the rest. Only the main process knows where a
# block's documents stand in the corpus (its worker counts them), so it splits documents into
# train / val by `is_validation` and appends the blocks, in corpus order, to the current shard: the
# token stream is the one a single process writes, whatever the number of workers.
#
# A token folder holds shard-NNNNN.{train,val}.bin (`shard_blocks` blocks each; each file renamed into
# place when whole), shards.jsonl (a line per finished shard), plan.json (the block layout) and, last,
# meta.json: the folder is complete iff meta.json exists. A killed run leaves its finished shards and
# their lines, and the next run skips them.

SHARD_BLOCKS = 64  # ~16M tokens a shard: few files to map, and at most a shard's work lost if killed
SPLITS = ("train", "val")
PROGRESS_FILE = "shards.jsonl"
PLAN_FILE = "plan.json"
# One thread per encoder: the workers fill the cores, a Rust thread pool in each would oversubscribe them.
ONE_THREAD_ENV = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}


def _raw_backend(tokenizer_json: str):
    """The Rust tokenizer without padding/truncation (MiniLM's tokenizer.json pads everything to 128)."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tokenizer_json)
    backend.no_padding()
    backend.no_truncation()
    return backend


class _BlockEncoder:
    """A block -> (its documents' token ids, each document followed by [SEP]; per-document lengths)."""

    def __init__(self, tokenizer_json: str, text_field: str, dtype: str, sep_id: int):
        self.backend = _raw_backend(tokenizer_json)
        self.text_field, self.dtype, self.sep_id = text_field, np.dtype(dtype), sep_id

    def __call__(self, block: CorpusBlock) -> tuple[np.ndarray, np.ndarray]:
        encodings = self.backend.encode_batch(block_documents(block, self.text_field), add_special_tokens=False)
        docs = [np.asarray(e.ids + [self.sep_id], dtype=self.dtype) for e in encodings]
        lengths = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))
        return (np.concatenate(docs) if docs else np.zeros(0, self.dtype)), lengths


_WORKER_ENCODER: _BlockEncoder | None = None


def _init_worker(*encoder_args) -> None:
    global _WORKER_ENCODER
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the main process handles it
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked worker keeps no handler of the command's (errors.py)
    _WORKER_ENCODER = _BlockEncoder(*encoder_args)


def _encode_in_worker(block: CorpusBlock) -> tuple[np.ndarray, np.ndarray]:
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
def _block_encoders(num_workers: int, encoder_args: tuple) -> Iterator[Callable[[CorpusBlock], Future]]:
    """submit(block) -> a Future of its encoding, on `num_workers` processes (this one for 1)."""
    if num_workers == 1:
        encode = _BlockEncoder(*encoder_args)

        def submit(block: CorpusBlock) -> Future:
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
    documents by `is_validation` of their index in the corpus. A shard's files are renamed into place
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
            (is_validation(self.documents + i, self.args.val_fraction, self.args.split_seed) for i in range(len(lengths))),
            dtype=bool,
            count=len(lengths),
        )
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


def _write_shards(
    blocks: Iterator[CorpusBlock],
    submit,
    writer: _ShardWriter,
    done: dict[int, dict],
    shard_blocks: int,
    window: int,
    limit: int | None,
    bar,
) -> None:
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
    (see the comment above `SHARD_BLOCKS`); return that folder. A killed run resumes where it stopped."""
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
            corpus_extent(args),
            workers,
            "es" if workers > 1 else "",
            f"{block_bytes / 2**10:,.0f}",
            shard_blocks,
            f"; resuming: {len(done)} shard(s) already done" if done else "",
            once_note(out, args),
        )
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
        meta["tokens"]["train"],
        meta["tokens"]["val"],
        len(meta["shards"]),
        writer.encoded,
        writer.encoded / seconds,
        out,
    )
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


def _damaged(token_dir: Path, what: str) -> DataError:
    return DataError(
        f"token cache {what}; the cache is damaged: delete the folder {token_dir} and run again to tokenize the corpus anew"
    )


def read_meta(token_dir: Path) -> dict:
    """The meta.json of a complete token folder (`tokenize_corpus`), its shard fields checked; damage is a
    DataError that says to delete the folder."""
    path = token_dir / "meta.json"
    try:
        meta = read_json(path, "a token cache's meta.json")
        np.dtype(meta["dtype"])
        for shard in meta["shards"]:
            shard["name"], shard["tokens"]["train"], shard["tokens"]["val"]  # noqa: B018 (fields that must be there)
    except (ReadError, OSError, ValueError, KeyError, TypeError) as e:
        raise _damaged(token_dir, f"{path}: unreadable ({type(e).__name__}: {e})") from None
    return meta


def map_shard(token_dir: Path, name: str, split: str, count: int, dtype: np.dtype) -> np.ndarray:
    """Shard `name`'s file of `split`, memory-mapped as `count` tokens of `dtype` (what meta.json records); a file of
    another size is a DataError that says to delete the folder."""
    path = token_dir / f"{name}.{split}.bin"
    expected = count * dtype.itemsize
    size = path.stat().st_size if path.exists() else None
    if size != expected:
        found = "it is missing" if size is None else f"it holds {size} bytes"
        raise _damaged(token_dir, f"{path}: meta.json says {count} tokens ({expected} bytes), but {found}")
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))
