"""Declared limits (crossbert_model.limits): every config field's range, choices or form is declared with the field and
checked by the one loader as it loads, the message naming the field and where its value came from (the YAML file or
the command-line override); every numeric command-line option takes its argparse type from a declared limit; the
relations between fields are declared once, in the class, naming the fields they relate."""

from __future__ import annotations

import argparse
import re
import typing
from pathlib import Path

import pytest
import yaml

from crossbert_eval.cli import build_parser, main
from crossbert_eval.sweep_config import SweepConfig
from crossbert_eval.sweep_plan import plan_runs
from crossbert_eval.zoo import ZooConfig, check_zoo_config
from crossbert_model.args import ConfigError, deep_merge, is_section, load_config
from crossbert_model.data_args import DataArgs
from crossbert_model.errors import USER_ERROR_EXIT
from crossbert_model.limits import Limit, check_limits, field_hints, limits_in, relations_of
from crossbert_model.train_config import ModelArgs, TrainConfig, validate_config

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "configs/train/tiny_mlm.yaml"
CONFIGS = (TrainConfig, SweepConfig, ZooConfig)  # every config `load_config` reads (crossbert train / sweep / zoo)

# The fields with no limit of their own, each on purpose: any value of the type is taken here, and where something
# further is asked of it, that is checked where the value is used (which names the field too).
UNLIMITED = {
    "DataArgs.corpus": "a file, folder or hf: id; the data pipeline names it when it is not there",
    "DataArgs.cache_dir": "any folder path (created when missing)",
    "DataArgs.data_root": "a folder path; crossbert_model.utils.data_root refuses a missing one",
    "ObjectiveSpec.model": "ModelArgs fields of the objective's runs, checked as their model section by plan_runs",
    "ObjectiveSpec.train": "TrainConfig overrides of the objective's runs, checked as each run's config by plan_runs",
    "SweepConfig.train": "TrainConfig overrides of every run, checked as each run's config by plan_runs",
    "SweepConfig.size_overrides": "TrainConfig overrides per size, checked as each run's config by plan_runs",
    "SweepConfig.probe_tasks": "task names, families or 'all': resolved against the task files by check_tasks",
    "SweepConfig.geometry_tasks": "task names, families or 'all': resolved against the task files by check_tasks",
    "SweepConfig.mteb_tasks": "mteb task names: resolved against the task files and mteb, under data_root, by check_tasks",
    "SweepConfig.data_root": "a folder path; crossbert_model.utils.data_root refuses a missing one",
    "SubmititArgs.folder": "any folder path",
    "SubmititArgs.partition": "a SLURM partition: the cluster's to accept",
    "SubmititArgs.slurm": "further submitit parameters: submitit's update_parameters checks them (crossbert_eval.launcher)",
    "ZooConfig.probe_tasks": "task names, families or 'all': resolved against the task files by check_zoo_config",
    "ZooConfig.geometry_tasks": "task names, families or 'all': resolved against the task files by check_zoo_config",
    "ZooConfig.mteb_tasks": "mteb task names: resolved against the task files and mteb by preflight",
    "ZooConfig.features_dir": "any folder path (a feature cache zoos may share)",
    "ZooConfig.data_root": "a folder path; crossbert_model.utils.data_root refuses a missing one",
}


def _config_classes() -> list[type]:
    """Every dataclass a config file can hold: the configs and their sections (nested, or in lists), each once."""
    found: list[type] = []

    def visit(cls: type) -> None:
        if cls in found:
            return
        found.append(cls)
        for tp in field_hints(cls).values():
            for inner in _types_within(tp):
                if is_section(inner):
                    visit(inner)

    for cls in CONFIGS:
        visit(cls)
    return found


def _types_within(tp) -> list:
    """The type, and every type inside it (Optional, list items, Annotated)."""
    base, _ = limits_in(tp)
    return [base, *(t for arg in typing.get_args(base) for t in _types_within(arg))]


def _has_limit(tp) -> bool:
    """A declared limit on the field, or on each item of a list field; a bool's limit is its type."""
    return any(limits_in(t)[1] for t in [tp, *typing.get_args(limits_in(tp)[0])]) or bool in _types_within(tp)


def test_every_config_field_declares_its_limit_or_is_a_listed_exception():
    # catches: a field added with a bare type, whose out-of-range value nothing refuses (or something refuses
    # far from the field, an hour into a run); and an exception left listed after the field got its limit
    classes = _config_classes()
    assert {
        "TrainConfig",
        "ModelArgs",
        "DataArgs",
        "OptimArgs",
        "SweepConfig",
        "ObjectiveSpec",
        "SubmititArgs",
        "ZooConfig",
        "ZooModel",
    } <= {c.__name__ for c in classes}
    limited, unlimited = [], []
    for cls in classes:
        for name, tp in field_hints(cls).items():
            if any(is_section(t) for t in _types_within(tp)) and not limits_in(tp)[1]:
                continue  # a nested section: its own fields are walked
            (limited if _has_limit(tp) else unlimited).append(f"{cls.__name__}.{name}")
    assert sorted(set(unlimited) - set(UNLIMITED)) == [], (
        "fields with no declared limit (declare one, or list it with the reason)"
    )
    assert sorted(set(UNLIMITED) - set(unlimited)) == [], "listed as unlimited, but the field has a limit now (or is gone)"
    assert len(limited) >= 115  # when written: 105 declared, and 10 bools whose type is their limit


def test_each_relation_names_fields_of_its_own_class():
    # catches: a relation whose field was renamed away (it would name a key the user cannot find)
    relations = {cls.__name__: relations_of(cls) for cls in _config_classes()}
    assert relations["TrainConfig"] and relations["ModelArgs"] and relations["SweepConfig"]
    for cls in _config_classes():
        for fields, method in relations_of(cls):
            assert set(fields) <= set(field_hints(cls)), (cls.__name__, method.__name__, fields)


# -- refused at the edge, naming the field and where its value came from ---------------------------------------------


@pytest.mark.parametrize(
    "cls, config, yaml_text, override, field, expected",
    [
        (
            TrainConfig,
            TINY,
            "data: {split_seed: -1}\n",
            "data.split_seed=-1",
            "config field 'data.split_seed'",
            r"an integer from 0 to 2\*\*63 - 1, got -1",
        ),
        (
            TrainConfig,
            TINY,
            "data: {num_workers: 0}\n",
            "data.num_workers=0",
            "config field 'data.num_workers'",
            "a positive integer or null, got 0",
        ),
        (
            TrainConfig,
            TINY,
            "data: {text_field: ''}\n",
            "data.text_field=' '",
            "config field 'data.text_field'",
            "a non-empty string, got ",
        ),
        (
            SweepConfig,
            REPO / "configs/sweep/cpu_small.yaml",
            "report_every_s: -5\n",
            "report_every_s=-5",
            "sweep field 'report_every_s'",
            "a number of seconds >= 0, got -5",
        ),
        (
            SweepConfig,
            REPO / "configs/sweep/cpu_small.yaml",
            "batch_size: 0\n",
            "batch_size=0",
            "sweep field 'batch_size'",
            "a positive integer, got 0",
        ),
        (
            ZooConfig,
            REPO / "configs/zoo/offline.yaml",
            "models: [{model: minilm, name: ''}]\n",
            "models=[{model: minilm, name: ''}]",
            "zoo field 'models[0] (minilm).name'",
            "a display name or null, got ''",
        ),
    ],
)
def test_a_value_no_check_refused_before_is_refused_in_one_line_naming_its_field_and_source(
    tmp_path, cls, config, yaml_text, override, field, expected
):
    # catches: a field whose limit nothing checked (these passed load_config and the command's own checks, and
    # failed, or silently misbehaved, only once the run was under way)
    def load_and_check(path, overrides):
        cfg = load_config(cls, path, overrides)
        {TrainConfig: validate_config, SweepConfig: plan_runs, ZooConfig: check_zoo_config}[cls](cfg)

    yaml_file = tmp_path / "config.yaml"  # the shipped config with the bad value in it
    yaml_file.write_text(yaml.safe_dump(deep_merge(yaml.safe_load(Path(config).read_text()), yaml.safe_load(yaml_text))))
    with pytest.raises(ConfigError) as from_file:
        load_and_check(yaml_file, [])
    assert re.fullmatch(rf"{re.escape(str(yaml_file))}: {re.escape(field)}: expected {expected}.*", str(from_file.value))
    with pytest.raises(ConfigError) as from_override:
        load_and_check(config, [override])
    assert re.fullmatch(
        rf"command-line override {re.escape(repr(override))}: {re.escape(field)}: expected {expected}.*", str(from_override.value)
    )
    assert "\n" not in str(from_file.value) + str(from_override.value)


def test_a_limit_error_names_the_override_that_set_the_value_else_the_file(tmp_path):
    # catches: a refused value blamed on the YAML file when the command line set it, or the other way round
    config = tmp_path / "run.yaml"
    config.write_text("optim: {lr: -1}\nsteps: 10\n")
    with pytest.raises(
        ConfigError, match=rf"^{re.escape(str(config))}: config field 'optim.lr': expected a positive number, got -1.0$"
    ):
        load_config(TrainConfig, config, ["steps=20"])
    with pytest.raises(
        ConfigError, match=r"^command-line override 'optim={lr: 0}': config field 'optim.lr': expected a positive number"
    ):
        load_config(TrainConfig, None, ["steps=20", "optim={lr: 0}"])  # an override of the section above the key
    with pytest.raises(
        ConfigError, match=r"^command-line override 'steps=0': config field 'steps': expected a positive integer, got 0$"
    ):
        load_config(TrainConfig, config, ["optim.lr=1e-3", "steps=0"])
    assert load_config(TrainConfig, config, ["optim.lr=1e-3"]).optim.lr == 1e-3  # the override's good value replaces the file's


def test_a_config_built_in_code_is_checked_by_the_same_declarations():
    # catches: a limit only the loader knows, so that a config made in code (a sweep's resolved runs, the tests,
    # the benches) skips it
    with pytest.raises(ConfigError, match=r"^config field 'data.split_seed': expected an integer from 0 to 2\*\*63 - 1, got -1$"):
        validate_config(TrainConfig(data=DataArgs(split_seed=-1)))
    cfg = load_config(SweepConfig, REPO / "configs/sweep/cpu_small.yaml")
    cfg.sizes.append("nano")
    with pytest.raises(ConfigError, match=r"^sweep field 'sizes': the entry 'nano' is given twice"):
        check_limits(cfg)


def test_the_model_sections_limits_word_a_refusal_as_crossbert_config_does():
    # catches: the model section and CrossBertConfig (crossbert_model.config, which travels alone inside checkpoints
    # and keeps its own checks) drifting apart: a value one refuses that the other takes, or other words for it
    from crossbert_model.config import check_model_values

    good = {
        "mask_ratio": 0.5,
        "mlm_mask_prob": 0.5,
        "mlm_random_prob": 0.0,
        "mlp_type": "gelu",
        "norm_type": "layernorm",
        "embedding_init_std": None,
        "predictor_positions": "rotary",
    }
    samples = {
        "mask_ratio": [0.0, 0.3, 1.0, 1.5],
        "mlm_mask_prob": [-0.1, 0.0, 1.0, 1.2],
        "mlm_random_prob": [-0.5, 0.0, 0.5, 2.0],
        "mlp_type": ["gelu", "swiglu", "relu"],
        "norm_type": ["rmsnorm", "batchnorm"],
        "embedding_init_std": [0.0, 0.02, -1.0],
        "predictor_positions": ["rotary", "encoder", "queries"],
    }
    hints = field_hints(ModelArgs)
    for name, values in samples.items():
        (limit,) = limits_in(hints[name])[1]
        for value in values:
            with_value = {**good, name: value}
            try:
                check_model_values(
                    **{k: v for k, v in with_value.items() if k != "predictor_positions"},
                    section="model.",
                    predictor_positions=with_value["predictor_positions"],
                    absolute_positions=True,
                )
                config_says = None
            except ValueError as e:
                config_says = str(e)
            try:
                limit.check(value, f"model.{name}", optional=name in ("mask_ratio", "embedding_init_std"))
                section_says = None
            except ConfigError as e:
                section_says = re.sub(r" \(did you mean .*\?\)$", "", str(e))  # the section's hint is its own addition
            assert section_says == config_says, (name, value)


# -- crossbert train --help ------------------------------------------------------------------------------------------


def test_train_help_shows_each_keys_limit_beside_its_default(capsys):
    # catches: a limit the user meets only as an error, not in the listing of the keys
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if "=" in line and line.startswith("  ")}
    assert "(> 0)" in lines["optim.lr=0.001"] and "peak learning rate" in lines["optim.lr=0.001"]
    assert "(cosine|linear|constant)" in lines["optim.schedule=cosine"]
    assert "(>= 3)" in lines["data.seq_len=128"] and "(0 <= x < 1)" in lines["data.val_fraction=0.02"]
    assert "(0 < x < 1)" in lines["model.mask_ratio=null"] and "(a folder name)" in lines["name=run"]


# -- command-line options --------------------------------------------------------------------------------------------


def _options() -> list[tuple[str, argparse.Action]]:
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # noqa: SLF001
    return [(command, action) for command, sub in commands.items() for action in sub._actions]  # noqa: SLF001


def test_every_typed_option_takes_its_type_from_a_declared_limit():
    # catches: a numeric option typed `int` / `float` (any number passes argparse, to fail, or not, deep in the command)
    typed = [
        (command, action.option_strings[0]) for command, action in _options() if action.type is not None and action.option_strings
    ]
    bare = [
        (command, option) for command, action in _options() for option in action.option_strings[:1] if action.type in (int, float)
    ]
    assert bare == []
    assert ("probe", "--seed") in typed and ("presets", "--seq-len") in typed and ("sweep", "--budget-s") in typed


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["probe", "no-such-model", "--tasks", "TREC", "--seed", "-1"],
            "argument --seed: expected an integer from 0 to 2**63 - 1, got '-1'",
        ),
        (["presets", "--seq-len", "2"], "argument --seq-len: expected an integer >= 3 ([CLS] + text + [SEP]), got '2'"),
        (
            ["probe", "no-such-model", "--tasks", "TREC", "--batch-size", "0"],
            "argument --batch-size: expected a positive integer, got '0'",
        ),
        (["sweep", "no-such.yaml", "--budget-s", "nan"], "argument --budget-s: expected a positive number of seconds, got 'nan'"),
    ],
)
def test_an_option_out_of_its_limit_is_refused_by_argparse_in_one_line(argv, expected, capsys, monkeypatch):
    # catches: an option whose limit is checked late (after a model loads) or not at all
    monkeypatch.delenv("CROSSBERT_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == USER_ERROR_EXIT and len(err.strip().splitlines()) == 1 and expected in err, err


def test_a_declared_limit_is_a_limit_object_everywhere():
    # catches: a stray non-Limit object in an Annotated field (the loader would skip it silently)
    for cls in _config_classes():
        for name, tp in field_hints(cls).items():
            for t in [tp, *typing.get_args(limits_in(tp)[0])]:
                if typing.get_origin(t) is typing.Annotated:
                    assert all(isinstance(m, Limit) for m in typing.get_args(t)[1:]), (cls.__name__, name)
