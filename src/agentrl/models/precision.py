"""The compute dtype ``auto``: bf16 autocast where the device has native bf16 matmuls, else fp32 — a rule, not a timing.

bf16 autocast roughly halves the update time on CPUs with native bf16 matmuls (AVX-512 BF16 / AMX) and on any
recent GPU. On a CPU without them a bf16 matmul falls to a reference kernel, many times slower than fp32, and a
training step looks hung (figures: docs/benchmarks-log.md, "AMD EPYC (Zen 5), busy"). bf16 changes the numbers, so the
engine's recorded log-probs stop being the trainer's π_old: the trainer then recomputes π_old and corrects the gap
(`agentrl.training.update.mismatch`), which is what makes bf16 safe to turn on by default.

``auto`` decides from what the device *is*, so the same config on the same machine always trains in the same dtype
(an earlier rule timed a matmul at start-up and could flip under load):

* CPU: bf16 when the CPU flags (``/proc/cpuinfo``) include ``avx512_bf16`` or ``amx_bf16`` (``bf16`` on Arm),
  else fp32 (`cpu_bf16_support`, the one probe, which tests replace to simulate another CPU);
* CUDA: bf16 where ``torch.cuda.is_bf16_supported()``;
* any other device: fp32.

Models narrower than ``MIN_WIDTH`` stay in fp32 whatever the device: their matmuls are too small for bf16 to pay,
and this keeps the tiny test model exact and deterministic on every machine.

An explicit ``bfloat16`` on a device without native bf16 is refused before the model loads
(`check_explicit_bf16`, run by `agentrl.training.command.preflight` and by ``agentrl serve --dtype bfloat16``) unless
``AGENTRL_ALLOW_SLOW_BF16=1``.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path
from typing import Any, NamedTuple

import torch

MIN_WIDTH = 256
"""Hidden sizes below this always compute in fp32."""
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
"""CPU flags of native bf16 matmul instructions (x86 AVX-512 BF16, x86 AMX, Arm BF16)."""
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
"""The x86 flags that decide matmul speed, recorded with every benchmark result (`cpu_identity`)."""
ALLOW_SLOW_BF16 = "AGENTRL_ALLOW_SLOW_BF16"
"""Environment variable: ``1`` lets an explicit bf16 run on a device without native bf16 (slowly)."""
SLOW_BF16 = ("a bf16 matmul falls to a reference kernel there (measured 1.2 GFLOP/s against 29 in fp32 at 512^3 "
             "on an AVX2-only AMD EPYC), so training would look hung")


class Bf16Support(NamedTuple):
    """Whether a device has native bf16 matmuls, and the evidence in words (recorded with the run)."""

    native: bool
    reason: str


class DtypeChoice(NamedTuple):
    """What ``auto`` resolved to, and why."""

    dtype: torch.dtype
    reason: str


@functools.cache
def _cpuinfo_fields(path: str = "/proc/cpuinfo") -> dict[str, str]:
    """The ``key: value`` lines of the first processor listed in ``path``; empty where it cannot be read."""
    try:
        text = Path(path).read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep and fields:  # the blank line after the first processor
            break
        fields.setdefault(key.strip(), value.strip())
    return fields


def _cpuinfo(path: str = "/proc/cpuinfo") -> tuple[str, frozenset[str]]:
    """(model name, flags) of the first processor listed in ``path``; ("", empty) where it cannot be read."""
    fields = _cpuinfo_fields(path)
    return fields.get("model name", ""), frozenset((fields.get("flags") or fields.get("Features") or "").split())


def _torch_flags() -> frozenset[str]:
    """The x86 flags torch's own (private) CPU queries report: the fallback where /proc/cpuinfo is missing."""
    queries = {"avx2": "_is_avx2_supported", "avx512f": "_is_avx512_supported",
               "avx512_bf16": "_is_avx512_bf16_supported", "amx_tile": "_is_amx_tile_supported",
               "amx_bf16": "_is_amx_tile_supported"}  # every x86 CPU with AMX tiles has AMX-BF16
    found = set()
    for flag, name in queries.items():
        query = getattr(torch.cpu, name, None)
        if callable(query) and query():
            found.add(flag)
    return frozenset(found)


def cpu_identity() -> dict[str, Any]:
    """The CPU model and its matmul-relevant ISA flags, for benchmark results (``"cpu"`` beside ``"machine"``)."""
    name, flags = _cpuinfo()
    source = "/proc/cpuinfo"
    if not flags:
        flags, source = _torch_flags(), "torch.cpu"
    fields = _cpuinfo_fields()
    family = "/".join(fields.get(key, "?") for key in ("vendor_id", "cpu family", "model", "stepping"))
    return {"model": name or platform.processor() or platform.machine(), "vendor/family/model/stepping": family,
            "flags": {flag: flag in flags for flag in ISA_FLAGS}, "flags_from": source,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def cpu_bf16_support(cpuinfo: str = "/proc/cpuinfo") -> Bf16Support:
    """The probe: does this CPU have native bf16 matmul instructions? (Tests replace it to simulate another CPU.)"""
    name, flags = _cpuinfo(cpuinfo)
    if not flags:
        flags = _torch_flags()
    have = [flag for flag in NATIVE_BF16_FLAGS if flag in flags]
    cpu = name or platform.machine()
    if have:
        return Bf16Support(True, f"CPU {cpu} has {', '.join(have)}")
    return Bf16Support(False, f"CPU {cpu} has no native bf16 (none of {', '.join(NATIVE_BF16_FLAGS[:2])})")


def bf16_support(device: torch.device) -> Bf16Support:
    """Native bf16 matmuls on ``device``: the CPU flags (`cpu_bf16_support`), CUDA's own query, else none."""
    if device.type == "cpu":
        return cpu_bf16_support()
    if device.type == "cuda":
        native = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return Bf16Support(native, f"torch.cuda.is_bf16_supported() is {native}")
    return Bf16Support(False, f"no bf16 rule for device type {device.type!r}")


def resolve_auto(device: torch.device, width: int) -> DtypeChoice:
    """``auto``'s choice for a model ``width`` wide on ``device``: bf16 where the device has native bf16."""
    if width < MIN_WIDTH:
        return DtypeChoice(torch.float32, f"hidden size {width} < {MIN_WIDTH}: always float32")
    support = bf16_support(device)
    return DtypeChoice(torch.bfloat16 if support.native else torch.float32, support.reason)


def auto_compute_dtype(device: torch.device, width: int) -> torch.dtype:
    """bf16 where ``device`` has native bf16 matmuls and the model is at least ``MIN_WIDTH`` wide, else fp32."""
    return resolve_auto(device, width).dtype


def check_explicit_bf16(key: str, device: torch.device) -> None:
    """Refuse ``key: bfloat16`` on a device without native bf16 (one line naming the key and why).

    Raises:
        ValueError: no native bf16 on ``device`` and ``AGENTRL_ALLOW_SLOW_BF16`` is not ``1``.
    """
    if os.environ.get(ALLOW_SLOW_BF16) == "1":
        return
    support = bf16_support(device)
    if not support.native:
        raise ValueError(f"{key} is bfloat16, but {support.reason}: {SLOW_BF16}; use float32 or auto "
                         f"(or set {ALLOW_SLOW_BF16}=1 to run bf16 anyway)")
