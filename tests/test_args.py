"""The one typed loader (crossbert_model.args.from_dict): config files and task files read YAML through it;
its mistakes carry what went wrong, so each caller words them its own way."""

import re
from dataclasses import dataclass, field

import pytest

from crossbert_model.args import ConfigError, MissingKeys, UnknownKeys, WrongType, from_dict, load_config, required


@dataclass
class Inner:
    path: str = required()
    size: int = 1


@dataclass
class Outer:
    name: str
    inner: Inner | None = None
    ratio: float = 0.5
    tags: list[str] = field(default_factory=list)


def test_values_are_typed_and_nested_sections_become_dataclasses():
    cfg = from_dict(Outer, {"name": "a", "inner": {"path": "p"}, "ratio": 1, "tags": ["x"]})
    assert cfg == Outer("a", Inner("p", 1), 1.0, ["x"]) and isinstance(cfg.ratio, float)


def test_an_unknown_key_carries_where_the_keys_in_order_and_the_valid_ones():
    with pytest.raises(UnknownKeys) as e:
        from_dict(Outer, {"name": "a", "inner": {"path": "p", "zize": 2, "aa": 1}})
    assert (e.value.where, e.value.keys, e.value.valid) == ("inner", ["zize", "aa"], ["path", "size"])
    # a key close to a valid one names it ("did you mean")
    assert str(e.value) == "unknown config key(s) inner.aa, inner.zize (did you mean size?); valid keys under inner: path, size"


def test_missing_keys_are_fields_without_default_and_required_ones_absent_or_null():
    with pytest.raises(MissingKeys) as e:
        from_dict(Outer, {})
    assert e.value.keys == ["name"] and str(e.value) == "Outer: missing required key(s) name"
    with pytest.raises(MissingKeys) as e:
        from_dict(Outer, {"name": "a", "inner": {"path": None}})
    assert (e.value.where, e.value.keys, e.value.required) == ("inner", ["path"], ["path"])


def test_a_value_of_the_wrong_type_carries_the_expected_type_and_the_value():
    with pytest.raises(WrongType) as e:
        from_dict(Outer, {"name": "a", "inner": {"path": "p", "size": "big"}})
    assert (e.value.where, e.value.expected, e.value.value) == ("inner.size", int, "big")
    assert str(e.value) == "inner.size: expected int, got 'big'"
    with pytest.raises(WrongType, match=r"^inner: expected a mapping of Inner fields, got 'p'$"):
        from_dict(Outer, {"name": "a", "inner": "p"})
    with pytest.raises(WrongType, match=r"^tags\[1\]: expected str, got 3$"):
        from_dict(Outer, {"name": "a", "tags": ["x", 3]})


def test_a_bad_value_from_a_command_line_override_is_reported_as_that_override_not_as_the_files(tmp_path):
    from crossbert_model.train_config import TrainConfig

    config = tmp_path / "run.yaml"
    config.write_text("steps: 10\noptim: {lr: 0.001}\n")
    with pytest.raises(ConfigError, match=r"^command-line override 'steps=abc': steps: expected int, got 'abc'$"):
        load_config(TrainConfig, config, ["steps=abc"])
    with pytest.raises(ConfigError, match=r"^command-line override 'optim.lr=x': optim.lr: expected float"):
        load_config(TrainConfig, config, ["batch_size=4", "optim.lr=x"])
    config.write_text("steps: ten\n")  # the file's own value: the file is named
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(config))}: steps: expected int, got 'ten'$"):
        load_config(TrainConfig, config, ["batch_size=4"])
