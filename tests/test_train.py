"""The trainer on the real corpus: resume equivalence, multi-process equivalence, bad input."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModel

from crossbert_model.args import ConfigError, load_config
from crossbert_model.checkpoint import list_checkpoints
from crossbert_model.data import DataArgs, DataError, prepare_data
from crossbert_model.train import NonFiniteLossError, TrainConfig, train

REPO = Path(__file__).resolve().parent.parent


def tiny_config(corpus_args, out_dir, objective="crossbert", **kw) -> TrainConfig:
    cfg = TrainConfig(
        name=kw.pop("name", objective), out_dir=str(out_dir), steps=6, batch_size=8, log_every=1, eval_every=3,
        eval_sequences=16, dtype="fp32", data=dataclasses.replace(corpus_args), peak_flops=1e11,
    )  # fmt: skip
    cfg.model.preset = "nano"
    cfg.model.objective = objective
    cfg.optim.warmup_steps = 2
    for key, value in kw.items():
        setattr(cfg, key, value)
    return cfg


def losses(run_dir: Path) -> list[float]:
    return [row["loss"] for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in row]


@pytest.mark.parametrize("objective", ["mlm", "crossbert"])
def test_resume_gives_the_same_run_as_an_uninterrupted_one(corpus_args, tmp_path, objective):
    straight = train(tiny_config(corpus_args, tmp_path, objective, name="straight"))
    # first half, then a "killed" run: the final checkpoint never got written
    # step 4 is off the eval_every=3 grid: the resumed run evaluates there and the straight one does not,
    # so equal losses also show that evaluating leaves training untouched
    half = tiny_config(corpus_args, tmp_path, objective, name="resumed", checkpoint_steps=[4])
    train(half)
    resumed_dir = half.run_dir
    for step, path in list_checkpoints(resumed_dir):
        if step == 6:
            import shutil

            shutil.rmtree(path)
    (resumed_dir / "checkpoints" / ".step_0000006.killed.tmp").mkdir()  # a half-written save
    train(half)
    assert losses(resumed_dir) == losses(straight)  # bit-identical, not just close
    assert [s for s, _ in list_checkpoints(resumed_dir)] == [4, 6]
    for _, path in list_checkpoints(resumed_dir):  # every checkpoint records its validation loss
        assert "val_loss" in json.loads((path / "trainer_state.json").read_text())["metrics"]
    assert not list((resumed_dir / "checkpoints").glob(".step_*"))


def test_trained_checkpoint_loads_with_automodel_and_records_provenance(corpus_args, tmp_path):
    run_dir = train(tiny_config(corpus_args, tmp_path, "mlm"))
    (step, path), = list_checkpoints(run_dir)
    encoder = AutoModel.from_pretrained(path, local_files_only=True)
    assert encoder.config.objective == "mlm" and step == 6
    state = json.loads((path / "trainer_state.json").read_text())
    assert state["corpus_tokens"] == 6 * 8 * 64 and "git_revision" in state
    assert (path / "tokenizer.json").exists()
    saved = (run_dir / "config.yaml").read_text()
    assert "preset: nano" in saved
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["step"] == 0 and "val_loss" in metrics[0]  # the untrained model's validation loss
    assert {"loss", "corpus_tokens_per_s", "mfu"} <= set(metrics[1]) and "val_ppl" in metrics[-1]
    assert metrics[-1]["val_loss"] < metrics[0]["val_loss"]


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_process_torchrun_matches_one_process(corpus_args, tmp_path, mode):
    one = tiny_config(corpus_args, tmp_path, "crossbert", name="one")
    train(one)
    config_file = tmp_path / "two.yaml"
    two = tiny_config(corpus_args, tmp_path, "crossbert", name="two", distributed=mode)
    from crossbert_model.args import dump_yaml

    config_file.write_text(dump_yaml(two))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "crossbert_model.train", str(config_file), "num_threads=1"],
        check=True, env=env, cwd=tmp_path, capture_output=True, timeout=300,
    )  # fmt: skip
    assert losses(two.run_dir) == pytest.approx(losses(one.run_dir), rel=1e-5)


def test_non_finite_loss_stops_with_a_clear_error_and_keeps_the_last_checkpoint(corpus_args, tmp_path):
    cfg = tiny_config(corpus_args, tmp_path, "mlm", steps=40, checkpoint_steps=[1])
    cfg.optim.lr, cfg.optim.grad_clip, cfg.optim.warmup_steps = 1e12, 1e30, 1
    with pytest.raises(NonFiniteLossError, match=r"non-finite training loss .* at step \d+ .*last good checkpoint: .*step_0000001"):
        train(cfg)
    assert [s for s, _ in list_checkpoints(cfg.run_dir)] == [1]
    AutoModel.from_pretrained(list_checkpoints(cfg.run_dir)[0][1], local_files_only=True)  # still whole


def test_resuming_a_folder_of_another_config_is_refused(corpus_args, tmp_path):
    train(tiny_config(corpus_args, tmp_path, "mlm", name="run"))
    other = tiny_config(corpus_args, tmp_path, "mlm", name="run")
    other.model.preset, other.optim.lr = "tiny", 5e-4
    with pytest.raises(ConfigError, match=r"model.preset: saved 'nano', now 'tiny'.*optim.lr"):
        train(other)


def test_missing_corpus_and_missing_text_field_are_named(tmp_path):
    with pytest.raises(DataError, match=r"corpus .*nowhere.jsonl does not exist"):
        prepare_data(DataArgs(corpus=str(tmp_path / "nowhere.jsonl"), cache_dir=str(tmp_path)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"body": "no text here"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: no text field 'text' \(fields present: \['body'\]\)"):
        prepare_data(DataArgs(corpus=str(bad), cache_dir=str(tmp_path), vocab_size=100))


def test_tokenizer_that_does_not_match_the_model_is_refused(corpus_args, tmp_path):
    cfg = tiny_config(corpus_args, tmp_path, "mlm")
    run_dir = train(cfg)
    _, path = list_checkpoints(run_dir)[-1]
    from crossbert_model.data import check_tokenizer_matches, load_tokenizer

    with pytest.raises(DataError, match=r"vocab_size: model 2048, tokenizer 30522"):
        check_tokenizer_matches(AutoModel.from_pretrained(path).config, load_tokenizer("minilm"), str(path))


def test_config_overrides_are_typed_and_unknown_keys_rejected(tmp_path):
    cfg = load_config(TrainConfig, REPO / "configs/train/tiny_crossbert.yaml", ["model.preset=mini", "optim.lr=3e-4", "checkpoint_steps=[5, 10]"])
    assert cfg.model.preset == "mini" and cfg.optim.lr == 3e-4 and cfg.checkpoint_steps == [5, 10]
    with pytest.raises(ConfigError, match="no field 'lrr'"):
        load_config(TrainConfig, None, ["optim.lrr=1"])
    with pytest.raises(ConfigError, match="steps: expected int"):
        load_config(TrainConfig, None, ["steps=many"])
