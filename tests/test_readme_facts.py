"""Numbers the README, docs/ and the result folders' READMEs quote, checked against the committed files they come
from: a quoted number that no longer matches its source fails here, naming the doc, the number and the source.

One fact is one line of FACTS: the doc, a pattern with one group per quoted number (the doc's whitespace is read as
single spaces, so a pattern may span a wrapped line), the committed source, and how to read the numbers from it, in
the pattern's order. A quoted number agrees when it is the source's value rounded to the digits it shows. Reads only
committed files, with the standard library (no pandas: the whole module runs in well under a second).
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from crossbert_model.readers import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
NUMBER = r"(-?[\d,]+(?:\.\d+)?)"  # a quoted number: 6.68, 1,159, 61, -0.91


@dataclass(frozen=True)
class Fact:
    doc: str  # the file that quotes the numbers, from the repository root
    pattern: str  # a regular expression with one group per quoted number ({n}: NUMBER)
    source: str  # the committed file the numbers come from
    read: Callable[[Path], list[float]]  # the source -> the numbers, in the pattern's order


@cache
def rows(path: Path) -> tuple[dict, ...]:
    """The rows of a committed CSV or JSON-lines file (CSV cells as text; a store compressed as .xz read through it)."""
    if path.suffix != ".csv":
        return tuple(read_jsonl(path))
    with open(path, newline="") as f:
        return tuple(csv.DictReader(f))


def where(path: Path, **match) -> list[dict]:
    return [r for r in rows(path) if all(str(r.get(k)) == str(v) for k, v in match.items())]


def only(values) -> float:
    """The one value every row holds (the corpus's unigram entropy is the same in every run)."""
    distinct = {float(v) for v in values}
    assert len(distinct) == 1, f"expected one value, got {sorted(distinct)}"
    return distinct.pop()


def span(path: Path, column: str, **match) -> list[float]:
    """[min, max] of a column over the matching rows: what a doc quotes as "low-high"."""
    values = [float(r[column]) for r in where(path, **match)]
    assert values, f"{path.name}: no row with {match}"
    return [min(values), max(values)]


def unigram_entropies(path: Path) -> list[float]:
    return [only(r["unigram_entropy_r15"] for r in rows(path)), only(r["unigram_entropy_r50"] for r in rows(path))]


def mteb_main_score(path: Path, task: str) -> float:
    return only(100 * r["value"] for r in where(path, task=task, is_main=True))


def zoo_last_layer(path: Path, model: str) -> list[float]:
    """A model's row of the zoo README's last-layer table: SST-2 linear, kNN, TREC linear, kNN, STSBenchmark."""
    (row,) = where(path, model=model)
    return [float(row[c]) for c in ("SST-2:linear", "SST-2:knn", "TREC:linear", "TREC:knn", "STSBenchmark:mteb")]


def stage(path: Path, name: str) -> dict:
    (row,) = [r for r in json.loads(path.read_text())["rows"] if r["stage"] == name]
    return row


def baseline(path: Path, task: str, name: str, probe: str) -> float:
    (row,) = where(path, task=task, baseline=name, probe=probe)
    return float(row["score"])


def quoted_in(path: Path, pattern: str) -> list[float]:
    """A number a result folder's README records as measured there (its set-up time), read from that README."""
    match = re.search(pattern, " ".join(path.read_text().split()))
    assert match, f"{path} no longer records {pattern!r}"
    return [float(match.group(1))]


CPU_SMALL = "results/cpu_small"
ZOO = "results/zoo_offline"
N = NUMBER

FACTS = [
    Fact(
        "docs/training.md",
        rf"main job's corpus and tokenizer: {N} / {N} nats",
        f"{CPU_SMALL}/checkpoints.jsonl",
        unigram_entropies,
    ),
    Fact(f"{CPU_SMALL}/README.md", rf"\({N} at r = 0\.15, {N} at r = 0\.5;", f"{CPU_SMALL}/checkpoints.jsonl", unigram_entropies),
    *(
        Fact(
            f"{CPU_SMALL}/README.md",
            rf"\| {o} \| {s} \| {N} to {N} \| {N} to {N} \|",
            f"{CPU_SMALL}/tables/plateau.csv",  # its plateau table
            lambda p, o=o, s=s: span(p, "own_ratio_shared_loss", objective=o, size=s) + span(p, "margin", objective=o, size=s),
        )
        for o in ("mlm", "crossbert")
        for s in ("nano", "tiny")
    ),
    Fact(
        "docs/reference_runs.md",
        rf"flat MLM margins {N} to {N} nats: above the entropy; CrossBERT {N} to {N}\)",
        f"{CPU_SMALL}/tables/plateau.csv",
        lambda p: span(p, "margin", objective="mlm") + span(p, "margin", objective="crossbert"),
    ),
    Fact(
        f"{CPU_SMALL}/README.md",
        rf"its {N} objective, {N} size and {N} layer comparisons",
        f"{CPU_SMALL}/tables/comparisons.csv",
        lambda p: [
            len(where(p, comparison=c)) for c in ("crossbert - mlm", "larger size - smaller size", "last layer - layer 0")
        ],
    ),
    Fact(
        "docs/reference_runs.md",
        rf"creating the environment, {N} s the sweep: training {N}%, probes {N}% of the worker time\)",
        f"{CPU_SMALL}/main_job_timing.json",
        lambda p: [
            json.loads(p.read_text())["wall_seconds"],
            100 * stage(p, "train")["share_of_worker_time"],
            100 * stage(p, "probe")["share_of_worker_time"],
        ],
    ),
    Fact(
        f"{CPU_SMALL}/README.md",
        rf"\| train \(12 runs[^|]*\| 12 \| {N} \| {N}% \|",
        f"{CPU_SMALL}/main_job_timing.json",
        lambda p: [stage(p, "train")["seconds"], 100 * stage(p, "train")["share_of_worker_time"]],
    ),
    Fact(
        "README.md",
        rf"the environment \({N} s on a fresh clone",
        f"{CPU_SMALL}/README.md",
        lambda p: quoted_in(p, r"(\d+) s creating `\.venv`"),
    ),
    Fact(
        "README.md",
        rf"on first use \({N} s on a fresh clone",
        f"{CPU_SMALL}/README.md",
        lambda p: quoted_in(p, r"(\d+) s creating `\.venv`"),
    ),
    Fact(
        "docs/reference_runs.md",
        rf"\({N} s creating the environment",
        f"{CPU_SMALL}/README.md",
        lambda p: quoted_in(p, r"(\d+) s creating `\.venv`"),
    ),
    Fact(
        "results/cpu_second_target/README.md",
        rf"flat MLM {N}-{N} nats below, CrossBERT {N}-{N}",
        "results/cpu_second_target/tables/plateau.csv",
        lambda p: span(p, "margin", objective="mlm") + span(p, "margin", objective="crossbert-emb1"),
    ),
    Fact(
        "docs/mteb.md",
        rf"STSBenchmark {N} \(published [\d.]+\) and BIOSSES {N}",
        "results/mteb_eng_v2_minilm/results/results.jsonl.xz",
        lambda p: [mteb_main_score(p, "STSBenchmark"), mteb_main_score(p, "BIOSSES")],
    ),
    Fact(
        f"{ZOO}/README.md",
        rf"MiniLM's STSBenchmark score is its published MTEB score \({N}\)",
        f"{ZOO}/tables/summary.csv",
        lambda p: zoo_last_layer(p, "MiniLM-L6")[-1:],
    ),
    Fact(
        f"{ZOO}/README.md",
        rf"\| MiniLM-L6 \| [^|]+\| mean \| [\d,]+ \| {N} \| {N} \| {N} \| {N} \| {N} \|",
        f"{ZOO}/tables/summary.csv",
        lambda p: zoo_last_layer(p, "MiniLM-L6"),
    ),
    Fact(
        f"{ZOO}/README.md",
        rf"\| tiny-crossbert \| [^|]+\| mean \| [\d,]+ \| {N} \| {N} \| {N} \| {N} \| {N} \|",
        f"{ZOO}/tables/summary.csv",
        lambda p: zoo_last_layer(p, "tiny-crossbert"),
    ),
    Fact(
        "docs/evaluation.md",
        rf"majority SST-2 {N}, MRPC F1 {N} .* BigramShift and CoordinationInversion {N}; TF-IDF \+ linear SST-2 {N}, "
        rf"MRPC F1 {N}, BigramShift {N}, CoordinationInversion {N}; TF-IDF cosine on STS-B {N}",
        f"{CPU_SMALL}/tables/baselines.csv",
        lambda p: [
            baseline(p, "SST-2", "majority", "majority"),
            baseline(p, "MRPC", "majority", "majority"),
            baseline(p, "BigramShift", "majority", "majority"),
            *(baseline(p, t, "tfidf", "linear") for t in ("SST-2", "MRPC", "BigramShift", "CoordinationInversion")),
            baseline(p, "STS-B", "tfidf", "cosine"),
        ],
    ),
    Fact(
        f"{ZOO}/README.md",
        rf"same linear probe score SST-2 {N} and TREC {N}, and their cosine scores STSBenchmark {N}",
        f"{ZOO}/tables/baselines.csv",
        lambda p: [
            baseline(p, "SST-2", "tfidf", "linear"),
            baseline(p, "TREC", "tfidf", "linear"),
            baseline(p, "STSBenchmark", "tfidf", "cosine"),
        ],
    ),
    Fact(
        f"{CPU_SMALL}/README.md",
        rf"majority class scores MRPC F1 {N} .* linear probe score SST-2 {N}, MRPC F1 {N}, BigramShift {N}, "
        rf"CoordinationInversion {N}, and their cosine scores mteb's STSBenchmark {N}",
        f"{CPU_SMALL}/tables/baselines.csv",
        lambda p: [
            baseline(p, "MRPC", "majority", "majority"),
            *(baseline(p, t, "tfidf", "linear") for t in ("SST-2", "MRPC", "BigramShift", "CoordinationInversion")),
            baseline(p, "STSBenchmark", "tfidf", "cosine"),
        ],
    ),
]


def agrees(quoted: str, value: float) -> bool:
    """The quoted text is `value` rounded to the digits it shows."""
    decimals = len(quoted.partition(".")[2])
    return abs(float(quoted.replace(",", "")) - value) <= 0.5 * 10**-decimals + 1e-9


@pytest.mark.parametrize("fact", FACTS, ids=[f"{i}-{f.doc}-from-{Path(f.source).name}" for i, f in enumerate(FACTS)])
def test_a_number_a_doc_quotes_is_the_one_its_committed_source_holds(fact):
    text = " ".join((ROOT / fact.doc).read_text().split())
    match = re.search(fact.pattern, text)
    assert match, f"{fact.doc} no longer says {fact.pattern!r}: update the doc's sentence or this fact"
    expected = fact.read(ROOT / fact.source)
    assert len(match.groups()) == len(expected)
    wrong = [(q, round(v, 4)) for q, v in zip(match.groups(), expected) if not agrees(q, v)]
    assert not wrong, f"{fact.doc} quotes {[q for q, _ in wrong]} where {fact.source} holds {[v for _, v in wrong]}"


def test_a_quoted_number_agrees_only_with_the_value_it_rounds():
    assert agrees("6.68", 6.679162) and agrees("1,159", 1159.0) and agrees("61", 61.27)
    assert not agrees("6.85", 6.679162) and not agrees("6.64", 6.6799) and not agrees("62", 61.27)
