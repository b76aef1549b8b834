"""Declarative tasks: one YAML file per task in `tasks/`, loaded into splits of texts and labels.

A task file says what the data is, where it lies and how to read it; nothing about a task is
hard-coded here. Adding a task = adding a file. Schema (see tasks/README.md for every key):

    name: SST-2
    family: glue                   # glue | senteval | sts | classification | clustering | reranking
    input: single                  # single | pair
    target: class                  # class | score
    metrics: [accuracy]            # the first is the main score
    data:
      local: glue/SST-2            # folder under the data root
      hub: {path: nyu-mll/glue, name: sst2}   # for users who are online
      format: tsv                  # tsv | csv | jsonl | label_first
      header: true
    splits: {train: train.tsv.xz, validation: dev.tsv}
    columns: {text: sentence, label: label}
    labels: [0, 1]                 # or {raw value: class id}, or `infer` (sorted values of train)
    train_split: train
    eval_split: validation

Reading is strict: TSV rows with the wrong number of fields, empty splits, unknown labels and missing
files stop with a message naming the file, the line or field, and what was expected.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import lzma
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import yaml

from crossbert_model.utils import PROJECT_ROOT, data_root
from crossbert_model.errors import CrossbertError

TASKS_DIR_ENV = "CROSSBERT_TASKS_DIR"
FAMILIES = ("glue", "senteval", "sts", "classification", "pair_classification", "clustering", "reranking")


class TaskError(CrossbertError, ValueError):
    """A task file or its data is wrong; the message says which file, line or field."""


class TaskDataMissing(TaskError, FileNotFoundError):
    """The task is known but its data is not in the data root (and no hub access)."""


@dataclass
class Split:
    texts: list[str]
    labels: np.ndarray  # int64 class ids, or float64 scores
    texts_pair: list[str] | None = None
    groups: np.ndarray | None = None  # e.g. the question id of reranking candidates

    def __len__(self) -> int:
        return len(self.texts)


@dataclass
class Task:
    name: str
    family: str
    input: str
    target: str
    metrics: list[str]
    data: dict
    splits: dict
    columns: dict
    source_file: Path
    labels: list | dict | str | None = None
    score_range: list[float] | None = None
    train_split: str | None = "train"
    eval_split: str | list[str] = "validation"
    holdout: dict | None = None
    probes: list[str] | None = None
    drop_empty_text: bool = False
    description: str = ""
    notes: str = ""
    mteb: dict | None = None
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
        self._cache.setdefault("root", root)
        key = (split, str(root))
        if key not in self._cache:
            self._cache[key] = self._load_split(split, root)
        return self._cache[key]

    def _load_split(self, split: str, root) -> Split:
        if self.holdout and split in (self.holdout["train"], self.holdout["test"]):
            return self._holdout_split(split, root)
        if split not in self.splits:
            raise TaskError(f"{self.source_file}: task {self.name} has no split {split!r} (splits: {', '.join(self.splits)})")
        local = self.data.get("local")
        files = self.splits[split] if isinstance(self.splits[split], list) else [self.splits[split]]
        folder = None
        try:
            folder = data_root(root) / local if local is not None else None
        except FileNotFoundError:
            pass
        paths = [folder / f for f in files] if folder else []
        missing = [p for p in paths if not p.is_file()]
        if folder is None or missing:
            if self.data.get("hub") and os.environ.get("CROSSBERT_ONLINE") == "1":
                return self._load_hub_split(split)
            where = ", ".join(str(p) for p in (missing or paths)) or f"{local} under the data root"
            hint = f"; online users can set CROSSBERT_ONLINE=1 to read the hub dataset {self.data['hub']}" if self.data.get("hub") else ""
            raise TaskDataMissing(
                f"task {self.name} ({self.source_file.name}): data for split {split!r} not found; looked for {where} "
                f"(see MANIFEST.md of the data root){hint}"
            )
        rows = []
        for path in paths:
            rows.extend(self._read_rows(path))
        return self._to_split(rows, split, ", ".join(str(p) for p in paths))

    def _holdout_split(self, split: str, root) -> Split:
        """A deterministic split of a source split (e.g. QNLI, whose only labelled file is dev). With
        `group: text` all pairs sharing a first text (QNLI: the question) land on the same side, so a
        probe never meets a test question it was trained on."""
        h = self.holdout
        source = self.load_split(h["source"], root)
        rng = np.random.default_rng(h.get("seed", 0))
        if h.get("group") == "text":
            groups = list(dict.fromkeys(source.texts))
            test_groups = set(rng.permutation(groups)[: int(round(len(groups) * h["test_fraction"]))])
            in_test = np.array([t in test_groups for t in source.texts])
        else:
            in_test = np.zeros(len(source), dtype=bool)
            in_test[rng.permutation(len(source))[: int(round(len(source) * h["test_fraction"]))]] = True
        idx = np.flatnonzero(in_test if split == h["test"] else ~in_test)
        return Split(
            texts=[source.texts[i] for i in idx],
            labels=source.labels[idx],
            texts_pair=[source.texts_pair[i] for i in idx] if source.texts_pair is not None else None,
        )

    def _read_rows(self, path: Path) -> list[tuple[int, dict]]:
        fmt = self.data.get("format", "tsv")
        text = _read_text(path, self.data.get("encoding", "utf-8-sig"))
        if fmt == "jsonl":
            rows = []
            for lineno, line in enumerate(text.splitlines(), 1):
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
        if fmt not in ("tsv", "csv"):
            raise TaskError(f"{self.source_file}: data.format must be tsv, csv, jsonl or label_first, got {fmt!r}")
        delimiter = self.data.get("delimiter", "\t" if fmt == "tsv" else ",")
        # GLUE / STS TSVs contain bare quotes: read them with quoting disabled (MANIFEST.md).
        quoting = csv.QUOTE_NONE if self.data.get("quoting", "none" if fmt == "tsv" else "minimal") == "none" else csv.QUOTE_MINIMAL
        reader = csv.reader(io.StringIO(text), delimiter=delimiter, quoting=quoting)
        header = self.data.get("header", True)
        fields = list(self.data.get("fields") or [])
        optional = list(self.data.get("optional_fields") or [])
        rows = []
        for record in reader:
            lineno = reader.line_num
            if not record or (len(record) == 1 and not record[0].strip()):
                continue
            if header and not fields:
                fields = [f.strip() for f in record]
                continue
            if header and lineno == 1:
                continue
            if not (len(fields) <= len(record) <= len(fields) + len(optional)):
                expected = f"{len(fields)}" + (f" to {len(fields) + len(optional)}" if optional else "")
                raise TaskError(
                    f"{path}:{lineno}: expected {expected} {fmt.upper()} fields ({', '.join(fields)}), got {len(record)}"
                )
            rows.append((lineno, dict(zip(fields + optional, record))))
        return rows

    def _to_split(self, rows: list[tuple[int, dict]], split: str, where: str) -> Split:
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
                if self.data.get("drop_unlabelled"):
                    continue
                raise TaskError(f"{where}:{lineno}: empty label in column {cols['label']!r} (set data.drop_unlabelled for unscored pairs)")
            text = str(row[cols["text"]]).strip()
            pair = str(row[cols["text_pair"]]).strip() if self.is_pair else None
            if not text or (self.is_pair and not pair):
                if self.drop_empty_text:
                    continue
                raise TaskError(f"{where}:{lineno}: empty text in column {cols['text'] if not text else cols['text_pair']!r}")
            texts.append(text)
            if self.is_pair:
                pairs.append(pair)
            labels.append(self._label(raw_label, where, lineno))
            if "group" in cols:
                groups.append(row[cols["group"]])
        if not texts:
            raise TaskError(f"{where}: split {split!r} of task {self.name} is empty")
        return Split(
            texts=texts,
            labels=np.asarray(labels, dtype=np.float64 if self.is_regression else np.int64),
            texts_pair=pairs if self.is_pair else None,
            groups=np.asarray(groups) if groups else None,
        )

    def label_mapping(self) -> dict[str, int] | None:
        if self.is_regression:
            return None
        if "mapping" not in self._cache:
            spec = self.labels
            if spec == "infer":
                values = sorted({str(v) for v in self._raw_train_labels()})
                mapping = {v: i for i, v in enumerate(values)}
            elif isinstance(spec, dict):
                mapping = {str(k): int(v) for k, v in spec.items()}
            elif isinstance(spec, list):
                mapping = {str(v): i for i, v in enumerate(spec)}
            else:
                raise TaskError(f"{self.source_file}: a class task needs `labels` (a list, a mapping, or infer)")
            self._cache["mapping"] = mapping
        return self._cache["mapping"]

    @property
    def num_classes(self) -> int:
        return len(set(self.label_mapping().values()))

    def _raw_train_labels(self) -> list:
        """Raw label values of the train split (of every split when the task has none)."""
        names = [self.train_split] if self.train_split in self.splits else list(self.splits)
        root = data_root(self._cache.get("root")) / self.data["local"]
        out = []
        for name in names:
            files = self.splits[name]
            for f in files if isinstance(files, list) else [files]:
                out.extend(str(r[self.columns["label"]]).strip() for _, r in self._read_rows(root / f))
        return out

    def _label(self, raw, where: str, lineno: int):
        if self.is_regression:
            try:
                value = float(raw)
            except (TypeError, ValueError):
                raise TaskError(f"{where}:{lineno}: label {raw!r} in column {self.columns['label']!r} is not a number") from None
            if self.score_range and not (self.score_range[0] <= value <= self.score_range[1]):
                raise TaskError(f"{where}:{lineno}: score {value} outside the declared range {self.score_range}")
            return value
        mapping = self.label_mapping()
        key = str(raw)
        if key not in mapping:
            raise TaskError(
                f"{where}:{lineno}: label {raw!r} in column {self.columns['label']!r} is not in the task's label mapping "
                f"({', '.join(list(mapping)[:12])}{', ...' if len(mapping) > 12 else ''})"
            )
        return mapping[key]

    def _load_hub_split(self, split: str) -> Split:
        import datasets

        hub = self.data["hub"]
        hub_split = hub.get("splits", {}).get(split, split)
        ds = datasets.load_dataset(hub["path"], hub.get("name"), split=hub_split, revision=hub.get("revision"))
        rows = [(i + 1, dict(r)) for i, r in enumerate(ds)]
        cols = hub.get("columns")
        if cols:  # the hub copy may name columns differently
            rows = [(i, {**r, **{ours: r[theirs] for ours, theirs in cols.items()}}) for i, r in rows]
        return self._to_split(rows, split, f"hub:{hub['path']}")


def _read_text(path: Path, encoding: str) -> str:
    """Whole file as text with line ends normalised (SICK has CRLF). The default utf-8-sig drops the
    BOM that MRPC's dev.tsv starts with."""
    opener = lzma.open if path.name.endswith(".xz") else gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding=encoding, newline="") as f:
            return f.read().replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError as e:
        raise TaskError(f"{path}: not valid {encoding} at byte {e.start} (set data.encoding in the task file)") from None


# ------------------------------------------------------------------------------------------------
# The registry: every *.yaml under tasks/ (or $CROSSBERT_TASKS_DIR)
# ------------------------------------------------------------------------------------------------

REQUIRED = ("name", "family", "input", "target", "metrics", "data", "splits", "columns")


def tasks_dir() -> Path:
    return Path(os.environ.get(TASKS_DIR_ENV, PROJECT_ROOT / "tasks"))


def parse_task_file(path: Path) -> Task:
    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise TaskError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(spec, dict):
        raise TaskError(f"{path}: expected a mapping of task fields")
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
    if "text" not in spec["columns"] or "label" not in spec["columns"]:
        raise TaskError(f"{path}: columns must name `text` and `label` (and `text_pair` for pair tasks)")
    if spec["input"] == "pair" and "text_pair" not in spec["columns"]:
        raise TaskError(f"{path}: a pair task needs columns.text_pair")
    if spec["target"] == "class" and "labels" not in spec:
        raise TaskError(f"{path}: a class task needs `labels` (a list, a mapping, or infer); without labels it cannot be probed")
    return Task(**spec, source_file=path)


@lru_cache(maxsize=4)
def _registry(directory: str) -> dict[str, Task]:
    tasks = {}
    for path in sorted(Path(directory).glob("**/*.yaml")):
        if path.name.startswith("_"):
            continue
        task = parse_task_file(path)
        if task.name in tasks:
            raise TaskError(f"{path}: task name {task.name!r} is also defined in {tasks[task.name].source_file}")
        tasks[task.name] = task
    return tasks


def all_tasks() -> dict[str, Task]:
    return _registry(str(tasks_dir()))


def get_task(name: str) -> Task:
    tasks = all_tasks()
    if name in tasks:
        return tasks[name]
    folded = {k.lower(): k for k in tasks}
    if name.lower() in folded:
        return tasks[folded[name.lower()]]
    raise TaskError(f"unknown task {name!r}; known tasks ({tasks_dir()}): {', '.join(sorted(tasks))}")


def resolve_tasks(spec: str | list[str]) -> list[Task]:
    """'SST-2,STS-B', a family name ('glue'), or 'all'."""
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[Task] = []
    for name in (n.strip() for n in names if n.strip()):
        if name == "all":
            out.extend(all_tasks().values())
        elif name in FAMILIES:
            out.extend(t for t in all_tasks().values() if t.family == name)
        else:
            out.append(get_task(name))
    seen, unique = set(), []
    for t in out:
        if t.name not in seen:
            seen.add(t.name)
            unique.append(t)
    return unique
