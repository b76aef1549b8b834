"""Typed configuration: nested dataclasses <- YAML file <- `key=value` overrides (lingua's args.py style).

    cfg = load_config(TrainConfig, "configs/train/tiny_mlm.yaml", ["model.preset=mini", "optim.lr=3e-4"])

Values in overrides are parsed as YAML scalars (`3e-4`, `true`, `null`, `[100, 200]`). Unknown keys are
errors that list the valid ones, so a typo never silently trains the wrong model.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import functools
import inspect
import io
import re
import textwrap
import tokenize
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from . import readers
from .errors import CrossbertError

T = TypeVar("T")


class ConfigError(CrossbertError, ValueError):
    """`key`: the config key of the refused value as a tuple of section and field names, without list indices
    (("models", "pooling") for `models[1] (second).pooling`); set by the typed loader, None for errors raised
    elsewhere. load_config reads it to name the override or file that set the value."""

    key: tuple[str, ...] | None = None


@contextlib.contextmanager
def _refusing_at(key: tuple[str, ...]):
    """An error raised inside is the value at `key`'s, unless a deeper key already claimed it."""
    try:
        yield
    except ConfigError as e:
        if e.key is None:
            e.key = key
        raise


# The wording of a refused field, naming it as the config file does ("optim.lr"). A field's limit is declared with
# the field (crossbert_model.limits), which words its refusal so; the relations between fields use `require`.


def require(ok: bool, name: str, expected: str, value) -> None:
    """The one wording of a refused value: config field NAME: expected WHAT, got VALUE."""
    if not ok:
        raise ConfigError(f"config field {name!r}: expected {expected}, got {value!r}")


# A name that becomes one folder or file name (a run, a sweep, a zoo, an objective's runs): letters, digits and _ . + -,
# starting with a letter or digit, so never '', '.', '..', an absolute path or a path of several parts.
FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
FOLDER_NAME_EXPECTED = "one folder name (letters, digits, '_', '.', '+' or '-', starting with a letter or digit; no '/')"


def _folded(name: str) -> str:
    """A name without case and punctuation: SST2, sst-2 and SST_2 fold alike."""
    return re.sub(r"[^0-9a-z]", "", name.lower())


def close_matches(word: str, choices, limit: int = 3) -> list[str]:
    """The choices a mistyped `word` most likely meant: equal once case and punctuation are folded first
    (SST2 -> SST-2), then the closest spellings (difflib), at most `limit`."""
    choices = [c for c in dict.fromkeys(str(c) for c in choices) if c != word]
    exact = [c for c in choices if _folded(c) == _folded(word) and c != word]
    by_fold = {_folded(c): c for c in choices}
    near = [by_fold[f] for f in difflib.get_close_matches(_folded(word), list(by_fold), n=limit, cutoff=0.7)]
    return list(dict.fromkeys(exact + near))[:limit]


def did_you_mean(word: str, choices) -> str:
    """'; did you mean X?' (or 'X or Y'), or '' when nothing is close: appended to an error's one line."""
    matches = close_matches(word, choices)
    return f"; did you mean {' or '.join(matches)}?" if matches else ""


# The typed loader's mistakes carry what went wrong, so that a caller with its own wording (task files,
# crossbert_eval/tasks/schema.py) words the same facts its way; str() is the config files' wording.


class UnknownKeys(ConfigError):
    def __init__(self, where: str, keys: list[str], valid: list[str]):
        self.where, self.keys, self.valid = where, keys, valid
        prefix = f"{where}." if where else ""
        named = [
            prefix + k + (f" (did you mean {' or '.join(m)}?)" if (m := close_matches(k, valid)) else "") for k in sorted(keys)
        ]
        super().__init__(
            f"unknown config key(s) {', '.join(named)}; "
            f"valid keys{' under ' + where if where else ''}: {', '.join(sorted(valid))}"
        )


class MissingKeys(ConfigError):
    def __init__(self, where: str, keys: list[str], required: list[str], cls: type):
        self.where, self.keys, self.required = where, keys, required
        super().__init__(f"{where or cls.__name__}: missing required key(s) {', '.join(keys)}")


class WrongType(ConfigError):
    """`expected`: list, dict, a dataclass, or a scalar type."""

    def __init__(self, where: str, expected: type, value: Any):
        self.where, self.expected, self.value = where, expected, value
        if dataclasses.is_dataclass(expected):
            words = f"a mapping of {expected.__name__} fields"
        else:
            words = {list: "a list", dict: "a mapping"}.get(expected, getattr(expected, "__name__", str(expected)))
        super().__init__(f"{where}: expected {words}, got {value!r}")


def required(default: Any = None) -> Any:
    """A dataclass field the loader requires (absent or null is MissingKeys) though it has a default, so it
    can stand anywhere in field order: `path: str = required()`."""
    return dataclasses.field(default=default, metadata={"required": True})


@functools.cache  # a class's annotations never change: resolved once a process, not for every value loaded
def _field_types(cls: type) -> typing.Mapping[str, Any]:
    hints = typing.get_type_hints(cls)
    return types.MappingProxyType({f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init})


@functools.cache
def annotated_hints(cls: type) -> typing.Mapping[str, Any]:
    """{field: its annotation with the limits it declares (Annotated)} of a config dataclass, resolved once a process."""
    return types.MappingProxyType(typing.get_type_hints(cls, include_extras=True))


def _missing(cls: type, data: dict) -> tuple[list[str], list[str]]:
    """(the required keys `data` lacks, every required key): a field without a default must be given; a
    `required()` one must be given and not null."""
    required_, missing = [], []
    for f in dataclasses.fields(cls):
        needed = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.init and (needed or f.metadata.get("required")):
            required_.append(f.name)
            if f.name not in data or (f.metadata.get("required") and data[f.name] is None):
                missing.append(f.name)
    return missing, required_


def _coerce(
    value: Any, tp: Any, where: str, kind: str = "config field", pending: list | None = None, key: tuple[str, ...] = ()
) -> Any:
    """Check / convert a parsed YAML value against a field annotation (int -> float is allowed). An annotation's
    limits (`Annotated[float, POSITIVE]`: metadata with a `check`, crossbert_model.limits) are checked on the
    converted value, naming the field as `kind` 'where'; a `heavy` one is put on `pending`, checked after the rest.
    `key`: the value's config key (ConfigError.key), which a heavy limit's later refusal carries."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        base, *metas = typing.get_args(tp)
        value = _coerce(value, base, where, kind, pending, key)
        optional = typing.get_origin(base) in (typing.Union, types.UnionType) and type(None) in typing.get_args(base)
        for meta in [m for m in metas if callable(getattr(m, "check", None))] if value is not None else ():
            if getattr(meta, "heavy", False) and pending is not None:
                pending.append(lambda meta=meta, value=value: _check_at(key, meta, value, where, kind, optional))
            else:
                meta.check(value, where, kind, optional)
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where, kind, pending, key)
            except ConfigError as e:
                errors.append(e)
        raise errors[0] if errors else ConfigError(f"{where}: invalid value {value!r}")
    if tp is Any:
        return value
    if isinstance(tp, type) and hasattr(tp, "from_config"):  # a typed value (a LayerSpec): parsed here, once
        try:
            return tp.from_config(value)
        except ValueError as e:
            raise ConfigError(f"{kind} {where!r}: {e}") from None
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise WrongType(where, list, value)
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        items = [_coerce(v, item_tp, item_key(where, i, item_tp, v), kind, pending, key) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise WrongType(where, dict, value)
        return dict(value)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise WrongType(where, tp, value)
        return from_dict(tp, value, where, kind, pending, key)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:  # YAML 1.1 reads "3e-4" (no dot) as a string
            return float(value)
        except ValueError:
            pass
    if tp in (int, float, str, bool) and not (isinstance(value, tp) and not (tp is int and isinstance(value, bool))):
        raise WrongType(where, tp, value)
    return value


def _check_at(key: tuple[str, ...], meta: Any, value: Any, where: str, kind: str, optional: bool) -> None:
    with _refusing_at(key):
        meta.check(value, where, kind, optional)


def from_dict(
    cls: type[T], data: dict, where: str = "", kind: str | None = None, _pending: list | None = None, _key: tuple = ()
) -> T:
    """The one typed loader: a YAML mapping -> `cls` (nested dataclasses), each value checked against its
    annotation. Keys in the mapping's order; an unknown key, a missing required one (no default, or
    `required()`), a value of the wrong type: UnknownKeys, MissingKeys, WrongType. A value out of its field's
    declared limit (crossbert_model.limits): ConfigError "KIND 'key': expected ..., got ...", KIND the class's
    FIELD_KIND ('config field' unless it says otherwise); limits that import torch are checked last. Every
    ConfigError raised carries the key of the value it refuses (ConfigError.key; a section's for a key it lacks or
    does not know)."""
    types_ = _field_types(cls)
    unknown = [k for k in data if k not in types_]
    missing, required_ = _missing(cls, data)
    with _refusing_at(_key):
        if unknown:
            raise UnknownKeys(where, unknown, list(types_))
        if missing:
            raise MissingKeys(where, missing, required_, cls)
    kind = kind or getattr(cls, "FIELD_KIND", "config field")
    pending = [] if _pending is None else _pending
    annotated = annotated_hints(cls)
    kwargs = {}
    for name, value in data.items():
        with _refusing_at((*_key, name)):
            kwargs[name] = _coerce(value, annotated[name], f"{where}.{name}" if where else name, kind, pending, (*_key, name))
    with _refusing_at(_key):
        try:
            obj = cls(**kwargs)
        except TypeError as e:
            raise ConfigError(f"{where or cls.__name__}: {e}") from None
    if _pending is None:  # the outermost call: the heavy limits, once every light one has passed
        for check in pending:
            check()
    return obj


def is_section(tp_or_value: Any) -> bool:
    """A nested config section (a dataclass of fields), not a typed value: a class that reads itself from one config value
    (`from_config`, such as a LayerSpec) is a leaf, however it is built inside."""
    return dataclasses.is_dataclass(tp_or_value) and not hasattr(tp_or_value, "from_config")


def to_dict(obj: Any) -> dict:
    """A config as plain data (what dump_yaml writes and signatures hash): a typed value (one with `to_config`, such as a
    LayerSpec) as the user wrote it, so that writing a config back and reading it again gives the same config."""
    return _plain(obj)


def _plain(value: Any) -> Any:
    if hasattr(value, "to_config"):
        return value.to_config()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _set_dotted(data: dict, key: str, value: Any, cls: type) -> None:
    parts = key.split(".")
    node, node_cls = data, cls
    for i, part in enumerate(parts):
        types_ = _field_types(node_cls)
        if part not in types_:
            where = ".".join(parts[:i]) or "top level"
            raise ConfigError(
                f"unknown config key {key!r}: no field {part!r} at {where}{did_you_mean(part, types_)}; "
                f"valid: {', '.join(sorted(types_))}"
            )
        if i == len(parts) - 1:
            node[part] = value
            return
        field_type = types_[part]
        if typing.get_origin(field_type) is dict or field_type is dict:  # free-form mapping: nest the rest as is
            node = node.setdefault(part, {})
            for sub in parts[i + 1 : -1]:
                node = node.setdefault(sub, {})
            node[parts[-1]] = value
            return
        if not is_section(field_type):
            raise ConfigError(f"config key {key!r}: {'.'.join(parts[: i + 1])} is not a section")
        node = node.setdefault(part, {})
        node_cls = field_type


def parse_overrides(overrides: list[str], cls: type) -> dict:
    data: dict = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value (e.g. model.preset=mini)")
        key, raw = item.split("=", 1)
        where = f"command-line override {item!r}: the value"
        value = readers.parse_yaml(raw, where, ConfigError, with_line=False) if raw.strip() else None
        _set_dotted(data, key.strip(), value, cls)
    return data


def deep_merge(base: dict, update: dict) -> dict:
    out = dict(base)
    for k, v in update.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def read_yaml(path: str | Path) -> dict:
    """A YAML config file: a mapping at top level."""
    return readers.read_yaml(path, "a YAML config (a mapping of config keys)", ConfigError)


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    data = read_yaml(path) if path else {}
    data = deep_merge(data, parse_overrides(overrides or [], cls))
    try:
        return from_dict(cls, data)
    except ConfigError as e:
        raise ConfigError(f"{_source_of(e.key or (), path, overrides or [])}: {e}") from None


def _source_of(key: tuple[str, ...], path, overrides: list[str]) -> str:
    """Where the value at config key `key` came from: the command-line override that set it (or a section above
    it), else the YAML file."""
    for override in reversed(overrides):  # the last override of a key wins, as in parse_overrides
        name = tuple(part.strip() for part in override.split("=", 1)[0].split("."))
        if key[: len(name)] == name:
            return f"command-line override {override!r}"
    return str(path or "config")


@dataclasses.dataclass
class ConfigKey:
    """One key of a config schema, as `crossbert train --help` lists it."""

    key: str  # dotted: optim.lr
    default: Any
    description: str  # the comment the dataclass carries for the field ('' when none)
    limit: str = ""  # its declared limit, short ("> 0", "cosine|linear|constant"; crossbert_model.limits)


def item_key(key: str, index: int, item_type: Any, value: Any) -> str:
    """How a message names a list's item: `models[1]`, and where the item's class declares ITEM_LABEL (the fields that
    name an item, first set wins) its name too, `models[1] (second)`, so that a refusal points at the entry the user
    knows by name."""
    fields = getattr(item_type, "ITEM_LABEL", ())
    get = value.get if isinstance(value, dict) else lambda name: getattr(value, name, None)
    label = next((str(get(f)) for f in fields if get(f) not in (None, "")), None)
    return f"{key}[{index}]" + (f" ({label})" if label else "")


@functools.cache  # parsed once a process: every validation of a run's config lists its keys (DottedKeys)
def _field_comments(cls: type) -> typing.Mapping[str, str]:
    """{field: its comment in the dataclass source}: a comment inside the field's own lines (beside it, or beside its
    value where the formatter wrapped it), else the comment lines right above it. The schema's comments are its
    documentation; `--help` reads them, nothing types them twice. Read with Python's own parser, so that any layout
    of a field gives the same comment. Shared between callers, so read-only."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source (a frozen build): keys and defaults only
        return {}
    comment_at = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    lines = source.splitlines()
    comments = {}
    for node in ast.parse(source).body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        own = [comment_at[n] for n in range(node.lineno, node.end_lineno + 1) if n in comment_at]
        above, n = [], node.lineno - 1
        while n in comment_at and lines[n - 1].lstrip().startswith("#"):
            above.insert(0, comment_at[n])
            n -= 1
        comments[node.target.id] = first_clause(own[-1] if own else " ".join(above))
    return types.MappingProxyType(comments)


def first_clause(text: str) -> str:
    """A comment's first sentence or clause (ended by '. ' or '; ' outside parentheses): the one line a listing shows."""
    depth = 0
    for i, char in enumerate(text := text.strip()):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and text[i : i + 2] in (". ", "; ") and not text[max(0, i - 3) : i + 1].endswith(("e.g.", "i.e.")):
            return text[:i].rstrip(".;")
    return text.rstrip(".;")


def config_keys(cls: type, prefix: str = "") -> list[ConfigKey]:
    """Every key of a config dataclass with its default and comment, sections (nested dataclasses) after the
    top-level keys, each section's keys dotted (`model.preset`)."""
    comments, keys, sections = _field_comments(cls), [], []
    annotated = annotated_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if is_section(default):
            sections += config_keys(type(default), f"{prefix}{f.name}.")
        else:
            tp = annotated[f.name]
            metas = typing.get_args(tp)[1:] if typing.get_origin(tp) is typing.Annotated else ()
            item = (typing.get_args(tp) or [None])[0] if typing.get_origin(tp) is list else None  # list[Annotated[int, ...]]
            each = typing.get_args(item)[1:] if typing.get_origin(item) is typing.Annotated else ()
            limit = "; ".join(
                [m.shown for m in metas if getattr(m, "shown", "")] + [f"each {m.shown}" for m in each if getattr(m, "shown", "")]
            )
            keys.append(
                ConfigKey(prefix + f.name, None if default is dataclasses.MISSING else default, comments.get(f.name, ""), limit)
            )
    return keys + sections


def section_doc(cls: type, section: str) -> str:
    """The first line of a section's docstring ('' for none or the dataclass's generated one)."""
    field = next((f for f in dataclasses.fields(cls) if f.name == section), None)
    doc = inspect.getdoc(field.default_factory) if field and callable(field.default_factory) else None
    if not doc or doc.startswith(f"{getattr(field.default_factory, '__name__', '')}("):  # the generated signature
        return ""
    return first_clause(" ".join(doc.split()))


def format_config_keys(cls: type) -> str:
    """The listing of `crossbert train --help`: one line a key (default, then comment), a header a section."""
    lines, section = [], None
    for k in config_keys(cls):
        head = k.key.rsplit(".", 1)[0] if "." in k.key else None
        if head != section:
            section = head
            doc = section_doc(cls, head)
            lines.append(f"\n[{head}]" + (f"  {doc}" if doc else ""))
        cell = f"  {k.key}={yaml.safe_dump(k.default, default_flow_style=True).strip().removesuffix('...').strip()}"
        cell += f"  ({k.limit})" if k.limit else ""
        lines.append(f"{cell:44} {k.description}" if k.description else cell)
    return "\n".join(lines).lstrip("\n")


def dump_yaml(obj: Any) -> str:
    return yaml.safe_dump(to_dict(obj) if dataclasses.is_dataclass(obj) else obj, sort_keys=False)


def diff_dicts(a: dict, b: dict, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """Keys (dotted) whose values differ between two nested dicts."""
    out = []
    for k in sorted(set(a) | set(b)):
        key = f"{prefix}{k}"
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out.extend(diff_dicts(va, vb, key + "."))
        elif va != vb:
            out.append((key, va, vb))
    return out


def config_main(prog: str, cls: type[T], run, argv: list[str] | None = None) -> None:
    """`python -m MODULE [CONFIG] [key=value ...] [--debug]`: load the typed config and call `run` on it,
    a user's mistake as one line and exit 2 (crossbert_model.errors). The entry point of torchrun launches."""
    import sys

    from .errors import debug_requested, exit_on_user_error
    from .utils import set_offline_env

    set_offline_env()  # first, before any library reads its switch: offline unless CROSSBERT_ONLINE=1
    argv = sys.argv[1:] if argv is None else argv
    debug = debug_requested(argv)
    argv = [a for a in argv if a != "--debug"]
    from .logs import setup_logging

    setup_logging()
    path, overrides = (argv[0], argv[1:]) if argv and "=" not in argv[0] else (None, argv)
    with exit_on_user_error(prog, debug):
        run(load_config(cls, path, overrides))
