"""The objective registry (crossbert_model.objectives) and the one translation of a model section into a
CrossBertConfig (crossbert_model.train_config.model_config): what every objective must answer, that every
caller goes through them, and that the package imports without a cycle."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest
import torch

import crossbert_model as cm
from crossbert_model.data_args import DataArgs
from crossbert_model.masking import RowRandom, num_targets, target_ids
from crossbert_model.objectives import (
    config_from_preset,
    num_views,
    objective,
    objective_names,
    objective_of,
    parameter_counts,
    pretraining_batch,
    pretraining_model_for,
    targets_per_row,
    training_flops_by_part,
)
from crossbert_model.shared_loss import protocol_generator, protocol_selection, shared_protocol_loss
from crossbert_model.train_config import ModelArgs, TrainConfig, model_config, validate_config

REPO = Path(__file__).resolve().parent.parent


def test_the_registry_names_each_objective_once_with_its_model_class():
    assert objective_names() == ("mlm", "crossbert")
    assert objective("mlm").model_class is cm.FlatMlmForPreTraining
    assert objective("crossbert").model_class is cm.CrossBertForPreTraining
    for name in objective_names():
        assert objective(name).name == name


def test_an_unknown_objective_is_refused_in_one_line_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"^config field 'objective': expected one of \('mlm', 'crossbert'\), got 'bert'$"):
        objective("bert")
    with pytest.raises(ValueError, match="expected one of"):
        config_from_preset("nano", objective="bert")


@pytest.mark.parametrize("name, ratio", [("mlm", 0.15), ("crossbert", 0.5)])
def test_each_objective_brings_its_default_mask_ratio(name, ratio):
    assert objective(name).default_mask_ratio == ratio
    assert config_from_preset("nano", objective=name).mask_ratio == ratio
    assert model_config(ModelArgs(preset="nano", objective=name), DataArgs()).mask_ratio == ratio


@pytest.mark.parametrize("name", objective_names())
def test_every_objective_answers_everything_the_library_asks_of_it(name):
    """Model, batch, loss normaliser, shared-protocol inputs and accounting agree with one another."""
    config = config_from_preset("nano", objective=name, vocab_size=512)
    torch.manual_seed(0)
    model = pretraining_model_for(config)
    assert type(model) is objective_of(config).model_class
    assert parameter_counts(config)["total"] == sum(p.numel() for p in model.parameters())
    ids = torch.randint(5, 512, (4, 32))
    attention = torch.ones_like(ids)
    batch = pretraining_batch(ids, attention, config, RowRandom(0))
    assert num_targets(batch) == int(targets_per_row(attention.sum(dim=1), config).sum()) == len(target_ids(batch))
    out = model(**batch)
    assert int(out.num_predicted) == num_targets(batch) and torch.isfinite(out.loss)
    selected = protocol_selection(attention, 0.5, protocol_generator())
    _, count = shared_protocol_loss(model, ids, attention, 0.5, protocol_generator())
    assert count == int(selected.sum())
    assert num_views(config) >= 1
    flops = training_flops_by_part(config, 32)
    assert set(flops) == {"encoder", "predictor", "head"} and all(v >= 0 for v in flops.values())


def test_a_model_class_refuses_the_config_of_another_objective():
    with pytest.raises(ValueError, match="objective='mlm'.*objective='crossbert'"):
        cm.FlatMlmForPreTraining(config_from_preset("nano", objective="crossbert"))


# -- the one translation of the model section --------------------------------------------------------

# A value for every field of the model section, none of them the default, all valid together.
SECTION = dict(
    objective="crossbert",
    mask_ratio=0.75,
    mlm_mask_prob=0.7,
    mlm_random_prob=0.2,
    complementary_masking=True,
    predictor_layers=3,
    predictor_hidden_size=64,
    predictor_heads=2,
    hidden_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=320,
    mlp_type="swiglu",
    norm_type="rmsnorm",
    embedding_init_std=0.5,
    predictor_positions="encoder",
    absolute_positions=True,
    vocab_chunk_rows=512,
)


def test_every_field_of_the_model_section_reaches_the_model_config():
    fields = {f.name for f in dataclasses.fields(ModelArgs)} - {"preset"}
    assert set(SECTION) == fields, "a model-section field this test (and model_config) does not know"
    config = model_config(ModelArgs(preset="nano", **SECTION), DataArgs(vocab_size=1000, seq_len=96))
    for name, value in SECTION.items():
        assert getattr(config, name) == value, name
    assert (config.vocab_size, config.max_position_embeddings) == (1000, 96)


class _Tokenizer:
    pad_token_id, cls_token_id, sep_token_id, mask_token_id, all_special_ids = 0, 101, 102, 103, [0, 100, 101, 102, 103]

    def __len__(self):
        return 3000


def test_with_a_tokenizer_the_vocabulary_and_ids_are_the_tokenizers():
    config = model_config(ModelArgs(preset="nano"), DataArgs(vocab_size=1000), _Tokenizer())
    assert (config.vocab_size, config.mask_token_id, config.cls_token_id, config.num_special_tokens) == (3000, 103, 101, 104)


def test_validation_refuses_what_the_built_config_refuses_in_one_line():
    cfg = TrainConfig(model=ModelArgs(objective="crossbert", mask_ratio=0.6))
    with pytest.raises(Exception, match=r"^config section 'model': config field 'mask_ratio': .*whole number"):
        validate_config(cfg)


def _python_files(*folders: str) -> list[Path]:
    return [p for folder in folders for p in sorted((REPO / folder).glob("*.py"))]


def test_no_caller_builds_a_model_config_past_the_one_translation():
    """Only the translation itself (train_config.model_config) calls config_from_preset: the trainer, the sweep's
    planning, the benches and the CLI build theirs from a model section."""
    callers = [
        str(p.relative_to(REPO))
        for p in _python_files("crossbert_model", "crossbert_eval", "bench")
        if "config_from_preset(" in p.read_text() and p.name not in ("objectives.py", "train_config.py")
    ]
    assert callers == []


def test_no_module_compares_objective_names():
    """Every difference between objectives is the registry's: no `objective == "mlm"` anywhere else."""
    names = "|".join(map(re.escape, objective_names()))
    compare = re.compile(rf"""objective\W{{0,3}}\s*(==|!=|\bin\b)\s*[("'\[]*({names})\b""")
    found = [
        f"{p.relative_to(REPO)}:{i}"
        for p in _python_files("crossbert_model", "bench")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if compare.search(line)
    ]
    assert found == []


def _imports(path: Path) -> set[str]:
    """The crossbert_model modules a module imports, anywhere in it (a function's import counts too), except under
    `if TYPE_CHECKING:`: an import for annotations only never runs, so it cannot close a cycle."""
    out = set()
    tree = ast.parse(path.read_text())
    for block in [n for n in ast.walk(tree) if isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING"]:
        block.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            out |= {node.module} if node.module else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("crossbert_model."):
            out.add(node.module.split(".")[1])
    return out


def test_the_package_imports_without_a_cycle():
    graph = {p.stem: _imports(p) for p in _python_files("crossbert_model") if p.stem != "__init__"}
    done, path = set(), []

    def visit(module):
        if module in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(module) :] + [module]))
        if module in done or module not in graph:
            return
        path.append(module)
        for dep in graph[module]:
            visit(dep)
        path.pop()
        done.add(module)

    for module in graph:
        visit(module)


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("mask_ratio", 1.5, r"a number in \(0, 1\)"),
        ("mlm_mask_prob", -0.5, r"a number in \[0, 1\]"),
        ("mlp_type", "relu", "one of gelu, swiglu"),
        ("norm_type", "batchnorm", "one of layernorm, rmsnorm"),
        ("embedding_init_std", 0.0, "a positive number or null"),
    ],
)
def test_a_value_is_checked_by_one_definition_in_the_section_and_in_the_config(field, value, expected):
    """The model section and CrossBertConfig refuse the same values in the same words, each naming the field its way."""
    with pytest.raises(ValueError, match=rf"^config field '{field}': expected {expected}, got "):
        config_from_preset("nano", **{field: value})
    with pytest.raises(ValueError, match=rf"^config field 'model.{field}': expected {expected}, got "):
        validate_config(TrainConfig(model=ModelArgs(**{field: value})))
