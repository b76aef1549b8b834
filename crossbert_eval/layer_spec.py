"""Which layers a probe, geometry or mteb stage reads: one typed value, parsed once where the user's text enters and
resolved against a model's depth in one place.

    spec = LayerSpec.parse("0,3,-1")     # all | last | N | N,M,... (or an int, or a list of ints)
    spec.indices(6)                      # [0, 3, 6]: 0 = the embedding output, -1 = the last layer
    str(spec)                            # '0,3,-1'

Where the text enters: a command-line option (its argparse type, crossbert_eval.cli) or a config field (the config
loader, crossbert_model.args, reads a field typed LayerSpec through LayerSpec.from_config, and writes it back as it was
given). Below that, sweep and zoo configs, ProbeSettings, GeometrySettings and MtebSettings hold a LayerSpec (their limit
LAYERS refuses anything else) and FrozenEncoder.layer_indices resolves it: nothing re-parses.
Light (no torch): config files are checked with it before anything heavy is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

from crossbert_model.errors import CrossbertError
from crossbert_model.limits import Check

# What a refused spec was expected to be: the one wording, whoever refuses it (the caller puts the option or field in front).
EXPECTED = "all, last or layer numbers N[,M,...] (0 = the embedding output, -1 = the last layer)"


class LayerSpecError(CrossbertError, ValueError):
    """A layer spec that is not all | last | N,M,..., or layers a model does not have: one line."""


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class LayerSpec:
    which: str  # "all", "last" or "numbers"
    numbers: tuple[int, ...] = ()  # which == "numbers": as given, negative ones counted from the last layer (-1)
    # as a config file or override wrote it ('all', 3, [0, 2], '0,-1'): written back as it was (to_config), so that a
    # sweep's config and the signatures hashed from it read the same before and after parsing
    given: object = field(default=None, compare=False, repr=False)

    ALL: ClassVar[LayerSpec]
    LAST: ClassVar[LayerSpec]

    def __post_init__(self) -> None:
        numbered = self.which == "numbers" and bool(self.numbers) and all(map(_is_int, self.numbers))
        if not (numbered or self.which in ("all", "last") and not self.numbers):
            raise LayerSpecError(
                f"LayerSpec({self.which!r}, {self.numbers!r}): expected 'all', 'last', or 'numbers' with layer numbers"
            )

    @classmethod
    def parse(cls, spec) -> LayerSpec:
        """'all', 'last', 'N' or 'N,M,...' (an int N, or a list of ints, as a YAML file gives them): the one parser of the
        grammar. LayerSpecError 'expected ..., got ...' for anything else."""
        if spec in ("all", "last"):
            return cls(spec)
        try:
            items = list(spec) if isinstance(spec, (list, tuple)) else [int(s) for s in str(spec).split(",")]
        except ValueError:
            items = []
        if not items or not all(map(_is_int, items)):
            raise LayerSpecError(f"expected {EXPECTED}, got {spec!r}")
        return cls("numbers", tuple(items))

    @classmethod
    def from_config(cls, value) -> LayerSpec:
        """A config field's value (crossbert_model.args reads typed fields through this): parsed, and kept as written."""
        return replace(cls.parse(value), given=value)

    def to_config(self):
        """The value as the config wrote it (its grammar's text for a spec built in code)."""
        return str(self) if self.given is None else self.given

    @classmethod
    def of(cls, *numbers: int) -> LayerSpec:
        """The spec of these layer numbers: LayerSpec.of(0, 6) is LayerSpec.parse('0,6')."""
        return cls("numbers", numbers)

    def indices(self, num_layers: int, model: str = "the model") -> list[int]:
        """The layer numbers of a model with `num_layers` blocks (hidden states 0..num_layers, 0 = the embedding
        output), in the order given: the one place a spec becomes numbers. LayerSpecError names the layers the
        model does not have, and its depth."""
        if self.which == "all":
            return list(range(num_layers + 1))
        if self.which == "last":
            return [num_layers]
        out = [i if i >= 0 else num_layers + 1 + i for i in self.numbers]
        bad = [given for given, i in zip(self.numbers, out) if not 0 <= i <= num_layers]
        if bad:
            raise LayerSpecError(f"layers {bad} out of range for {model}: it has layers 0 (embeddings) to {num_layers}")
        return out

    def __str__(self) -> str:
        """The spec as the grammar writes it: 'all', 'last', '0,3,-1'."""
        return ",".join(map(str, self.numbers)) if self.which == "numbers" else self.which


LayerSpec.ALL = LayerSpec("all")
LayerSpec.LAST = LayerSpec("last")

# The limit of every field that holds a layer spec: a config's (a sweep's or zoo's probe_layers, ..., parsed by the config
# loader through LayerSpec.from_config) and a settings object's (ProbeSettings.layers, ...): a LayerSpec, never text.
LAYERS = Check(
    lambda value: None if isinstance(value, LayerSpec) else "a LayerSpec (LayerSpec.parse('all|last|N,M,...'))",
    shown="all|last|N,M,...",
)
