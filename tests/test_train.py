"""The trainer on the real corpus: resume equivalence, multi-process equivalence, bad input."""

import dataclasses
import itertools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModel

from crossbert_model.args import ConfigError, load_config
from crossbert_model.checkpoint import list_checkpoints
from crossbert_model.data.errors import DataError
from crossbert_model.data.sequences import prepare_data
from crossbert_model.data_args import DataArgs
from crossbert_model.objectives import objective_names
from crossbert_model.train import TrainingDivergedError, train
from crossbert_model.train_config import TrainConfig
from tiny_configs import tiny_train_config

REPO = Path(__file__).resolve().parent.parent


def tiny_config(corpus_args, out_dir, objective="crossbert", **fields) -> TrainConfig:
    return tiny_train_config(corpus_args, out_dir, objective, **fields)


def losses(run_dir: Path) -> list[float]:
    return [row["loss"] for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in row]


@pytest.mark.parametrize("objective", objective_names())
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
    ((step, path),) = list_checkpoints(run_dir)
    encoder = AutoModel.from_pretrained(path, local_files_only=True)
    assert encoder.config.objective == "mlm" and step == 6
    state = json.loads((path / "trainer_state.json").read_text())
    assert state["corpus_tokens"] == 6 * 8 * 64 and "git_revision" in state
    assert (path / "tokenizer.json").exists()
    plain = tmp_path / "plain"
    plain.touch()  # what the umask gives a file: every file of the checkpoint has it (transformers writes weights 0600)
    files = [f for f in path.rglob("*") if f.is_file()]  # 1_Pooling/ is a folder (sentence-transformers' layout)
    assert {f.name: oct(f.stat().st_mode) for f in files} == {f.name: oct(plain.stat().st_mode) for f in files}
    saved = (run_dir / "config.yaml").read_text()
    assert "preset: nano" in saved
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["step"] == 0 and "val_loss" in metrics[0]  # the untrained model's validation loss
    assert {"loss", "corpus_tokens_per_s", "mfu"} <= set(metrics[1]) and "val_ppl" in metrics[-1]
    assert metrics[-1]["val_loss"] < metrics[0]["val_loss"]


# The runs the two-process tests compare with one process: trained in one torchrun launch (each launch starts three
# interpreters that import torch; one launch for the three saves two of them).
TWO_PROCESS_RUNS = {
    "ddp": dict(distributed="ddp"),
    "fsdp-accumulated": dict(
        distributed="fsdp", grad_accum=2, activation_checkpointing=True, steps=2, eval_every=2, eval_sequences=8
    ),
    "fsdp-bf16": dict(distributed="fsdp", dtype="bf16", steps=2, eval_every=0, eval_sequences=8),
}


@pytest.fixture(scope="module")
def two_process_runs(corpus_args, tmp_path_factory) -> dict[str, tuple[TrainConfig, list[dict]]]:
    """TWO_PROCESS_RUNS trained by 2 gloo processes: each run's config and, per rank, its collectives."""
    out = tmp_path_factory.mktemp("two-process")
    configs = [tiny_config(corpus_args, out, "crossbert", name=name, **fields) for name, fields in TWO_PROCESS_RUNS.items()]
    collectives = torchrun_two_processes(configs, out)
    return {cfg.name: (cfg, collectives[cfg.name]) for cfg in configs}


def one_process_twin(cfg: TrainConfig, tmp_path: Path) -> TrainConfig:
    """`cfg` trained by one process: the same run with the whole global batch at once, in fp32."""
    one = dataclasses.replace(cfg, name="one", out_dir=str(tmp_path), grad_accum=1, activation_checkpointing=False, dtype="fp32")
    train(one)
    return one


def test_two_process_ddp_matches_one_process(two_process_runs, tmp_path):
    """(FSDP2 over two processes: the accumulation test below, validation included.)"""
    two, _ = two_process_runs["ddp"]
    one = one_process_twin(two, tmp_path)
    assert losses(two.run_dir) == pytest.approx(losses(one.run_dir), rel=1e-5)
    # validation, shared-protocol losses included: each process scores its rows, the sums are reduced
    single, double = evaluated(one.run_dir), evaluated(two.run_dir)
    assert "shared_loss_r50" in single[-1]
    assert double == [{k: pytest.approx(v, rel=1e-5) for k, v in r.items()} for r in single]


# Runs crossbert_model.train under torchrun for each config named on its command line, in one process group as a sweep
# under torchrun does (crossbert_model.distributed.shared_process_group), and writes, per run and rank, the dtype of
# every tensor FSDP2 gathers (all_gather_single) and reduces (reduce_scatter_single): collectives.<run>.rank<N>.json.
COUNTING_TRAIN = """
import json, os, sys
import torch.distributed as dist

seen = {}

def counted(name, collective):
    def call(output, input, *args, **kwargs):
        seen[name].append(str(input.dtype))
        return collective(output, input, *args, **kwargs)
    return call

dist.all_gather_single = counted("all_gather", dist.all_gather_single)
dist.reduce_scatter_single = counted("reduce_scatter", dist.reduce_scatter_single)
from crossbert_model.distributed import shared_process_group
from crossbert_model.train import main
with shared_process_group():
    for config in sys.argv[1:]:
        seen.update(all_gather=[], reduce_scatter=[])
        main([config, "num_threads=1"])
        with open(f"collectives.{config.removesuffix('.yaml')}.rank{os.environ['RANK']}.json", "w") as out:
            json.dump(seen, out)
"""


def torchrun_two_processes(configs: list[TrainConfig], work: Path) -> dict[str, list[dict]]:
    """Train each of `configs` in turn in 2 gloo processes, one torchrun launch; per run, each rank's collectives. A
    trainer that ended the shared process group would leave the next run hanging: the launch then times out.

    A failed launch shows its own output (subprocess's error holds only the command). It is tried once more,
    from empty run folders, after a warning that carries that output: CI once saw a launch exit 1 with
    its output lost, and 100 launches here (60 on a contended CPU) and 25 test runs did not fail (2026-12-05)."""
    from crossbert_model.args import dump_yaml

    for cfg in configs:
        (work / f"{cfg.name}.yaml").write_text(dump_yaml(cfg))
    (work / "counting_train.py").write_text(COUNTING_TRAIN)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "counting_train.py"]
    command += [f"{cfg.name}.yaml" for cfg in configs]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    for attempt in (1, 2):
        launched = run_as_a_group(command, env=env, cwd=work, timeout=300)
        if launched.returncode == 0:
            break
        output = (
            f"torchrun exited {launched.returncode} (attempt {attempt}):\n{launched.stdout[-3000:]}\n{launched.stderr[-8000:]}"
        )
        assert attempt == 1, output
        warnings.warn(output)
        for cfg in configs:
            shutil.rmtree(cfg.run_dir, ignore_errors=True)
    return {
        cfg.name: [json.loads((work / f"collectives.{cfg.name}.rank{r}.json").read_text()) for r in range(2)] for cfg in configs
    }


def run_as_a_group(command: list[str], timeout: float, **popen) -> subprocess.CompletedProcess:
    """`command` in a process group of its own, all of it killed if it outlives `timeout`: torchrun's workers would
    outlive a killed torchrun (subprocess.run kills only the process it started) and hold a core for hours."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **popen
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"{' '.join(command)}: still running after {timeout} s, killed:\n{stdout[-3000:]}\n{stderr[-8000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def metric_rows(run_dir: Path) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def test_fsdp2_with_accumulation_and_checkpointing_matches_one_process(two_process_runs, tmp_path):
    """FSDP2 over 2 processes, 2 micro-batches each, activation checkpointing on, gives the losses, gradient
    norms, validation losses (native and shared-protocol: each process scores its rows, the sums are reduced)
    and weights of one process with the whole global batch at once (fp32; rtol 1e-5, atol 1e-6 on weights
    after 2 AdamW steps), and reduce-scatters once per step and FSDP unit: never after the non-final
    micro-batch (set_requires_gradient_sync(False))."""
    from safetensors.torch import load_file

    from crossbert_model.model import Block, PredictorBlock
    from crossbert_model.objectives import pretraining_model_for
    from crossbert_model.train_config import model_config

    two, collectives = two_process_runs["fsdp-accumulated"]
    one = one_process_twin(two, tmp_path)
    single, sharded = metric_rows(one.run_dir), metric_rows(two.run_dir)
    for key in ("loss", "grad_norm"):
        assert [r[key] for r in sharded] == pytest.approx([r[key] for r in single], rel=1e-5), key
    validated = evaluated(one.run_dir)
    assert "shared_loss_r50" in validated[-1]
    assert evaluated(two.run_dir) == [{k: pytest.approx(v, rel=1e-5) for k, v in r.items()} for r in validated]
    weights = {cfg.name: load_file(str(list_checkpoints(cfg.run_dir)[-1][1] / "model.safetensors")) for cfg in (one, two)}
    for name, value in weights["one"].items():
        torch.testing.assert_close(weights[two.name][name], value, rtol=1e-5, atol=1e-6, msg=name)
    model = pretraining_model_for(model_config(two.model, two.data))
    units = 1 + sum(isinstance(m, (Block, PredictorBlock)) for m in model.modules())  # each block, then the root
    for rank in collectives:
        assert rank["reduce_scatter"] == ["torch.float32"] * (two.steps * units)
        assert set(rank["all_gather"]) == {"torch.float32"}


def test_fsdp2_in_bf16_gathers_bf16_weights_and_reduces_fp32_gradients(two_process_runs, tmp_path):
    """With dtype=bf16 FSDP2's mixed-precision policy computes with bf16 weights (half the gather traffic)
    and sums gradients in fp32; the run trains the model the fp32 run trains (losses within 2%)."""
    two, collectives = two_process_runs["fsdp-bf16"]
    one = one_process_twin(two, tmp_path)
    for rank in collectives:
        assert "torch.bfloat16" in rank["all_gather"]
        assert set(rank["reduce_scatter"]) == {"torch.float32"}
    assert losses(two.run_dir) == pytest.approx(losses(one.run_dir), rel=2e-2)


def test_activation_checkpointing_is_a_trainer_option_for_both_objectives(corpus_args, tmp_path):
    """`activation_checkpointing: true` reaches every block of either objective's model, and a run may turn it
    on or off when it resumes (the loss and gradients do not change: tests/test_model.py)."""
    from crossbert_model.model import CheckpointableBlock
    from crossbert_model.train import Trainer
    from crossbert_model.train_config import NON_DEFINING_KEYS

    for objective in objective_names():
        trainer = Trainer(tiny_config(corpus_args, tmp_path, objective, activation_checkpointing=True, eval_sequences=0))
        blocks = [m for m in trainer.model.modules() if isinstance(m, CheckpointableBlock)]
        assert blocks and all(b.activation_checkpointing for b in blocks), objective
    assert "activation_checkpointing" in NON_DEFINING_KEYS


def test_a_checkpoint_of_the_earlier_masking_scheme_is_not_resumed(corpus_args, tmp_path):
    """Masks drawn per row (scheme 2) differ from those one generator drew for the global batch (scheme 1,
    checkpoints written before the scheme was recorded): resuming such a run is refused with one line that
    says why and what to do, and the folder is left as it was."""
    cfg = tiny_config(corpus_args, tmp_path, "mlm", steps=2, eval_every=0, checkpoint_steps=[1])
    train(cfg)
    assert json.loads((cfg.run_dir / "run_info.json").read_text())["masking_scheme"] == 2
    shutil.rmtree(list_checkpoints(cfg.run_dir)[-1][1])  # "killed" before the final checkpoint
    state_file = list_checkpoints(cfg.run_dir)[-1][1] / "trainer_state.json"
    state = json.loads(state_file.read_text())
    assert state.pop("masking_scheme") == 2
    state_file.write_text(json.dumps(state))  # as written before the scheme was recorded
    with pytest.raises(
        ConfigError,
        match=r"step_0000001: its run drew masks with masking scheme 1, this version draws scheme 2 .*"
        r"finish it with the revision that started it .* or start a new run",
    ):
        train(cfg)
    assert [s for s, _ in list_checkpoints(cfg.run_dir)] == [1]


def evaluated(run_dir: Path) -> list[dict]:
    """The validation metrics (native and shared-protocol) of every evaluated step."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k.startswith(("val_", "shared_"))} for r in rows if "val_loss" in r]


def test_a_diverged_model_is_never_saved(corpus_args, tmp_path):
    cfg = tiny_config(corpus_args, tmp_path, "mlm", steps=40, checkpoint_steps=[1])
    cfg.optim.lr, cfg.optim.grad_clip, cfg.optim.warmup_steps = 1e12, 1e30, 1
    diverged = r"(non-finite|above the divergence threshold).* at step 1 .*no usable checkpoint yet"
    with pytest.raises(TrainingDivergedError, match=diverged):
        train(cfg)
    assert list_checkpoints(cfg.run_dir) == []


def test_divergence_is_named_and_the_run_continues_with_a_lower_lr_only_with_the_opt_in(corpus_args, tmp_path, monkeypatch):
    import crossbert_model.train as T

    real_lr_at = T.lr_at
    # From step 3 on the learning rate explodes: the checkpoint of step 2 is the last usable one.
    monkeypatch.setattr(T, "lr_at", lambda step, total, o: 1e12 if step >= 3 else real_lr_at(step, total, o))
    cfg = tiny_config(corpus_args, tmp_path, "mlm", checkpoint_steps=[2])
    with pytest.raises(TrainingDivergedError) as caught:
        train(cfg)
    message = str(caught.value)
    assert re.search(r"(non-finite training loss|non-finite gradient norm|above the divergence threshold)", message), message
    assert re.search(r"Latest usable checkpoint: .*step_0000002 \(step 2, val_loss [\d.]+\)", message), message
    assert "resume_allow_changes=[optim.lr]" in message
    assert [s for s, _ in list_checkpoints(cfg.run_dir)] == [2]

    monkeypatch.setattr(T, "lr_at", real_lr_at)
    lower = tiny_config(corpus_args, tmp_path, "mlm", checkpoint_steps=[2])
    lower.optim.lr = 1e-4
    with pytest.raises(ConfigError, match=r"optim.lr: saved 0.001, now 0.0001.*resume_allow_changes=\[optim.lr\]"):
        train(lower)
    lower.resume_allow_changes = ["optim.lr"]
    train(lower)
    assert [s for s, _ in list_checkpoints(cfg.run_dir)] == [2, 6]
    info = json.loads((cfg.run_dir / "run_info.json").read_text())
    assert info["config_history"] == [
        {"resumed_at_step": 2, "changes": {"optim.lr": {"saved": 1e-3, "now": 1e-4}}, "time": info["config_history"][0]["time"]}
    ]


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
    from crossbert_model.data.tokenizer import check_tokenizer_matches, load_tokenizer

    with pytest.raises(DataError, match=r"vocab_size: model 2048, tokenizer 30522"):
        check_tokenizer_matches(AutoModel.from_pretrained(path).config, load_tokenizer("minilm"), str(path))


def test_config_overrides_are_typed_and_unknown_keys_rejected(tmp_path):
    cfg = load_config(
        TrainConfig,
        REPO / "configs/train/tiny_crossbert.yaml",
        ["model.preset=mini", "optim.lr=3e-4", "checkpoint_steps=[5, 10]"],
    )
    assert cfg.model.preset == "mini" and cfg.optim.lr == 3e-4 and cfg.checkpoint_steps == [5, 10]
    with pytest.raises(ConfigError, match="no field 'lrr'"):
        load_config(TrainConfig, None, ["optim.lrr=1"])
    with pytest.raises(ConfigError, match="steps: expected int"):
        load_config(TrainConfig, None, ["steps=many"])


# -- config validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, value, field, expected",
    [
        ("steps", 0, "steps", "a positive integer"),
        ("steps", -5, "steps", "a positive integer"),
        ("batch_size", 0, "batch_size", "a positive integer"),
        ("grad_accum", 0, "grad_accum", "a positive integer"),
        ("log_every", 0, "log_every", "a positive integer"),
        ("eval_every", -1, "eval_every", "an integer >= 0"),
        ("max_tokens", 0, "max_tokens", "a positive integer or null"),
        ("optim.lr", 0.0, "optim.lr", "a positive number"),
        ("optim.lr", -1e-3, "optim.lr", "a positive number"),
        ("model.mask_ratio", 1.0, "model.mask_ratio", r"a number in \(0, 1\)"),
        ("model.mask_ratio", 0.0, "model.mask_ratio", r"a number in \(0, 1\)"),
        ("optim.schedule", "cosinus", "optim.schedule", "one of cosine, linear, constant"),
        ("dtype", "fp16", "dtype", "one of auto, fp32, bf16"),
        ("model.mlm_mask_prob", 1.5, "model.mlm_mask_prob", r"a number in \[0, 1\]"),
        ("model.mlm_random_prob", -0.1, "model.mlm_random_prob", r"a number in \[0, 1\]"),
        ("model.mlm_random_prob", 0.3, "model.mlm_random_prob", r"at most 1 - model.mlm_mask_prob \(0.2\)"),
        ("resume_allow_changes", ["optim.lrr"], "resume_allow_changes", "dotted config keys such as optim.lr"),
        ("activation_checkpointing", "yes", "activation_checkpointing", "true or false"),
        ("seed", -1, "seed", r"an integer from 0 to 2\*\*63 - 1"),
        ("data.trust_remote_code", "yes", "data.trust_remote_code", "true or false"),
    ],
)
def test_bad_config_values_are_refused_before_anything_is_written(corpus_args, tmp_path, key, value, field, expected):
    cfg = tiny_config(corpus_args, tmp_path, "mlm")
    section, _, name = key.rpartition(".")
    setattr(getattr(cfg, section) if section else cfg, name, value)
    with pytest.raises(ConfigError, match=rf"^config field '{re.escape(field)}': expected {expected}, got "):
        train(cfg)
    assert not cfg.run_dir.exists()


def test_a_model_shape_the_config_class_refuses_is_a_config_error(corpus_args, tmp_path):
    cfg = tiny_config(corpus_args, tmp_path, "mlm")
    cfg.model.hidden_size, cfg.model.num_attention_heads = 100, 3
    with pytest.raises(ConfigError, match=r"config section 'model': .*'hidden_size' \(100\) must be divisible"):
        train(cfg)
    assert not cfg.run_dir.exists()


# -- learning-rate schedule ------------------------------------------------------------------------------


def test_lr_schedule_warmup_cosine_linear_constant():
    from crossbert_model.train import lr_at
    from crossbert_model.train_config import OptimArgs

    o = OptimArgs(lr=1e-3, warmup_steps=10, schedule="cosine", min_lr_ratio=0.1)
    assert lr_at(0, 110, o) == pytest.approx(1e-4)  # warm-up starts at lr / warmup_steps, not 0
    assert lr_at(9, 110, o) == pytest.approx(1e-3)  # and reaches lr on its last step
    assert lr_at(10, 110, o) == pytest.approx(1e-3)  # decay starts at the peak
    assert lr_at(60, 110, o) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))  # cosine midpoint
    assert lr_at(110, 110, o) == pytest.approx(1e-4)  # end: min_lr_ratio * lr
    assert lr_at(500, 110, o) == pytest.approx(1e-4)  # and stays there
    linear = dataclasses.replace(o, schedule="linear")
    assert lr_at(35, 110, linear) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.75))
    assert lr_at(110, 110, linear) == pytest.approx(1e-4)
    constant = dataclasses.replace(o, schedule="constant")
    assert lr_at(5, 110, constant) == pytest.approx(6e-4) and lr_at(100, 110, constant) == 1e-3


# -- gradient accumulation -------------------------------------------------------------------------------


def test_gradient_accumulation_gives_the_update_of_one_big_batch(corpus_args, tmp_path):
    from safetensors.torch import load_file

    params = {}
    for accum in (1, 4):
        cfg = tiny_config(corpus_args, tmp_path, "crossbert", name=f"accum{accum}", steps=1, grad_accum=accum, eval_sequences=0)
        run_dir = train(cfg)  # dtype=fp32 (tiny_config): the comparison is at fp32 rounding
        params[accum] = load_file(str(list_checkpoints(run_dir)[-1][1] / "model.safetensors"))
        # Adam's first update is nearly sign(gradient), blind to how the gradient is scaled; the loss and
        # the (pre-clipping) gradient norm are not, so a wrong normalisation of the micro-batches shows there.
        rows = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
        params[accum]["loss_and_grad_norm"] = torch.tensor([[r["loss"], r["grad_norm"]] for r in rows])
    assert params[1].keys() == params[4].keys()
    for name in params[1]:
        torch.testing.assert_close(params[4][name], params[1][name], rtol=1e-5, atol=1e-6, msg=name)


# -- resume: which keys may change -----------------------------------------------------------------------


def test_resume_accepts_a_non_defining_change_and_refuses_a_defining_one(corpus_args, tmp_path):
    first = tiny_config(corpus_args, tmp_path, "mlm", name="run", checkpoint_steps=[3])
    train(first)
    shutil.rmtree(list_checkpoints(first.run_dir)[-1][1])  # "killed" before the final save
    defining = tiny_config(corpus_args, tmp_path, "mlm", name="run")
    defining.optim.lr = 5e-4
    with pytest.raises(ConfigError, match=r"optim.lr: saved 0.001, now 0.0005.*resume_allow_changes=\[optim.lr\]"):
        train(defining)
    assert [s for s, _ in list_checkpoints(first.run_dir)] == [3]  # the refusal touched nothing
    train(tiny_config(corpus_args, tmp_path, "mlm", name="run", log_every=2, eval_every=2, checkpoint_steps=[3]))
    assert [s for s, _ in list_checkpoints(first.run_dir)] == [3, 6]


# -- checkpoints: complete or absent, damaged ones fall back ---------------------------------------------


def test_resume_falls_back_when_the_newest_checkpoint_is_truncated(corpus_args, tmp_path, caplog):
    from crossbert_model.checkpoint import CheckpointError, load_model_state, pretraining_model_from_pretrained

    straight = train(tiny_config(corpus_args, tmp_path, "mlm", name="straight"))
    cfg = tiny_config(corpus_args, tmp_path, "mlm", name="damaged", checkpoint_every=2)
    train(cfg)
    assert [s for s, _ in list_checkpoints(cfg.run_dir)] == [2, 4, 6]  # two periodic resume points kept
    shutil.rmtree(list_checkpoints(cfg.run_dir)[-1][1])  # killed before the final save
    newest = list_checkpoints(cfg.run_dir)[-1][1] / "model.safetensors"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    unreadable = rf"^{re.escape(str(newest))}: not a readable safetensors file \(truncated or corrupt\?\)"
    with pytest.raises(CheckpointError, match=unreadable):
        load_model_state(newest.parent)
    with pytest.raises(CheckpointError, match=re.escape(str(newest))):
        pretraining_model_from_pretrained(newest.parent)

    with caplog.at_level("WARNING", logger="crossbert.train"):
        train(cfg)
    assert any(str(newest) in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    assert [s for s, _ in list_checkpoints(cfg.run_dir)] == [2, 4, 6]  # step 4 trained again from step 2
    assert losses(cfg.run_dir) == losses(straight)


def test_a_run_whose_only_checkpoint_is_damaged_is_not_resumed_and_says_so(corpus_args, tmp_path):
    from crossbert_model.checkpoint import CheckpointError

    cfg = tiny_config(corpus_args, tmp_path, "mlm", steps=4, checkpoint_steps=[2])
    train(cfg)
    for _, path in list_checkpoints(cfg.run_dir):
        (path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"no usable checkpoint to resume from \(2 damaged, renamed \*\.corrupt\); remove"):
        train(cfg)


def test_a_corpus_without_validation_trains_only_when_asked_and_records_why(corpus_args, tmp_path, caplog):
    cfg = tiny_config(corpus_args, tmp_path, "mlm", eval_sequences=0)
    with caplog.at_level("WARNING", logger="crossbert.train"):
        train(cfg)
    validation = json.loads((cfg.run_dir / "run_info.json").read_text())["validation"]
    assert validation == {
        "sequences": 0,
        "reason": "eval_sequences=0: no validation loss, shared-protocol loss or divergence check on validation",
    }
    assert any("trained without validation" in r.getMessage() for r in caplog.records)
    assert all("val_loss" not in row for row in map(json.loads, (cfg.run_dir / "metrics.jsonl").read_text().splitlines()))


def test_a_checkpoint_folder_without_its_complete_marker_is_not_listed(corpus_args, tmp_path):
    run_dir = train(tiny_config(corpus_args, tmp_path, "mlm", checkpoint_steps=[3]))
    (list_checkpoints(run_dir)[-1][1] / "COMPLETE").unlink()
    assert [s for s, _ in list_checkpoints(run_dir)] == [3]


# -- corpus encoding ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".txt"])
def test_a_corpus_byte_that_is_not_utf8_is_named_with_file_line_and_offset(tmp_path, suffix):
    first = '{"text": "caf\xc3\xa9 fine"}\n' if suffix == ".jsonl" else "first paragraph line\n"
    corpus = tmp_path / f"corpus{suffix}"
    corpus.write_bytes(first.encode("latin-1") + b'{"text": "bad \xff byte"}\n')
    offset = len(first.encode("latin-1")) + len(b'{"text": "bad ')
    with pytest.raises(DataError, match=rf"^{re.escape(str(corpus))}:2: not valid UTF-8 at byte {offset} "):
        prepare_data(DataArgs(corpus=str(corpus), cache_dir=str(tmp_path / "cache"), vocab_size=100))


# -- MLM corruption shares and the shared-protocol loss ----------------------------------------------------


def test_mlm_corruption_shares_reach_the_model_config_and_the_training_batch(corpus_args):
    from crossbert_model.masking import RowRandom
    from crossbert_model.objectives import pretraining_batch
    from crossbert_model.train_config import ModelArgs, model_config

    config = model_config(ModelArgs(mask_ratio=0.5, mlm_mask_prob=1.0, mlm_random_prob=0.0), corpus_args)
    assert (config.mlm_mask_prob, config.mlm_random_prob) == (1.0, 0.0)
    ids = torch.randint(5, 2048, (16, 64))
    batch = pretraining_batch(ids, torch.ones_like(ids), config, RowRandom(0))
    selected = batch["labels"] != -100
    assert bool((batch["input_ids"][selected] == config.mask_token_id).all())  # pure masking: no random, no kept
    default = model_config(ModelArgs(), corpus_args)
    assert (default.mlm_mask_prob, default.mlm_random_prob) == (0.8, 0.1)  # BERT's 80/10/10 stays the default


def test_the_predictor_head_count_is_a_model_option_checked_before_work(corpus_args):
    from crossbert_model.train_config import ModelArgs, model_config, validate_config

    args = ModelArgs(objective="crossbert", predictor_hidden_size=64, predictor_heads=4)
    assert model_config(args, corpus_args).predictor_heads == 4
    assert model_config(ModelArgs(objective="crossbert", predictor_hidden_size=64), corpus_args).predictor_heads == 1
    with pytest.raises(ConfigError, match="model.predictor_heads"):
        validate_config(TrainConfig(model=ModelArgs(objective="crossbert", predictor_heads=0), data=corpus_args))


def test_a_deterministic_run_asks_torch_for_deterministic_algorithms(corpus_args, tmp_path):
    from crossbert_model.train import Trainer

    try:
        Trainer(tiny_config(corpus_args, tmp_path, deterministic=True))
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)  # process-wide: leave the other tests as they were
    Trainer(tiny_config(corpus_args, tmp_path, name="default"))
    assert not torch.are_deterministic_algorithms_enabled()


@pytest.mark.parametrize("objective", objective_names())
def test_evaluate_records_shared_losses_that_the_checkpoint_scorer_reproduces(corpus_args, tmp_path, objective, monkeypatch):
    from crossbert_model.data import tokenizer as tokenizer_module
    from crossbert_model.shared_loss import SHARED_LOSS_R15, SHARED_LOSS_R50, shared_losses_for_checkpoint

    cfg = tiny_config(corpus_args, tmp_path, objective, steps=3, eval_every=3, num_threads=1)
    run_dir = train(cfg)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in evaluated] == [0, 3]
    assert all({SHARED_LOSS_R15, SHARED_LOSS_R50, "shared_targets_r15", "shared_targets_r50"} <= set(r) for r in evaluated)
    assert evaluated[0]["shared_targets_r50"] == 16 * round(0.5 * 64)  # eval_sequences x round(r * n)
    ((step, path),) = list_checkpoints(run_dir)
    recorded = json.loads((path / "trainer_state.json").read_text())["metrics"]
    assert recorded[SHARED_LOSS_R50] == evaluated[-1][SHARED_LOSS_R50]
    # an old run is scored the same way from its folder alone (another batch size: same masks, same sums),
    # with the tokenizer it was trained with even after the tokenizer recipe changed
    monkeypatch.setattr(tokenizer_module, "TOKENIZER_RECIPE", "a newer recipe")
    tokenizers = set((Path(corpus_args.cache_dir) / "tokenizers").iterdir())
    scored = shared_losses_for_checkpoint(path, batch_size=5)
    assert set((Path(corpus_args.cache_dir) / "tokenizers").iterdir()) == tokenizers  # none trained anew
    for key in (SHARED_LOSS_R15, SHARED_LOSS_R50, "shared_targets_r15", "shared_targets_r50"):
        assert scored[key] == pytest.approx(recorded[key], rel=1e-5), key
    assert scored["step"] == 3


def test_the_checkpoint_scorer_names_a_folder_that_is_not_a_run_checkpoint(tmp_path):
    from crossbert_model.args import ConfigError
    from crossbert_model.shared_loss import shared_losses_for_checkpoint

    with pytest.raises(ConfigError, match=r"step_0000003: expected a checkpoint folder .*config.yaml, was not found"):
        shared_losses_for_checkpoint(tmp_path / "checkpoints" / "step_0000003")


def test_a_trained_wordpiece_keeps_merges_when_the_corpus_alphabet_is_larger_than_the_vocabulary(tmp_path):
    """Thousands of distinct characters (CJK here, as in a large Wikipedia sample) must not crowd the
    word pieces out of a small vocabulary: the alphabet is capped, common words stay whole."""
    from crossbert_model.data.tokenizer import train_wordpiece

    rare = ["".join(chr(0x4E00 + i + j) for j in range(3)) for i in range(0, 3000, 3)]  # 3,000 distinct CJK characters
    english = ["the river flows through the old town and the bridge crosses the river near the station"] * 200
    tokenizer = train_wordpiece(lambda: iter(english + rare), 512, tmp_path / "tok")
    tokens = tokenizer.tokenize("the river flows through the town")
    assert tokens == ["the", "river", "flows", "through", "the", "town"]


def test_a_trained_wordpiece_is_the_same_vocabulary_id_for_id_every_time(tmp_path, real_data_root):
    """The same corpus gives the same tokenizer: equally rare characters at the alphabet's cap are chosen by
    the character, and pieces are numbered by the piece, not in the trainer's hash-map order (before, two
    trainings on the main job's corpus agreed on 191 of 4,096 ids)."""
    from crossbert_model.data.tokenizer import prepare_tokenizer
    from crossbert_model.data_args import DataArgs

    def train(i):
        args = DataArgs(
            corpus=str(real_data_root / "wikipedia_en_2015"),
            vocab_size=1024,
            max_documents=400,
            cache_dir=str(tmp_path / str(i)),
        )
        return prepare_tokenizer(args).get_vocab()

    first, second = train(0), train(1)
    assert len(first) == 1024 and first == second
    assert [first[t] for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [0, 1, 2, 3, 4]


def test_the_alphabet_is_the_most_frequent_characters_of_the_normalised_text(real_data_root):
    """Counting raw characters and normalising each once gives the counts of the normalised text: accents split off
    and dropped, case folded (final sigma too), control characters gone, CJK characters kept."""
    from tokenizers import normalizers

    from crossbert_model.data.corpus import iter_documents
    from crossbert_model.data.tokenizer import initial_alphabet

    norm = normalizers.BertNormalizer(lowercase=True)
    tricky = ["ΟΔΟΣ ΣΟΦΟΣ İstanbul ǅ ß ﬁ e\u0301\u0327 Åström \u4e2d\u6587x \x00\x07\t\r\n"]
    docs = tricky + list(itertools.islice(iter_documents(str(real_data_root / "wikipedia_en_2015")), 200))
    counts = Counter(c for doc in docs for c in norm.normalize_str(doc) if not c.isspace())
    assert initial_alphabet(docs, norm, len(counts)) == sorted(counts, key=lambda c: (-counts[c], c))
    assert initial_alphabet(docs, norm, 5) == sorted(counts, key=lambda c: (-counts[c], c))[:5]


def test_a_character_level_vocabulary_is_refused(tmp_path):
    from tokenizers import Tokenizer, models

    from crossbert_model.data.tokenizer import _check_has_merges

    letters = {c: i for i, c in enumerate(chr(0x4E00 + i) for i in range(600))}
    with pytest.raises(DataError, match="600 of its 512 pieces are single characters"):
        _check_has_merges(Tokenizer(models.WordPiece(vocab=letters, unk_token=chr(0x4E00))), 512, tmp_path)


def test_a_run_saved_before_the_mlm_corruption_keys_existed_resumes(corpus_args, tmp_path):
    import yaml

    cfg = tiny_config(corpus_args, tmp_path, "mlm", steps=2, eval_every=0, num_threads=1)
    train(cfg)
    saved = yaml.safe_load((cfg.run_dir / "config.yaml").read_text())
    del saved["model"]["mlm_mask_prob"], saved["model"]["mlm_random_prob"]  # as written before they existed
    (cfg.run_dir / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    train(cfg)  # same defaults: accepted (complete, nothing to do)
    cfg.model.mlm_mask_prob, cfg.model.mlm_random_prob = 1.0, 0.0
    with pytest.raises(ConfigError, match="model.mlm_mask_prob: saved 0.8, now 1.0"):
        train(cfg)  # another corruption than the one the run was trained with


def test_a_run_records_the_unigram_entropies_of_the_targets_its_losses_score(corpus_args, corpus, tmp_path):
    """A flat MLM trained at 0.3, a ratio the shared protocol does not have: it is scored there too, and
    every loss it records has beside it the unigram entropy of exactly its targets."""
    from crossbert_model.plateau import unigram_cross_entropy
    from crossbert_model.shared_loss import protocol_selections
    from crossbert_model.validation import unigram_entropies_for_checkpoint

    cfg = tiny_config(corpus_args, tmp_path, "mlm", steps=2, eval_every=2, num_threads=1)
    cfg.model.mask_ratio = 0.3
    run_dir = train(cfg)
    recorded = json.loads((run_dir / "run_info.json").read_text())["unigram_entropies"]
    keys = ["unigram_entropy_val", "unigram_entropy_r15", "unigram_entropy_r30", "unigram_entropy_r50"]
    assert set(keys) <= set(recorded) and recorded["smoothing"].startswith("add-one")
    evaluated = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "val_loss" in r]
    assert [r["step"] for r in evaluated] == [0, 2]
    assert all({k: r[k] for k in keys} == {k: recorded[k] for k in keys} for r in evaluated)
    assert {"shared_loss_r30", "shared_targets_r30"} <= set(evaluated[-1])  # the run's own ratio, scored exactly
    # by hand: counts of every training sequence, over the protocol's 30% of the first 16 validation sequences
    counts = np.bincount(corpus.train.get(np.arange(len(corpus.train))).flatten(), minlength=len(corpus.tokenizer))
    val = corpus.val.get(np.arange(16))
    selected = protocol_selections(torch.ones_like(val), (0.3,))[0.3]
    assert recorded["unigram_entropy_r30"] == pytest.approx(unigram_cross_entropy(counts, val[selected]), rel=1e-12)
    assert len(val[selected]) == evaluated[-1]["shared_targets_r30"]
    # near the entropy of the unigram distribution, far below knowing nothing (ln V)
    assert 4.0 < recorded["unigram_entropy_val"] < math.log(len(corpus.tokenizer))
    ((_, path),) = list_checkpoints(run_dir)
    state = json.loads((path / "trainer_state.json").read_text())
    assert state["metrics"]["unigram_entropy_r30"] == recorded["unigram_entropy_r30"]
    # a run trained before they were recorded gets the same numbers from its checkpoint folder
    assert unigram_entropies_for_checkpoint(path) == pytest.approx({k: recorded[k] for k in keys}, rel=1e-12)


def test_a_run_without_a_terminal_logs_progress_lines_with_the_time_left(corpus_args, tmp_path, caplog, monkeypatch):
    import logging

    from crossbert_model import train as train_module
    from crossbert_model.logs import duration

    monkeypatch.setattr(train_module, "PROGRESS_LINE_S", 0.0)  # a line at every logged step
    with caplog.at_level(logging.INFO, logger="crossbert.train"):
        train(tiny_train_config(corpus_args, tmp_path, "mlm"))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert len(lines) == 6 and all(re.search(r" tok/s MFU [\d.]+% ETA \d+s$", line) for line in lines), lines
    assert lines[-1].endswith("ETA 0s")  # nothing left after the last step
    assert [duration(s) for s in (0, 59.4, 61, 3600 * 2 + 180)] == ["0s", "59s", "1m01s", "2h03m"]
