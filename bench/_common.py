"""Shared bits of the benchmark scripts: interleaved timing, table printing, JSON output."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from crossbert_model.data_args import DataArgs  # noqa: E402
from crossbert_model.objectives import objective_names  # noqa: E402
from crossbert_model.train_config import ModelArgs, model_config  # noqa: E402
from crossbert_model.utils import atomic_write_json, provenance, quiet_transformers, set_offline_env  # noqa: E402


def setup() -> None:
    set_offline_env()
    quiet_transformers()


def contender_config(preset: str, model: dict, seq_len: int, tokenizer=None, vocab_size: int | None = None):
    """The CrossBertConfig a run with this model section (ModelArgs fields: objective, mask_ratio, ...) at
    `preset` trains, through the trainer's own translation (crossbert_model.train_config.model_config):
    the vocabulary and special-token ids are the tokenizer's (a `TokenIds` for ids without one), else
    `vocab_size` with the default ids."""
    data = DataArgs(seq_len=seq_len) if vocab_size is None else DataArgs(seq_len=seq_len, vocab_size=vocab_size)
    return model_config(ModelArgs(preset=preset, **model), data, tokenizer)


def with_every_objective(contenders: dict[str, dict]) -> dict[str, dict]:
    """A bench's contender table (name -> model-section fields) with every registered objective it does not
    name added at its defaults (named after it): a new objective is measured without editing the benches,
    and the variants a table chose, and their recorded names, stay as they are."""
    covered = {spec.get("objective") for spec in contenders.values()}
    return {**contenders, **{name: {"objective": name} for name in objective_names() if name not in covered}}


class TokenIds:
    """What a model config takes from a tokenizer (crossbert_model.data.tokenizer.special_token_config), given as those
    fields: a shape measured with a vocabulary other than the tokenizer's at hand (gpu_check: BERT's 30,522)."""

    def __init__(
        self,
        vocab_size: int,
        pad_token_id: int,
        cls_token_id: int,
        sep_token_id: int,
        mask_token_id: int,
        num_special_tokens: int,
    ):
        self.vocab_size, self.pad_token_id, self.cls_token_id = vocab_size, pad_token_id, cls_token_id
        self.sep_token_id, self.mask_token_id = sep_token_id, mask_token_id
        self.all_special_ids = [num_special_tokens - 1]  # special_token_config counts max(all_special_ids) + 1

    def __len__(self) -> int:
        return self.vocab_size


def hf_bert_of_shape(c):
    """The named baseline: Hugging Face BertForMaskedLM with the encoder shape of CrossBertConfig `c`
    (SDPA attention, no dropout, as our models train). It computes vocabulary logits at every position."""
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        intermediate_size=c.intermediate_size,
        max_position_embeddings=max(512, c.max_position_embeddings),
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        attn_implementation="sdpa",
        pad_token_id=c.pad_token_id,
    )
    return BertForMaskedLM(config)


def interleaved(contenders: dict, rounds: int, clock=time.perf_counter) -> dict[str, list[float]]:
    """Time each callable once per round, in turn (A B A B ...): slow phases of a shared machine hit all.
    `clock=time.thread_time` measures CPU time instead of wall: the work, not the waits for a core."""
    times = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
    return times


def median_ratio(times: dict[str, list[float]], baseline: str, name: str) -> float:
    """Median over rounds of baseline time / contender time (>1: the contender is faster)."""
    return statistics.median(b / c for b, c in zip(times[baseline], times[name]))


def markdown(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = []
        for c in columns:
            v = r.get(c)
            v = "" if v is None else v
            cells.append(f"{v:,.2f}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write(out: str | Path, name: str, rows: list[dict], table: str, **extra) -> None:
    out = Path(out)
    atomic_write_json(out / f"{name}.json", {"rows": rows, **extra, **provenance()})
    (out / f"{name}.md").write_text(table + "\n")
    print(table)
    print(f"wrote {out / (name + '.json')}")
