"""dtype=auto is decided once per training run, recorded in config.yaml / run_info.json, and kept on resume."""

import dataclasses
import json

import pytest
import torch
import yaml

from crossbert_model import hardware
from crossbert_model.args import ConfigError
from crossbert_model.checkpoint import list_checkpoints
from crossbert_model.hardware import autocast_dtype, resolve_dtype, resolve_precision
from crossbert_model.train import train
from crossbert_model.train_config import TrainConfig
from tiny_configs import tiny_train_config

CPU = torch.device("cpu")


def fake_speedup(monkeypatch, value: float) -> list[str]:
    """Replace the matmul measurement; the returned list records each time it was asked."""
    calls = []

    def measured(device_str: str) -> float:
        calls.append(device_str)
        return value

    monkeypatch.setattr(hardware, "bf16_speedup", measured)
    return calls


def test_auto_takes_bf16_where_measured_faster(monkeypatch):
    fake_speedup(monkeypatch, 3.0)
    assert resolve_dtype("auto", CPU) == "bf16"
    info = resolve_precision("auto", CPU)
    assert info["requested"] == "auto" and info["resolved"] == "bf16" and info["bf16_speedup"] == 3.0
    assert autocast_dtype("auto", CPU) is torch.bfloat16


def test_auto_takes_fp32_where_bf16_is_emulated(monkeypatch):
    fake_speedup(monkeypatch, 0.01)
    assert resolve_dtype("auto", CPU) == "fp32"
    assert resolve_precision("auto", CPU)["bf16_speedup"] == 0.01
    assert autocast_dtype("auto", CPU) is None


def test_explicit_dtypes_are_not_measured_and_unknown_ones_named(monkeypatch):
    calls = fake_speedup(monkeypatch, 0.01)
    assert resolve_dtype("bf16", CPU) == "bf16" and resolve_dtype("fp32", CPU) == "fp32"
    assert calls == []
    with pytest.raises(ConfigError, match=r"config field 'dtype': expected one of auto, fp32, bf16, got 'fp16'"):
        resolve_dtype("fp16", CPU)


def tiny(corpus_args, out_dir, **fields) -> TrainConfig:
    return tiny_train_config(
        corpus_args,
        out_dir,
        "mlm",
        name="run",
        steps=2,
        batch_size=4,
        eval_every=0,
        eval_sequences=4,
        dtype="auto",
        warmup_steps=1,
        **fields,
    )


def test_run_records_the_resolved_dtype_and_a_resume_with_auto_keeps_it(corpus_args, tmp_path, monkeypatch):
    calls = fake_speedup(monkeypatch, 3.0)
    run_dir = train(tiny(corpus_args, tmp_path, checkpoint_steps=[1]))
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["dtype"] == "bf16"
    precision = json.loads((run_dir / "run_info.json").read_text())["precision"]
    assert precision["requested"] == "auto" and precision["resolved"] == "bf16" and precision["bf16_speedup"] == 3.0
    assert len(calls) == 1  # measured once, at the start

    # The final checkpoint is lost; the machine now measures bf16 as slow. auto must keep the run's bf16.
    import shutil

    shutil.rmtree(list_checkpoints(run_dir)[-1][1])
    calls = fake_speedup(monkeypatch, 0.01)
    train(tiny(corpus_args, tmp_path))
    assert calls == []  # not measured again
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["dtype"] == "bf16"
    assert [s for s, _ in list_checkpoints(run_dir)] == [1, 2]
    state = json.loads((list_checkpoints(run_dir)[-1][1] / "trainer_state.json").read_text())
    assert state["dtype"] == "bf16"


def test_resume_with_an_explicit_other_dtype_is_refused(corpus_args, tmp_path, monkeypatch):
    fake_speedup(monkeypatch, 3.0)
    train(tiny(corpus_args, tmp_path))
    with pytest.raises(ConfigError, match=r"dtype: saved 'bf16', now 'fp32'"):
        train(dataclasses.replace(tiny(corpus_args, tmp_path), dtype="fp32"))
