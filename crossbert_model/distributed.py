"""torchrun / torch.distributed glue: DDP (gloo on CPU, NCCL on GPU) and FSDP2 for large presets.

Launched without torchrun everything here degrades to a single process with no process group.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

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
    if world > 1 and not dist.is_initialized():
        # Generous timeout: rank 0 may tokenize a large corpus while the others wait at a barrier.
        minutes = int(os.environ.get("CROSSBERT_DIST_TIMEOUT_MIN", "180"))
        dist.init_process_group(backend="nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=minutes))
    return DistEnv(rank, world, local_rank, device)


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


def wrap_model(model: torch.nn.Module, env: DistEnv, mode: str, block_types: tuple[type, ...]) -> torch.nn.Module:
    """DDP replicates the model; FSDP2 (`fully_shard`) shards each block, then the root."""
    if not env.enabled:
        return model
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[env.local_rank] if env.device.type == "cuda" else None)
    if mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for module in model.modules():
            if isinstance(module, block_types):
                fully_shard(module)
        fully_shard(model)
        return model
    raise ValueError(f"config field 'distributed': expected 'ddp' or 'fsdp', got {mode!r}")


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
    if env.enabled and dist.is_initialized():
        dist.destroy_process_group()
