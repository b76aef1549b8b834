"""Shared bits of the benchmark scripts: interleaved timing, table printing, JSON output."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from crossbert_model.utils import atomic_write_json, provenance, quiet_transformers, set_offline_env  # noqa: E402


def setup() -> None:
    set_offline_env()
    quiet_transformers()


def hf_bert_of_shape(c):
    """The named baseline: Hugging Face BertForMaskedLM with the encoder shape of CrossBertConfig `c`
    (SDPA attention, no dropout, as our models train). It computes vocabulary logits at every position."""
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, intermediate_size=c.intermediate_size,
        max_position_embeddings=max(512, c.max_position_embeddings), hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, attn_implementation="sdpa", pad_token_id=c.pad_token_id,
    )  # fmt: skip
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
