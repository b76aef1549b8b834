"""The training config's data section (DataArgs), in a module of its own so that reading the config's
schema (`crossbert train --help`, `--print-config`) imports no torch; the pipeline is crossbert_model.data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from .limits import POSITIVE_INT, SEED, Range, Text


@dataclass
class DataArgs:
    corpus: str = "${data_root}/wikipedia_en_2015"  # jsonl / txt file or folder (.xz, .gz too), or hf:owner/name online
    text_field: Annotated[str, Text()] = "text"  # the jsonl field holding a document's text
    tokenizer: Annotated[str, Text()] = "train"  # "train" (WordPiece on the corpus) | "minilm" | path to a tokenizer folder
    vocab_size: Annotated[int, POSITIVE_INT] = 8192  # for a trained tokenizer
    seq_len: Annotated[int, Range(3, integer=True, words="an integer >= 3 ([CLS] + text + [SEP])")] = (
        128  # tokens per training sequence, [CLS] and [SEP] included
    )
    val_fraction: Annotated[float, Range(0, 1, high_open=True)] = 0.02  # of documents
    split_seed: Annotated[int, SEED] = 1234  # which documents are held out for validation
    max_documents: Annotated[int | None, POSITIVE_INT] = None  # read only the first N documents (quick experiments, tests)
    cache_dir: str = "runs/cache"  # tokenizers and token ids, built once and shared by runs
    data_root: str | None = None  # ${data_root} above (default: $CROSSBERT_DATA_ROOT or ../shared/data)
    num_workers: Annotated[int | None, POSITIVE_INT] = None  # tokenization processes; None: every core this process may run on
    # run the Python a tokenizer folder carries (auto_map) to load it: only for a folder you trust (crossbert_model.remote_code)
    trust_remote_code: bool = False
