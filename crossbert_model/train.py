"""The trainer: one loop, read top to bottom.

    crossbert train configs/train/tiny_crossbert.yaml model.preset=mini steps=2000
    torchrun --nproc_per_node 2 -m crossbert_model.train CONFIG [key=value ...]

Every step is a pure function of (seed, step): the batch comes from `EpochSampler`, and each row's masks
from (seed, step, its index in the global batch) (`masking.RowRandom`), so every process draws only its
own rows. Hence resuming from a checkpoint reproduces the uninterrupted run, and N processes reproduce
one process at the same global batch. The loss is normalised by the number of predicted tokens of the
global batch, which each process knows without the others' masks (`objectives.targets_per_row`), so
gradient accumulation, DDP and FSDP give the same update as one big batch.

Before anything is written the config is validated (crossbert_model.train_config: each error names its
field) and `dtype=auto` is resolved to fp32 or bf16 for the life of the run. A step whose loss or
gradient norm is non-finite, or whose loss is above `divergence_threshold`, stops the run before the
update, and a diverged model is never checkpointed; `resume_allow_changes=[optim.lr]` continues from
the latest checkpoint with another learning rate, recorded in run_info.json.

On an accelerator the step never waits for the device: batches and masks are prepared on the host,
ahead, on pinned memory, with every data-dependent shape decided there (`objectives.pretraining_batch`);
the loss and gradient norm stay on the device and are read only every `log_every` steps, at
evaluations and checkpoints, where the divergence check then runs (a diverged model is still never
checkpointed). On the CPU reading costs nothing, so they are read and checked at every step.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import json
import logging
import math
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import torch
from tqdm.auto import tqdm

from . import distributed as D
from .model_card import model_card
from .readers import read_json
from .run_layout import RunDir
from .args import ConfigError, config_main, dump_yaml
from .checkpoint import (
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_model_state,
    load_optimizer_state,
    read_trainer_state,
    remove_stale_temporaries,
    save_checkpoint,
)
from .claims import exclusive_folder
from .data.corpus import corpus_location
from .data.sequences import CorpusData, EpochSampler, prepare_data
from .logs import duration
from .hardware import matmul_flops, torch_autocast_dtype
from .masking import MASKING_SCHEME, RowRandom
from .model import Block, PredictorBlock
from .objectives import describe, num_views, pretraining_batch, pretraining_model_for, targets_per_row, training_flops_per_token
from .plateau import SMOOTHING
from .shared_loss import protocol_ratios, protocol_selections, shared_loss_metrics, shared_loss_sums
from .utils import (
    append_jsonl,
    atomic_write_json,
    atomic_write_text,
    core_share,
    data_root,
    provenance,
    quiet_transformers,
    set_offline_env,
)
from .validation import unigram_entropies, validation_batches
from .readers import read_jsonl
from .errors import CrossbertError, report_crashes_in
from .train_config import OptimArgs, TrainConfig, model_config, validate_config
from .resume import check_masking_scheme, check_resume_compatible, resolve_run_precision
from .tracking import Trackers, open_trackers


log = logging.getLogger("crossbert.train")


# Periodic resume points (checkpoint_every) kept: two, so that a damaged newest one has a fallback.
KEEP_PERIODIC = 2


class TrainingDivergedError(CrossbertError, RuntimeError):
    """Training blew up: the message names the condition, the latest usable checkpoint and how to continue."""


class NonFiniteLossError(TrainingDivergedError):
    """The loss or the gradient norm is inf / nan."""


def divergence_threshold(vocab_size: int) -> float:
    """The masked-token loss above which a run counts as diverged: max(2 x ln(vocab_size), 10).

    A model that has learnt nothing predicts the uniform distribution over the vocabulary, a loss of
    ln(V), and a freshly initialised model starts about there; training only goes down from it. A
    loss of twice that is a model confidently wrong on most tokens, which a healthy run never is and a
    blown-up update (too high a learning rate) is at once. The floor of 10 keeps very small
    vocabularies (tests) from tripping on early noise."""
    return max(2.0 * math.log(max(vocab_size, 2)), 10.0)


def loss_is_usable(loss: float | None, threshold: float) -> bool:
    return loss is None or (math.isfinite(loss) and loss <= threshold)


def lr_at(step: int, total: int, o: OptimArgs) -> float:
    if step < o.warmup_steps:
        return o.lr * (step + 1) / o.warmup_steps
    if o.schedule == "constant":
        return o.lr
    progress = min(1.0, (step - o.warmup_steps) / max(1, total - o.warmup_steps))
    decay = 0.5 * (1 + math.cos(math.pi * progress)) if o.schedule == "cosine" else 1.0 - progress
    return o.lr * (o.min_lr_ratio + (1 - o.min_lr_ratio) * decay)


def step_generator(seed: int, step: int, stream: int = 0) -> RowRandom:
    """The masking randomness of one step, rows from global row 0 (`RowRandom.from_row` for others):
    independent of process count and of where the run was resumed."""
    return RowRandom(seed, step, stream)


def make_optimizer(model: torch.nn.Module, o: OptimArgs, device: torch.device = torch.device("cpu")) -> torch.optim.AdamW:
    # No weight decay on norms, biases and the mask embedding (all 1-D), as in BERT / GPT-2.
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # One fused kernel for the whole update on CUDA; the CPU keeps the default (foreach) implementation.
    return torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, fused=device.type == "cuda")


def slice_batch(batch: dict, start: int, stop: int) -> dict:
    return {k: None if v is None else v[start:stop] for k, v in batch.items()}


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: None if v is None else v.to(device, non_blocking=True) for k, v in batch.items()}


def pinned(batch: dict) -> dict:
    """Page-locked host memory: the copy to the GPU is asynchronous and overlaps the running step."""
    return {k: None if v is None else v.pin_memory() for k, v in batch.items()}


def prepared_ahead(make: Callable[[int], dict], steps: Iterable[int], depth: int = 2) -> Iterator[dict]:
    """make(step) for each step, computed `depth` steps ahead by one background thread, so that reading
    the corpus and drawing masks overlap the device's work on the current step."""
    steps = iter(steps)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="batches") as pool:
        pending = collections.deque(pool.submit(make, s) for s in itertools.islice(steps, depth))
        while pending:
            batch = pending.popleft().result()
            pending.extend(pool.submit(make, s) for s in itertools.islice(steps, 1))
            yield batch


# Without a terminal (a log file, a sweep worker), a progress line at least this often (seconds), on a logged step.
PROGRESS_LINE_S = 30.0


class Trainer:
    def __init__(self, cfg: TrainConfig):
        validate_config(cfg)  # before anything is written
        self.env = D.init_distributed()
        if cfg.batch_size % (self.env.world_size * cfg.grad_accum):
            raise ConfigError(
                f"config field 'batch_size': expected a multiple of processes x grad_accum "
                f"({self.env.world_size} x {cfg.grad_accum}), got {cfg.batch_size}"
            )
        # dtype=auto is decided here, once; config.yaml records the decision and resumes keep it.
        self.precision = self._same_on_every_rank(resolve_run_precision(cfg, self.env.device))
        self.cfg = cfg = dataclasses.replace(cfg, dtype=self.precision["resolved"])
        self.run_dir, self.layout = cfg.run_dir, RunDir(cfg.run_dir)
        if self.layout.config.exists() and not cfg.resume:
            raise ConfigError(f"{self.run_dir} already holds a run and resume=false: choose another name or remove it")
        self.allowed_changes = check_resume_compatible(self.run_dir, cfg) if cfg.resume else []
        torch.set_num_threads(cfg.num_threads or core_share(int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
        if cfg.deterministic:
            torch.use_deterministic_algorithms(True)

        # Rank 0 tokenizes (once, cached); the others wait and then read the cache.
        if self.env.is_main:
            self.data = prepare_data(cfg.data)
        D.barrier(self.env)
        if not self.env.is_main:
            self.data = prepare_data(cfg.data)

        self.validation = validation_plan(cfg, self.data)
        self.model_config = model_config(cfg.model, cfg.data, self.data.tokenizer)  # built once, with the vocabulary
        self.max_loss = divergence_threshold(self.model_config.vocab_size)
        # Where a model that knows only token frequencies stands: recorded in run_info.json and beside
        # every evaluation's losses (crossbert_model.plateau).
        self.unigram_entropies = unigram_entropies(self.data, self.model_config, cfg)
        self.total_steps = cfg.total_steps()
        self.amp_dtype = torch_autocast_dtype(cfg.dtype)
        torch.manual_seed(cfg.seed)
        model = pretraining_model_for(self.model_config).to(self.env.device)
        model.set_activation_checkpointing(cfg.activation_checkpointing)
        fsdp = self.env.enabled and cfg.distributed == "fsdp"
        if cfg.compile and fsdp:  # each block on its own: FSDP's gathers and reductions stay outside the graphs
            D.compile_blocks(model, (Block, PredictorBlock))
        self.model = D.wrap_model(model, self.env, cfg.distributed, (Block, PredictorBlock), param_dtype=self.amp_dtype)
        self.hf_model = D.unwrap(self.model)
        self.optimizer = make_optimizer(self.model, cfg.optim, self.env.device)
        # The module that runs the step: compiled or not, it shares its parameters with self.model.
        self.step_model = torch.compile(self.model) if cfg.compile and not fsdp else self.model
        # The loss normaliser: the global batch's predicted-token count, which depends on the rows' lengths
        # only (every training sequence is packed to seq_len), so no process needs the others' masks.
        self.global_targets = int(targets_per_row(torch.full((cfg.batch_size,), cfg.data.seq_len), self.model_config).sum())
        # On the CPU a read costs nothing: check every step. Elsewhere, only at logging points.
        self.read_every_step = self.env.device.type == "cpu"
        self.sampler = EpochSampler(len(self.data.train), cfg.seed)
        self.flops_per_token = training_flops_per_token(self.model_config, cfg.data.seq_len)
        dtype_name = "bfloat16" if self.amp_dtype else "float32"
        self.peak_flops = cfg.peak_flops or matmul_flops(str(self.env.device), dtype_name) * self.env.world_size
        self.start_step = self._resume_or_start()

    # -- set-up ------------------------------------------------------------------------------------

    def _same_on_every_rank(self, value):
        """Rank 0's value everywhere: a measured decision (dtype=auto) must not differ between processes."""
        if not self.env.enabled:
            return value
        box = [value]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def _resume_or_start(self) -> int:
        step, path = self._load_latest_checkpoint() if self.cfg.resume else (0, None)
        if self.env.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(self.run_dir)
            atomic_write_text(self.layout.config, dump_yaml(self.cfg))
            atomic_write_json(self.layout.run_info, self._run_info(step))
            metrics_file = self.layout.metrics
            if metrics_file.exists():
                # Forget metrics logged after the checkpoint (all of them when starting over, as after a
                # divergence before the first checkpoint): they will be produced again.
                rows = [r for r in read_jsonl(metrics_file) if path is not None and r["step"] <= step]
                rows = list({r["step"]: r for r in rows}.values())  # one row a step (older files may hold steps twice)
                atomic_write_text(metrics_file, "".join(json.dumps(r) + "\n" for r in rows))
        if path is not None:
            (log.info if self.env.is_main else log.debug)(
                "resumed %s from %s (step %d of %d)", self.run_dir, path, step, self.total_steps
            )
        return step

    def _run_info(self, step: int) -> dict:
        info_file = self.layout.run_info
        history = (
            read_json(info_file, "a run's run_info.json", CheckpointError).get("config_history", []) if info_file.exists() else []
        )
        if self.allowed_changes:
            changes = {key: {"saved": old, "now": new} for key, old, new in self.allowed_changes}
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            history.append({"resumed_at_step": step, "changes": changes, "time": when})
            log.info("resuming %s at step %d with changed %s (resume_allow_changes)", self.run_dir, step, ", ".join(changes))
        return {
            "model": describe(self.model_config, self.cfg.data.seq_len),
            "total_steps": self.total_steps,
            "world_size": self.env.world_size,
            "precision": self.precision,  # requested, resolved, measured bf16 speed-up, why
            "autocast_dtype": str(self.amp_dtype) if self.amp_dtype else "float32",
            "peak_flops": self.peak_flops,
            "divergence_threshold": self.max_loss,
            "masking_scheme": MASKING_SCHEME,
            "unigram_entropies": {**self.unigram_entropies, "smoothing": SMOOTHING},
            "validation": self.validation,
            "data": self.data.meta,
            "config_history": history,
            **provenance(),
        }

    def _load_latest_checkpoint(self) -> tuple[int, Path | None]:
        """Load the newest usable checkpoint; a damaged one is set aside (renamed `step_*.corrupt`)
        with a warning naming the file, and the previous one is used instead."""
        candidates = list(reversed(list_checkpoints(self.run_dir)))
        damaged = []
        loaded = (0, None)
        for step, path in candidates:
            try:
                trainer_state = read_trainer_state(path)
                check_masking_scheme(path, trainer_state)
                val_loss = (trainer_state.get("metrics") or {}).get("val_loss")
                if not loss_is_usable(val_loss, self.max_loss):
                    log.warning("%s: validation loss %s is diverged; resuming from an earlier checkpoint", path, val_loss)
                    continue
                state = load_model_state(path)
                optim_state = load_optimizer_state(path)
            except CheckpointError as e:
                log.warning("%s; resuming from the previous checkpoint instead", e)
                damaged.append(path)
                continue
            D.load_full_state(self.model, self.optimizer, state, optim_state)
            loaded = (step, path)
            break
        D.barrier(self.env)  # every rank has read before rank 0 moves damaged folders
        if self.env.is_main:
            for path in damaged:
                aside = path.with_name(path.name + ".corrupt")
                shutil.rmtree(aside, ignore_errors=True)
                path.rename(aside)
        if candidates and loaded[1] is None:
            # Starting over silently would overwrite what the folder holds: the user decides.
            diverged = len(candidates) - len(damaged)
            why = [f"{len(damaged)} damaged, renamed *.corrupt"] * bool(damaged) + [f"{diverged} diverged"] * bool(diverged)
            raise CheckpointError(
                f"{self.run_dir / 'checkpoints'}: no usable checkpoint to resume from ({'; '.join(why)}); "
                "remove the run folder to start over"
            )
        return loaded

    # -- one step ----------------------------------------------------------------------------------

    def host_batch(self, step: int) -> dict:
        """This process's rows of the global batch of `step` (rows rank x per_rank onwards), masks and
        packing included, on the host (pinned for a GPU), with the global batch's predicted-token count."""
        per_rank = self.cfg.batch_size // self.env.world_size
        first = self.env.rank * per_rank
        ids = self.data.train.get(self.sampler.indices(step, self.cfg.batch_size)[first : first + per_rank])
        masks = step_generator(self.cfg.seed, step).from_row(first)
        batch = pretraining_batch(ids, torch.ones_like(ids), self.model_config, masks)
        return {**(pinned(batch) if self.env.device.type == "cuda" else batch), "targets": self.global_targets}

    def host_batches(self, start: int) -> Iterator[dict]:
        steps = range(start, self.total_steps)
        if self.env.device.type == "cpu":  # a thread would only compete with the step for the cores
            return map(self.host_batch, steps)
        return prepared_ahead(self.host_batch, steps)

    def _autocast(self):
        return torch.autocast(self.env.device.type, dtype=self.amp_dtype or torch.float32, enabled=self.amp_dtype is not None)

    def train_step(self, step: int, batch: dict, read: bool = True) -> dict:
        """One optimizer step on `batch` (from `host_batch`). Loss and gradient norm come back as device
        tensors; with `read` false (on an accelerator, between logging points) nothing waits for them."""
        cfg, env = self.cfg, self.env
        lr = lr_at(step, self.total_steps, cfg.optim)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        targets = batch.pop("targets")
        micro = cfg.batch_size // env.world_size // cfg.grad_accum
        loss_sum = torch.zeros((), dtype=torch.float64, device=env.device)
        for i in range(cfg.grad_accum):
            part = to_device(slice_batch(batch, i * micro, (i + 1) * micro), env.device)
            # Gradients cross processes once per step, after the last micro-batch.
            with D.gradient_sync(self.model, i == cfg.grad_accum - 1):
                with self._autocast():
                    out = self.step_model(**part)
                # DDP and FSDP average gradients over ranks: scale so that the result is sum / global count.
                (out.loss_sum * (env.world_size / targets)).backward()
            loss_sum += out.loss_sum.detach()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.grad_clip)
        loss = D.all_reduce_sum_tensor(env, loss_sum) / targets
        if read or self.read_every_step:
            self._check_divergence(step, float(loss), float(grad_norm))  # before the update: the model stays as it was
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss": loss, "lr": lr, "grad_norm": grad_norm, "targets": targets}

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Masked-token loss on a fixed set of held-out sequences with fixed masks (perplexity for MLM):
        `val_loss` is the objective's own task (not comparable across objectives), `shared_loss_r15` /
        `shared_loss_r50` the shared protocol's (comparable; see crossbert_model.shared_loss), each
        beside the unigram entropy of its targets (`unigram_entropy_val`, `unigram_entropy_r15`, ...)."""
        cfg, env = self.cfg, self.env
        n = min(cfg.eval_sequences, len(self.data.val))
        if n == 0:
            return {}
        self.model.eval()
        total, count = 0.0, 0
        for batch in validation_batches(self.data, n, self.model_config, cfg.seed, cfg.batch_size):
            rows = len(batch["input_ids"])
            lo, hi = env.rank * rows // env.world_size, (env.rank + 1) * rows // env.world_size
            part = to_device(slice_batch(batch, lo, hi), env.device)
            with self._autocast():
                out = (self.model if cfg.distributed == "fsdp" else self.hf_model)(**part)
            total += float(out.loss_sum)
            count += int(out.num_predicted)
        shared = self._shared_loss_sums(n)
        self.model.train()
        total, count = D.all_reduce_sum(env, total, count)
        val_loss = total / max(count, 1)
        metrics = {"val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 50.0)), "val_targets": int(count)}
        return {**metrics, **shared_loss_metrics(shared), **self.unigram_entropies}

    def _shared_loss_sums(self, n: int) -> dict[float, tuple[float, int]]:
        """The objective-independent masked-token loss (crossbert_model.shared_loss) on the same n
        validation sequences, at the protocol's ratios and the run's own: the number that compares a
        flat MLM run with a CrossBERT run."""
        cfg, env = self.cfg, self.env
        ids = self.data.val.get(np.arange(n))
        model = self.model if cfg.distributed == "fsdp" else self.hf_model
        selections = protocol_selections(torch.ones_like(ids), protocol_ratios(self.model_config.mask_ratio))
        sums = shared_loss_sums(
            model,
            self.model_config,
            ids,
            selections,
            cfg.batch_size,
            env.device,
            autocast=self._autocast,
            rows=lambda r: (env.rank * r // env.world_size, (env.rank + 1) * r // env.world_size),
        )
        ratios = list(sums)
        reduced = D.all_reduce_sum(env, *[x for ratio in ratios for x in sums[ratio]])
        return {ratio: (reduced[2 * i], int(reduced[2 * i + 1])) for i, ratio in enumerate(ratios)}

    # -- divergence ------------------------------------------------------------------------------

    def _check_divergence(self, step: int, loss: float, grad_norm: float | None = None, what: str = "training loss") -> None:
        if not math.isfinite(loss):
            raise NonFiniteLossError(f"non-finite {what} {loss} at step {step} of {self.run_dir}" + self._divergence_advice())
        if grad_norm is not None and not math.isfinite(grad_norm):
            raise NonFiniteLossError(
                f"non-finite gradient norm {grad_norm} at step {step} of {self.run_dir} ({what} {loss:.4g})"
                + self._divergence_advice()
            )
        if loss > self.max_loss:
            raise TrainingDivergedError(
                f"{what} {loss:.4g} at step {step} of {self.run_dir} is above the divergence threshold {self.max_loss:.3g} "
                f"(max(2 x ln(vocab_size {self.model_config.vocab_size}), 10))" + self._divergence_advice()
            )

    def _divergence_advice(self) -> str:
        usable = self.latest_usable_checkpoint()
        lower = f"optim.lr=<lower than {self.cfg.optim.lr:g}>"
        if usable is None:
            return (
                f"; nothing of this step was saved and the run has no usable checkpoint yet: start it again with {lower} "
                "resume_allow_changes=[optim.lr] (it starts from step 0); "
                "lowering optim.grad_clip or using dtype=fp32 may also help."
            )
        val_loss = "not measured" if usable[2] is None else f"{usable[2]:.4g}"
        return (
            f"; nothing of this step was saved. "
            f"Latest usable checkpoint: {usable[1]} (step {usable[0]}, val_loss {val_loss}). "
            f"To continue from it with a lower learning rate, run the same config with {lower} resume_allow_changes=[optim.lr] "
            "(a resume starts at the latest checkpoint); lowering optim.grad_clip or using dtype=fp32 may also help."
        )

    def latest_usable_checkpoint(self) -> tuple[int, Path, float | None] | None:
        """The newest checkpoint whose recorded validation loss is finite and below the threshold."""
        for step, path in reversed(list_checkpoints(self.run_dir)):
            try:
                val_loss = (read_trainer_state(path).get("metrics") or {}).get("val_loss")
            except CheckpointError:
                continue
            if loss_is_usable(val_loss, self.max_loss):
                return step, path, val_loss
        return None

    # -- checkpoints -------------------------------------------------------------------------------

    def _should_checkpoint(self, step: int) -> bool:
        cfg = self.cfg
        periodic = bool(cfg.checkpoint_every and step % cfg.checkpoint_every == 0)
        return step == self.total_steps or step in cfg.checkpoint_steps or periodic

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
                "dtype": cfg.dtype,
                "masking_scheme": MASKING_SCHEME,  # a resume refuses a checkpoint of another scheme
                "metrics": metrics,
                **provenance(),
            }
            card = model_card(self.hf_model.config, state, self.cfg, self.layout.name)
            save_checkpoint(
                self.layout.checkpoint(step).path, self.hf_model, model_state, self.data.tokenizer, state, optim_state, card
            )
            self._prune_periodic()
        D.barrier(self.env)

    def _prune_periodic(self) -> None:
        """Probe checkpoints and the final one are kept; of the periodic resume points, the newest
        KEEP_PERIODIC, so that a resume can fall back when the newest one is damaged."""
        protected = set(self.cfg.checkpoint_steps) | {self.total_steps}
        periodic = [(s, p) for s, p in list_checkpoints(self.run_dir) if s not in protected]
        for _, path in periodic[:-KEEP_PERIODIC]:
            shutil.rmtree(path, ignore_errors=True)

    # -- the loop ----------------------------------------------------------------------------------

    def fit(self) -> Path:
        """Train to the last step. Rank 0 writes each metrics row to metrics.jsonl and to the config's
        trackers (crossbert_model.tracking), opened for the steps still to train."""
        if self.start_step >= self.total_steps or not self.env.is_main:
            self.trackers = Trackers([])
            return self._fit()
        with open_trackers(self.cfg) as self.trackers:
            return self._fit()

    def _record(self, row: dict) -> None:
        append_jsonl(self.layout.metrics, [row])
        self.trackers.log(row)

    def _fit(self) -> Path:
        cfg, env = self.cfg, self.env
        final = self.layout.checkpoint(self.total_steps).path
        if self.start_step >= self.total_steps:
            log.info("%s is complete (%d steps); nothing to do", self.run_dir, self.total_steps)
            log.info("checkpoint: %s", final)
            return self.run_dir
        counts = describe(self.model_config, cfg.data.seq_len)
        (log.info if env.is_main else log.debug)(
            "training %s: %s %s (%s encoder params, %.3g train FLOPs/token), %d steps x %d seqs x %d tokens, "
            "%d process(es), dtype %s (%s), corpus %s",
            self.run_dir,
            self.model_config.objective,
            cfg.model.preset,
            f"{counts['params_encoder']:,}",
            self.flops_per_token,
            self.total_steps,
            cfg.batch_size,
            cfg.data.seq_len,
            env.world_size,
            cfg.dtype,
            self.precision["reason"],
            corpus_location(cfg.data),
        )
        self.model.train()
        views = num_views(self.model_config)
        bar = tqdm(total=self.total_steps, initial=self.start_step, desc=f"train {cfg.name}", disable=not env.is_main or None)
        if self.start_step == 0:
            initial = self.evaluate()  # the untrained model: where the validation curve starts
            if initial and env.is_main:
                self._record({"step": 0, "corpus_tokens": 0, **initial})
        window_start, window_tokens, last_line = time.perf_counter(), 0, time.monotonic()
        progress_every = max(cfg.log_every, (self.total_steps // 20) // cfg.log_every * cfg.log_every)
        for step, batch in zip(range(self.start_step, self.total_steps), self.host_batches(self.start_step)):
            done = step + 1
            checkpoint = self._should_checkpoint(done)
            evaluate = bool(cfg.eval_every and done % cfg.eval_every == 0) or checkpoint
            log_now = done % cfg.log_every == 0 or done == self.total_steps
            out = self.train_step(step, batch, read=log_now or evaluate)
            window_tokens += cfg.batch_size * cfg.data.seq_len
            bar.update(1)
            row = None
            if log_now:
                out = {k: float(v) if torch.is_tensor(v) else v for k, v in out.items()}
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
                # no terminal: log lines instead of the bar, every progress_every steps and at least every PROGRESS_LINE_S
                if (
                    bar.disable
                    and env.is_main
                    and (done % progress_every == 0 or time.monotonic() - last_line >= PROGRESS_LINE_S)
                ):
                    left = (self.total_steps - done) * cfg.batch_size * cfg.data.seq_len / max(tps, 1e-9)
                    log.info(
                        "step %d/%d loss %.4f lr %.2e %s tok/s MFU %.1f%% ETA %s",
                        done,
                        self.total_steps,
                        out["loss"],
                        out["lr"],
                        f"{tps:,.0f}",
                        100 * row["mfu"],
                        duration(left),
                    )
                    last_line = time.monotonic()
            # every checkpoint carries its validation loss (the sweep tables join probe scores with it)
            val = self.evaluate() if evaluate else {}
            if val:
                row = {**(row or {"step": done}), **val}
                bar.write(f"step {done}: val_loss {val['val_loss']:.4f} (ppl {val['val_ppl']:.1f})") if env.is_main else None
            if row and env.is_main:
                self._record(row)
            if val:  # a diverged model is never saved: the latest checkpoint stays a usable one
                self._check_divergence(done, val["val_loss"], what="validation loss")
            if checkpoint:
                self.save(done, val)
        bar.close()
        log.info("checkpoint: %s", final)
        return self.run_dir


def train(cfg: TrainConfig) -> Path:
    set_offline_env()
    quiet_transformers()
    validate_config(cfg)  # before the run folder's lock: a refused config leaves no folder behind
    if "data_root" in cfg.data.corpus:  # resolved once, here: every process and log line sees this path
        cfg.data.data_root = str(data_root(cfg.data.data_root))
    with holding_run_folder(cfg):
        report_crashes_in(cfg.run_dir)
        trainer = Trainer(cfg)
        try:
            return trainer.fit()
        except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (crossbert_model.errors): say what a rerun starts from
            e.args = (kept_after_interrupt(cfg.run_dir),)
            raise
        finally:
            D.cleanup(trainer.env)


def holding_run_folder(cfg: TrainConfig):
    """One trainer per run folder: its lock, held by rank 0 (the other ranks of a torchrun launch are the same
    trainer), so that a second trainer of the folder is refused with one line instead of training it twice."""
    if int(os.environ.get("RANK", "0")) != 0:
        return contextlib.nullcontext()
    return exclusive_folder(cfg.run_dir, "being trained")


def kept_after_interrupt(run_dir: Path) -> str:
    latest = latest_checkpoint(run_dir)
    if latest is None:
        return f"{run_dir}: stopped before its first checkpoint; the same command starts it again"
    return f"{run_dir}: stopped; checkpoint {latest[1].name} is kept and the same command resumes from it"


def validation_plan(cfg: TrainConfig, data: CorpusData) -> dict:
    """The validation sequences each evaluation scores (val_loss, the shared-protocol losses, the divergence check
    on validation). A corpus too small to hold any out is refused, unless eval_sequences=0 asks to train without
    validation, which is logged and recorded (run_info.json `validation`)."""
    used = min(cfg.eval_sequences, len(data.val))
    if used:
        return {"sequences": used}
    if cfg.eval_sequences:
        raise ConfigError(
            f"data.corpus {corpus_location(cfg.data)}: no validation sequence (its held-out documents, data.val_fraction "
            f"{cfg.data.val_fraction:g}, hold fewer than data.seq_len {cfg.data.seq_len} tokens), so no validation loss, shared-protocol "
            "loss or divergence check on validation: raise data.val_fraction or data.max_documents, or set eval_sequences=0 "
            "to train without validation"
        )
    reason = "eval_sequences=0: no validation loss, shared-protocol loss or divergence check on validation"
    log.warning("%s: trained without validation (%s)", cfg.run_dir, reason)
    return {"sequences": 0, "reason": reason}


def main(argv: list[str] | None = None) -> None:
    """torchrun entry point (`crossbert train` is the same for one process); `-h` prints this module's usage."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    config_main("crossbert_model.train", TrainConfig, train, argv)


if __name__ == "__main__":
    main()
