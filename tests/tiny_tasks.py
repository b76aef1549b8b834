"""Tasks of their own made of slices of the real data files, for tests that need a task fast to encode: the task files
(YAML, as the shipped ones) and the first lines of the real files they read, in a data root and a tasks folder of the
test's own (CROSSBERT_DATA_ROOT, CROSSBERT_TASKS_DIR)."""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest

# STS-B's pairs (the real stsbenchmark files), scored as a task of its own; `extra` adds keys (probes, train_split, ...)
TINY_STS = """
name: {name}
family: {family}
input: pair
target: score
metrics: [pearson, spearman]
score_range: [0, 5]
data: {{local: tiny_sts, format: tsv, header: false, fields: [genre, file, year, id, score, sentence1, sentence2],
       optional_fields: [source1, source2]}}
splits: {{train: train.tsv, validation: dev.tsv}}
columns: {{text: sentence1, text_pair: sentence2, label: score}}
eval_split: validation
{extra}"""
STS_FILES = {"train.tsv": "stsbenchmark/sts-train.tsv.xz", "dev.tsv": "stsbenchmark/sts-dev.tsv.xz"}


def tiny_sts(name: str = "TinySTS", family: str = "sts", extra: str = "") -> str:
    """The task file of STS-B's sliced pairs, named `name`."""
    return TINY_STS.format(name=name, family=family, extra=extra)


def make_tasks(
    root: Path,
    real_data_root: Path,
    monkeypatch: pytest.MonkeyPatch,
    data: dict[str, dict[str, tuple[str, int]]],
    tasks: dict[str, str],
) -> Path:
    """`data`: {folder: {file name: (real file under the data root, lines kept)}} (a header line counts as a line);
    `tasks`: {task name: its YAML}. Both under `root`, which the tests' tasks and data are then read from."""
    for folder, files in data.items():
        (root / "data" / folder).mkdir(parents=True)
        for name, (source, lines) in files.items():
            text = lzma.open(real_data_root / source, "rt", encoding="utf-8").read().splitlines()[:lines]
            (root / "data" / folder / name).write_text("\n".join(text) + "\n", encoding="utf-8")
    (root / "tasks").mkdir()
    for name, yaml_text in tasks.items():
        (root / "tasks" / f"{name}.yaml").write_text(yaml_text)
    monkeypatch.setenv("CROSSBERT_TASKS_DIR", str(root / "tasks"))
    monkeypatch.setenv("CROSSBERT_DATA_ROOT", str(root / "data"))
    return root
