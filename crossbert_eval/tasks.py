"""Declarative tasks: one YAML file per task in `tasks/`, loaded into splits of texts and labels.

A task file says what the data is, where it lies and how to read it; nothing about a task is
hard-coded here. Adding a task = adding a file. Schema (every key of the nested sections is a field of
DataSpec, HubSpec, ColumnsSpec, HoldoutSpec or MtebSpec below; an unknown key is an error):

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
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import yaml

from crossbert_model.utils import PROJECT_ROOT, data_root
from crossbert_model.errors import CrossbertError

TASKS_DIR_ENV = "CROSSBERT_TASKS_DIR"
FORMATS = ("tsv", "csv", "jsonl", "label_first")
MTEB_TYPES = ("STS", "Classification", "Clustering", "Reranking")
FAMILIES = ("glue", "senteval", "sts", "classification", "pair_classification", "clustering", "reranking")


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

    NESTED = {"hub": HubSpec}

    def check(self, path: Path, where: str) -> None:
        self._one_of("format", FORMATS, path, where)
        self._one_of("quoting", ("none", "minimal"), path, where)
        if not isinstance(self.header, bool):
            raise TaskError(f"{path}: {where}.header must be true or false, got {self.header!r}")
        if self.local is None and self.hub is None:
            raise TaskError(f"{path}: {where} needs `local` (a folder under the data root) or `hub`")


@dataclass
class ColumnsSpec(_Section):
    text: str | None = None
    text_pair: str | None = None
    label: str | None = None
    group: str | None = None  # e.g. the question id of reranking candidates

    REQUIRED = ("text", "label")


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

    REQUIRED = ("type",)

    def check(self, path: Path, where: str) -> None:
        self._one_of("type", MTEB_TYPES, path, where)


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
        local = self.data.local
        files = self.splits[split] if isinstance(self.splits[split], list) else [self.splits[split]]
        folder = root / local if (root is not None and local is not None) else None
        paths = [folder / f for f in files] if folder else []
        missing = [p for p in paths if not p.is_file()]
        if folder is None or missing:
            if self.data.hub and os.environ.get("CROSSBERT_ONLINE") == "1":
                return self._load_hub_split(split)
            where = ", ".join(str(p) for p in (missing or paths)) or f"{local} under the data root"
            hub = self.data.hub
            hint = f"; online users can set CROSSBERT_ONLINE=1 to read the hub dataset {hub.path}" if hub else ""
            raise TaskDataMissing(
                f"task {self.name} ({self.source_file.name}): data for split {split!r} not found; looked for {where} "
                f"(see MANIFEST.md of the data root){hint}"
            )
        rows = []
        for path in paths:
            rows.extend(self._read_rows(path))
        return self._to_split(rows, split, ", ".join(str(p) for p in paths), root)

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

    def _read_rows(self, path: Path) -> list[tuple[int, dict]]:
        fmt = self.data.format
        text = _read_text(path, self.data.encoding)
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
        delimiter = self.data.get("delimiter", "\t" if fmt == "tsv" else ",")
        # GLUE / STS TSVs contain bare quotes: read them with quoting disabled (MANIFEST.md).
        quoting = csv.QUOTE_NONE if self.data.get("quoting", "none" if fmt == "tsv" else "minimal") == "none" else csv.QUOTE_MINIMAL
        reader = csv.reader(io.StringIO(text), delimiter=delimiter, quoting=quoting)
        header = self.data.header
        fields = list(self.data.fields or [])
        optional = list(self.data.optional_fields or [])
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
        root = folder / self.data.local
        out = []
        for name in names:
            files = self.splits[name]
            for f in files if isinstance(files, list) else [files]:
                out.extend(str(r[self.columns["label"]]).strip() for _, r in self._read_rows(root / f))
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


def _resolved_root(root: str | os.PathLike | None) -> Path | None:
    """The data root for `root`. A root that was given but is missing is the resolver's error; with
    none given and none found, None: the data is then reported missing (or read from the hub)."""
    try:
        return data_root(root)
    except FileNotFoundError:
        if root is not None:
            raise
        return None


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
    given = [key for key in SECTIONS if spec.get(key) is not None or key in REQUIRED]  # data: null is an error
    typed = {key: SECTIONS[key].parse(spec[key], path, key) for key in given}
    if spec["input"] == "pair" and typed["columns"].text_pair is None:
        raise TaskError(f"{path}: a pair task needs columns.text_pair")
    if spec["target"] == "class" and "labels" not in spec:
        raise TaskError(f"{path}: a class task needs `labels` (a list, a mapping, or infer); without labels it cannot be probed")
    return Task(**{**spec, **typed}, source_file=path)


SECTIONS = {"data": DataSpec, "columns": ColumnsSpec, "holdout": HoldoutSpec, "mteb": MtebSpec}


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
