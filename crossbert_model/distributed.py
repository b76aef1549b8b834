"""torchrun / torch.distributed glue: DDP (gloo on CPU, NCCL on GPU) and FSDP2 for large presets.

Launched without torchrun everything here degrades to a single process with no process group.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    owns_group: bool = False  # this call made the process group, so its cleanup ends it (else its maker does)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed() -> DistEnv:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    owns_group = world > 1 and not dist.is_initialized()
    if owns_group:
        # Generous timeout: rank 0 may tokenize a large corpus while the others wait at a barrier.
        minutes = int(os.environ.get("CROSSBERT_DIST_TIMEOUT_MIN", "180"))
        dist.init_process_group(backend="nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=minutes))
    return DistEnv(rank, world, local_rank, device, owns_group)


@contextlib.contextmanager
def shared_process_group() -> Iterator[DistEnv]:
    """One process group for every training inside (a sweep under torchrun trains all its runs in one): each
    trainer finds it made and leaves it (cleanup), and it ends here."""
    env = init_distributed()
    try:
        yield env
    finally:
        cleanup(env)


def barrier(env: DistEnv) -> None:
    if env.enabled:
        dist.barrier()


def all_reduce_sum(env: DistEnv, *values: float) -> list[float]:
    if not env.enabled:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=env.device)
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_sum_tensor(env: DistEnv, value: torch.Tensor) -> torch.Tensor:
    """Sum over processes, on the device: nothing waits for the result until it is read."""
    if env.enabled:
        value = value.clone()
        dist.all_reduce(value)
    return value


def wrap_model(
    model: torch.nn.Module, env: DistEnv, mode: str, block_types: tuple[type, ...], param_dtype: torch.dtype | None = None
) -> torch.nn.Module:
    """DDP replicates the model; FSDP2 (`fully_shard`) shards each block, then the root. With a bf16
    `param_dtype` FSDP gathers and computes in bf16 and reduces gradients in fp32 (the sharded weights and
    the optimizer stay fp32): half the gather traffic, no loss of gradient precision in the sum."""
    if not env.enabled:
        return model
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[env.local_rank] if env.device.type == "cuda" else None)
    if mode == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
        for module in model.modules():
            if isinstance(module, block_types):
                fully_shard(module, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        return model
    raise ValueError(f"config field 'distributed': expected 'ddp' or 'fsdp', got {mode!r}")


def compile_blocks(model: torch.nn.Module, block_types: tuple[type, ...]) -> None:
    """torch.compile each block's computation (`compute`) in place. Under FSDP the gathers and reductions
    run in the module's hooks, eager, around it; module tree and state dict keys are unchanged. `compute`,
    not `forward`: each block type then has its own compiled code (one graph for all encoder blocks), and
    the activation-checkpointing switch in `forward` stays outside the graphs."""
    for module in model.modules():
        if isinstance(module, block_types):
            module.compute = torch.compile(module.compute)


@contextlib.contextmanager
def gradient_sync(model: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """Forward and backward of one micro-batch, reducing gradients across processes only when `enabled`
    (the last micro-batch of a step). Otherwise DDP skips its all-reduce (`no_sync`) and FSDP2 its
    reduce-scatter (`set_requires_gradient_sync(False)`: gradients accumulate unsharded, in the reduce dtype)."""
    from torch.distributed.fsdp import FSDPModule

    if enabled or not (hasattr(model, "no_sync") or isinstance(model, FSDPModule)):
        yield
    elif isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        with model.no_sync():
            yield


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state(model: torch.nn.Module) -> dict:
    """The whole state dict (gathered from shards under FSDP; every rank must call)."""
    return get_model_state_dict(model, options=_FULL)


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    return get_optimizer_state_dict(model, optimizer, options=_FULL)


def load_full_state(model, optimizer, model_state: dict, optimizer_state: dict | None) -> None:
    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_state, options=options)
    if optimizer is not None and optimizer_state is not None:
        set_optimizer_state_dict(model, optimizer, optimizer_state, options=options)


def cleanup(env: DistEnv) -> None:
    """End the process group where `env` made it. A group made before (a sweep under torchrun trains its runs in one
    group) is left to its maker: a group ended and made again in the same processes is not reliable (gloo's second
    rendezvous reads the first one's addresses and hangs, measured with torch 2.13)."""
    if env.owns_group and dist.is_initialized():
        dist.destroy_process_group()
