"""Declarative tasks: one YAML file per task in `tasks/`, loaded into splits of texts and labels.

A task file says what the data is, where it lies and how to read it; nothing about a task is hard-coded
here. Adding a task = adding a file; adding a data format = registering a reader. The package by seam:

* schema.py   what a task file may say (TaskSpec and its sections), read by the one typed loader
* formats.py  reading data files: the row readers, registered by name (`data.format`)
* task.py     Task: a TaskSpec that reads its splits (texts, labels, pairs; BEIR retrieval sets)
* registry.py every task file under tasks/ by name and family; broken files kept with their error

This module is the package's public face: callers import from `crossbert_eval.tasks`.
"""

from .formats import ReadOptions, format_names, register_format
from .registry import all_tasks, broken_tasks, get_task, parse_task_file, resolve_tasks, task_listing, tasks_dir
from .errors import TaskDataMissing, TaskError
from .schema import FAMILIES, ColumnsSpec, DataSpec, MtebSpec, TaskSpec
from .task import BeirSplit, Split, Task

__all__ = [
    "BeirSplit",
    "ColumnsSpec",
    "DataSpec",
    "FAMILIES",
    "MtebSpec",
    "ReadOptions",
    "Split",
    "Task",
    "TaskDataMissing",
    "TaskError",
    "TaskSpec",
    "all_tasks",
    "broken_tasks",
    "format_names",
    "get_task",
    "parse_task_file",
    "register_format",
    "resolve_tasks",
    "task_listing",
    "tasks_dir",
]
