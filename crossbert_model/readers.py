"""The one reader of each kind of file the tool reads. Every parse, shape or value failure becomes one line that names
the file (and the line, where there is one) and what was expected; the caller chooses the error's class, so a damaged
checkpoint stays a CheckpointError and a damaged task file a TaskError.

| kind                          | reader                                               |
|-------------------------------|------------------------------------------------------|
| text (UTF-8)                  | `read_text`                                          |
| JSON (configs, states, stamps)| `read_json`                                          |
| YAML (configs, task files)    | `read_yaml`, `parse_yaml` (text already in memory)   |
| JSONL (results stores, logs)  | `read_jsonl`, `jsonl_row`                            |
| safetensors weights           | `read_safetensors`, `check_safetensors`, `safetensors_tensors`, `safetensors_shapes` |
| torch pickles (where allowed) | `read_torch_pickle`                                  |
| numpy arrays (features, predictions) | `read_array`, `read_arrays`                   |
| CSV tables (a report's tables)| `read_table`                                         |

Corpora are read by crossbert_model.data.corpus and task data files by crossbert_eval.tasks.formats (their
formats are theirs); both take their bytes and text from here. tests/test_readers.py holds every other module to this.
torch, numpy and safetensors load on first use: a command that only reads a config stays light.
"""

from __future__ import annotations

import io
import json
import lzma
import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any, Iterator

import yaml

from .errors import CrossbertError, one_line


class ReadError(CrossbertError, ValueError):
    """A file that is missing, unreadable or not what its kind promises."""


PathLike = str | os.PathLike
ErrorClass = type[CrossbertError]

# libyaml's loader where PyYAML was built with it: the same safe subset, about ten times faster (36 task files:
# 0.3 s instead of several seconds, the bulk of `crossbert tasks`)
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_text(path: PathLike, what: str, error: ErrorClass = ReadError, encoding: str = "utf-8") -> str:
    """The file's text; missing or not `encoding` text: one line naming the file and `what` it should be."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: missing (expected {what})" if not path.exists() else f"{path}: a folder, expected {what}")
    try:
        return path.read_text(encoding=encoding)
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise error(f"{path}:{line}: not {encoding} text (byte {e.start}); expected {what}") from None


def read_json(path: PathLike, what: str, error: ErrorClass = ReadError, expect: type = dict) -> Any:
    """A JSON file whose top level is an `expect` (a JSON object by default)."""
    text = read_text(path, what, error)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{path}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno}); expected {what}") from None
    if not isinstance(data, expect):
        raise error(f"{path}: a JSON {_json_kind(data)} where {what} (a JSON {_json_kind(expect())}) was expected")
    return data


def _json_kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def parse_yaml(text: str, where: str, error: ErrorClass = ReadError, with_line: bool = True) -> Any:
    """YAML text read from `where` (a file, a file's header, a command-line value), by the safe loader: no tags that
    build objects. `with_line`: name the line of a failure after `where` (a file's, not a one-line value's)."""
    try:
        return yaml.load(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None and with_line else ""
        problem = getattr(e, "problem", None) or one_line(str(e))
        raise error(f"{where}{line}: not valid YAML ({problem})") from None


def read_yaml(path: PathLike, what: str, error: ErrorClass = ReadError) -> dict:
    """A YAML file whose top level is a mapping (an empty file is an empty mapping)."""
    data = parse_yaml(read_text(path, what, error), str(path), error)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise error(f"{path}: expected a mapping at top level ({what}), got {type(data).__name__}")
    return data


def read_jsonl(path: PathLike) -> list[dict]:
    """Every whole line, each a JSON object; a torn final line (a writer killed mid-append) is skipped, a bad line
    elsewhere is an error naming the file and line. A `.xz` path is read through lzma (committed reference stores are
    kept compressed: `make reference`). A missing file has no rows."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    opener = lzma.open if path.suffix == ".xz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.endswith("\n"):
                    break  # torn final line of a killed writer
                rows.append(jsonl_row(line, f"{path}:{lineno}"))
    except (UnicodeDecodeError, lzma.LZMAError, EOFError) as e:
        raise ReadError(f"{path}: not a UTF-8 JSONL file ({one_line(str(e))}); expected one JSON object a line") from None
    return rows


def jsonl_row(line: str | bytes, where: str) -> dict:
    """One line of a JSONL file of ours: a JSON object, or an error naming `where` (file:line)."""
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        reason = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8"
        raise ReadError(f"{where}: not a JSON line ({reason}); remove or fix that line") from None
    if not isinstance(row, dict):
        raise ReadError(f"{where}: a JSON {_json_kind(row)}, not a row (a JSON object); remove or fix that line")
    return row


def read_table(path: PathLike, what: str, error: ErrorClass = ReadError):
    """A CSV table of ours (a report's tables/*.csv) as a pandas DataFrame."""
    import pandas as pd

    text = read_text(path, what, error)  # names a missing or non-UTF-8 file
    try:
        return pd.read_csv(io.StringIO(text))
    except (ValueError, pd.errors.ParserError) as e:  # EmptyDataError is a ValueError
        raise error(f"{path}: not a readable CSV table ({one_line(str(e))[:160]}); expected {what}") from None


# -- weights ------------------------------------------------------------------------------------------------------------


def _safetensors_errors() -> tuple[type[BaseException], ...]:
    from safetensors import SafetensorError

    return (SafetensorError, OSError, ValueError)


def _unreadable_weights(file: Path, error: ErrorClass, e: BaseException) -> CrossbertError:
    return error(f"{file}: not a readable safetensors file (truncated or corrupt?): {one_line(str(e))[:200]}")


def check_safetensors(file: PathLike, error: ErrorClass = ReadError) -> None:
    """Open the header (memory-mapped, cheap): safetensors checks that it covers the whole file (truncation)."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt"):
            pass
    except _safetensors_errors() as e:
        raise _unreadable_weights(Path(file), error, e) from None


def read_safetensors(file: PathLike, error: ErrorClass = ReadError) -> dict:
    """Every tensor of a safetensors file, by name."""
    from safetensors.torch import load_file

    try:
        return load_file(str(file))
    except _safetensors_errors() as e:
        raise _unreadable_weights(Path(file), error, e) from None


def safetensors_tensors(file: PathLike, error: ErrorClass = ReadError) -> Iterator[tuple[str, Any]]:
    """(name, tensor) of every tensor of a safetensors file, read one at a time."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
    except _safetensors_errors() as e:
        raise _unreadable_weights(Path(file), error, e) from None


def safetensors_shapes(file: PathLike, error: ErrorClass = ReadError) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape from the file's header; no tensor is loaded."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except _safetensors_errors() as e:
        raise _unreadable_weights(Path(file), error, e) from None


def read_torch_pickle(file: PathLike, what: str, error: ErrorClass = ReadError) -> Any:
    """Tensors and plain containers only (torch's weights_only): a pickle that asks to run code is refused, never run."""
    import torch

    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # weights_only refused a global (and its subclasses)
        blocked = re.search(r"unsupported GLOBAL (\S+)", str(e))
        raise error(
            f"{file}: not {what} this tool can read: a pickle that asks to run code when loaded"
            f"{f' ({blocked.group(1)})' if blocked else ''}, refused"
        ) from None
    except (RuntimeError, OSError, EOFError, ValueError) as e:
        raise error(f"{file}: not {what} this tool can read (truncated or corrupt?): {one_line(str(e))[:200]}") from None


# -- arrays -------------------------------------------------------------------------------------------------------------


def read_array(path: PathLike, what: str, error: ErrorClass = ReadError, rows: int | None = None):
    """A .npy array of numbers (never pickled objects), finite, with `rows` rows where given."""
    import numpy as np

    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise error(f"{path}: not a readable .npy array ({one_line(str(e))[:160]}); expected {what}") from None
    _check_numbers(array, path, what, error, rows)
    return array


def read_arrays(path: PathLike, names: tuple[str, ...], what: str, error: ErrorClass = ReadError) -> tuple:
    """The named arrays of a .npz file (numbers, never pickled objects), in the order of `names`."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as saved:
            missing = [n for n in names if n not in saved.files]
            if missing:
                raise error(f"{path}: no array {missing[0]!r}; expected {what} ({', '.join(names)})")
            arrays = tuple(saved[n] for n in names)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:  # a torn .npz is a torn zip archive
        raise error(f"{path}: not a readable .npz file ({one_line(str(e))[:160]}); expected {what}") from None
    return arrays


def _check_numbers(array, path: PathLike, what: str, error: ErrorClass, rows: int | None) -> None:
    import numpy as np

    if not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
        raise error(f"{path}: holds {array.dtype} values; expected {what} (numbers)")
    if rows is not None and (array.ndim == 0 or array.shape[0] != rows):
        raise error(f"{path}: shape {array.shape}; expected {what} with {rows} rows")
    if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
        raise error(f"{path}: holds NaN or Inf; expected {what} (finite numbers)")
