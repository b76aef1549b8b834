"""The trainer: one loop, read top to bottom.

    crossbert train configs/train/tiny_crossbert.yaml model.preset=mini steps=2000
    torchrun --nproc_per_node 2 -m crossbert_model.train CONFIG [key=value ...]

Every step is a pure function of (seed, step): the batch comes from `EpochSampler`, the masks from a
generator seeded by (seed, step) and drawn for the whole global batch on every rank. Hence resuming
from a checkpoint reproduces the uninterrupted run, and N processes reproduce one process at the same
global batch. The loss is normalised by the number of predicted tokens of the global batch, so
gradient accumulation and DDP give the same update as one big batch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from tqdm.auto import tqdm

from . import distributed as D
from .args import ConfigError, diff_dicts, dump_yaml, load_config, read_yaml, to_dict
from .checkpoint import (
    checkpoint_dir,
    latest_checkpoint,
    list_checkpoints,
    load_optimizer_state,
    remove_stale_temporaries,
    save_checkpoint,
)
from .config import CrossBertConfig, config_from_preset, describe, training_flops_per_token
from .data import DataArgs, EpochSampler, check_tokenizer_matches, prepare_data, special_token_config
from .hardware import autocast_dtype, matmul_flops
from .masking import num_targets, pretraining_batch
from .model import Block, PredictorBlock, pretraining_model_for
from .utils import atomic_write_json, atomic_write_text, append_jsonl, provenance, quiet_transformers, read_jsonl, set_offline_env
from .errors import CrossbertError

log = logging.getLogger("crossbert.train")


@dataclass
class ModelArgs:
    preset: str = "tiny"
    objective: str = "mlm"  # "mlm" (flat BERT) | "crossbert"
    mask_ratio: float | None = None  # default: 0.15 for mlm, 0.5 for crossbert
    complementary_masking: bool = True
    predictor_layers: int = 2  # 1 layer: every query of a view is the same vector, only RoPE tells them apart; it plateaus
    predictor_hidden_size: int | None = None  # default: the preset's
    hidden_size: int | None = None  # overrides of the preset's shape
    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    intermediate_size: int | None = None
    mlp_type: str = "gelu"
    norm_type: str = "layernorm"


@dataclass
class OptimArgs:
    lr: float = 1e-3
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-6
    warmup_steps: int = 100
    schedule: str = "cosine"  # cosine | linear | constant (after warm-up)
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0


@dataclass
class TrainConfig:
    name: str = "run"
    out_dir: str = "runs"
    seed: int = 0
    steps: int = 1000
    max_tokens: int | None = None  # corpus-token budget; when set it decides `steps`
    batch_size: int = 32  # sequences per optimizer step, over all processes
    grad_accum: int = 1
    dtype: str = "auto"  # auto | fp32 | bf16 (autocast)
    log_every: int = 10
    eval_every: int = 200
    eval_sequences: int = 256
    checkpoint_steps: list[int] = field(default_factory=list)  # kept for probing along training
    checkpoint_every: int = 0  # periodic resume points; only the newest is kept
    resume: bool = True
    distributed: str = "ddp"  # ddp | fsdp, when launched by torchrun
    num_threads: int | None = None
    peak_flops: float | None = None  # MFU denominator; measured (matmul) when null
    model: ModelArgs = field(default_factory=ModelArgs)
    data: DataArgs = field(default_factory=DataArgs)
    optim: OptimArgs = field(default_factory=OptimArgs)

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.name

    def total_steps(self) -> int:
        if self.max_tokens:
            return max(1, math.ceil(self.max_tokens / (self.batch_size * (self.data.seq_len))))
        return self.steps


# Keys that do not change what is trained: a run may be resumed with other values for them.
NON_DEFINING_KEYS = {
    "name", "out_dir", "resume", "log_every", "eval_every", "eval_sequences", "checkpoint_steps",
    "checkpoint_every", "num_threads", "peak_flops", "distributed", "data.cache_dir", "data.data_root",
}  # fmt: skip


class NonFiniteLossError(CrossbertError, RuntimeError):
    pass


def build_model_config(cfg: TrainConfig, tokenizer) -> CrossBertConfig:
    m = cfg.model
    shape = {k: getattr(m, k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "predictor_hidden_size")}
    config = config_from_preset(
        m.preset,
        objective=m.objective,
        mask_ratio=m.mask_ratio,
        complementary_masking=m.complementary_masking,
        predictor_layers=m.predictor_layers,
        mlp_type=m.mlp_type,
        norm_type=m.norm_type,
        max_position_embeddings=cfg.data.seq_len,
        **shape,
        **special_token_config(tokenizer),
    )
    check_tokenizer_matches(config, tokenizer, f"tokenizer {cfg.data.tokenizer!r}")
    return config


def lr_at(step: int, total: int, o: OptimArgs) -> float:
    if step < o.warmup_steps:
        return o.lr * (step + 1) / o.warmup_steps
    if o.schedule == "constant":
        return o.lr
    progress = min(1.0, (step - o.warmup_steps) / max(1, total - o.warmup_steps))
    decay = 0.5 * (1 + math.cos(math.pi * progress)) if o.schedule == "cosine" else 1.0 - progress
    return o.lr * (o.min_lr_ratio + (1 - o.min_lr_ratio) * decay)


def step_generator(seed: int, step: int, stream: int = 0) -> torch.Generator:
    """The masking RNG of one step: independent of process count and of where the run was resumed."""
    state = int(np.random.SeedSequence([seed, stream, step]).generate_state(1, dtype=np.uint64)[0] >> 1)
    return torch.Generator().manual_seed(state)


def make_optimizer(model: torch.nn.Module, o: OptimArgs) -> torch.optim.AdamW:
    # No weight decay on norms, biases and the mask embedding (all 1-D), as in BERT / GPT-2.
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps)


def check_resume_compatible(run_dir: Path, cfg: TrainConfig) -> None:
    saved_file = run_dir / "config.yaml"
    if not saved_file.exists():
        return
    saved, current = read_yaml(saved_file), to_dict(cfg)
    diffs = [d for d in diff_dicts(saved, current) if d[0] not in NON_DEFINING_KEYS]
    if diffs:
        listing = "; ".join(f"{k}: saved {a!r}, now {b!r}" for k, a, b in diffs)
        raise ConfigError(
            f"{saved_file}: this run folder was trained with another config ({listing}). "
            "Use another `name=`/`out_dir=`, or `resume=false` after removing the folder."
        )


def slice_batch(batch: dict, start: int, stop: int) -> dict:
    return {k: v[start:stop] for k, v in batch.items()}


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


class Trainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.env = D.init_distributed()
        self.run_dir = cfg.run_dir
        if cfg.batch_size % (self.env.world_size * cfg.grad_accum):
            raise ConfigError(
                f"batch_size ({cfg.batch_size}) must be divisible by processes x grad_accum "
                f"({self.env.world_size} x {cfg.grad_accum})"
            )
        torch.set_num_threads(cfg.num_threads or max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))

        # Rank 0 tokenizes (once, cached); the others wait and then read the cache.
        if self.env.is_main:
            self.data = prepare_data(cfg.data)
        D.barrier(self.env)
        if not self.env.is_main:
            self.data = prepare_data(cfg.data)

        self.model_config = build_model_config(cfg, self.data.tokenizer)
        self.total_steps = cfg.total_steps()
        self.amp_dtype = autocast_dtype(cfg.dtype, self.env.device)
        torch.manual_seed(cfg.seed)
        model = pretraining_model_for(self.model_config).to(self.env.device)
        self.model = D.wrap_model(model, self.env, cfg.distributed, (Block, PredictorBlock))
        self.hf_model = D.unwrap(self.model)
        self.optimizer = make_optimizer(self.model, cfg.optim)
        self.sampler = EpochSampler(len(self.data.train), cfg.seed)
        self.flops_per_token = training_flops_per_token(self.model_config, cfg.data.seq_len)
        dtype_name = "bfloat16" if self.amp_dtype else "float32"
        self.peak_flops = cfg.peak_flops or matmul_flops(str(self.env.device), dtype_name) * self.env.world_size
        self.start_step = self._resume_or_start()

    # -- set-up ------------------------------------------------------------------------------------

    def _resume_or_start(self) -> int:
        cfg = self.cfg
        latest = latest_checkpoint(self.run_dir) if cfg.resume else None
        if (self.run_dir / "config.yaml").exists() and not cfg.resume:
            raise ConfigError(f"{self.run_dir} already holds a run and resume=false: choose another name or remove it")
        check_resume_compatible(self.run_dir, cfg)
        if self.env.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(self.run_dir)
            atomic_write_text(self.run_dir / "config.yaml", dump_yaml(cfg))
            info = {
                "model": describe(self.model_config, cfg.data.seq_len),
                "total_steps": self.total_steps,
                "world_size": self.env.world_size,
                "autocast_dtype": str(self.amp_dtype) if self.amp_dtype else "float32",
                "peak_flops": self.peak_flops,
                "data": self.data.meta,
                **provenance(),
            }
            atomic_write_json(self.run_dir / "run_info.json", info)
        if latest is None:
            return 0
        step, path = latest
        state = load_file(str(path / "model.safetensors"))
        D.load_full_state(self.model, self.optimizer, state, load_optimizer_state(path))
        if self.env.is_main:
            # Forget metrics logged after the checkpoint: they will be produced again.
            rows = [r for r in read_jsonl(self.run_dir / "metrics.jsonl") if r["step"] <= step]
            atomic_write_text(self.run_dir / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        (log.info if self.env.is_main else log.debug)("resumed %s from %s (step %d of %d)", self.run_dir, path, step, self.total_steps)
        return step

    # -- one step ----------------------------------------------------------------------------------

    def global_batch(self, step: int, generator: torch.Generator) -> dict:
        ids = self.data.train.get(self.sampler.indices(step, self.cfg.batch_size))
        return pretraining_batch(ids, torch.ones_like(ids), self.model_config, generator)

    def _autocast(self):
        return torch.autocast(self.env.device.type, dtype=self.amp_dtype or torch.float32, enabled=self.amp_dtype is not None)

    def train_step(self, step: int) -> dict:
        cfg, env = self.cfg, self.env
        lr = lr_at(step, self.total_steps, cfg.optim)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batch = self.global_batch(step, step_generator(cfg.seed, step))
        targets = num_targets(batch)
        per_rank = cfg.batch_size // env.world_size
        local = slice_batch(batch, env.rank * per_rank, (env.rank + 1) * per_rank)
        micro = per_rank // cfg.grad_accum
        loss_sum = 0.0
        for i in range(cfg.grad_accum):
            part = to_device(slice_batch(local, i * micro, (i + 1) * micro), env.device)
            sync = i == cfg.grad_accum - 1
            context = self.model.no_sync() if (not sync and hasattr(self.model, "no_sync")) else contextlib.nullcontext()
            with context, self._autocast():
                out = self.model(**part)
            # DDP averages gradients over ranks: scale so that the result is sum / global count.
            (out.loss_sum * (env.world_size / targets)).backward()
            loss_sum += float(out.loss_sum.detach())
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.grad_clip))
        (loss_sum,) = D.all_reduce_sum(env, loss_sum)
        loss = loss_sum / targets
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            latest = latest_checkpoint(self.run_dir)
            raise NonFiniteLossError(
                f"non-finite training loss {loss} (grad norm {grad_norm}) at step {step} of {self.run_dir}; "
                f"nothing of this step was written; last good checkpoint: {latest[1] if latest else 'none'}. "
                "Lower optim.lr or optim.grad_clip, or use dtype=fp32."
            )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss": loss, "lr": lr, "grad_norm": grad_norm, "targets": targets}

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Masked-token loss on a fixed set of held-out sequences with fixed masks (perplexity for MLM)."""
        cfg, env = self.cfg, self.env
        n = min(cfg.eval_sequences, len(self.data.val))
        if n == 0:
            return {}
        self.model.eval()
        total, count = 0.0, 0
        generator = step_generator(cfg.seed, 0, stream=1)
        for start in range(0, n, cfg.batch_size):
            ids = self.data.val.get(np.arange(start, min(n, start + cfg.batch_size)))
            batch = pretraining_batch(ids, torch.ones_like(ids), self.model_config, generator)
            rows = len(ids)
            lo, hi = env.rank * rows // env.world_size, (env.rank + 1) * rows // env.world_size
            part = to_device(slice_batch(batch, lo, hi), env.device)
            with self._autocast():
                out = (self.model if cfg.distributed == "fsdp" else self.hf_model)(**part)
            total += float(out.loss_sum)
            count += int(out.num_predicted)
        self.model.train()
        total, count = D.all_reduce_sum(env, total, count)
        val_loss = total / max(count, 1)
        return {"val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 50.0)), "val_targets": int(count)}

    # -- checkpoints -------------------------------------------------------------------------------

    def _should_checkpoint(self, step: int) -> bool:
        cfg = self.cfg
        return step == self.total_steps or step in cfg.checkpoint_steps or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0)

    def save(self, step: int, metrics: dict) -> None:
        cfg = self.cfg
        model_state = D.full_model_state(self.model)
        optim_state = D.full_optimizer_state(self.model, self.optimizer)
        if self.env.is_main:
            tokens = step * cfg.batch_size * cfg.data.seq_len
            state = {
                "step": step,
                "total_steps": self.total_steps,
                "corpus_tokens": tokens,
                "train_flops": tokens * self.flops_per_token,
                "objective": self.model_config.objective,
                "run": str(self.run_dir),
                "metrics": metrics,
                **provenance(),
            }
            save_checkpoint(checkpoint_dir(self.run_dir, step), self.hf_model, model_state, self.data.tokenizer, state, optim_state)
            # Periodic resume points are replaced by newer ones; probe checkpoints are kept.
            keep = set(cfg.checkpoint_steps) | {self.total_steps, step}
            for old_step, path in list_checkpoints(self.run_dir):
                if old_step not in keep:
                    shutil.rmtree(path, ignore_errors=True)
        D.barrier(self.env)

    # -- the loop ----------------------------------------------------------------------------------

    def fit(self) -> Path:
        cfg, env = self.cfg, self.env
        if self.start_step >= self.total_steps:
            log.info("%s is complete (%d steps); nothing to do", self.run_dir, self.total_steps)
            return self.run_dir
        counts = describe(self.model_config, cfg.data.seq_len)
        (log.info if env.is_main else log.debug)(
            "training %s: %s %s (%s encoder params, %.3g train FLOPs/token), %d steps x %d seqs x %d tokens, "
            "%d process(es), autocast %s",
            self.run_dir, self.model_config.objective, cfg.model.preset, f"{counts['params_encoder']:,}",
            self.flops_per_token, self.total_steps, cfg.batch_size, cfg.data.seq_len, env.world_size, self.amp_dtype or "off",
        )  # fmt: skip
        self.model.train()
        views = self.model_config.num_views
        bar = tqdm(total=self.total_steps, initial=self.start_step, desc=f"train {cfg.name}", disable=not env.is_main or None)
        if self.start_step == 0:
            initial = self.evaluate()  # the untrained model: where the validation curve starts
            if initial and env.is_main:
                append_jsonl(self.run_dir / "metrics.jsonl", [{"step": 0, "corpus_tokens": 0, **initial}])
        window_start, window_tokens = time.perf_counter(), 0
        progress_every = max(cfg.log_every, (self.total_steps // 20) // cfg.log_every * cfg.log_every)
        for step in range(self.start_step, self.total_steps):
            out = self.train_step(step)
            done = step + 1
            window_tokens += cfg.batch_size * cfg.data.seq_len
            bar.update(1)
            row = None
            if done % cfg.log_every == 0 or done == self.total_steps:
                elapsed = time.perf_counter() - window_start
                tps = window_tokens / elapsed
                row = {
                    "step": done,
                    "loss": out["loss"],
                    "lr": out["lr"],
                    "grad_norm": out["grad_norm"],
                    "corpus_tokens": done * cfg.batch_size * cfg.data.seq_len,
                    "corpus_tokens_per_s": tps,
                    "sequence_tokens_per_s": tps * views,  # every CMS view counts as one sequence
                    "mfu": tps * self.flops_per_token / self.peak_flops,
                }
                window_start, window_tokens = time.perf_counter(), 0
                bar.set_postfix(loss=f"{out['loss']:.3f}", tok_s=f"{tps:,.0f}", mfu=f"{row['mfu']:.1%}")
                if bar.disable and env.is_main and done % progress_every == 0:  # no terminal: log lines instead
                    log.info("step %d/%d loss %.4f lr %.2e %s tok/s MFU %.1f%%", done, self.total_steps, out["loss"], out["lr"], f"{tps:,.0f}", 100 * row["mfu"])
            checkpoint = self._should_checkpoint(done)
            # every checkpoint carries its validation loss (the sweep tables join probe scores with it)
            val = self.evaluate() if (done % cfg.eval_every == 0 or checkpoint) else {}
            if val:
                row = {**(row or {"step": done}), **val}
                bar.write(f"step {done}: val_loss {val['val_loss']:.4f} (ppl {val['val_ppl']:.1f})") if env.is_main else None
            if row and env.is_main:
                append_jsonl(self.run_dir / "metrics.jsonl", [row])
            if checkpoint:
                self.save(done, val)
        bar.close()
        return self.run_dir


def train(cfg: TrainConfig) -> Path:
    set_offline_env()
    quiet_transformers()
    trainer = Trainer(cfg)
    try:
        return trainer.fit()
    finally:
        D.cleanup(trainer.env)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    path, overrides = (argv[0], argv[1:]) if "=" not in argv[0] else (None, argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    train(load_config(TrainConfig, path, overrides))


if __name__ == "__main__":
    main()
