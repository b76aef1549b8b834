"""Parse once at the edge: a layer spec is one typed value (crossbert_eval.layer_spec.LayerSpec), parsed where the user's text
enters (a command-line option, a config field) and resolved against a model's depth in one place; each stage's settings
object is built once by its caller and handed down whole; the library names a refused setting by its field, and the command
line says it with its option (crossbert_eval.cli.OPTION_OF, the one table)."""

from __future__ import annotations

import dataclasses

import pytest

from crossbert_eval import cli
from crossbert_eval.cli import main
from crossbert_eval.layer_spec import EXPECTED, LayerSpec, LayerSpecError
from crossbert_model.errors import USER_ERROR_EXIT

# -- the grammar: one parser, one resolver -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given, spec",
    [
        ("all", LayerSpec.ALL),
        ("last", LayerSpec.LAST),
        ("3", LayerSpec.of(3)),
        (3, LayerSpec.of(3)),
        ("-1", LayerSpec.of(-1)),
        ("0,3,-1", LayerSpec.of(0, 3, -1)),
        (" 1, 2", LayerSpec.of(1, 2)),
        ([0, 2], LayerSpec.of(0, 2)),
    ],
)
def test_the_grammar_parses_into_one_typed_value_that_writes_itself_back(given, spec):
    # catches: a form the grammar always took (a YAML number, a list) refused, or a spec whose text form parses otherwise
    assert LayerSpec.parse(given) == spec
    assert LayerSpec.parse(str(spec)) == spec


@pytest.mark.parametrize("given", ["", "abc", "1,x", "first", [], ["a"], [1.0], True, 1.5, None, {"layers": 1}])
def test_a_spec_outside_the_grammar_is_refused_in_one_wording(given):
    with pytest.raises(LayerSpecError) as e:
        LayerSpec.parse(given)
    assert str(e.value) == f"expected {EXPECTED}, got {given!r}"


def test_indices_resolve_a_spec_against_the_depth_and_name_the_layers_a_model_lacks():
    assert LayerSpec.ALL.indices(2) == [0, 1, 2] and LayerSpec.LAST.indices(2) == [2]
    assert LayerSpec.of(0, -1, 3).indices(6) == [0, 6, 3]  # in the order given; -1 = the last layer
    with pytest.raises(LayerSpecError, match=r"^layers \[9, -9\] out of range for minilm: it has layers 0 \(embeddings\) to 6$"):
        LayerSpec.of(0, 9, -9).indices(6, "minilm")  # the layers as the user wrote them, not as counted from the end


# -- parsed once, at the command line, and the typed value reaching the encoder ---------------------------------------


@pytest.fixture
def parses(monkeypatch):
    """Every LayerSpec.parse call (the grammar's one parser), as (given, returned)."""
    calls, parse = [], LayerSpec.parse.__func__

    def counted(cls, spec):
        calls.append(spec)
        return parse(cls, spec)

    monkeypatch.setattr(LayerSpec, "parse", classmethod(counted))
    return calls


def test_one_probe_command_parses_its_layer_spec_once_and_the_encoder_gets_the_typed_value(parses, tmp_path, monkeypatch, capsys):
    # catches: the spec re-parsed on its way down (the settings, the runner and the encoder each parsed it: 3 times for one
    # command), or text reaching the encoder instead of the spec parsed at the command line
    from test_cli import _nano_model

    from crossbert_eval.encoders import FrozenEncoder
    from crossbert_model.readers import read_jsonl

    resolved, layer_indices = [], FrozenEncoder.layer_indices
    monkeypatch.setattr(FrozenEncoder, "layer_indices", lambda self, spec: resolved.append(spec) or layer_indices(self, spec))
    main(
        [
            "probe",
            _nano_model(tmp_path),
            "--tasks",
            "TREC",
            "--probe",
            "knn",
            "--layers",
            "0,2",
            "--max-train",
            "40",
            "--results",
            str(tmp_path / "r"),
            "--cache",
            str(tmp_path / "f"),
        ]
    )
    assert parses == ["0,2"]
    assert resolved == [LayerSpec.of(0, 2)] and isinstance(resolved[0], LayerSpec)
    assert {r["layer"] for r in read_jsonl(tmp_path / "r" / "results.jsonl")} == {0, 2}


def test_one_mteb_command_parses_its_layer_spec_once(parses, tmp_path, monkeypatch, capsys):
    from crossbert_eval import mteb_runner

    asked = []
    monkeypatch.setattr(
        mteb_runner, "run_mteb", lambda model, settings, **kw: asked.append(settings) or ([], mteb_runner.MtebRun(None, 0.0))
    )
    main(["mteb", "minilm", "--tasks", "STSBenchmark", "--layers", "0,2", "--out", str(tmp_path / "m")])
    assert parses == ["0,2"] and asked[0].layers == LayerSpec.of(0, 2)


# -- the library names the field; the command line, its option ----------------------------------------------------


# Settings fields no option of `crossbert probe` / `geometry` / `mteb` sets (a sweep's --limit caps max_eval).
NOT_OPTIONS = {"max_eval", "normalize"}


def test_every_setting_an_option_sets_is_in_the_one_table_and_the_table_names_real_options():
    # catches: a settings field added (or renamed) whose refusal the command line would say with no option, or a table
    # entry naming an option that is gone
    from crossbert_eval.geometry_runner import GeometrySettings
    from crossbert_eval.mteb_runner import MtebSettings
    from crossbert_eval.probe_runner import ProbeSettings

    fields = {f.name for cls in (ProbeSettings, GeometrySettings, MtebSettings) for f in dataclasses.fields(cls)}
    assert sorted(fields - NOT_OPTIONS - set(cli.OPTION_OF)) == []
    commands = cli.build_parser()._subparsers._group_actions[0].choices
    options = {
        o for c in ("probe", "geometry", "mteb", "export", "sweep") for a in commands[c]._actions for o in a.option_strings
    }
    assert sorted({o for o in cli.OPTION_OF.values() if o.startswith("--")} - options) == []


def test_a_refused_setting_is_said_with_its_option_on_the_command_line_and_with_its_field_elsewhere():
    from crossbert_eval.probe_runner import ProbeSettings
    from crossbert_eval.settings import SettingError
    from crossbert_model.errors import CrossbertError

    with pytest.raises(SettingError, match=r"^probe setting 'k': expected a positive integer, got 0$"):
        ProbeSettings(tasks=["TREC"], k=0)
    with pytest.raises(CrossbertError, match=r"^--k: expected a positive integer, got 0$"), cli.settings_as_options():
        ProbeSettings(tasks=["TREC"], k=0)
    with (
        pytest.raises(CrossbertError, match=r"^--feature-transform: expected one or more of raw, centred, whitened"),
        cli.settings_as_options(),
    ):
        ProbeSettings(tasks=["TREC"], feature_transforms=["centered"])


@pytest.mark.parametrize(
    "argv, says",
    [
        (["probe", "minilm", "--tasks", "TREC", "--k", "0"], "--k"),
        (["mteb", "minilm"], "--tasks: expected one or more mteb task names (or a benchmark), got none"),
    ],
)
def test_the_command_line_still_names_its_options(argv, says, tmp_path, capsys, monkeypatch):
    # catches: a library wording (probe setting 'k') leaking to the command line; an mteb run without tasks found out only
    # after its model was loaded
    from crossbert_eval.encoders import FrozenEncoder

    monkeypatch.delenv("CROSSBERT_DEBUG", raising=False)
    monkeypatch.setattr(FrozenEncoder, "load", lambda *a, **kw: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as exit_:
        main(
            [*argv, "--results", str(tmp_path / "r"), "--cache", str(tmp_path / "f")]
            + (["--out", str(tmp_path / "m")] if argv[0] == "mteb" else [])
        )
    err = capsys.readouterr().err
    assert exit_.value.code == USER_ERROR_EXIT and len(err.strip().splitlines()) == 1 and says in err, err
    assert "setting" not in err


# -- a sweep and a zoo: their config fields, mapped to the settings once ------------------------------------------------


def test_a_sweep_builds_each_stages_settings_once_from_its_config_fields(tmp_path):
    # catches: the plan copying settings under other names (max_probe_train, features_dir, mteb_layers) for the runners to
    # rebuild, or a layer spec passed down as text
    from crossbert_eval.folder_layout import SweepDir
    from crossbert_eval.mteb_runner import MtebSettings
    from crossbert_eval.probe_runner import ProbeSettings
    from crossbert_eval.sweep_config import SweepConfig
    from crossbert_eval.sweep_plan import evaluation_plan
    from crossbert_model.args import load_config

    cfg = load_config(
        SweepConfig,
        "configs/sweep/cpu_small.yaml",
        [
            f"out_dir={tmp_path}",
            "probe_layers=0,-1",
            "intermediate_layers=2",
            "mteb_layers=all",
            "max_probe_train=300",
            "limit=100",
        ],
    )
    final, earlier = (evaluation_plan(cfg, SweepDir(cfg.root), final) for final in (True, False))
    assert isinstance(final.probe, ProbeSettings) and isinstance(final.mteb, MtebSettings)
    assert (final.probe.layers, final.geometry.layers, final.mteb.layers) == (
        LayerSpec.of(0, -1),
        LayerSpec.of(0, -1),
        LayerSpec.ALL,
    )
    assert (earlier.probe.layers, earlier.geometry.layers, earlier.mteb.layers) == (LayerSpec.of(2),) * 3
    assert (final.probe.max_train, final.probe.max_eval) == (100, 100)  # max_probe_train capped by the limited sweep's limit
    assert final.probe.cache_dir == final.geometry.cache_dir == final.mteb.cache_dir == str(cfg.root / "features")
    assert final.mteb.pooling == cfg.poolings[0] and final.mteb.out_dir == str(cfg.root / "mteb")


def test_a_sweep_configs_layer_fields_are_parsed_once_at_load_and_written_back_as_given(parses, tmp_path):
    # catches: a layer field re-parsed by the plan's checks or when the settings are built (3 + 3 + 3 parses of three
    # fields before), or a typed field written back in another form (sweep.yaml and every run's signature would change)
    from crossbert_eval.folder_layout import SweepDir
    from crossbert_eval.sweep_config import SweepConfig
    from crossbert_eval.sweep_plan import completion_signature, evaluation_plan, plan_runs
    from crossbert_model.args import dump_yaml, load_config, to_dict

    overrides = [f"out_dir={tmp_path}", "probe_layers=0,-1", "intermediate_layers=2", "mteb_layers=[0, 2]"]
    cfg = load_config(SweepConfig, "configs/sweep/cpu_small.yaml", overrides)
    assert sorted(map(str, parses)) == ["0,-1", "2", "[0, 2]"]
    runs = plan_runs(cfg)
    for final in (True, False):
        evaluation_plan(cfg, SweepDir(cfg.root), final)
    assert len(parses) == 3
    written = {k: to_dict(cfg)[k] for k in ("probe_layers", "intermediate_layers", "mteb_layers")}
    assert written == {"probe_layers": "0,-1", "intermediate_layers": 2, "mteb_layers": [0, 2]}
    (tmp_path / "sweep.yaml").write_text(dump_yaml(cfg))
    reloaded = load_config(SweepConfig, tmp_path / "sweep.yaml")
    assert reloaded == cfg and completion_signature(reloaded, runs[0]) == completion_signature(cfg, runs[0])


@pytest.mark.parametrize(
    "override, field",
    [
        ("probe_layers=1,x", "probe_layers"),
        ("intermediate_layers=[a]", "intermediate_layers"),
        ("mteb_layers=true", "mteb_layers"),
    ],
)
def test_a_bad_layer_spec_in_a_sweep_config_is_named_as_its_config_field(override, field, tmp_path):
    from crossbert_eval.sweep_config import SweepConfig
    from crossbert_model.args import ConfigError, load_config

    with pytest.raises(ConfigError) as e:
        load_config(SweepConfig, "configs/sweep/cpu_small.yaml", [f"out_dir={tmp_path}", override])
    assert f"sweep field '{field}': expected {EXPECTED}, got " in str(e.value) and "--layers" not in str(e.value), str(e.value)


def test_a_sweep_field_refused_in_code_names_the_field_not_an_option(tmp_path):
    from crossbert_eval.sweep_config import SweepConfig
    from crossbert_eval.sweep_plan import plan_runs
    from crossbert_model.args import ConfigError, load_config

    cfg = load_config(SweepConfig, "configs/sweep/cpu_small.yaml", [f"out_dir={tmp_path}"])
    cfg.max_probe_train = 0  # changed in code after loading: checked again by plan_runs
    with pytest.raises(ConfigError, match=r"^sweep field 'max_probe_train': expected a positive integer or null, got 0$"):
        plan_runs(cfg)


@pytest.mark.parametrize(
    "override, spec",
    [
        ("probe_layers=2", LayerSpec.of(2)),
        ("probe_layers=-1", LayerSpec.of(-1)),
        ("probe_layers=[0, 2]", LayerSpec.of(0, 2)),
    ],
)
def test_a_layer_spec_a_yaml_file_reads_as_a_number_or_list_is_the_same_spec(override, spec, tmp_path):
    # catches: `probe_layers: 2` in a config refused (YAML reads it as a number) though the grammar takes N
    from crossbert_eval.folder_layout import SweepDir
    from crossbert_eval.sweep_config import SweepConfig
    from crossbert_eval.sweep_plan import evaluation_plan, plan_runs
    from crossbert_model.args import load_config

    cfg = load_config(SweepConfig, "configs/sweep/cpu_small.yaml", [f"out_dir={tmp_path}", override])
    assert plan_runs(cfg)
    assert evaluation_plan(cfg, SweepDir(cfg.root), final=True).probe.layers == spec


def test_a_zoo_maps_its_config_fields_to_the_settings_once_and_an_entry_changes_only_its_pooling(tmp_path):
    from crossbert_eval.folder_layout import ZooDir
    from crossbert_eval.zoo import ZooConfig, ZooModel, entry_plan, evaluation_plan

    cfg = ZooConfig(
        models=[ZooModel(model="minilm")],
        out_dir=str(tmp_path),
        probe_layers=LayerSpec.of(0, 6),
        mteb_layers=LayerSpec.of(-1),
        max_probe_train=200,
        features_dir=str(tmp_path / "shared"),
    )
    plan = evaluation_plan(cfg, ZooDir(cfg.root))
    assert (plan.probe.layers, plan.geometry.layers, plan.mteb.layers) == (
        LayerSpec.of(0, 6),
        LayerSpec.of(0, 6),
        LayerSpec.of(-1),
    )
    assert plan.probe.max_train == 200 and plan.probe.cache_dir == plan.mteb.cache_dir == str(tmp_path / "shared")
    assert entry_plan(plan, ZooModel(model="minilm")) is plan  # the model's own pooling
    cls = entry_plan(plan, ZooModel(model="minilm", pooling="cls"))
    assert (cls.probe.poolings, cls.geometry.poolings, cls.mteb.pooling) == (["cls"], ["cls"], "cls")
    assert cls.probe.layers is plan.probe.layers and plan.probe.poolings is None  # nothing parsed again; the zoo's plan untouched
