"""The settings of a probe, geometry or mteb run (ProbeSettings, GeometrySettings, MtebSettings) checked against the
limits declared on their fields (crossbert_model.limits: the one home of each limit), a refusal naming the field as the
library knows it:

    probe setting 'k': expected a positive integer, got 0

Nothing here knows a command-line option: `crossbert probe` says a refused setting with the option that sets it
(crossbert_eval.cli.OPTION_OF, the one table of them), and a sweep or zoo, whose config fields are checked by the
loader before any settings are built, never sees one.
"""

from __future__ import annotations

import typing
from typing import Any

from crossbert_model.args import ConfigError
from crossbert_model.limits import BOOL, field_hints, field_kind, is_optional, limits_in


class SettingError(ConfigError):
    """A setting out of its declared limit: `kind` ('probe setting'), `field` ('k') and `problem` ('expected a positive
    integer, got 0'), so that a caller can say it its own way (the command line: with the option)."""

    def __init__(self, kind: str, field: str, problem: str):
        self.kind, self.field, self.problem = kind, field, problem
        super().__init__(f"{kind} {field!r}: {problem}")


def check_settings(settings: Any) -> None:
    """Every declared limit of a settings dataclass, field by field; SettingError naming the first field out of its limit
    (its kind is the class's FIELD_KIND)."""
    kind = field_kind(type(settings))
    for name, tp in field_hints(type(settings)).items():
        base, limits = limits_in(tp)
        value, optional = getattr(settings, name), is_optional(base)
        if optional and value is None:
            continue
        if bool in (base, *typing.get_args(base)):
            limits = [BOOL, *limits]
        for limit in limits:
            problem = limit.refusal(value, optional)
            if problem is not None:
                raise SettingError(kind, name, problem)
