"""The compute dtype ``auto``: bf16 autocast where a measured bf16 matmul beats fp32 on this device, else fp32.

bf16 autocast roughly halves the update time on CPUs with native bf16 matmuls (AVX-512 BF16 / AMX) and on any
recent GPU, and makes things slower on CPUs without them. It changes the numbers, so the engine's recorded log-probs
stop being the trainer's π_old: the trainer then recomputes π_old and corrects the gap
(`agentrl.training.mismatch`), which is what makes bf16 safe to turn on by default.

``auto`` decides once per (device type, model width), by timing a ``(512 × H) @ (H × 4H)`` matmul — the shape of a
transformer MLP — in fp32 and in bf16 (best of three, after a warm-up). bf16 is chosen when it is at least
``MIN_SPEEDUP`` times faster. Models narrower than ``MIN_WIDTH`` stay in fp32 without measuring: their matmuls are
too small for bf16 to pay, and this keeps the tiny test model exact and deterministic on every machine.
"""

from __future__ import annotations

import time

import torch

MIN_WIDTH = 256
"""Hidden sizes below this always compute in fp32."""
MIN_SPEEDUP = 1.3
"""bf16 must be at least this much faster than fp32 to be chosen."""
_CHOSEN: dict[tuple[str, int], torch.dtype] = {}


def matmul_seconds(device: torch.device, dtype: torch.dtype, width: int, rows: int = 512, reps: int = 3) -> float:
    """Best-of-``reps`` seconds of a ``(rows × width) @ (width × 4·width)`` matmul in ``dtype`` on ``device``."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(rows, width, generator=gen).to(device=device, dtype=dtype)
    w = torch.randn(width, 4 * width, generator=gen).to(device=device, dtype=dtype)
    best = float("inf")
    for i in range(reps + 1):
        _sync(device)
        start = time.perf_counter()
        a @ w
        _sync(device)
        if i:  # the first call is a warm-up
            best = min(best, time.perf_counter() - start)
    return best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bf16_pays(fp32_seconds: float, bf16_seconds: float, min_speedup: float = MIN_SPEEDUP) -> bool:
    """Whether bf16 is at least ``min_speedup`` times faster than fp32."""
    return bf16_seconds * min_speedup <= fp32_seconds


def auto_compute_dtype(device: torch.device, width: int) -> torch.dtype:
    """bf16 where it pays for a model ``width`` wide on ``device`` (measured once and remembered), else fp32."""
    if width < MIN_WIDTH:
        return torch.float32
    key = (device.type, width)
    if key not in _CHOSEN:
        fp32 = matmul_seconds(device, torch.float32, width)
        bf16 = matmul_seconds(device, torch.bfloat16, width)
        _CHOSEN[key] = torch.bfloat16 if bf16_pays(fp32, bf16) else torch.float32
    return _CHOSEN[key]
