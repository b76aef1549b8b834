"""Declared limits: what values a config field (or a command-line option) takes, declared where the field is.

    lr: Annotated[float, POSITIVE] = 1e-3                                    # peak learning rate
    schedule: Annotated[str, OneOf("cosine", "linear", "constant")] = "cosine"
    objective: Annotated[str, OneOf(lazy="crossbert_model.objectives:objective_names", shown="an objective")] = "mlm"
    seeds: Annotated[list[Annotated[int, SEED]], NON_EMPTY, Unique()] = ...   # each item, and the list

A limit is a field's range, choices or form: the one loader (crossbert_model.args.from_dict, the edge every config
file and command-line override passes) checks each limit as it builds the config, in the wording of
crossbert_model.args.require ("config field 'optim.lr': expected a positive number, got -1", or "sweep field ..."
for a class whose FIELD_KIND says so), and load_config puts in front where the value came from (the YAML file, or the
command-line override that set it). `check_limits(obj)` checks the same declarations on a config built in code.
A limit whose check imports a heavy module (`heavy`: torch, transformers) is checked after every light one, so a
mistyped light value is answered before torch loads.

What relates two fields (batch_size a multiple of grad_accum, a budget that needs its number) is a method of the
config class marked `@relation("batch_size", "grad_accum")`, declared once there and checked by `check_relations`
(the validate functions: crossbert_model.train_config.validate_config, the sweep's plan_runs, the zoo's
check_zoo_config), after the limits.

A command-line option takes its limit from here as well: `type=option(POSITIVE_INT)` or `type=option(limit_of(DataArgs,
"seq_len"))`, so that argparse refuses `--batch-size 0` in one line naming the option, before any model loads.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import types
import typing
from typing import Any, Callable

from .args import (
    FOLDER_NAME,
    FOLDER_NAME_EXPECTED,
    ConfigError,
    annotated_hints,
    close_matches,
    config_keys,
    is_section,
    item_key,
)

INF = math.inf


class Limit:
    """What values a field takes. `ok(value)` for a value of the field's type (None never reaches it for an optional
    field); `expected`: the words of a refusal ("a positive number"); `shown`: its short form in `crossbert train --help`."""

    heavy = False  # checking it imports torch or transformers: checked after every light limit
    expected = ""
    shown = ""
    or_null = True  # an optional field's refusal says "... or null"

    def ok(self, value: Any) -> bool:
        raise NotImplementedError

    def hint(self, value: Any) -> str:
        return ""

    def refusal(self, value: Any, optional: bool = False) -> str | None:
        """None for a value within the limit; else what follows `KIND 'KEY': ` in the message."""
        if self.ok(value):
            return None
        return f"expected {self.expected}{' or null' if optional and self.or_null else ''}, got {value!r}{self.hint(value)}"

    def check(self, value: Any, key: str, kind: str = "config field", optional: bool = False) -> None:
        """Raise ConfigError naming the field (`key`, dotted as the config file writes it) unless `value` is within."""
        if optional and value is None:
            return
        problem = self.refusal(value, optional)
        if problem is not None:
            raise ConfigError(f"{kind} {key!r}: {problem}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.shown or self.expected})"


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class Range(Limit):
    """A number (`integer`: an integer) from `low` to `high`, each end closed unless said open; `words` / `shown`
    replace the generated wording ("a positive integer", "a number in [0, 1)") and its short form ("> 0", "0 <= x < 1")."""

    def __init__(
        self,
        low: float = -INF,
        high: float = INF,
        *,
        low_open: bool = False,
        high_open: bool = False,
        integer: bool = False,
        words: str | None = None,
        shown: str | None = None,
        or_null: bool = True,
    ):
        self.low, self.high, self.low_open, self.high_open, self.integer = low, high, low_open, high_open, integer
        self.expected, self.shown, self.or_null = words or self._words(), shown or self._shown(), or_null

    def ok(self, value) -> bool:
        if not (_is_int(value) if self.integer else _is_number(value)):
            return False
        above = value > self.low if self.low_open else value >= self.low
        return above and (value < self.high if self.high_open else value <= self.high)

    def _words(self) -> str:
        noun = "an integer" if self.integer else "a number"
        if (
            self.high == INF
            and self.low == 0
            and self.low_open
            or self.integer
            and self.high == INF
            and self.low == 1
            and not self.low_open
        ):
            return "a positive integer" if self.integer else "a positive number"
        if self.high == INF:
            return f"{noun} {'>' if self.low_open else '>='} {self.low:g}"
        if self.low == -INF:
            return f"{noun} {'<' if self.high_open else '<='} {self.high:g}"
        return f"{noun} in {self._interval()}"

    def _interval(self) -> str:
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"

    def _shown(self) -> str:
        """'> 0', '>= 1', '0 <= x < 1': what `--help` shows beside the default."""
        if self.high == INF:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.low == -INF:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return f"{self.low:g} {'<' if self.low_open else '<='} x {'<' if self.high_open else '<='} {self.high:g}"


def _resolve(path: str) -> Any:
    """'package.module:name' (a value, or a function called without arguments) -> its value, imported when needed."""
    module, _, name = path.partition(":")
    value = getattr(importlib.import_module(module), name)
    return value() if callable(value) else value


class OneOf(Limit):
    """One of `choices`; or of those `lazy` names ('package.module:NAME', a collection or a function returning one),
    imported at the first check (an objective name from the registry, which imports torch: `heavy`). `shown`: the
    help's words for a lazy set, which `--help` does not import."""

    def __init__(self, *choices, lazy: str | None = None, shown: str | None = None, heavy: bool | None = None):
        if bool(choices) == bool(lazy):
            raise TypeError("OneOf: give the choices, or a lazy 'module:name' of them")
        self._choices, self.lazy = tuple(choices) or None, lazy
        self.heavy = bool(lazy) if heavy is None else heavy
        self.shown = shown or "|".join(map(str, choices))

    @property
    def choices(self) -> tuple:
        if self._choices is None:
            self._choices = tuple(_resolve(self.lazy))
        return self._choices

    @property
    def expected(self) -> str:
        return "one of " + ", ".join(map(str, self.choices))

    def ok(self, value) -> bool:
        return isinstance(value, typing.Hashable) and value in self.choices

    def hint(self, value) -> str:
        matches = close_matches(value, map(str, self.choices)) if isinstance(value, str) else []
        return f" (did you mean {' or '.join(matches)}?)" if matches else ""


class SomeOf(OneOf):
    """A list of one or more of `choices` (an entry given twice is not refused): probes, poolings, feature transforms."""

    @property
    def expected(self) -> str:
        return "one or more of " + ", ".join(map(str, self.choices))

    def ok(self, value) -> bool:
        return isinstance(value, list) and bool(value) and all(OneOf.ok(self, v) for v in value)

    def hint(self, value) -> str:
        bad = [v for v in value if isinstance(v, str) and v not in self.choices] if isinstance(value, list) else []
        return OneOf.hint(self, bad[0]) if bad else ""


class FolderNameLimit(Limit):
    """One safe path segment: a run, sweep, zoo or objective name that becomes a folder name (crossbert_model.args.FOLDER_NAME)."""

    expected, shown = FOLDER_NAME_EXPECTED, "a folder name"

    def ok(self, value) -> bool:
        return isinstance(value, str) and FOLDER_NAME.fullmatch(value) is not None and value != ".."


class Text(Limit):
    """A string with something in it (not '' nor blanks)."""

    def __init__(self, words: str = "a non-empty string", shown: str = ""):
        self.expected, self.shown = words, shown

    def ok(self, value) -> bool:
        return isinstance(value, str) and bool(value.strip())


class NonEmpty(Limit):
    """A list with at least one entry."""

    def __init__(self, words: str = "a list of one or more", got: str = "an empty one"):
        self.expected, self.got, self.shown = words, got, "1 or more"

    def ok(self, value) -> bool:
        return bool(value)

    def refusal(self, value, optional: bool = False) -> str | None:
        return None if self.ok(value) else f"expected {self.expected}, got {self.got}"


class Unique(Limit):
    """No entry twice (`key`: what of an entry must differ, e.g. an objective's name; `what` names it)."""

    def __init__(self, key: Callable[[Any], Any] | None = None, what: str = "entry"):
        self.key, self.what, self.expected, self.shown = key, what, f"each {what} once", "each once"

    def _twice(self, value) -> Any:
        seen = set()
        for item in value if isinstance(value, list) else ():
            name = self.key(item) if self.key else item
            if name in seen:
                return name
            seen.add(name)
        return None

    def ok(self, value) -> bool:
        return self._twice(value) is None

    def refusal(self, value, optional: bool = False) -> str | None:
        twice = self._twice(value)
        return None if twice is None else f"the {self.what} {twice!r} is given twice; each must be given once"


class Check(Limit):
    """A limit a function states: `problem(value)` returns None, or the words of what was expected."""

    def __init__(self, problem: Callable[[Any], str | None], shown: str, heavy: bool = False):
        self.problem, self.shown, self.heavy, self.expected = problem, shown, heavy, shown

    def refusal(self, value, optional: bool = False) -> str | None:
        words = self.problem(value)
        return None if words is None else f"expected {words}, got {value!r}"

    def ok(self, value) -> bool:
        return self.problem(value) is None


class OutsideDataRoot(Limit):
    """A folder outputs go to: never inside the data root (crossbert_model.utils.check_outside_data_root)."""

    expected, shown = "a folder outside the data root", "outside the data root"

    def ok(self, value) -> bool:
        try:
            self.check(value, "value")
        except ConfigError:
            return False
        return True

    def check(self, value, key: str, kind: str = "config field", optional: bool = False) -> None:
        from .errors import CrossbertError
        from .utils import check_outside_data_root

        if optional and value is None:
            return
        try:
            check_outside_data_root(value, f"{kind} {key!r}")
        except CrossbertError as e:
            raise ConfigError(str(e)) from None


class DottedKeys(Limit):
    """A list of dotted keys of a config class (`lazy` 'package.module:Class'): optim.lr, model.preset, ..."""

    expected, shown = "dotted config keys such as optim.lr", "config keys"

    def __init__(self, lazy: str):
        self.lazy = lazy

    def keys(self) -> list[str]:
        """Every key and every section (`optim` stands for every key under it)."""
        module, _, name = self.lazy.partition(":")
        leaves = [k.key for k in config_keys(getattr(importlib.import_module(module), name))]
        sections = [key.rsplit(".", i)[0] for key in leaves for i in range(1, key.count(".") + 1)]
        return list(dict.fromkeys(leaves + sections))

    def ok(self, value) -> bool:
        return isinstance(value, list) and all(isinstance(k, str) for k in value) and set(value) <= set(self.keys())

    def refusal(self, value, optional: bool = False) -> str | None:
        if self.ok(value):
            return None
        unknown = [k for k in value if k not in self.keys()] if isinstance(value, list) else []
        if unknown and isinstance(unknown[0], str):
            hint = close_matches(unknown[0], self.keys())
            return f"expected {self.expected}, got unknown key {unknown[0]!r}" + (
                f" (did you mean {' or '.join(hint)}?)" if hint else ""
            )
        return f"expected {self.expected}, got {value!r}"


class SameAs(Limit):
    """The limits another declared field has ('package.module:Class.field'): a sweep objective's mask_ratio is its
    runs' model.mask_ratio."""

    def __init__(self, lazy: str):
        self.lazy, self.shown = lazy, f"as {lazy.split(':')[-1]}"

    @property
    def heavy(self) -> bool:
        return any(limit.heavy for limit in self.limits())

    @property
    def expected(self) -> str:
        return " and ".join(limit.expected for limit in self.limits())

    def limits(self) -> list[Limit]:
        module, _, dotted = self.lazy.partition(":")
        cls_name, field_name = dotted.split(".")
        hint = annotated_hints(getattr(importlib.import_module(module), cls_name))[field_name]
        return limits_in(hint)[1]

    def check(self, value, key: str, kind: str = "config field", optional: bool = False) -> None:
        for limit in self.limits():
            limit.check(value, key, kind, optional)

    def ok(self, value) -> bool:
        return all(limit.ok(value) for limit in self.limits())


class TrueOrFalse(Limit):
    """A bool field's limit is its type; on a config built in code (check_limits) it is checked in these words."""

    expected = "true or false"

    def ok(self, value) -> bool:
        return isinstance(value, bool)


# Named limits: one home for each limit a config field and a command-line option share.
POSITIVE_INT = Range(1, integer=True)
NON_NEGATIVE_INT = Range(0, integer=True)
POSITIVE = Range(0, low_open=True)
FRACTION = Range(0, 1)  # [0, 1]
SECONDS = Range(0, low_open=True, words="a positive number of seconds", shown="> 0 s")
# Seeds: torch.manual_seed takes at most 64 bits, numpy's SeedSequence no negative number.
MAX_SEED = 2**63 - 1
SEED = Range(0, MAX_SEED, integer=True, words="an integer from 0 to 2**63 - 1", shown="0 <= x < 2**63")
FOLDER_NAME_LIMIT = FolderNameLimit()
# The layers a probe, geometry or mteb stage reads: the grammar's one parser (light), in its one wording.
NON_EMPTY = NonEmpty()
BOOL = TrueOrFalse()


# -- reading the declarations -------------------------------------------------------------------------------------


def limits_in(tp: Any) -> tuple[Any, list[Limit]]:
    """(the type without its Annotated limits, the limits): `Annotated[int | None, POSITIVE_INT]` -> (int | None, [POSITIVE_INT])."""
    if typing.get_origin(tp) is typing.Annotated:
        base, *metas = typing.get_args(tp)
        return base, [m for m in metas if isinstance(m, Limit)]
    return tp, []


def is_optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def _without_none(tp: Any) -> Any:
    if is_optional(tp):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        return rest[0] if len(rest) == 1 else tp
    return tp


def field_hints(cls: type) -> dict[str, Any]:
    """{field: its annotation with the limits}, for every field the loader sets."""
    hints = annotated_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def limit_of(cls: type, name: str) -> Limit:
    """The one limit a field declares (a command-line option that sets the same value takes it: `option(limit_of(...))`)."""
    (limit,) = limits_in(field_hints(cls)[name])[1]
    return limit


def field_kind(cls: type) -> str:
    """How messages name a field of this config: 'config field' (the training config), 'sweep field', 'zoo field'."""
    return getattr(cls, "FIELD_KIND", "config field")


def check_limits(obj: Any, kind: str | None = None) -> None:
    """Every declared limit of a config built in code (what the loader checks of a loaded one), nested sections
    and lists of sections included, light limits first; ConfigError naming the first field out of its limit."""
    heavy: list[Callable[[], None]] = []
    _check_fields(obj, "", kind or field_kind(type(obj)), heavy)
    for check in heavy:
        check()


def _check_fields(obj: Any, prefix: str, kind: str, heavy: list) -> None:
    for name, tp in field_hints(type(obj)).items():
        _check_value(getattr(obj, name), tp, prefix + name, kind, heavy)


def _check_value(value: Any, tp: Any, key: str, kind: str, heavy: list) -> None:
    base, limits = limits_in(tp)
    optional = is_optional(base)
    if optional and value is None:
        return
    base = _without_none(base)
    if base is bool:
        limits = [BOOL, *limits]
    for limit in limits:
        if limit.heavy:
            heavy.append(lambda limit=limit: limit.check(value, key, kind, optional))
        else:
            limit.check(value, key, kind, optional)
    if is_section(base) and is_section(value):
        _check_fields(value, key + ".", kind, heavy)
    elif typing.get_origin(base) is list and isinstance(value, list):
        (item,) = typing.get_args(base) or (Any,)
        for i, v in enumerate(value):
            _check_value(v, item, item_key(key, i, limits_in(item)[0], v), kind, heavy)


# -- relations between fields -------------------------------------------------------------------------------------


def relation(*fields: str) -> Callable:
    """Mark a config class's method as the check of what relates `fields` (its own, by name): called with the
    section's prefix ('' at top level, 'model.' for the model section) by check_relations; raises ConfigError."""
    if not fields:
        raise TypeError("relation: name the fields it relates")

    def mark(method: Callable) -> Callable:
        method.relates = fields
        return method

    return mark


def relations_of(cls: type) -> list[tuple[tuple[str, ...], Callable]]:
    """[(the fields it relates, the method)] of a config class, in declaration order."""
    return [(m.relates, m) for m in vars(cls).values() if callable(m) and hasattr(m, "relates")]


def check_relations(obj: Any, prefix: str = "") -> None:
    """Each section's relations (nested sections first), then the class's own: the first broken one raises."""
    for name, tp in field_hints(type(obj)).items():
        value = getattr(obj, name)
        if is_section(value) and is_section(_without_none(limits_in(tp)[0])):
            check_relations(value, f"{prefix}{name}.")
    for _, method in relations_of(type(obj)):
        method(obj, prefix)


# -- command-line options -----------------------------------------------------------------------------------------


def option(limit: Limit, convert: Callable[[str], Any] | None = None) -> Callable[[str], Any]:
    """An argparse `type=` from a limit: the text converted (int for an integer range, else float), refused by
    argparse in one line naming the option (`argument --batch-size: expected a positive integer, got '0'`)."""
    import argparse

    convert = convert or (int if getattr(limit, "integer", False) else float if isinstance(limit, Range) else str)

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {limit.expected}, got {text!r}") from None
        if not limit.ok(value):
            raise argparse.ArgumentTypeError(f"expected {limit.expected}, got {text!r}")
        return value

    parse.__name__ = limit.shown or type(limit).__name__
    return parse
