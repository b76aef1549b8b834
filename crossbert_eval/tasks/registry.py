"""The task registry: every *.yaml under tasks/ (or $CROSSBERT_TASKS_DIR), by name and family.

A task file that does not parse breaks only itself: the registry keeps it (broken_tasks()) and raises
its error when that task, its family or `all` is asked for; other tasks work as before.
"""

from __future__ import annotations

import importlib.util
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from crossbert_model.args import did_you_mean
from crossbert_model.readers import read_yaml
from crossbert_model.utils import PROJECT_ROOT

from .errors import TaskDataMissing, TaskError
from .schema import FAMILIES, read_task_spec, spec_fields
from .task import Task

TASKS_DIR_ENV = "CROSSBERT_TASKS_DIR"


def tasks_dir() -> Path:
    """$CROSSBERT_TASKS_DIR, else the task files installed with the package (`crossbert_tasks`, the checkout's tasks/
    folder: pyproject.toml), else the checkout's tasks/ (a checkout used without installing it)."""
    if TASKS_DIR_ENV in os.environ:
        return Path(os.environ[TASKS_DIR_ENV])
    installed = importlib.util.find_spec("crossbert_tasks")
    return Path(next(iter(installed.submodule_search_locations))) if installed else PROJECT_ROOT / "tasks"


def parse_task_file(path: Path) -> Task:
    """A task file as a Task, or the TaskError (one line) of its first mistake."""
    return Task(**spec_fields(read_task_spec(path)), source_file=path)


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
        spec = read_yaml(path, "a task file", TaskError)
    except TaskError:  # any unreadable file: fall back on the path alone
        spec = {}
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
    hint = did_you_mean(name, [*tasks, *(b.name for b in registry.broken.values()), "all", *FAMILIES])
    raise TaskError(f"unknown task {name!r}{hint}; known tasks ({tasks_dir()}): {', '.join(known)}")


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


def _split_sizes(task: Task, root) -> list[str]:
    """`split=N` per split of a task (N examples), or why there is no number."""
    sizes = []
    for split in task.splits:
        try:
            sizes.append(f"{split}={task.count_split(split, root):,}")
        except TaskDataMissing:
            sizes.append(f"{split}: MISSING")
        except TaskError as e:
            sizes.append(f"{split}: ERROR {e}")
    return sizes


def task_listing(root: str | os.PathLike | None = None) -> tuple[list[str], dict[str, str]]:
    """(lines of `crossbert tasks`, broken_tasks()): one line per task with its split sizes under
    `root`, then one BROKEN line per task file that does not parse (with its error), so one bad file
    hides nothing else; the caller decides the exit code from the broken ones."""
    registry = _registry(str(tasks_dir()))
    ordered = sorted(registry.tasks.items(), key=lambda kv: (kv[1].family, kv[0]))
    # one thread a task: decompressing (.xz, .gz) releases the GIL, so the big files count side by side
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        sizes = list(pool.map(lambda task: _split_sizes(task, root), (task for _, task in ordered)))
    lines = [
        f"{task.family:15} {name:40} {task.input:6} {','.join(task.default_probes):18} {' '.join(size)}"
        for (name, task), size in zip(ordered, sizes)
    ]
    for name, bad in sorted(registry.broken.items()):
        lines.append(f"{'BROKEN':15} {name:40} {bad.error}")
    return lines, {name: str(bad.error) for name, bad in registry.broken.items()}
