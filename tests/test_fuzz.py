"""Fuzzing the edges (hypothesis): config overrides, command-line options, task files, result stores and checkpoint
folders, generated. For every input: success, or one line and exit 2 (a user's mistake) - never a traceback (exit 1
is the bug line of crossbert_model.errors), never a write outside the folder given, nothing half-written.

`make test` runs the bounded, derandomised profile "ci" (a few dozen inputs per edge); `make fuzz` the long one
("fuzz", HYPOTHESIS_PROFILE=fuzz), printing the outcomes per edge."""

import json
import math
import os
import shutil
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crossbert_eval.cli import main
from crossbert_model.errors import CrossbertError

REPO = Path(__file__).resolve().parent.parent
settings.register_profile(
    "ci",
    max_examples=25,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.register_profile(
    "fuzz",
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

OUTCOMES: dict[str, Counter] = defaultdict(Counter)


@pytest.fixture(scope="module", autouse=True)
def report_outcomes():
    yield
    path = os.environ.get("FUZZ_COUNTS")
    if path:
        Path(path).write_text(json.dumps({edge: dict(c) for edge, c in OUTCOMES.items()}, indent=2) + "\n")


# Values a user could type: numbers of every kind, strings that are paths, YAML that is a list or a mapping.
VALUES = st.one_of(
    st.integers(-(10**6), 10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(
        [
            "",
            "null",
            "true",
            "no",
            "nan",
            "-inf",
            "1e400",
            "[]",
            "[1, -1]",
            "{a: 1}",
            "../..",
            "/etc",
            ".",
            "..",
            "a/b",
            "~",
            "0x10",
            "1_000",
            "'3'",
            "[[]]",
        ]
    ),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12),
)


def _outcome(edge: str, call) -> None:
    """Run `call`; success, or a CrossbertError (exit 2) whose message is one line. Anything else fails the test."""
    try:
        call()
    except CrossbertError as e:
        assert "\n" not in str(e).strip(), str(e)
        OUTCOMES[edge]["refused in one line"] += 1
        return
    OUTCOMES[edge]["accepted"] += 1


def _fresh(tmp_path: Path) -> Path:
    """A folder of its own for one generated input (hypothesis runs many inputs in one test's tmp_path)."""
    return Path(tempfile.mkdtemp(dir=tmp_path))


def _no_writes_outside(folder: Path, before: set[str]) -> None:
    """Nothing new in the repository (the usual place a stray relative write would land)."""
    after = {p.name for p in REPO.iterdir()}
    assert after <= before | {".pytest_cache", ".hypothesis"}, after - before


TRAIN_KEYS = [
    "steps",
    "batch_size",
    "seed",
    "name",
    "out_dir",
    "dtype",
    "log_every",
    "eval_every",
    "checkpoint_every",
    "checkpoint_steps",
    "grad_accum",
    "max_tokens",
    "num_threads",
    "model.preset",
    "model.objective",
    "model.mask_ratio",
    "model.hidden_size",
    "model.predictor_positions",
    "model.absolute_positions",
    "model.embedding_init_std",
    "optim.lr",
    "optim.warmup_steps",
    "optim.weight_decay",
    "optim.beta1",
    "data.vocab_size",
    "data.seq_len",
    "data.val_fraction",
    "data.max_documents",
    "unknown_key",
    "model.unknown",
]


@given(overrides=st.lists(st.tuples(st.sampled_from(TRAIN_KEYS), VALUES), min_size=1, max_size=3))
def test_train_config_overrides(overrides, tmp_path):
    from crossbert_model.args import load_config
    from crossbert_model.train_config import TrainConfig, validate_config

    before = {p.name for p in REPO.iterdir()}

    def call():
        cfg = load_config(
            TrainConfig, REPO / "configs/train/tiny_mlm.yaml", [f"out_dir={tmp_path}"] + [f"{k}={v}" for k, v in overrides]
        )
        validate_config(cfg)
        assert Path(cfg.run_dir).resolve().parent == Path(cfg.out_dir).resolve()  # the run folder is one level in

    _outcome("train overrides", call)
    _no_writes_outside(tmp_path, before)


SWEEP_KEYS = [
    "name",
    "sizes",
    "seeds",
    "budget",
    "budget_tokens",
    "budget_flops",
    "budget_s",
    "checkpoint_fractions",
    "probe_tasks",
    "probes",
    "probe_layers",
    "mteb_tasks",
    "mteb_layers",
    "feature_transforms",
    "max_probe_train",
    "batch_size",
    "claim_lease_s",
    "worker_poll_s",
    "device",
    "missing_packages",
    "reference_objective",
    "train.batch_size",
    "train.optim.lr",
    "objectives",
]


@given(overrides=st.lists(st.tuples(st.sampled_from(SWEEP_KEYS), VALUES), min_size=1, max_size=3))
def test_sweep_config_overrides(overrides, tmp_path):
    from crossbert_model.args import load_config
    from crossbert_eval.sweep_config import SweepConfig
    from crossbert_eval.sweep_plan import check_machine, plan_runs

    def call():
        cfg = load_config(
            SweepConfig, REPO / "configs/sweep/cpu_small.yaml", [f"out_dir={tmp_path}"] + [f"{k}={v}" for k, v in overrides]
        )
        if cfg.device == "cuda":
            cfg.device = None  # this machine has none: that refusal has its own test
        check_machine(cfg)
        plan_runs(cfg)
        assert cfg.root.resolve().parent == tmp_path.resolve()

    _outcome("sweep overrides", call)


PROBE_OPTIONS = {
    "--layers": VALUES,
    "--pooling": VALUES,
    "--max-length": VALUES,
    "--batch-size": VALUES,
    "--dtype": VALUES,
    "--tasks": st.one_of(VALUES, st.sampled_from(["TREC", "trec", "STS-B,SST-2", "all", "glue", ",", "TREC,TREC"])),
}


@given(option=st.sampled_from(sorted(PROBE_OPTIONS)), data=st.data())
def test_probe_options_refused_before_any_model_is_loaded(option, data, tmp_path, capsys, monkeypatch):
    """Options of `crossbert probe` with a nonexistent model: every bad option is refused in one line before the
    model is looked for; a good one reaches the model lookup, which refuses the missing folder (also one line)."""
    value = data.draw(PROBE_OPTIONS[option])
    tmp_path = _fresh(tmp_path)
    argv = [
        "probe",
        str(tmp_path / "no-model"),
        "--tasks",
        "TREC",
        option,
        value,
        "--results",
        str(tmp_path / "r"),
        "--cache",
        str(tmp_path / "f"),
    ]
    monkeypatch.delenv("CROSSBERT_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)
    OUTCOMES["probe options"]["refused in one line" if "no-model" not in err else "reached the model lookup"] += 1
    assert not (tmp_path / "r").exists() and not (tmp_path / "f").exists()  # nothing written for a refused command


ROW_FIELDS = ["model_fingerprint", "task", "probe", "layer", "metric", "value", "is_main", "split", "pooling", "family", "unit"]


@given(
    rows=st.lists(
        st.one_of(
            st.dictionaries(
                st.sampled_from(ROW_FIELDS),
                st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(), st.text(max_size=5)),
                max_size=8,
            ),
            st.sampled_from(['{"task": ', "[1, 2]", "null", "NaN", '{"value": NaN}', "", "\x00"]),
        ),
        max_size=6,
    )
)
def test_report_of_a_damaged_results_store(rows, tmp_path, capsys, monkeypatch):
    folder = _fresh(tmp_path) / "r"
    folder.mkdir()
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    (folder / "results.jsonl").write_text("".join(line + "\n" for line in lines))
    monkeypatch.delenv("CROSSBERT_DEBUG", raising=False)
    try:
        main(["report", str(folder)])
        OUTCOMES["report of a store"]["accepted"] += 1
    except SystemExit as e:
        err = capsys.readouterr().err
        assert e.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        OUTCOMES["report of a store"]["refused in one line"] += 1
    leftovers = [p.name for p in folder.rglob("*") if p.name.endswith((".tmp", ".partial"))]
    assert not leftovers  # nothing half-written


TASK_LINES = [
    "name: TREC",
    "family: senteval",
    "input: single",
    "target: class",
    "metrics: [accuracy]",
    "data: {local: sentence_classification, format: label_first, encoding: latin-1}",
    "splits: {train: TREC.train.all.xz, test: TREC.test.all}",
    "columns: {text: text, label: label}",
    'labels: ["0", "1", "2", "3", "4", "5"]',
    "eval_split: test",
]  # tasks/senteval/TREC.yaml, one line a key


@given(edits=st.lists(st.tuples(st.integers(0, len(TASK_LINES) - 1), st.one_of(VALUES, st.just(None))), max_size=2))
def test_task_file_mutations(edits, tmp_path):
    """The TREC task file with values replaced by generated text or lines dropped: read and its evaluation split
    loaded from the real data root, or one TaskError."""
    from crossbert_eval.tasks import parse_task_file

    lines = list(TASK_LINES)
    for i, value in edits:
        lines[i] = "" if value is None else f"{lines[i].split(':', 1)[0]}: {value}"
    path = _fresh(tmp_path) / "TREC.yaml"
    path.write_text("\n".join(lines) + "\n")

    def call():
        task = parse_task_file(path)
        task.load_split(task.eval_splits[0])

    _outcome("task file", call)


CONFIG_FIELDS = [
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
    "max_position_embeddings",
    "objective",
    "mask_ratio",
    "predictor_positions",
    "absolute_positions",
    "model_type",
    "intermediate_size",
    "pad_token_id",
]


@pytest.fixture(scope="module")
def nano_folder(tmp_path_factory):
    import crossbert_model as cm
    from crossbert_model.data.tokenizer import load_tokenizer, special_token_config

    folder = tmp_path_factory.mktemp("nano")
    tokenizer = load_tokenizer("minilm")
    cm.pretraining_model_for(cm.config_from_preset("nano", **special_token_config(tokenizer))).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@given(
    field=st.sampled_from(CONFIG_FIELDS),
    value=st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(), st.text(max_size=8)),
)
def test_checkpoint_config_mutations(field, value, nano_folder, tmp_path):
    """A checkpoint folder whose config.json has one field changed: loads (and encodes), or one line."""
    from crossbert_eval.encoders import FrozenEncoder

    folder = _fresh(tmp_path) / "model"
    shutil.copytree(nano_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    config[field] = value
    (folder / "config.json").write_text(json.dumps(config, allow_nan=True))

    def call():
        encoder = FrozenEncoder.load(str(folder))
        out = encoder.encode(["a short sentence"], None, layers=[encoder.num_layers], poolings=["mean"], desc="fuzz")
        assert all(math.isfinite(float(v)) for v in next(iter(out.values())).ravel())

    _outcome("checkpoint config", call)
