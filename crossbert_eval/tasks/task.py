"""A task: its file's TaskSpec (schema.py) and the reading of its splits into texts and labels.

Reading is strict: TSV rows with the wrong number of fields, empty splits, unknown labels and missing
files stop with a message naming the file, the line or field, and what was expected. Rows come from the
reader registered for data.format (formats.py).

`format: beir` reads a retrieval set in the BEIR layout (data.corpus, data.queries, one qrels file per
split): `load_beir(split, root)` gives corpus, queries and relevance judgements; `load_split` gives the
judged (query, document) pairs, so that `crossbert tasks` can count them.

The data root is always an argument (`load_split(split, root)`); no task remembers one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from crossbert_model.utils import data_root, online

from .errors import TaskDataMissing, TaskError
from .formats import BEIR, ReadOptions, Row, delimiter_for, is_file, read_rows, read_text, text_lines
from .schema import SplitFileSpec, TaskSpec


@dataclass
class Split:
    texts: list[str]
    labels: np.ndarray  # int64 class ids, or float64 scores
    texts_pair: list[str] | None = None
    groups: np.ndarray | None = None  # e.g. the question id of reranking candidates

    def __len__(self) -> int:
        return len(self.texts)

    def subsample(self, n: int | None, seed: int) -> "Split":
        """A seeded sample of n examples in their original order (the whole split when n is None or not smaller): the
        cap of a probe's training split (max_train) and of an evaluation split (max_eval: probes, geometry and baselines
        draw it at one seed, so they score the same texts), drawn the same way wherever a split is capped."""
        if not n or len(self) <= n:
            return self
        idx = np.sort(np.random.default_rng(seed).choice(len(self), n, replace=False))
        return Split(
            texts=[self.texts[i] for i in idx],
            labels=self.labels[idx],
            texts_pair=[self.texts_pair[i] for i in idx] if self.texts_pair is not None else None,
            groups=self.groups[idx] if self.groups is not None else None,
        )


@dataclass
class BeirSplit:
    """A retrieval split: documents {id: (title, text)}, queries {id: text}, qrels {query id: {doc id: relevance}}."""

    corpus: dict[str, tuple[str, str]]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]


@dataclass
class Task(TaskSpec):
    source_file: Path = field(kw_only=True)
    _cache: dict = field(default_factory=dict, repr=False, kw_only=True)

    @property
    def is_pair(self) -> bool:
        return self.input == "pair"

    @property
    def is_regression(self) -> bool:
        return self.target == "score"

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

    def count_split(self, split: str, root: str | os.PathLike | None = None) -> int:
        """len(load_split(split, root)), without reading the texts where one non-blank line of the split's files
        is one example (tsv without quoting, jsonl, label_first; no filters, holdouts, pastes or selects): then the
        lines are counted (`crossbert tasks`: 2 s instead of 19). Other splits are read as load_split reads them.
        Counted lines are not checked: a malformed line shows when the split is read."""
        folder = _resolved_root(root)
        if (split, str(folder)) in self._cache or not self._lines_are_examples(split):
            return len(self.load_split(split, folder))
        paths = self._present_paths(split, folder)
        if paths is None:  # the hub's copy: only reading it counts it
            return len(self.load_split(split, folder))
        header = 1 if self.data.header and self.data.format == "tsv" else 0
        return sum(max(0, _nonblank_lines(read_text(p, self.data.encoding), self.data.format) - header) for p in paths)

    def _lines_are_examples(self, split: str) -> bool:
        data = self.data
        plain_entries = all(
            not isinstance(e, SplitFileSpec) or (e.paste is None and e.select is None) for e in self._split_entries(split)
        )
        unfiltered = not (data.drop_unlabelled or data.drop_labels or self.drop_empty_text)
        unquoted = data.format != "tsv" or (data.quoting or "none") == "none"
        holdout = bool(self.holdout and split in (self.holdout.train, self.holdout.test))
        return data.format in LINE_FORMATS and unquoted and unfiltered and plain_entries and not holdout and split in self.splits

    def _load_split(self, split: str, root: Path | None) -> Split:
        if self.holdout and split in (self.holdout.train, self.holdout.test):
            return self._holdout_split(split, root)
        if split not in self.splits:
            raise TaskError(f"{self.source_file}: task {self.name} has no split {split!r} (splits: {', '.join(self.splits)})")
        if self.data.format == BEIR and not (self.data.hub and online()):
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
        missing = [p for p in paths if not is_file(p)]
        if paths and not missing:
            return paths
        if self.data.hub and online():
            return None
        where = ", ".join(str(p) for p in (missing or paths)) or f"{local} under the data root"
        hub = self.data.hub
        hint = f"; online users can set CROSSBERT_ONLINE=1 to read the hub dataset {hub.path}" if hub else ""
        raise TaskDataMissing(
            f"task {self.name} ({self.source_file.name}): data for split {split!r} not found; looked for {where} "
            f"(see MANIFEST.md of the data root){hint}"
        )

    def _entry_rows(self, entry, root: Path) -> list[Row]:
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

    def _pasted_rows(self, paths: list[Path], fields: list | None) -> list[Row]:
        """Files read side by side: line i of every file makes example i, their fields joined in order."""
        columns = [text_lines(read_text(p, self.data.encoding)) for p in paths]
        for path, lines in zip(paths[1:], columns[1:]):
            if len(lines) != len(columns[0]):
                raise TaskError(
                    f"{path}: {len(lines)} lines, but {paths[0]} has {len(columns[0])}; pasted files need one line per example"
                )
        delimiter = delimiter_for(self.data.format, self.data.delimiter)
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
        if self.data.format != BEIR:
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

    def _beir_records(self, path: Path, required: tuple[str, ...]) -> list[Row]:
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
    ) -> list[Row]:
        """Rows of one file by the reader registered for its format; `fmt`, `fields` and `optional` override
        the task's data.format / data.fields / data.optional_fields for this file."""
        data = self.data
        options = ReadOptions(
            format=fmt or data.format,
            header=data.header,
            delimiter=data.delimiter,
            quoting=data.quoting,
            fields=fields if fields is not None else data.fields,
            optional_fields=optional if optional is not None else data.optional_fields,
        )
        return read_rows(path, options, data.encoding)

    def _to_split(self, rows: list[Row], split: str, where: str, root: Path | None) -> Split:
        cols = self.columns
        needed = [cols.text] + ([cols.text_pair] if self.is_pair else []) + [cols.label]
        texts, pairs, labels, groups = [], [], [], []
        for lineno, row in rows:
            absent = [c for c in needed if c not in row]
            if absent:
                raise TaskError(f"{where}:{lineno}: no column {absent[0]!r} (columns present: {list(row)})")
            raw_label = row[cols.label]
            if isinstance(raw_label, str):
                raw_label = raw_label.strip()
            if raw_label in ("", None):
                if self.data.drop_unlabelled:
                    continue
                raise TaskError(
                    f"{where}:{lineno}: empty label in column {cols.label!r} (set data.drop_unlabelled for unscored pairs)"
                )
            if self.data.drop_labels and str(raw_label) in {str(v) for v in self.data.drop_labels}:
                continue
            if cols.label_before is not None:
                raw_label = str(raw_label).split(cols.label_before, 1)[0]
            text = str(row[cols.text]).strip()
            pair = str(row[cols.text_pair]).strip() if self.is_pair else None
            if not text or (self.is_pair and not pair):
                if self.drop_empty_text:
                    continue
                raise TaskError(f"{where}:{lineno}: empty text in column {cols.text if not text else cols.text_pair!r}")
            texts.append(text)
            if self.is_pair:
                pairs.append(pair)
            labels.append(self._label(raw_label, where, lineno, root))
            if cols.group is not None:
                groups.append(row[cols.group])
        if not texts:
            raise TaskError(f"{where}: split {split!r} of task {self.name} is empty")
        labels = np.asarray(labels, dtype=np.float64 if self.is_regression else np.int64)
        check_metric_defined(
            labels, self.is_regression, split == self.train_split, f"{where}: split {split!r} of task {self.name}"
        )
        return Split(
            texts=texts,
            labels=labels,
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
                    value = str(r[self.columns.label]).strip()
                    if value in dropped or (value == "" and self.data.drop_unlabelled):
                        continue
                    out.append(value.split(self.columns.label_before, 1)[0] if self.columns.label_before else value)
        return out

    def _label(self, raw, where: str, lineno: int, root: Path | None):
        if self.is_regression:
            try:
                value = float(raw)
            except (TypeError, ValueError):
                raise TaskError(f"{where}:{lineno}: label {raw!r} in column {self.columns.label!r} is not a number") from None
            if self.score_range and not (self.score_range[0] <= value <= self.score_range[1]):
                raise TaskError(f"{where}:{lineno}: score {value} outside the declared range {self.score_range}")
            return value
        mapping = self.label_mapping(root)
        key = str(raw)
        if key not in mapping:
            raise TaskError(
                f"{where}:{lineno}: label {raw!r} in column {self.columns.label!r} is not in the task's label mapping "
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


# Formats whose every non-blank line is one record (tsv read without quoting: a quote never spans lines)
LINE_FORMATS = ("tsv", "jsonl", "label_first")


def check_metric_defined(labels: np.ndarray, regression: bool, training: bool, where: str) -> None:
    """A split on which the task's probe or metric is undefined is refused when it is read, before anything is encoded:
    gold scores that are not all finite; an evaluation split whose scores are all equal (a correlation with a constant
    is undefined); a training split with one class (a probe needs two to fit)."""
    if regression and not np.isfinite(labels).all():
        raise TaskError(f"{where}: {int((~np.isfinite(labels)).sum())} gold score(s) are not finite numbers")
    values = np.unique(labels)
    if len(values) > 1:
        return
    if regression and not training:
        raise TaskError(f"{where}: every gold score is {values[0]:g}: a correlation with a constant is undefined")
    if not regression and training:
        raise TaskError(f"{where}: every example has class {int(values[0])}: a probe needs two or more classes to fit")


def _nonblank_lines(text: str, fmt: str) -> int:
    """Non-blank lines as the format's reader splits them (jsonl at "\n" only; label_first by splitlines)."""
    lines = text.splitlines() if fmt == "label_first" else text.split("\n")
    return sum(1 for line in lines if line.strip())


def _resolved_root(root: str | os.PathLike | None) -> Path | None:
    """The data root for `root`. A root that was given but is missing is the resolver's error; with
    none given and none found, None: the data is then reported missing (or read from the hub)."""
    try:
        return data_root(root)
    except FileNotFoundError:
        if root is not None:
            raise
        return None
