"""The errors of task files and their data."""

from crossbert_model.errors import CrossbertError


class TaskError(CrossbertError, ValueError):
    """A task file or its data is wrong; the message says which file, line or field."""


class TaskDataMissing(TaskError, FileNotFoundError):
    """The task is known but its data is not in the data root (and no hub access)."""
