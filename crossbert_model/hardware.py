"""What this machine's arithmetic is worth: measured matmul peak and whether bf16 autocast pays.

Precision policy (`dtype` of a training config, `--dtype` of frozen evaluation):

* `fp32`: no autocast. `bf16`: bfloat16 autocast.
* `auto` is decided ONCE, by `resolve_dtype` / `resolve_precision`, and the decision is what a run
  records and keeps. On CUDA it is bf16 where the GPU supports it. On CPU it is bf16 only where a
  measured matmul (`bf16_speedup`) runs at least `BF16_MIN_SPEEDUP` times faster in bf16: on a CPU
  without native bf16 dot products (AVX2-only EPYC, for one) PyTorch emulates it and a bf16 matmul
  runs hundreds of times slower than fp32. The measurement is noisy on a shared machine, which is
  why a training run resolves `auto` at its start, writes the result (`dtype: bf16` or `fp32`) into
  its config.yaml, and a resume keeps it instead of measuring again.
"""

from __future__ import annotations

import functools
import time

import torch

from .args import ConfigError

from .defaults import DTYPES  # the one home of the dtype choices

# bf16 must be clearly faster to be worth its rounding: a ratio near 1 is timing noise.
BF16_MIN_SPEEDUP = 1.2


@functools.lru_cache(maxsize=None)
def matmul_flops(device_str: str, dtype_str: str, n: int | None = None, reps: int = 5) -> float:
    """Peak FLOP/s of an n x n x n matmul on random data (the MFU denominator).

    CUDA: about a second of products first, so the clocks have ramped up from idle, then the median of
    `max(reps, 50)` products timed by CUDA events. CPU: the best of `reps` host-timed runs, because this
    machine is shared and a peak is what nothing slowed down."""
    device, dtype = torch.device(device_str), getattr(torch, dtype_str)
    n = n or (8192 if device.type == "cuda" else 2048)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    if device.type == "cuda":
        return 2 * n**3 / _cuda_median_seconds(lambda: a @ b, warmup_s=1.0, reps=max(reps, 50))
    a @ b  # warm-up
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def _cuda_median_seconds(fn, warmup_s: float, reps: int) -> float:
    torch.cuda.synchronize()
    began = time.perf_counter()
    while time.perf_counter() - began < warmup_s:
        fn()
        torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(end) / 1e3 for start, end in events)
    return times[len(times) // 2]


@functools.lru_cache(maxsize=None)
def bf16_speedup(device_str: str) -> float:
    """fp32 time / bf16 time of a mid-size matmul (>1 means bf16 is faster)."""
    fp32 = matmul_flops(device_str, "float32", 256, 3)
    bf16 = matmul_flops(device_str, "bfloat16", 256, 3)
    return bf16 / fp32


def check_dtype(requested: str, field: str = "dtype") -> None:
    if requested not in DTYPES:
        raise ConfigError(f"config field {field!r}: expected one of {', '.join(DTYPES)}, got {requested!r}")


def resolve_precision(requested: str, device: torch.device) -> dict:
    """The concrete precision for `requested` on `device`, with what decided it (for run_info.json):
    {"requested", "resolved" ('fp32' | 'bf16'), "bf16_speedup" (measured, or None), "reason"}."""
    check_dtype(requested)
    device = torch.device(device)
    if requested != "auto":
        return {"requested": requested, "resolved": requested, "bf16_speedup": None, "reason": "requested"}
    if device.type == "cuda":
        supported = torch.cuda.is_bf16_supported()
        reason = "cuda device supports bf16" if supported else "cuda device lacks bf16"
        return {"requested": "auto", "resolved": "bf16" if supported else "fp32", "bf16_speedup": None, "reason": reason}
    speedup = bf16_speedup(str(device))
    faster = speedup >= BF16_MIN_SPEEDUP
    reason = f"measured bf16 matmul speed-up {speedup:.2f} {'>=' if faster else '<'} {BF16_MIN_SPEEDUP}"
    return {"requested": "auto", "resolved": "bf16" if faster else "fp32", "bf16_speedup": speedup, "reason": reason}


def resolve_dtype(requested: str, device: torch.device | str) -> str:
    """'auto' | 'fp32' | 'bf16' -> 'fp32' | 'bf16' (see the module docstring for what `auto` does)."""
    return resolve_precision(requested, torch.device(device))["resolved"]


def torch_autocast_dtype(resolved: str) -> torch.dtype | None:
    """A resolved dtype -> the autocast dtype (None: no autocast)."""
    check_dtype(resolved)
    if resolved == "auto":
        raise ValueError("torch_autocast_dtype needs a resolved dtype ('fp32' or 'bf16'); call resolve_dtype first")
    return torch.bfloat16 if resolved == "bf16" else None


def autocast_dtype(requested: str, device: torch.device) -> torch.dtype | None:
    """`fp32` -> None (no autocast); `bf16` -> bfloat16; `auto` -> as `resolve_dtype` decides."""
    return torch_autocast_dtype(resolve_dtype(requested, device))
