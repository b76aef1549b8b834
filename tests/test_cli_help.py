"""A CLI that teaches itself: config keys in `train --help`, `--print-config`, "did you mean",
bare hub ids, `probe --max-train --max-eval` and `geometry --max-eval` with intervals in the printed table, `tasks` with its data root, log lines
that leave progress bars whole. Each test names the break it catches."""

from __future__ import annotations

import io
import dataclasses
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import pytest
from tqdm import tqdm

from crossbert_eval.cli import main
from crossbert_eval.model_names import EncoderError
from crossbert_eval.model_sources import resolve_model
from crossbert_eval.tasks import get_task
from crossbert_model.args import close_matches, config_keys, to_dict
from crossbert_model.errors import USER_ERROR_EXIT
from crossbert_model.logs import ProgressBarSafeHandler
from crossbert_model.train_config import TrainConfig
from crossbert_model.utils import data_root
from crossbert_model.readers import read_jsonl

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "configs/train/tiny_mlm.yaml")


def _exit_and_output(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    out = capsys.readouterr()
    return caught.value.code, out.out, out.err


def _leaves(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        out.update(_leaves(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value})
    return out


# -- train --help and --print-config ---------------------------------------------------------------


def test_train_help_lists_every_config_key_with_its_default_and_description(capsys):
    # catches: a config key added to the dataclasses but missing from the help (a hand-typed list), a wrong
    # default shown, or the field comments no longer read as descriptions
    code, out, _ = _exit_and_output(["train", "--help"], capsys)
    assert code == 0
    for key, default in _leaves(to_dict(TrainConfig())).items():
        assert f"  {key}=" in out, key
    assert any(line.split() and line.split()[0] == "optim.lr=0.001" and "peak learning rate" in line for line in out.splitlines())
    assert "[model]" in out and "[data]" in out and "[optim]" in out


def test_every_train_config_key_has_a_description():
    # catches: a key added without its comment, or comments no longer found where the formatter put them (a long
    # field wrapped in parentheses carries its comment beside the value, on the line below the name)
    undescribed = [k.key for k in config_keys(TrainConfig) if not k.description]
    assert undescribed == []


@dataclasses.dataclass
class _Documented:
    beside: int = 1  # a comment beside the field
    # a comment above the field
    above: int = 2
    wrapped: Annotated[int, "a long annotation that the formatter wraps, so the value goes on a line of its own"] = (
        3  # a comment beside the wrapped value
    )
    # why the limit reads as it does (not the field's description)
    wrapped_with_note: int = 4  # the description, beside the value
    in_parentheses: int = 5  # a first clause (with a; semicolon inside); a second clause


def test_a_fields_description_is_its_comment_however_the_field_is_laid_out():
    # catches: a comment lost when a field spans several lines, a note above taken over the field's own comment, or a
    # clause cut inside parentheses
    described = {k.key: k.description for k in config_keys(_Documented)}
    assert described == {
        "beside": "a comment beside the field",
        "above": "a comment above the field",
        "wrapped": "a comment beside the wrapped value",
        "wrapped_with_note": "the description, beside the value",
        "in_parentheses": "a first clause (with a; semicolon inside)",
    }


def test_print_config_shows_the_resolved_config_and_touches_no_run_folder(tmp_path, capsys):
    # catches: --print-config that trains or creates the run folder, ignores overrides, or omits what the preset resolves to
    out_dir = tmp_path / "runs"
    main(["train", TINY, "model.preset=mini", "steps=20", f"out_dir={out_dir}", "--print-config"])
    out = capsys.readouterr().out
    assert "  preset: mini" in out and "\nsteps: 20\n" in out
    assert "# model.preset=mini objective=mlm resolves to: hidden_size=256 layers=4 heads=4" in out
    assert not out_dir.exists()


def test_print_config_refuses_a_bad_value_as_training_would(tmp_path, capsys):
    # catches: --print-config printing a config that `crossbert train` would refuse
    code, _, err = _exit_and_output(["train", TINY, "optim.lr=-1", f"out_dir={tmp_path / 'runs'}", "--print-config"], capsys)
    assert code == USER_ERROR_EXIT and "optim.lr" in err and not (tmp_path / "runs").exists()


# -- did you mean ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, hint",
    [
        (["train", TINY, "model.preset=tinny", "--print-config"], "did you mean tiny"),
        (["train", TINY, "optim.lrr=1e-3", "--print-config"], "did you mean lr?"),
        (["train", TINY, "model.objective=crosbert", "--print-config"], "did you mean crossbert?"),
    ],
)
def test_a_mistyped_config_key_or_name_gets_did_you_mean(argv, hint, capsys):
    # catches: unknown keys and choices (presets, objectives) refused without naming the likely one
    code, _, err = _exit_and_output(argv, capsys)
    assert code == USER_ERROR_EXIT and hint in err and len(err.strip().splitlines()) == 1


def test_an_unknown_task_names_the_one_meant():
    # catches: `SST2` answered with the whole task list and no pointer to SST-2
    with pytest.raises(Exception, match=r"unknown task 'SST2'; did you mean SST-2\?"):
        get_task("SST2")


def test_close_matches_fold_case_and_punctuation_first():
    # catches: a fuzzy matcher that ranks a merely similar name (STS12) above the same name spelt otherwise (SST-2)
    assert close_matches("sst2", ["STS12", "SST-2", "STS-B"])[0] == "SST-2"
    assert close_matches("zzz", ["SST-2", "CoLA"]) == []


# -- models: bare hub ids and aliases ----------------------------------------------------------------


def _offline_empty_hub(monkeypatch, tmp_path: Path) -> Path:
    cache = tmp_path / "empty-hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_a_bare_hub_id_is_a_hub_id_not_a_missing_folder(monkeypatch, tmp_path):
    # catches: `bert-base-uncased` (no organisation) reported as "no such folder" instead of the offline-cache line
    monkeypatch.chdir(tmp_path)
    cache = _offline_empty_hub(monkeypatch, tmp_path)
    with pytest.raises(EncoderError) as caught:
        resolve_model("bert-base-uncased")
    message = str(caught.value)
    assert "no such folder" not in message and "\n" not in message
    assert (
        f"model 'bert-base-uncased': not a local folder, and this hub id is not in the local Hugging Face cache {cache}"
        in message
    )


def test_a_mistyped_model_alias_names_it(monkeypatch, tmp_path):
    # catches: `minlm` treated as an unknown hub id with no word that 'minilm' was probably meant
    monkeypatch.chdir(tmp_path)
    _offline_empty_hub(monkeypatch, tmp_path)
    with pytest.raises(EncoderError, match=r"did you mean minilm\?"):
        resolve_model("minlm")


# -- tasks ---------------------------------------------------------------------------------------------


def test_tasks_prints_a_header_with_the_data_root_it_read(capsys):
    # catches: a listing with no header, or one that does not say which data root its sizes come from
    main(["tasks"])
    first, second, *rows = capsys.readouterr().out.splitlines()
    assert f"data root: {data_root()}" in first and "task files:" in first
    assert second.split()[:4] == ["family", "task", "input", "probes"]
    assert any(row.split()[1] == "SST-2" and "train=67,349" in row for row in rows)


@pytest.mark.parametrize("name", ["SST-2", "MRPC", "QNLI", "TREC", "MassiveScenarioClassification", "BigramShift", "STS12"])
def test_counted_split_sizes_equal_the_read_ones(name):
    # catches: the cheap line count of `crossbert tasks` drifting from what probes read (a header counted, a
    # filtered, pasted or held-out split counted by lines)
    task, root = get_task(name), data_root()
    for split in task.splits:
        counted = task.count_split(split, root)
        task._cache.clear()  # noqa: SLF001  (read it afresh, not from the count's own load)
        assert counted == len(task.load_split(split, root)), (name, split)


# -- probe --max-train and the printed table ---------------------------------------------------------------


def test_probe_and_geometry_caps_take_their_splits_samples_record_them_and_print_intervals(tmp_path, capsys):
    # catches: --max-train / --max-eval not reaching the probe (all 5,452 TREC training sentences, or all 500 test ones,
    # encoded), not recorded in the rows, geometry drawing another sample than the probe's at the same --seed, or a
    # printed table that hides the intervals every row stores
    from test_cli import _nano_model

    model, stores = _nano_model(tmp_path), ["--results", str(tmp_path / "r"), "--cache", str(tmp_path / "f")]
    sample = ["--tasks", "TREC", "--layers", "last", "--max-eval", "50", "--seed", "2"]
    main(["probe", model, *sample, "--probe", "linear,knn", "--max-train", "40", *stores])
    out = capsys.readouterr().out
    rows = read_jsonl(tmp_path / "r" / "results.jsonl")
    assert rows and all((r["n_train"], r["n_eval"]) == (40, 50) for r in rows)
    assert all((r["protocol"]["max_train"], r["protocol"]["max_eval"], r["seed"]) == (40, 50, 2) for r in rows)
    main_rows = [r for r in rows if r["is_main"]]
    for r in main_rows:
        assert f"{100 * r['value']:.2f} [{100 * r['ci_low']:.1f}, {100 * r['ci_high']:.1f}]" in out
    assert "95% bootstrap interval" in out

    features = sorted((tmp_path / "f").rglob("*"))
    main(["geometry", model, *sample, *stores])
    geometry = [r for r in read_jsonl(tmp_path / "r" / "results.jsonl") if r["probe"] == "geometry"]
    assert geometry and all(r["n_eval"] == 50 and r["protocol"]["max_eval"] == 50 for r in geometry)
    assert sorted((tmp_path / "f").rglob("*")) == features  # the probe's sample, read from its cache: nothing encoded


# -- logging and progress bars ---------------------------------------------------------------------------


def test_a_log_line_during_a_progress_bar_lands_on_its_own_line():
    # catches: log records written straight to the stream a bar is drawing on, so the line starts with the
    # half-drawn bar ("  0%|   | 0/3 ...2026-01-01 ... INFO ...")
    stream = io.StringIO()
    logger = logging.getLogger("crossbert.test.bars")
    handler = ProgressBarSafeHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.propagate, level = False, logger.level
    logger.setLevel(logging.INFO)
    try:
        with tqdm(total=3, file=stream, disable=False, mininterval=0) as bar:
            bar.update(1)
            logger.info("halfway")
            bar.update(2)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    (line,) = [line for line in stream.getvalue().split("\n") if "halfway" in line]
    assert line.split("\r")[-1] == "INFO halfway"
    assert "3/3" in stream.getvalue().split("INFO halfway", 1)[1]  # the bar is drawn again after the line


def test_the_cli_installs_the_progress_bar_safe_handler():
    # catches: an entry point that goes back to logging.basicConfig's plain StreamHandler
    code = (
        "import logging; from crossbert_eval.cli import configure_logging; configure_logging(False); "
        "print([type(h).__name__ for h in logging.getLogger().handlers])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert json.loads(out.strip().replace("'", '"')) == ["ProgressBarSafeHandler"]


# -- the one-time token cache says what it is doing -----------------------------------------------------------


def test_building_the_token_cache_says_once_what_where_and_how_big(tmp_path, caplog):
    # catches: a first short run that silently tokenizes the whole corpus (minutes on the 40.6M-word one) with no
    # word that this is a one-time cache, how big the corpus is, where it goes; or a cache rebuilt on the next run
    from crossbert_model.data.token_cache import tokenize_corpus
    from crossbert_model.data.tokenizer import load_tokenizer
    from crossbert_model.data_args import DataArgs

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"document {i} has a few words of text" for i in range(30)) + "\n")
    args = DataArgs(corpus=str(corpus), tokenizer="minilm", cache_dir=str(tmp_path / "cache"), num_workers=1)
    tokenizer = load_tokenizer("minilm")
    with caplog.at_level(logging.INFO, logger="crossbert_model.data.token_cache"):
        out = tokenize_corpus(args, tokenizer)
    (line,) = [r.getMessage() for r in caplog.records if "building the token cache" in r.getMessage()]
    assert f"of {corpus} (1 file, 0.0 MB on disk, the whole corpus)" in line
    assert f"once: every later run with this corpus, tokenizer and split reuses {out}" in line and "data.max_documents=N" in line
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="crossbert_model.data.token_cache"):
        assert tokenize_corpus(args, tokenizer) == out
    assert not [r for r in caplog.records if "building the token cache" in r.getMessage()]
