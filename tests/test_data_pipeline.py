"""The corpus pipeline: parallel sharded tokenization writes the stream one process writes, resumes when
killed, reads hub streams, and names damaged caches; the shards read back as one stream."""

import dataclasses
import itertools
import json
import os
import re

import numpy as np
import pytest

from crossbert_model.data import corpus as C
from crossbert_model.data import token_cache as T
from crossbert_model.data.errors import DataError
from crossbert_model.data.sequences import load_tokens
from crossbert_model.data.token_cache import ShardedTokens, tokenize_corpus
from crossbert_model.data_args import DataArgs

BLOCK = dict(block_bytes=16_384, shard_blocks=3)  # ~40 blocks, ~14 shards of the fixture


@pytest.fixture(scope="module")
def texts(real_data_root):
    """40 real Wikipedia articles (a few shortened), plus the cases the parsers skip or must keep."""
    docs = list(itertools.islice(C.iter_documents(str(real_data_root / "wikipedia_en_2015")), 40))
    docs[3], docs[7] = docs[3][:40], "caf\u00e9 \u2014 na\u00efve \u4e2d\u6587 text"
    return docs


def write_jsonl(path, texts):
    lines = []
    for i, text in enumerate(texts):
        lines.append(json.dumps({"text": text, "id": i}))
        if i % 5 == 0:
            lines.append("")  # blank lines are skipped
        if i % 9 == 0:
            lines.append(json.dumps({"text": "   "}))  # whitespace-only documents are skipped
    path.write_text("\n".join(lines) + "\n")
    return path


def write_txt(path, texts):
    path.write_text("".join(t.replace("\r", "") + "\n\n" for t in texts))
    return path


def write_txt_crlf(path, texts):
    """Windows line ends, blank lines holding spaces, no newline at the end of the file."""
    paragraphs = [t.replace("\r", "").replace("\n", "\r\n") for t in texts]
    path.write_bytes(" \t\r\n".join(p + "\r\n" for p in paragraphs).rstrip().encode())
    return path


def args_for(corpus, tmp_path, name, **kw):
    return DataArgs(corpus=str(corpus), cache_dir=str(tmp_path / name), val_fraction=0.2, split_seed=7, seq_len=64, **kw)


def reference_streams(args, tokenizer) -> dict[str, np.ndarray]:
    """The definition: documents in corpus order, each followed by [SEP], split by `is_validation`."""
    backend = T._raw_backend(tokenizer.backend_tokenizer.to_str())
    streams = {"train": [], "val": []}
    for i, doc in enumerate(C.documents(args)):
        split = "val" if C.is_validation(i, args.val_fraction, args.split_seed) else "train"
        streams[split] += backend.encode(doc, add_special_tokens=False).ids + [tokenizer.sep_token_id]
    return {k: np.asarray(v) for k, v in streams.items()}


def streams_of(token_dir, tokenizer, seq_len=64):
    data = load_tokens(token_dir, tokenizer, seq_len)
    return data, {name: np.asarray(getattr(data, name).tokens[:]) for name in ("train", "val")}


def assert_streams_equal(got, expected):
    for split in ("train", "val"):
        assert len(got[split]) == len(expected[split]) and (got[split] == expected[split]).all(), split


WRITERS = {"jsonl": write_jsonl, "txt": write_txt, "txt-crlf": write_txt_crlf}


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_parallel_tokenization_writes_the_stream_of_one_process(fmt, texts, corpus, tmp_path):
    path = WRITERS[fmt](tmp_path / f"corpus.{fmt.split('-')[0]}", texts)
    tok = corpus.tokenizer
    expected = reference_streams(args_for(path, tmp_path, "ref"), tok)
    for workers in (1, 2):
        token_dir = tokenize_corpus(args_for(path, tmp_path, f"w{workers}", num_workers=workers), tok, **BLOCK)
        data, got = streams_of(token_dir, tok)
        assert_streams_equal(got, expected)
        assert data.meta["num_shards"] > 5 and data.meta["documents"]["val"] > 0
        assert sum(data.meta["documents"].values()) == len(list(C.documents(args_for(path, tmp_path, "x"))))
        # Every packed sequence, those that straddle shard files included, is the window of the stream.
        window = 62
        rows = data.train.get(np.arange(len(data.train))).numpy()
        assert (rows[:, 1:-1] == expected["train"][: len(rows) * window].reshape(-1, window)).all()
        assert (rows[:, 0] == tok.cls_token_id).all() and (rows[:, -1] == tok.sep_token_id).all()


def test_max_documents_reads_just_enough(texts, corpus, tmp_path):
    path = write_jsonl(tmp_path / "corpus.jsonl", texts)
    args = args_for(path, tmp_path, "w2", num_workers=2, max_documents=7)
    data, got = streams_of(tokenize_corpus(args, corpus.tokenizer, **BLOCK), corpus.tokenizer)
    assert sum(data.meta["documents"].values()) == 7
    assert_streams_equal(got, reference_streams(args, corpus.tokenizer))


def test_a_killed_tokenization_resumes_with_the_finished_shards(texts, corpus, tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "corpus.jsonl", texts)
    args = args_for(path, tmp_path, "cache", num_workers=1)
    encode, calls = T._BlockEncoder.__call__, []

    def killed_at_block_20(self, block):
        calls.append(block.index)
        if block.index == 20:
            raise KeyboardInterrupt  # as Ctrl-C or a kill lands mid-run
        return encode(self, block)

    monkeypatch.setattr(T._BlockEncoder, "__call__", killed_at_block_20)
    with pytest.raises(KeyboardInterrupt):
        tokenize_corpus(args, corpus.tokenizer, **BLOCK)
    token_dir = next((tmp_path / "cache" / "tokens").iterdir())
    assert not (token_dir / "meta.json").exists()
    finished = sorted(p.name for p in token_dir.glob("shard-*.train.bin"))
    assert len(finished) == 20 // 3 and not list(token_dir.glob(".*.tmp"))  # the shard being written is gone
    (token_dir / ".shard-00006.train.bin.abc123.tmp").write_bytes(b"half")  # what a SIGKILL leaves

    calls.clear()
    monkeypatch.setattr(T._BlockEncoder, "__call__", lambda self, block: calls.append(block.index) or encode(self, block))
    mtimes = {name: (token_dir / name).stat().st_mtime_ns for name in finished}
    tokenize_corpus(args, corpus.tokenizer, **BLOCK)
    assert min(calls) == 18  # blocks 0..17 (shards 0..5) were not encoded again
    assert {name: (token_dir / name).stat().st_mtime_ns for name in finished} == mtimes
    assert not list(token_dir.glob(".*.tmp"))
    expected = reference_streams(args, corpus.tokenizer)
    assert_streams_equal(streams_of(token_dir, corpus.tokenizer)[1], expected)

    # A complete folder that lost meta.json and a shard redoes just that shard.
    (token_dir / "meta.json").unlink()
    (token_dir / "shard-00002.val.bin").unlink()
    calls.clear()
    tokenize_corpus(args, corpus.tokenizer, **BLOCK)
    assert calls == [6, 7, 8]
    assert_streams_equal(streams_of(token_dir, corpus.tokenizer)[1], expected)


def test_a_hub_stream_is_read_here_and_encoded_by_the_workers(texts, corpus, tmp_path, monkeypatch, no_network):
    monkeypatch.setattr(C, "_iter_hub_documents", lambda dataset_id, text_field: iter(texts))
    args = args_for("hf:someone/wiki", tmp_path, "ref")
    expected = reference_streams(args, corpus.tokenizer)
    for workers in (1, 2):
        token_dir = tokenize_corpus(
            dataclasses.replace(args, cache_dir=str(tmp_path / f"w{workers}"), num_workers=workers), corpus.tokenizer, **BLOCK
        )
        data, got = streams_of(token_dir, corpus.tokenizer)
        assert_streams_equal(got, expected)
        assert data.meta["corpus"] == "hf:someone/wiki" and data.meta["num_shards"] > 1


def test_a_missing_or_damaged_shard_is_named_with_what_to_do(texts, corpus, tmp_path):
    path = write_jsonl(tmp_path / "corpus.jsonl", texts)
    token_dir = tokenize_corpus(args_for(path, tmp_path, "cache", num_workers=2), corpus.tokenizer, **BLOCK)
    shard = token_dir / "shard-00001.train.bin"
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size - 2)
    fix = f"delete the folder {token_dir} and run again"
    says = rf"{re.escape(str(shard))}: meta.json says {size // 2} tokens .* holds {size - 2} bytes.*{re.escape(fix)}"
    with pytest.raises(DataError, match=says):
        load_tokens(token_dir, corpus.tokenizer, 64)
    shard.unlink()
    with pytest.raises(DataError, match=rf"{re.escape(str(shard))}: .* it is missing"):
        load_tokens(token_dir, corpus.tokenizer, 64)
    (token_dir / "meta.json").write_text("{not json")
    with pytest.raises(DataError, match=r"meta.json: unreadable"):
        load_tokens(token_dir, corpus.tokenizer, 64)


def test_a_bad_byte_in_a_worker_block_is_named_as_the_serial_reader_names_it(texts, corpus, tmp_path):
    path = write_jsonl(tmp_path / "corpus.jsonl", texts)
    path.write_bytes(path.read_bytes() + b'{"text": "bad \xff byte"}\n' + path.read_bytes())
    args = args_for(path, tmp_path, "cache", num_workers=2)
    with pytest.raises(DataError) as serial:
        list(C.documents(args))
    assert re.match(rf"{re.escape(str(path))}:\d+: not valid UTF-8 at byte \d+ ", str(serial.value))
    with pytest.raises(DataError, match=re.escape(str(serial.value))):
        tokenize_corpus(args, corpus.tokenizer, **BLOCK)


def _die(block):
    os._exit(3)  # as the kernel's out-of-memory killer ends a worker


def test_a_worker_that_dies_is_an_error_that_says_so(texts, corpus, tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "corpus.jsonl", texts)
    monkeypatch.setattr(T, "_encode_in_worker", _die)
    with pytest.raises(DataError, match=r"a tokenization worker process died .* run again to resume"):
        tokenize_corpus(args_for(path, tmp_path, "cache", num_workers=2), corpus.tokenizer, **BLOCK)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_num_workers_must_be_a_positive_integer(bad, corpus, tmp_path):
    with pytest.raises(DataError, match=r"data.num_workers must be a positive integer, or null for every core"):
        tokenize_corpus(DataArgs(corpus="hf:x/y", cache_dir=str(tmp_path), num_workers=bad), corpus.tokenizer)


def test_sharded_tokens_read_any_slice_across_shards():
    sizes = [5, 0, 7, 1, 12]
    stream = np.arange(sum(sizes), dtype=np.uint16)
    parts = np.split(stream, np.cumsum(sizes)[:-1])
    tokens = ShardedTokens(parts, np.uint16)
    assert len(tokens) == len(stream)
    for start, stop in itertools.combinations(range(len(stream) + 1), 2):
        assert (tokens[start:stop] == stream[start:stop]).all(), (start, stop)
    assert len(tokens[3:3]) == 0 and tokens[3:3].dtype == np.uint16
    for length in (1, 4, 9):
        starts = np.arange(len(stream) - length + 1)
        assert (tokens.windows(starts, length) == stream[starts[:, None] + np.arange(length)]).all()
