"""The task file schema: what a file in `tasks/` may say, read by the one typed loader
(crossbert_model.args.from_dict) and checked here. One YAML file per task:

    name: SST-2
    family: glue                   # one of FAMILIES: glue | senteval | probing | sts | classification | ...
    input: single                  # single | pair
    target: class                  # class | score
    metrics: [accuracy]            # the first is the main score
    data:
      local: glue/SST-2            # folder under the data root
      hub: {path: nyu-mll/glue, name: sst2}   # for users who are online
      format: tsv                  # a format registered in formats.py: tsv | csv | jsonl | label_first, or beir
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

Every key is a field of TaskSpec or of its sections (DataSpec, HubSpec, ColumnsSpec, SplitFileSpec,
HoldoutSpec, MtebSpec); an unknown key, a missing one or a value of the wrong type is a TaskError of one
line naming the file and the key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from crossbert_model.args import ConfigError, MissingKeys, UnknownKeys, WrongType, from_dict, required
from crossbert_model.readers import read_yaml

from .errors import TaskError
from .formats import BEIR, format_names

MTEB_TYPES = ("STS", "Classification", "Clustering", "Reranking", "PairClassification", "Retrieval")
FAMILIES = ("glue", "senteval", "probing", "sts", "classification", "pair_classification", "clustering", "reranking", "retrieval")


# ------------------------------------------------------------------------------------------------
# Sections: a misspelt key (`heder:` under `data:`) is an error, not a silent default
# ------------------------------------------------------------------------------------------------


def _one_of(section, key: str, allowed: tuple, path: Path, where: str) -> None:
    value = getattr(section, key)
    if value is not None and value not in allowed:
        raise TaskError(f"{path}: {where}.{key} must be one of {', '.join(map(str, allowed))}, got {value!r}")


@dataclass
class HubSpec:
    """Where online users read the task (`datasets.load_dataset(path, name, revision=...)`)."""

    path: str = required()
    name: str | None = None
    revision: str | None = None
    splits: dict | None = None  # our split name -> the hub's
    columns: dict | None = None  # our column name -> the hub's


@dataclass
class DataSpec:
    local: str | None = None  # folder under the data root
    hub: HubSpec | None = None
    format: str = "tsv"
    header: bool = True
    fields: list[str] | None = None
    optional_fields: list[str] | None = None
    delimiter: str | None = None
    quoting: str | None = None  # none | minimal (default: none for tsv, minimal for csv)
    encoding: str = "utf-8-sig"
    drop_unlabelled: bool = False
    drop_labels: list | None = None  # raw label values whose rows are not examples (TwitterURLCorpus: 3 of 6 votes)
    corpus: str | None = None  # format beir: the documents (jsonl {_id, title, text})
    queries: str | None = None  # format beir: the queries (jsonl {_id, text})

    def check(self, path: Path, where: str) -> None:
        _one_of(self, "format", format_names(), path, where)
        _one_of(self, "quoting", ("none", "minimal"), path, where)
        if self.local is None and self.hub is None:
            raise TaskError(f"{path}: {where} needs `local` (a folder under the data root) or `hub`")
        if self.format == BEIR and (self.corpus is None or self.queries is None):
            raise TaskError(f"{path}: {where}.format beir needs {where}.corpus and {where}.queries (files under {where}.local)")


@dataclass
class ColumnsSpec:
    text: str = required()
    text_pair: str | None = None
    label: str = required()
    group: str | None = None  # e.g. the question id of reranking candidates
    label_before: str | None = None  # the class is the label's text up to this separator (MASSIVE scenario = intent prefix)


@dataclass
class SplitFileSpec:
    """An entry of a split's file list that a plain file name cannot describe. Paths may go through a zip
    archive (`archive.zip/dir/member.txt`: read from the archive, never extracted)."""

    file: str | None = None
    paste: list | None = None  # files read side by side, line i of each making example i (like `paste`)
    folder: str | None = None  # a folder under the data root (default: data.local)
    fields: list[str] | None = None  # this file's fields (default: data.fields)
    optional_fields: list[str] | None = None
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
class HoldoutSpec:
    """A seeded split of `source` into `train` and `test` (see Task._holdout_split)."""

    source: str = required()
    train: str = required()
    test: str = required()
    test_fraction: float = required()
    seed: int = 0
    group: str | None = None  # text: pairs sharing a first text stay on one side

    def check(self, path: Path, where: str) -> None:
        _one_of(self, "group", ("text",), path, where)
        if not (isinstance(self.test_fraction, (int, float)) and 0 < self.test_fraction < 1):
            raise TaskError(f"{path}: {where}.test_fraction must be a number between 0 and 1, got {self.test_fraction!r}")


@dataclass
class MtebSpec:
    """How crossbert_eval/mteb_tasks.py runs the task through mteb's own task class."""

    type: str = required()
    eval_splits: list[str] | None = None
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
    from_splits: list[str] | None = None  # MTEB's eval split is these splits of ours, concatenated (TwitterURLCorpus)

    @property
    def splits_to_read(self) -> list[str]:
        """The splits of ours a local mteb task reads for evaluation: eval_splits, else test."""
        return list(self.eval_splits) if self.eval_splits is not None else ["test"]

    def check(self, path: Path, where: str) -> None:
        _one_of(self, "type", MTEB_TYPES, path, where)
        if self.variant_of is not None and not self.data_differs:
            raise TaskError(f"{path}: {where}.variant_of needs {where}.data_differs (how this data differs from MTEB's)")


@dataclass
class TaskSpec:
    """What a task file says; Task (task.py) adds the reading."""

    name: str
    family: str
    input: str
    target: str
    metrics: list[str]
    data: DataSpec
    splits: dict  # split name -> [file name | SplitFileSpec], see _split_files
    columns: ColumnsSpec
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

    @property
    def eval_splits(self) -> list[str]:
        return [self.eval_split] if isinstance(self.eval_split, str) else list(self.eval_split)


# ------------------------------------------------------------------------------------------------
# Reading a task file
# ------------------------------------------------------------------------------------------------


def read_task_spec(path: Path) -> TaskSpec:
    """A task file as a checked TaskSpec, or the TaskError of its first mistake (one line)."""
    spec = _typed(TaskSpec, _read_task_yaml(path), path, "")
    if spec.family not in FAMILIES:
        raise TaskError(f"{path}: family must be one of {', '.join(FAMILIES)}, got {spec.family!r}")
    if spec.input not in ("single", "pair"):
        raise TaskError(f"{path}: input must be 'single' or 'pair', got {spec.input!r}")
    if spec.target not in ("class", "score"):
        raise TaskError(f"{path}: target must be 'class' or 'score', got {spec.target!r}")
    if not isinstance(spec.splits, dict) or not spec.splits:
        raise TaskError(f"{path}: splits must map split names to files, got {spec.splits!r}")
    spec.splits = {name: _split_files(files, path, name) for name, files in spec.splits.items()}
    for key in ("data", "holdout", "mteb"):  # the sections with checks beyond their keys and types
        if getattr(spec, key) is not None:
            getattr(spec, key).check(path, key)
    if spec.input == "pair" and spec.columns.text_pair is None:
        raise TaskError(f"{path}: a pair task needs columns.text_pair")
    if spec.target == "class" and spec.labels is None:
        raise TaskError(f"{path}: a class task needs `labels` (a list, a mapping, or infer); without labels it cannot be probed")
    evaluated = spec.eval_splits
    if not evaluated or not all(isinstance(s, str) and s for s in evaluated):
        raise TaskError(f"{path}: eval_split must be a split name or a non-empty list of them, got {spec.eval_split!r}")
    _check_inside_root(spec, path)
    _check_train_apart(spec, path)
    return spec


_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a mapping"}


def _typed(cls: type, raw: dict, path: Path, where: str):
    """`raw` as `cls` through the typed loader, its mistakes worded as task files word them."""
    try:
        return from_dict(cls, raw, where)
    except UnknownKeys as e:
        if not e.where:
            valid = ", ".join(sorted(e.valid))
            raise TaskError(f"{path}: unknown field(s) {', '.join(sorted(e.keys))}; valid: {valid}") from None
        raise TaskError(f"{path}: unknown key {e.where}.{e.keys[0]}; valid keys under {e.where}: {', '.join(e.valid)}") from None
    except MissingKeys as e:
        if not e.where:
            raise TaskError(f"{path}: missing field(s) {', '.join(e.keys)}") from None
        required_ = ", ".join(e.required)
        raise TaskError(f"{path}: missing key {e.where}.{e.keys[0]} (required under {e.where}: {required_})") from None
    except WrongType as e:
        if e.expected in _TYPE_WORDS:
            raise TaskError(f"{path}: {e.where} must be {_TYPE_WORDS[e.expected]}, got {e.value!r}") from None
        raise TaskError(f"{path}: {e.where} must be a mapping of keys, got {type(e.value).__name__} {e.value!r}") from None
    except ConfigError as e:
        raise TaskError(f"{path}: {e}") from None


def _read_task_yaml(path: Path) -> dict:
    return read_yaml(path, "a task file (a mapping of task fields)", TaskError)


def _split_files(files, path: Path, split: str) -> list:
    """A split's value as a list of file names and SplitFileSpec entries."""
    entries = files if isinstance(files, list) else [files]
    if not entries:
        raise TaskError(f"{path}: splits.{split} lists no file")
    out = []
    for i, entry in enumerate(entries):
        if isinstance(entry, dict):
            where = f"splits.{split}" + (f"[{i}]" if isinstance(files, list) else "")
            out.append(_typed(SplitFileSpec, entry, path, where))
            out[-1].check(path, where)
        elif isinstance(entry, str) and entry.strip():
            out.append(entry)
        else:
            raise TaskError(f"{path}: splits.{split} entries must be file names or mappings (file/paste, ...), got {entry!r}")
    return out


def _check_inside_root(spec: TaskSpec, path: Path) -> None:
    """Every file a task reads lies under the data root: no absolute path, no way out with '..'."""
    local = spec.data.local or ""
    reads = [("data.local", [local])]
    reads += [(f"data.{key}", [local, getattr(spec.data, key)]) for key in ("corpus", "queries") if getattr(spec.data, key)]
    for where, parts in reads + _split_parts(spec):
        if _leaves_root(parts):
            raise TaskError(
                f"{path}: {where} reads {os.path.join(*parts)!r}, outside the data root "
                "(an absolute path or '..'); task data must lie under the data root"
            )


def _split_parts(spec: TaskSpec) -> list[tuple[str, list[str]]]:
    """(splits.NAME, path parts under the data root) of every file of every split."""
    out = []
    for split, entries in spec.splits.items():
        for entry in entries:
            if isinstance(entry, SplitFileSpec):
                out += [(f"splits.{split}", [entry.folder or spec.data.local or "", f]) for f in entry.files]
            else:
                out.append((f"splits.{split}", [spec.data.local or "", entry]))
    return out


def _leaves_root(parts: list[str]) -> bool:
    joined = os.path.normpath(os.path.join(*parts))
    return os.path.isabs(joined) or joined == ".." or joined.startswith("../")


def _check_train_apart(spec: TaskSpec, path: Path) -> None:
    """A probe trained on its evaluation data scores what it memorised: a task whose training split reads a
    file (with the same row selection) that an evaluation split reads is refused."""
    if spec.train_split not in spec.splits:  # none, or a holdout split (Task._holdout_split keeps its sides apart)
        return
    train = _split_sources(spec, spec.train_split)
    for split in spec.eval_splits:
        shared = train & _split_sources(spec, split) if split in spec.splits else set()
        if split == spec.train_split or shared:
            files = ", ".join(sorted(f for source in shared for f in source[0])) or f"split {split!r}"
            raise TaskError(
                f"{path}: the training split {spec.train_split!r} and the evaluation split {split!r} "
                f"read the same data ({files}); a probe must be evaluated on data it was not trained on"
            )


def _split_sources(spec: TaskSpec, split: str) -> set[tuple]:
    """What each entry of a split reads: (its files, normalised, and its row selection)."""
    sources = set()
    for entry in spec.splits[split]:
        if isinstance(entry, SplitFileSpec):
            files = tuple(os.path.normpath(os.path.join(entry.folder or spec.data.local or "", f)) for f in entry.files)
            sources.add((files, tuple(sorted((str(k), str(v)) for k, v in (entry.select or {}).items()))))
        else:
            sources.add(((os.path.normpath(os.path.join(spec.data.local or "", entry)),), ()))
    return sources


def spec_fields(spec: TaskSpec) -> dict:
    """The spec's fields by name, as given (sections stay objects): what Task(**...) takes."""
    return {f.name: getattr(spec, f.name) for f in fields(TaskSpec)}
