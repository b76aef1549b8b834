"""Runs a tracker reads: every scalar of metrics.jsonl also lands in TensorBoard event files in the run folder
(each step once, also after a resume) and, when asked for, in an offline W&B run grouped by its sweep."""

import json
import shutil
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

from crossbert_eval.cli import main
from crossbert_eval.sweep_config import SweepConfig
from crossbert_eval.sweep_plan import plan_runs
from crossbert_model.args import load_config
from crossbert_model.checkpoint import list_checkpoints
from crossbert_model.tracking import scalars, wandb_run_id
from crossbert_model.train import train
from crossbert_model.readers import read_jsonl
from tiny_configs import tiny_train_config

REPO = Path(__file__).resolve().parent.parent


def metrics_by_tag(run_dir: Path) -> dict[str, dict[int, float]]:
    """metrics.jsonl as {name: {step: value}}: what every tracker must show."""
    out: dict[str, dict[int, float]] = {}
    for row in read_jsonl(run_dir / "metrics.jsonl"):
        for key, value in scalars(row).items():
            out.setdefault(key, {})[row["step"]] = value
    return out


def tensorboard_by_tag(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """The run folder's event files as TensorBoard's scalar dashboard loads them: {tag: [(step, value), ...]} in file order."""
    events = EventAccumulator(str(run_dir), size_guidance={SCALARS: 0})  # 0: keep every event, no sampling
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()[SCALARS]}


def as_float32(metrics: dict[str, dict[int, float]]) -> dict[str, dict[int, float]]:
    """metrics.jsonl's doubles as a TensorBoard scalar holds them (float32)."""
    return {tag: {step: float(np.float32(v)) for step, v in points.items()} for tag, points in metrics.items()}


def test_tensorboard_events_hold_every_scalar_of_metrics_jsonl(corpus_args, tmp_path):
    run_dir = train(tiny_train_config(corpus_args, tmp_path, "crossbert"))
    expected = metrics_by_tag(run_dir)
    assert {"loss", "lr", "grad_norm", "corpus_tokens_per_s", "mfu", "val_loss", "shared_loss_r15", "unigram_entropy_val"} <= set(
        expected
    )
    shown = tensorboard_by_tag(run_dir)
    assert {tag: dict(points) for tag, points in shown.items()} == as_float32(expected)  # same names, steps, values
    assert all(len(points) == len({s for s, _ in points}) for points in shown.values())  # each step once


def test_a_resumed_run_shows_each_step_once_with_the_values_metrics_jsonl_keeps(corpus_args, tmp_path):
    cfg = tiny_train_config(corpus_args, tmp_path, "mlm", checkpoint_steps=[3])
    train(cfg)
    before = tensorboard_by_tag(cfg.run_dir)
    shutil.rmtree(dict(list_checkpoints(cfg.run_dir))[6])  # as if killed before its last save: resumed at step 3
    train(cfg)
    shown = tensorboard_by_tag(cfg.run_dir)
    assert {tag: dict(points) for tag, points in shown.items()} == as_float32(metrics_by_tag(cfg.run_dir))
    assert [s for s, _ in shown["loss"]] == [1, 2, 3, 4, 5, 6]  # no step twice, none missing, in order
    assert [v for _, v in shown["loss"]] == [v for _, v in before["loss"]]  # steps are pure functions of (seed, step)
    assert len(list(cfg.run_dir.glob("events.out.tfevents.*"))) == 1  # the interrupted process's file was replaced


def test_tracking_nothing_writes_metrics_jsonl_alone(corpus_args, tmp_path):
    run_dir = train(tiny_train_config(corpus_args, tmp_path, "mlm", steps=2, tracking=[]))
    assert metrics_by_tag(run_dir)["loss"]
    assert not list(run_dir.glob("events.out.tfevents.*")) and not (run_dir / "wandb").exists()


@pytest.mark.parametrize(
    "override, words",
    [
        ("tracking=[tensorboard,mlflow]", ["'tracking'", "'mlflow' is none of them", "tensorboard, wandb"]),
        ("tracking=[tensorboard,tensorboard]", ["'tracking'", "each tracker once"]),
        ("wandb_mode=onlin", ["'wandb_mode'", "offline, online", "'onlin'"]),
    ],
)
def test_a_bad_tracking_option_is_one_line_and_exit_2_before_the_run_folder_exists(override, words, tmp_path, capsys):
    code, err = run_train_cli(tmp_path, override, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and all(w in err for w in words), err
    assert not (tmp_path / "runs").exists()


def test_asking_for_wandb_where_it_is_not_installed_is_exit_2_before_training(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` meets where it is not installed
    code, err = run_train_cli(tmp_path, "tracking=[tensorboard,wandb]", capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "'tracking'" in err and "crossbert[tracking]" in err and "leave it out" in err
    assert not (tmp_path / "runs").exists()


def run_train_cli(tmp_path: Path, override: str, capsys) -> tuple[int, str]:
    argv = ["train", str(REPO / "configs/train/tiny_mlm.yaml"), f"out_dir={tmp_path / 'runs'}", "model.preset=nano", override]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code, capsys.readouterr().err


def test_a_sweep_groups_its_runs_by_its_name():
    cfg = load_config(SweepConfig, REPO / "configs/sweep/cpu_small.yaml", ["name=grouped"])
    runs = plan_runs(cfg)
    assert len(runs) > 1 and {r.train.group for r in runs} == {"grouped"}
    # TensorBoard: the sweep's folder is the logdir; its runs are folders side by side under it
    assert {r.train.run_dir.parent for r in runs} == {cfg.root / "runs"}


# ------------------------------------------------------------------------------------------------
# W&B, offline: the run file it writes, read back record by record
# ------------------------------------------------------------------------------------------------


def wandb_records(path: Path):
    """The records of a W&B run file (`run-<id>.wandb`): a 7-byte header (':W&B', magic, version), then
    32 KiB blocks of chunks, each chunk a CRC32 (of type byte + data), a 2-byte length, a type byte (full,
    first, middle, last) and the data; a record is a full chunk or first..last joined. Each record is a
    wandb_internal_pb2.Record."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B run file"
    block, pos, parts = 32768, 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # no room for a chunk header: the block's tail is padding
            pos += block - pos % block
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        if kind == 0 and length == 0:  # zero padding
            pos += block - pos % block
            continue
        assert zlib.crc32(bytes([kind]) + chunk) == crc, f"{path}: damaged chunk at byte {pos}"
        pos += 7 + length
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            yield record


def test_an_offline_wandb_run_holds_our_metrics_in_the_sweeps_group(corpus_args, tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install 'crossbert[tracking]')")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):  # nothing written outside the test's folder
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cfg = tiny_train_config(corpus_args, tmp_path, "mlm", tracking=["tensorboard", "wandb"], group="sweep-a")
    run_dir = train(cfg)
    (run_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")  # offline: no key, no network, files only
    records = list(wandb_records(run_file))
    (run,) = [r.run for r in records if r.HasField("run")]
    assert (run.run_id, run.run_group, run.display_name, run.project) == (wandb_run_id(run_dir), "sweep-a", "mlm", "crossbert")
    logged: dict[str, dict[int, float]] = {}
    for record in records:
        if record.HasField("history"):
            items = {item.key or "/".join(item.nested_key): item for item in record.history.item}
            step = int(json.loads(items["_step"].value_json))
            for key, item in items.items():
                if not key.startswith("_"):
                    value = item.number if item.HasField("number") else json.loads(item.value_json)
                    logged.setdefault(key, {})[step] = value
    assert logged == metrics_by_tag(run_dir)
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert (config["model"]["preset"], config["tracking"], config["group"]) == ("nano", ["tensorboard", "wandb"], "sweep-a")
    (exit_record,) = [r.exit for r in records if r.HasField("exit")]
    assert exit_record.exit_code == 0  # finished, not left looking crashed
