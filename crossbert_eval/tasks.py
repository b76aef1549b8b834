"""Declarative tasks: one YAML file per task in `tasks/`, loaded into splits of texts and labels.

A task file says what the data is, where it lies and how to read it; nothing about a task is
hard-coded here. Adding a task = adding a file. Schema (every key of the nested sections is a field of
DataSpec, HubSpec, ColumnsSpec, HoldoutSpec or MtebSpec below; an unknown key is an error):

    name: SST-2
    family: glue                   # one of FAMILIES: glue | senteval | probing | sts | classification | ...
    input: single                  # single | pair
    target: class                  # class | score
    metrics: [accuracy]            # the first is the main score
    data:
      local: glue/SST-2            # folder under the data root
      hub: {path: nyu-mll/glue, name: sst2}   # for users who are online
      format: tsv                  # tsv | csv | jsonl | label_first
      header: true
    splits: {train: train.tsv.xz, validation: dev.tsv}
    # a split may also list files, and entries of SplitFileSpec for what a file name cannot say: another
    # folder, other fields, only some rows, files read side by side, a member of a zip archive:
    #   test: [a.tsv, {folder: other, file: b.tsv.xz, fields: [...], select: {year: 2012test}}]
    #   test: {paste: [texts.zip/dir/input.txt, gold.zip/dir/gold.txt], fields: [sentence1, sentence2, score]}
    columns: {text: sentence, label: label}
    labels: [0, 1]                 # or {raw value: class id}, or `infer` (sorted values of train)
    train_split: train
    eval_split: validation

Reading is strict: TSV rows with the wrong number of fields, empty splits, unknown labels and missing
files stop with a message naming the file, the line or field, and what was expected.

`format: beir` reads a retrieval set in the BEIR layout (data.corpus, data.queries, one qrels file per
split): `load_beir(split, root)` gives corpus, queries and relevance judgements; `load_split` gives the
judged (query, document) pairs, so that `crossbert tasks` can count them.

A task file that does not parse breaks only itself: the registry keeps it (broken_tasks()) and raises
its error when that task, its family or `all` is asked for; other tasks work as before.
The data root is always an argument (`load_split(split, root)`); no task remembers one.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import lzma
import os
import zipfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import numpy as np
import yaml

from crossbert_model.utils import PROJECT_ROOT, data_root
from crossbert_model.errors import CrossbertError

TASKS_DIR_ENV = "CROSSBERT_TASKS_DIR"
FORMATS = ("tsv", "csv", "jsonl", "label_first", "beir")
MTEB_TYPES = ("STS", "Classification", "Clustering", "Reranking", "PairClassification", "Retrieval")
FAMILIES = ("glue", "senteval", "probing", "sts", "classification", "pair_classification", "clustering", "reranking", "retrieval")


class TaskError(CrossbertError, ValueError):
    """A task file or its data is wrong; the message says which file, line or field."""


class TaskDataMissing(TaskError, FileNotFoundError):
    """The task is known but its data is not in the data root (and no hub access)."""


# ------------------------------------------------------------------------------------------------
# Typed nested sections: a misspelt key (`heder:` under `data:`) is an error, not a silent default
# ------------------------------------------------------------------------------------------------


class _Section:
    """A nested section of a task file. Dict-style reads (`.get`, `[...]`, `in`) keep working so callers
    written against the old plain dicts (mteb_runner.py) need no change; an unset key reads as absent."""

    REQUIRED: tuple[str, ...] = ()
    NESTED: dict[str, type] = {}

    def get(self, key: str, default=None):
        value = getattr(self, key, None) if key in self.__dataclass_fields__ else None
        return default if value is None else value

    def __getitem__(self, key: str):
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def keys(self) -> list[str]:
        return [k for k in self.__dataclass_fields__ if self.get(k) is not None]

    def to_dict(self) -> dict:
        return {k: (v.to_dict() if isinstance(v, _Section) else v) for k in self.keys() for v in [self.get(k)]}

    @classmethod
    def parse(cls, raw, path: Path, where: str):
        """`where` is the dotted key of the section (data, data.hub, ...), used in every message."""
        if not isinstance(raw, dict):
            raise TaskError(f"{path}: {where} must be a mapping of keys, got {type(raw).__name__} {raw!r}")
        valid = list(cls.__dataclass_fields__)
        unknown = [k for k in raw if k not in valid]
        if unknown:
            raise TaskError(f"{path}: unknown key {where}.{unknown[0]}; valid keys under {where}: {', '.join(valid)}")
        missing = [k for k in cls.REQUIRED if raw.get(k) is None]
        if missing:
            raise TaskError(f"{path}: missing key {where}.{missing[0]} (required under {where}: {', '.join(cls.REQUIRED)})")
        nested = {k: cls.NESTED[k].parse(v, path, f"{where}.{k}") for k, v in raw.items() if k in cls.NESTED and v is not None}
        section = cls(**{**raw, **nested})
        section.check(path, where)
        return section

    def check(self, path: Path, where: str) -> None:
        """Value checks beyond the key names; sections override it."""

    def _one_of(self, key: str, allowed: tuple, path: Path, where: str) -> None:
        value = getattr(self, key)
        if value is not None and value not in allowed:
            raise TaskError(f"{path}: {where}.{key} must be one of {', '.join(map(str, allowed))}, got {value!r}")


@dataclass
class HubSpec(_Section):
    """Where online users read the task (`datasets.load_dataset(path, name, revision=...)`)."""

    path: str | None = None
    name: str | None = None
    revision: str | None = None
    splits: dict | None = None  # our split name -> the hub's
    columns: dict | None = None  # our column name -> the hub's

    REQUIRED = ("path",)


@dataclass
class DataSpec(_Section):
    local: str | None = None  # folder under the data root
    hub: HubSpec | None = None
    format: str = "tsv"
    header: bool = True
    fields: list | None = None
    optional_fields: list | None = None
    delimiter: str | None = None
    quoting: str | None = None  # none | minimal (default: none for tsv, minimal for csv)
    encoding: str = "utf-8-sig"
    drop_unlabelled: bool = False
    drop_labels: list | None = None  # raw label values whose rows are not examples (TwitterURLCorpus: 3 of 6 votes)
    corpus: str | None = None  # format beir: the documents (jsonl {_id, title, text})
    queries: str | None = None  # format beir: the queries (jsonl {_id, text})

    NESTED = {"hub": HubSpec}

    def check(self, path: Path, where: str) -> None:
        self._one_of("format", FORMATS, path, where)
        self._one_of("quoting", ("none", "minimal"), path, where)
        if not isinstance(self.header, bool):
            raise TaskError(f"{path}: {where}.header must be true or false, got {self.header!r}")
        if self.local is None and self.hub is None:
            raise TaskError(f"{path}: {where} needs `local` (a folder under the data root) or `hub`")
        if self.format == "beir" and (self.corpus is None or self.queries is None):
            raise TaskError(f"{path}: {where}.format beir needs {where}.corpus and {where}.queries (files under {where}.local)")


@dataclass
class ColumnsSpec(_Section):
    text: str | None = None
    text_pair: str | None = None
    label: str | None = None
    group: str | None = None  # e.g. the question id of reranking candidates
    label_before: str | None = None  # the class is the label's text up to this separator (MASSIVE scenario = intent prefix)

    REQUIRED = ("text", "label")


@dataclass
class SplitFileSpec(_Section):
    """An entry of a split's file list that a plain file name cannot describe. Paths may go through a zip
    archive (`archive.zip/dir/member.txt`: read from the archive, never extracted)."""

    file: str | None = None
    paste: list | None = None  # files read side by side, line i of each making example i (like `paste`)
    folder: str | None = None  # a folder under the data root (default: data.local)
    fields: list | None = None  # this file's fields (default: data.fields)
    optional_fields: list | None = None
    select: dict | None = None  # keep only the rows whose fields have these values

    def check(self, path: Path, where: str) -> None:
        if (self.file is None) == (self.paste is None):
            raise TaskError(f"{path}: {where} needs exactly one of `file` (one file) or `paste` (files read side by side)")
        listed = isinstance(self.paste, list) and len(self.paste) > 1 and all(isinstance(f, str) for f in self.paste)
        if self.paste is not None and not listed:
            raise TaskError(f"{path}: {where}.paste must list two or more files, got {self.paste!r}")
        if self.select is not None and not isinstance(self.select, dict):
            raise TaskError(f"{path}: {where}.select must map field names to values, got {self.select!r}")

    @property
    def files(self) -> list[str]:
        return list(self.paste) if self.paste else [self.file]


@dataclass
class HoldoutSpec(_Section):
    """A seeded split of `source` into `train` and `test` (see Task._holdout_split)."""

    source: str | None = None
    train: str | None = None
    test: str | None = None
    test_fraction: float | None = None
    seed: int = 0
    group: str | None = None  # text: pairs sharing a first text stay on one side

    REQUIRED = ("source", "train", "test", "test_fraction")

    def check(self, path: Path, where: str) -> None:
        self._one_of("group", ("text",), path, where)
        if not (isinstance(self.test_fraction, (int, float)) and 0 < self.test_fraction < 1):
            raise TaskError(f"{path}: {where}.test_fraction must be a number between 0 and 1, got {self.test_fraction!r}")


@dataclass
class MtebSpec(_Section):
    """How crossbert_eval/mteb_runner.py runs the task through mteb's own task class."""

    type: str | None = None
    eval_splits: list | None = None
    train_split: str | None = None
    subset: str | None = None
    seed: int | None = None
    set_size: int | None = None  # clustering
    sets: int | None = None  # clustering
    partial: bool | None = None  # our copy is a part of the benchmark's data
    min_score: float | None = None  # STS: documents the score range mteb normalises with
    max_score: float | None = None
    # The local data is not MTEB's exact data: the task runs under mteb's class for `variant_of` (its
    # evaluator and metrics) but under this file's own name, so no row can pass for MTEB's score.
    variant_of: str | None = None
    data_differs: str | None = None  # how the local data differs from MTEB's; shown beside every score
    from_splits: list | None = None  # MTEB's eval split is these splits of ours, concatenated (TwitterURLCorpus)

    REQUIRED = ("type",)

    def check(self, path: Path, where: str) -> None:
        self._one_of("type", MTEB_TYPES, path, where)
        if self.variant_of is not None and not self.data_differs:
            raise TaskError(f"{path}: {where}.variant_of needs {where}.data_differs (how this data differs from MTEB's)")


@dataclass
class Split:
    texts: list[str]
    labels: np.ndarray  # int64 class ids, or float64 scores
    texts_pair: list[str] | None = None
    groups: np.ndarray | None = None  # e.g. the question id of reranking candidates

    def __len__(self) -> int:
        return len(self.texts)


@dataclass
class BeirSplit:
    """A retrieval split: documents {id: (title, text)}, queries {id: text}, qrels {query id: {doc id: relevance}}."""

    corpus: dict[str, tuple[str, str]]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]


@dataclass
class Task:
    name: str
    family: str
    input: str
    target: str
    metrics: list[str]
    data: DataSpec
    splits: dict
    columns: ColumnsSpec
    source_file: Path
    labels: list | dict | str | None = None
    score_range: list[float] | None = None
    train_split: str | None = "train"
    eval_split: str | list[str] = "validation"
    holdout: HoldoutSpec | None = None
    probes: list[str] | None = None
    drop_empty_text: bool = False
    description: str = ""
    notes: str = ""
    mteb: MtebSpec | None = None
    reference_scores: dict = field(default_factory=dict)
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def is_pair(self) -> bool:
        return self.input == "pair"

    @property
    def is_regression(self) -> bool:
        return self.target == "score"

    @property
    def eval_splits(self) -> list[str]:
        return [self.eval_split] if isinstance(self.eval_split, str) else list(self.eval_split)

    @property
    def main_metric(self) -> str:
        return self.metrics[0]

    @property
    def default_probes(self) -> list[str]:
        if self.probes is not None:  # an explicit list, possibly empty (MTEB-only tasks)
            return list(self.probes)
        probes = []
        if self.train_split or self.holdout:
            probes += ["linear", "knn"]
        if self.family == "sts":
            probes.append("cosine")
        return probes

    # -- loading -----------------------------------------------------------------------------------

    def load_split(self, split: str, root: str | os.PathLike | None = None) -> Split:
        """`root` is the data root the caller resolved (None: `data_root()`'s default); it is passed on
        explicitly, never remembered, so one process can read two data roots."""
        folder = _resolved_root(root)
        key = (split, str(folder))
        if key not in self._cache:
            self._cache[key] = self._load_split(split, folder)
        return self._cache[key]

    def _load_split(self, split: str, root: Path | None) -> Split:
        if self.holdout and split in (self.holdout.train, self.holdout.test):
            return self._holdout_split(split, root)
        if split not in self.splits:
            raise TaskError(f"{self.source_file}: task {self.name} has no split {split!r} (splits: {', '.join(self.splits)})")
        if self.data.format == "beir" and not (self.data.hub and os.environ.get("CROSSBERT_ONLINE") == "1"):
            return self._beir_pairs(split, root)
        paths = self._present_paths(split, root)
        if paths is None:
            return self._load_hub_split(split)
        rows = []
        for entry in self._split_entries(split):
            rows.extend(self._entry_rows(entry, root))
        return self._to_split(rows, split, ", ".join(str(p) for p in paths), root)

    def _split_entries(self, split: str) -> list:
        """The split's files: names under data.local, or SplitFileSpec entries."""
        entries = self.splits[split]
        return list(entries) if isinstance(entries, list) else [entries]

    def _entry_paths(self, entry, root: Path) -> list[Path]:
        if isinstance(entry, SplitFileSpec):
            return [root / (entry.folder or self.data.local) / f for f in entry.files]
        return [root / self.data.local / entry]

    def _present_paths(self, split: str, root: Path | None, extra: list[str] = ()) -> list[Path] | None:
        """Every file the split reads (plus `extra` files under data.local), or TaskDataMissing naming the
        missing ones; None when they are missing but the hub may be read instead (CROSSBERT_ONLINE=1)."""
        local = self.data.local
        paths = []
        if root is not None and local is not None:
            paths = [p for entry in self._split_entries(split) for p in self._entry_paths(entry, root)]
            paths += [root / local / f for f in extra]
        missing = [p for p in paths if not _is_file(p)]
        if paths and not missing:
            return paths
        if self.data.hub and os.environ.get("CROSSBERT_ONLINE") == "1":
            return None
        where = ", ".join(str(p) for p in (missing or paths)) or f"{local} under the data root"
        hub = self.data.hub
        hint = f"; online users can set CROSSBERT_ONLINE=1 to read the hub dataset {hub.path}" if hub else ""
        raise TaskDataMissing(
            f"task {self.name} ({self.source_file.name}): data for split {split!r} not found; looked for {where} "
            f"(see MANIFEST.md of the data root){hint}"
        )

    def _entry_rows(self, entry, root: Path) -> list[tuple[int, dict]]:
        if not isinstance(entry, SplitFileSpec):
            return self._read_rows(root / self.data.local / entry)
        paths = self._entry_paths(entry, root)
        fields = entry.fields or self.data.fields
        if entry.paste:
            rows = self._pasted_rows(paths, fields)
        else:
            rows = self._read_rows(paths[0], fields=fields, optional=entry.optional_fields or self.data.optional_fields)
        if entry.select:
            unknown = [k for k in entry.select if rows and k not in rows[0][1]]
            if unknown:
                raise TaskError(f"{paths[0]}: select field {unknown[0]!r} is not a field of this file ({', '.join(rows[0][1])})")
            rows = [(n, r) for n, r in rows if all(str(r.get(k)) == str(v) for k, v in entry.select.items())]
            if not rows:
                raise TaskError(f"{paths[0]}: no row has {entry.select} (select of {self.source_file.name})")
        return rows

    def _pasted_rows(self, paths: list[Path], fields: list | None) -> list[tuple[int, dict]]:
        """Files read side by side: line i of every file makes example i, their fields joined in order."""
        columns = [_lines(_read_text(p, self.data.encoding)) for p in paths]
        for path, lines in zip(paths[1:], columns[1:]):
            if len(lines) != len(columns[0]):
                raise TaskError(
                    f"{path}: {len(lines)} lines, but {paths[0]} has {len(columns[0])}; pasted files need one line per example"
                )
        delimiter = self.data.get("delimiter", "\t" if self.data.format == "tsv" else ",")
        rows = []
        for lineno, parts in enumerate(zip(*columns), 1):
            if not any(part.strip() for part in parts):
                continue
            record = [value for part in parts for value in part.split(delimiter)]
            if fields is None or len(record) != len(fields):
                expected = f"{len(fields)} fields ({', '.join(fields)})" if fields else "`fields` for pasted files"
                raise TaskError(f"{', '.join(map(str, paths))}: line {lineno}: expected {expected}, got {len(record)}")
            rows.append((lineno, dict(zip(fields, record))))
        return rows

    # -- BEIR retrieval sets -----------------------------------------------------------------------

    def load_beir(self, split: str, root: str | os.PathLike | None = None) -> "BeirSplit":
        """Corpus, the split's queries (those with judgements, as BEIR and MTEB keep them) and qrels."""
        if self.data.format != "beir":
            raise TaskError(
                f"{self.source_file}: task {self.name} is not a retrieval task (data.format is {self.data.format}, not beir)"
            )
        if split not in self.splits:
            raise TaskError(f"{self.source_file}: task {self.name} has no split {split!r} (splits: {', '.join(self.splits)})")
        folder = _resolved_root(root)
        key = ("beir", split, str(folder))
        if key not in self._cache:
            self._cache[key] = self._read_beir(split, folder)
        return self._cache[key]

    def _read_beir(self, split: str, root: Path | None) -> "BeirSplit":
        self._present_paths(split, root, extra=[self.data.corpus, self.data.queries])
        folder = root / self.data.local
        documents = self._beir_records(folder / self.data.corpus, ("_id", "text"))
        corpus = {str(r["_id"]): (str(r.get("title") or ""), str(r["text"])) for _, r in documents}
        all_queries = {str(r["_id"]): str(r["text"]) for _, r in self._beir_records(folder / self.data.queries, ("_id", "text"))}
        qrels_path = self._entry_paths(self._split_entries(split)[0], root)[0]
        qrels: dict[str, dict[str, int]] = {}
        for lineno, row in self._read_rows(qrels_path, fmt="tsv"):
            try:
                qid, did, score = str(row["query-id"]), str(row["corpus-id"]), int(row["score"])
            except KeyError as e:
                raise TaskError(
                    f"{qrels_path}:{lineno}: no column {e.args[0]!r} (BEIR qrels: query-id, corpus-id, score)"
                ) from None
            except ValueError:
                raise TaskError(f"{qrels_path}:{lineno}: score {row['score']!r} is not an integer") from None
            if qid not in all_queries:
                raise TaskError(f"{qrels_path}:{lineno}: query-id {qid!r} is not in {folder / self.data.queries}")
            if did not in corpus:
                raise TaskError(f"{qrels_path}:{lineno}: corpus-id {did!r} is not in {folder / self.data.corpus}")
            qrels.setdefault(qid, {})[did] = score
        if not qrels:
            raise TaskError(f"{qrels_path}: split {split!r} of task {self.name} has no relevance judgements")
        return BeirSplit(corpus=corpus, queries={q: all_queries[q] for q in qrels}, qrels=qrels)

    def _beir_records(self, path: Path, required: tuple[str, ...]) -> list[tuple[int, dict]]:
        rows = self._read_rows(path, fmt="jsonl")
        for lineno, row in rows:
            absent = [k for k in required if k not in row]
            if absent:
                raise TaskError(f"{path}:{lineno}: no field {absent[0]!r} (BEIR jsonl: {', '.join(required)})")
        return rows

    def _beir_pairs(self, split: str, root: Path | None) -> Split:
        """The judged (query, document) pairs of a split, relevance as the label."""
        beir = self._read_beir(split, root)
        triples = [(q, d, score) for q, docs in beir.qrels.items() for d, score in docs.items()]
        return Split(
            texts=[beir.queries[q] for q, _, _ in triples],
            texts_pair=[" ".join(part for part in beir.corpus[d] if part) for _, d, _ in triples],
            labels=np.asarray([score for _, _, score in triples], dtype=np.float64 if self.is_regression else np.int64),
            groups=np.asarray([q for q, _, _ in triples]),
        )

    def _holdout_split(self, split: str, root) -> Split:
        """A deterministic split of a source split (e.g. QNLI, whose only labelled file is dev). With
        `group: text` all pairs sharing a first text (QNLI: the question) land on the same side, so a
        probe never meets a test question it was trained on."""
        h = self.holdout
        source = self.load_split(h.source, root)
        rng = np.random.default_rng(h.seed)
        if h.group == "text":
            groups = list(dict.fromkeys(source.texts))
            test_groups = set(rng.permutation(groups)[: int(round(len(groups) * h.test_fraction))])
            in_test = np.array([t in test_groups for t in source.texts])
        else:
            in_test = np.zeros(len(source), dtype=bool)
            in_test[rng.permutation(len(source))[: int(round(len(source) * h.test_fraction))]] = True
        idx = np.flatnonzero(in_test if split == h.test else ~in_test)
        return Split(
            texts=[source.texts[i] for i in idx],
            labels=source.labels[idx],
            texts_pair=[source.texts_pair[i] for i in idx] if source.texts_pair is not None else None,
        )

    def _read_rows(
        self, path: Path, fmt: str | None = None, fields: list | None = None, optional: list | None = None
    ) -> list[tuple[int, dict]]:
        """Rows of one file as (line number, {field: value}); `fmt`, `fields` and `optional` override the
        task's data.format / data.fields / data.optional_fields for this file."""
        fmt = fmt or self.data.format
        text = _read_text(path, self.data.encoding)
        if fmt == "jsonl":
            rows = []
            # "\n" only: str.splitlines() also breaks at U+2028, U+0085 and others, which JSON strings
            # may hold unescaped (IMDB reviews do)
            for lineno, line in enumerate(text.split("\n"), 1):
                if line.strip():
                    try:
                        rows.append((lineno, json.loads(line)))
                    except json.JSONDecodeError as e:
                        raise TaskError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            return rows
        if fmt == "label_first":  # "label text ..." (SentEval's TREC files)
            rows = []
            for lineno, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    label, _, sentence = line.strip().partition(" ")
                    if not sentence:
                        raise TaskError(f"{path}:{lineno}: expected '<label> <text>', got {line!r}")
                    rows.append((lineno, {"label": label, "text": sentence}))
            return rows
        delimiter = self.data.get("delimiter", "\t" if fmt == "tsv" else ",")
        # GLUE / STS TSVs contain bare quotes: read them with quoting disabled (MANIFEST.md).
        quoting = csv.QUOTE_NONE if self.data.get("quoting", "none" if fmt == "tsv" else "minimal") == "none" else csv.QUOTE_MINIMAL
        reader = csv.reader(io.StringIO(text), delimiter=delimiter, quoting=quoting)
        header = self.data.header
        fields = list(fields if fields is not None else self.data.fields or [])
        optional = list(optional if optional is not None else self.data.optional_fields or [])
        rows = []
        for lineno, record in _csv_records(reader, path, fmt):
            if not record or (len(record) == 1 and not record[0].strip()):
                continue
            if header and not fields:
                fields = [f.strip() for f in record]
                continue
            if header and lineno == 1:
                continue
            if not fields:
                raise TaskError(f"{path}: a file without a header line needs data.fields (or its split entry's fields)")
            if not (len(fields) <= len(record) <= len(fields) + len(optional)):
                expected = f"{len(fields)}" + (f" to {len(fields) + len(optional)}" if optional else "")
                raise TaskError(
                    f"{path}:{lineno}: expected {expected} {fmt.upper()} fields ({', '.join(fields)}), got {len(record)}"
                )
            rows.append((lineno, dict(zip(fields + optional, record))))
        return rows

    def _to_split(self, rows: list[tuple[int, dict]], split: str, where: str, root: Path | None) -> Split:
        cols = self.columns
        needed = [cols["text"]] + ([cols["text_pair"]] if self.is_pair else []) + [cols["label"]]
        texts, pairs, labels, groups = [], [], [], []
        for lineno, row in rows:
            absent = [c for c in needed if c not in row]
            if absent:
                raise TaskError(f"{where}:{lineno}: no column {absent[0]!r} (columns present: {list(row)})")
            raw_label = row[cols["label"]]
            if isinstance(raw_label, str):
                raw_label = raw_label.strip()
            if raw_label in ("", None):
                if self.data.drop_unlabelled:
                    continue
                raise TaskError(f"{where}:{lineno}: empty label in column {cols['label']!r} (set data.drop_unlabelled for unscored pairs)")
            if self.data.drop_labels and str(raw_label) in {str(v) for v in self.data.drop_labels}:
                continue
            if cols.label_before is not None:
                raw_label = str(raw_label).split(cols.label_before, 1)[0]
            text = str(row[cols["text"]]).strip()
            pair = str(row[cols["text_pair"]]).strip() if self.is_pair else None
            if not text or (self.is_pair and not pair):
                if self.drop_empty_text:
                    continue
                raise TaskError(f"{where}:{lineno}: empty text in column {cols['text'] if not text else cols['text_pair']!r}")
            texts.append(text)
            if self.is_pair:
                pairs.append(pair)
            labels.append(self._label(raw_label, where, lineno, root))
            if cols.group is not None:
                groups.append(row[cols["group"]])
        if not texts:
            raise TaskError(f"{where}: split {split!r} of task {self.name} is empty")
        return Split(
            texts=texts,
            labels=np.asarray(labels, dtype=np.float64 if self.is_regression else np.int64),
            texts_pair=pairs if self.is_pair else None,
            groups=np.asarray(groups) if groups else None,
        )

    def label_mapping(self, root: str | os.PathLike | None = None) -> dict[str, int] | None:
        """Raw label -> class id. `labels: infer` reads the train labels under `root` (so the mapping is
        memoised per data root)."""
        if self.is_regression:
            return None
        key = ("mapping", str(_resolved_root(root)) if self.labels == "infer" else None)
        if key not in self._cache:
            spec = self.labels
            if spec == "infer":
                values = sorted({str(v) for v in self._raw_train_labels(root)})
                mapping = {v: i for i, v in enumerate(values)}
            elif isinstance(spec, dict):
                mapping = {str(k): int(v) for k, v in spec.items()}
            elif isinstance(spec, list):
                mapping = {str(v): i for i, v in enumerate(spec)}
            else:
                raise TaskError(f"{self.source_file}: a class task needs `labels` (a list, a mapping, or infer)")
            self._cache[key] = mapping
        return self._cache[key]

    def class_count(self, root: str | os.PathLike | None = None) -> int:
        return len(set(self.label_mapping(root).values()))

    @property
    def num_classes(self) -> int:
        """Classes under the default data root; callers with a root of their own use class_count(root)."""
        return self.class_count()

    def _raw_train_labels(self, root: str | os.PathLike | None) -> list:
        """Raw label values of the train split (of every split when the task has none)."""
        names = [self.train_split] if self.train_split in self.splits else list(self.splits)
        folder = _resolved_root(root)
        if folder is None or self.data.local is None:
            raise TaskDataMissing(
                f"task {self.name} ({self.source_file.name}): `labels: infer` needs the data root to read the train labels"
            )
        out = []
        dropped = {str(v) for v in self.data.drop_labels or []}
        for name in names:
            for entry in self._split_entries(name):
                for _, r in self._entry_rows(entry, folder):
                    value = str(r[self.columns["label"]]).strip()
                    if value in dropped or (value == "" and self.data.drop_unlabelled):
                        continue
                    out.append(value.split(self.columns.label_before, 1)[0] if self.columns.label_before else value)
        return out

    def _label(self, raw, where: str, lineno: int, root: Path | None):
        if self.is_regression:
            try:
                value = float(raw)
            except (TypeError, ValueError):
                raise TaskError(f"{where}:{lineno}: label {raw!r} in column {self.columns['label']!r} is not a number") from None
            if self.score_range and not (self.score_range[0] <= value <= self.score_range[1]):
                raise TaskError(f"{where}:{lineno}: score {value} outside the declared range {self.score_range}")
            return value
        mapping = self.label_mapping(root)
        key = str(raw)
        if key not in mapping:
            raise TaskError(
                f"{where}:{lineno}: label {raw!r} in column {self.columns['label']!r} is not in the task's label mapping "
                f"({', '.join(list(mapping)[:12])}{', ...' if len(mapping) > 12 else ''})"
            )
        return mapping[key]

    def _load_hub_split(self, split: str) -> Split:
        import datasets

        hub = self.data.hub
        hub_split = (hub.splits or {}).get(split, split)
        ds = datasets.load_dataset(hub.path, hub.name, split=hub_split, revision=hub.revision)
        rows = [(i + 1, dict(r)) for i, r in enumerate(ds)]
        cols = hub.columns
        if cols:  # the hub copy may name columns differently
            rows = [(i, {**r, **{ours: r[theirs] for ours, theirs in cols.items()}}) for i, r in rows]
        return self._to_split(rows, split, f"hub:{hub.path}", None)


def _csv_records(reader, path: Path, fmt: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of a csv reader; a line the csv module refuses (a field over its size limit, an
    unclosed quote running on) is a TaskError naming it."""
    while True:
        try:
            record = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise TaskError(f"{path}:{reader.line_num}: not a valid {fmt.upper()} line ({e}); check the file, "
                            "data.delimiter and data.quoting") from None  # fmt: skip
        yield reader.line_num, record


def _resolved_root(root: str | os.PathLike | None) -> Path | None:
    """The data root for `root`. A root that was given but is missing is the resolver's error; with
    none given and none found, None: the data is then reported missing (or read from the hub)."""
    try:
        return data_root(root)
    except FileNotFoundError:
        if root is not None:
            raise
        return None


def _lines(text: str) -> list[str]:
    """Lines split at "\n" only (text from _read_text has no "\r"), without the empty one after a final newline."""
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def _zip_member(path: Path) -> tuple[Path, str] | None:
    """(archive, member name) when `path` runs through a zip archive (`archive.zip/dir/file.txt`)."""
    for parent in path.parents:
        if parent.suffix == ".zip" and parent.is_file():
            return parent, path.relative_to(parent).as_posix()
    return None


def _is_file(path: Path) -> bool:
    if path.is_file():
        return True
    member = _zip_member(path)
    if member is None:
        return False
    with zipfile.ZipFile(member[0]) as archive:
        return member[1] in archive.namelist()


def _read_text(path: Path, encoding: str) -> str:
    """Whole file as text with line ends normalised (SICK has CRLF). The default utf-8-sig drops the
    BOM that MRPC's dev.tsv starts with. A path through a zip archive reads the member in place."""
    try:
        member = None if path.is_file() else _zip_member(path)
        if member is not None:
            with zipfile.ZipFile(member[0]) as archive:
                text = archive.read(member[1]).decode(encoding)
        else:
            opener = lzma.open if path.name.endswith(".xz") else gzip.open if path.name.endswith(".gz") else open
            with opener(path, "rt", encoding=encoding, newline="") as f:
                text = f.read()
    except UnicodeDecodeError as e:
        raise TaskError(f"{path}: not valid {encoding} at byte {e.start} (set data.encoding in the task file)") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


# ------------------------------------------------------------------------------------------------
# The registry: every *.yaml under tasks/ (or $CROSSBERT_TASKS_DIR)
# ------------------------------------------------------------------------------------------------

REQUIRED = ("name", "family", "input", "target", "metrics", "data", "splits", "columns")


def tasks_dir() -> Path:
    return Path(os.environ.get(TASKS_DIR_ENV, PROJECT_ROOT / "tasks"))


def parse_task_file(path: Path) -> Task:
    spec = _read_task_yaml(path)
    missing = [k for k in REQUIRED if k not in spec]
    if missing:
        raise TaskError(f"{path}: missing field(s) {', '.join(missing)}")
    known = {f for f in Task.__dataclass_fields__ if not f.startswith("_")} - {"source_file"}
    unknown = set(spec) - known
    if unknown:
        raise TaskError(f"{path}: unknown field(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(known))}")
    if spec["family"] not in FAMILIES:
        raise TaskError(f"{path}: family must be one of {', '.join(FAMILIES)}, got {spec['family']!r}")
    if spec["input"] not in ("single", "pair"):
        raise TaskError(f"{path}: input must be 'single' or 'pair', got {spec['input']!r}")
    if spec["target"] not in ("class", "score"):
        raise TaskError(f"{path}: target must be 'class' or 'score', got {spec['target']!r}")
    if not isinstance(spec["splits"], dict) or not spec["splits"]:
        raise TaskError(f"{path}: splits must map split names to files, got {spec['splits']!r}")
    spec["splits"] = {name: _parse_split_files(files, path, name) for name, files in spec["splits"].items()}
    given = [key for key in SECTIONS if spec.get(key) is not None or key in REQUIRED]  # data: null is an error
    typed = {key: SECTIONS[key].parse(spec[key], path, key) for key in given}
    if spec["input"] == "pair" and typed["columns"].text_pair is None:
        raise TaskError(f"{path}: a pair task needs columns.text_pair")
    if spec["target"] == "class" and "labels" not in spec:
        raise TaskError(f"{path}: a class task needs `labels` (a list, a mapping, or infer); without labels it cannot be probed")
    task = Task(**{**spec, **typed}, source_file=path)
    _check_inside_root(task)
    _check_train_apart(task)
    return task


def _check_inside_root(task: Task) -> None:
    """Every file a task reads lies under the data root: no absolute path, no way out with '..'."""
    local = task.data.local or ""
    reads = [("data.local", [local])]
    reads += [(f"data.{key}", [local, task.data.get(key)]) for key in ("corpus", "queries") if task.data.get(key)]
    for where, parts in reads + _split_parts(task):
        if _leaves_root(parts):
            raise TaskError(f"{task.source_file}: {where} reads {os.path.join(*parts)!r}, outside the data root "
                            "(an absolute path or '..'); task data must lie under the data root (--data-root)")  # fmt: skip


def _split_parts(task: Task) -> list[tuple[str, list[str]]]:
    """(splits.NAME, path parts under the data root) of every file of every split."""
    out = []
    for split, entries in task.splits.items():
        for entry in entries:
            if isinstance(entry, SplitFileSpec):
                out += [(f"splits.{split}", [entry.folder or task.data.local or "", f]) for f in entry.files]
            else:
                out.append((f"splits.{split}", [task.data.local or "", entry]))
    return out


def _leaves_root(parts: list[str]) -> bool:
    joined = os.path.normpath(os.path.join(*parts))
    return os.path.isabs(joined) or joined == ".." or joined.startswith("../")


def _check_train_apart(task: Task) -> None:
    """A probe trained on its evaluation data scores what it memorised: a task whose training split reads a
    file (with the same row selection) that an evaluation split reads is refused."""
    if task.train_split not in task.splits:  # none, or a holdout split (Task._holdout_split keeps its sides apart)
        return
    train = _split_sources(task, task.train_split)
    for split in task.eval_splits:
        shared = train & _split_sources(task, split) if split in task.splits else set()
        if split == task.train_split or shared:
            files = ", ".join(sorted(f for source in shared for f in source[0])) or f"split {split!r}"
            raise TaskError(f"{task.source_file}: the training split {task.train_split!r} and the evaluation split {split!r} "
                            f"read the same data ({files}); a probe must be evaluated on data it was not trained on")  # fmt: skip


def _split_sources(task: Task, split: str) -> set[tuple]:
    """What each entry of a split reads: (its files, normalised, and its row selection)."""
    sources = set()
    for entry in task.splits[split]:
        if isinstance(entry, SplitFileSpec):
            files = tuple(os.path.normpath(os.path.join(entry.folder or task.data.local or "", f)) for f in entry.files)
            sources.add((files, tuple(sorted((str(k), str(v)) for k, v in (entry.select or {}).items()))))
        else:
            sources.add(((os.path.normpath(os.path.join(task.data.local or "", entry)),), ()))
    return sources


SECTIONS = {"data": DataSpec, "columns": ColumnsSpec, "holdout": HoldoutSpec, "mteb": MtebSpec}


def _parse_split_files(files, path: Path, split: str) -> list:
    """A split's value as a list of file names and SplitFileSpec entries."""
    entries = files if isinstance(files, list) else [files]
    if not entries:
        raise TaskError(f"{path}: splits.{split} lists no file")
    out = []
    for i, entry in enumerate(entries):
        if isinstance(entry, dict):
            out.append(SplitFileSpec.parse(entry, path, f"splits.{split}" + (f"[{i}]" if isinstance(files, list) else "")))
        elif isinstance(entry, str) and entry.strip():
            out.append(entry)
        else:
            raise TaskError(f"{path}: splits.{split} entries must be file names or mappings (file/paste, ...), got {entry!r}")
    return out


def _read_task_yaml(path: Path) -> dict:
    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise TaskError(f"{where}: not valid YAML ({getattr(e, 'problem', None) or type(e).__name__})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"{path}: cannot read the task file ({e})") from None
    if not isinstance(spec, dict):
        raise TaskError(f"{path}: expected a mapping of task fields, got {type(spec).__name__}")
    return spec


@dataclass
class BrokenTask:
    """A task file that does not parse: kept with its error, raised only when the task is asked for."""

    name: str  # the file's `name:` when readable, else the file stem
    family: str | None  # the file's family, else its folder's when that is a family
    source_file: Path
    error: TaskError


@dataclass
class Registry:
    tasks: dict[str, Task]
    broken: dict[str, BrokenTask]


def _broken(path: Path, error: TaskError) -> BrokenTask:
    """Name and family for lookups, from whatever part of the file still reads."""
    try:
        spec = yaml.safe_load(path.read_text())
    except Exception:  # any unreadable file: fall back on the path alone
        spec = None
    spec = spec if isinstance(spec, dict) else {}
    name = spec.get("name") if isinstance(spec.get("name"), str) else path.stem
    family = spec.get("family") if spec.get("family") in FAMILIES else path.parent.name if path.parent.name in FAMILIES else None
    return BrokenTask(name, family, path, error)


@lru_cache(maxsize=4)
def _registry(directory: str) -> Registry:
    tasks: dict[str, Task] = {}
    broken: dict[str, BrokenTask] = {}
    for path in sorted(Path(directory).glob("**/*.yaml")):
        if path.name.startswith("_"):
            continue
        try:
            task = parse_task_file(path)
        except TaskError as e:  # one bad file must not stop commands about other tasks
            bad = _broken(path, e)
            broken[bad.name if bad.name not in broken else str(path)] = bad
            continue
        if task.name in tasks or task.name in broken:
            first = tasks.pop(task.name, None)
            other = first.source_file if first else broken[task.name].source_file
            error = TaskError(f"{path}: task name {task.name!r} is also defined in {other}")
            broken[task.name] = BrokenTask(task.name, task.family, path, error)  # ambiguous: neither file is used
            continue
        tasks[task.name] = task
    return Registry(tasks, broken)


def all_tasks() -> dict[str, Task]:
    """Every task whose file parses; see broken_tasks() for the others."""
    return _registry(str(tasks_dir())).tasks


def broken_tasks() -> dict[str, str]:
    """{task name (or file path when the name is taken): the one-line error of its file}."""
    return {name: str(bad.error) for name, bad in _registry(str(tasks_dir())).broken.items()}


def _raise_broken(bad: list[BrokenTask]) -> None:
    if len(bad) == 1:
        raise type(bad[0].error)(str(bad[0].error))
    raise TaskError(f"{len(bad)} broken task files: " + " | ".join(str(b.error) for b in bad))


def get_task(name: str) -> Task:
    registry = _registry(str(tasks_dir()))
    tasks = registry.tasks
    folded = {k.lower(): k for k in tasks}
    if name.lower() in folded:
        return tasks[folded[name.lower()]]
    bad = [b for b in registry.broken.values() if b.name.lower() == name.lower()]
    if bad:
        _raise_broken(bad)
    known = sorted(tasks) + [f"{b.name} (broken)" for b in registry.broken.values()]
    raise TaskError(f"unknown task {name!r}; known tasks ({tasks_dir()}): {', '.join(known)}")


def resolve_tasks(spec: str | list[str]) -> list[Task]:
    """'SST-2,STS-B', a family name ('glue'), or 'all'. A broken task file in what is asked for stops
    here, with its file's error; broken files elsewhere are no concern of this command."""
    registry = _registry(str(tasks_dir()))
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[Task] = []
    for name in (n.strip() for n in names if n.strip()):
        if name in ("all", *FAMILIES):
            bad = [b for b in registry.broken.values() if name == "all" or b.family in (name, None)]
            if bad:
                _raise_broken(bad)
            out.extend(t for t in registry.tasks.values() if name == "all" or t.family == name)
        else:
            out.append(get_task(name))
    seen, unique = set(), []
    for t in out:
        if t.name not in seen:
            seen.add(t.name)
            unique.append(t)
    return unique


def task_listing(root: str | os.PathLike | None = None) -> tuple[list[str], dict[str, str]]:
    """(lines of `crossbert tasks`, broken_tasks()): one line per task with its split sizes under
    `root`, then one BROKEN line per task file that does not parse (with its error), so one bad file
    hides nothing else; the caller decides the exit code from the broken ones."""
    registry = _registry(str(tasks_dir()))
    lines = []
    for name, task in sorted(registry.tasks.items(), key=lambda kv: (kv[1].family, kv[0])):
        sizes = []
        for split in task.splits:
            try:
                sizes.append(f"{split}={len(task.load_split(split, root)):,}")
            except TaskDataMissing:
                sizes.append(f"{split}: MISSING")
            except TaskError as e:
                sizes.append(f"{split}: ERROR {e}")
        lines.append(f"{task.family:15} {name:40} {task.input:6} {','.join(task.default_probes):18} {' '.join(sizes)}")
    for name, bad in sorted(registry.broken.items()):
        lines.append(f"{'BROKEN':15} {name:40} {bad.error}")
    return lines, {name: str(bad.error) for name, bad in registry.broken.items()}
