"""What this machine's arithmetic is worth: measured matmul peak and whether bf16 autocast pays.

bf16 is not assumed to help on CPU: on a CPU without native bf16 dot products (AVX2-only EPYC, for
one) PyTorch emulates it and a bf16 matmul runs hundreds of times slower than fp32. `dtype=auto`
therefore measures both and takes bf16 only where it is clearly faster.
"""

from __future__ import annotations

import functools
import time

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@functools.lru_cache(maxsize=None)
def matmul_flops(device_str: str, dtype_str: str, n: int | None = None, reps: int = 5) -> float:
    """Peak FLOP/s of an n x n x n matmul: the best of `reps` timed runs (the MFU denominator).
    The best, not the mean, because this machine is shared and a peak is what nothing slowed down."""
    device, dtype = torch.device(device_str), getattr(torch, dtype_str)
    n = n or (8192 if device.type == "cuda" else 2048)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    a @ b  # warm-up
    _sync(device)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


@functools.lru_cache(maxsize=None)
def bf16_speedup(device_str: str) -> float:
    """fp32 time / bf16 time of a mid-size matmul (>1 means bf16 is faster)."""
    fp32 = matmul_flops(device_str, "float32", 256, 3)
    bf16 = matmul_flops(device_str, "bfloat16", 256, 3)
    return bf16 / fp32


def autocast_dtype(requested: str, device: torch.device) -> torch.dtype | None:
    """`fp32` -> None (no autocast); `bf16` -> bfloat16; `auto` -> bfloat16 where measured faster."""
    if requested == "fp32":
        return None
    if requested == "bf16":
        return torch.bfloat16
    if requested != "auto":
        raise ValueError(f"config field 'dtype': expected 'auto', 'fp32' or 'bf16', got {requested!r}")
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    return torch.bfloat16 if bf16_speedup(str(device)) > 1.2 else None
