"""Give freed memory back to the operating system between the phases of a run.

PyTorch frees CPU tensors with ``free``; glibc keeps much of what is freed inside the process (in the heap and in
per-thread arenas: the embedded engine's forward passes run in worker threads, so the rollout KV and the training
activations live in different arenas and neither reuses the other's free space). Without a trim the resident set
stays at the sum of the phases' peaks (rollouts + update + GGUF de-quantisation) rather than their maximum.
`release_memory` runs the garbage collector on the young generations (the phase's own garbage: a full collection
walks every object of the process, 0.45 s in a test process, which made it 75 % of a tiny model's step) and then
glibc's ``malloc_trim(0)``, which returns the free pages of every arena; elsewhere (musl, macOS, Windows) it only
collects garbage.

`bound_kernel_caches` caps oneDNN's caches of compiled kernels. PyTorch runs CPU bf16 matmuls (autocast's, and a bf16
weight copy's) through oneDNN, which keeps every kernel it builds in two caches of 1,024 entries each (oneDNN's own,
``ONEDNN_PRIMITIVE_CACHE_CAPACITY``, and ideep's, ``LRU_CACHE_CAPACITY``), one per matrix shape, each with its
scratch memory. A training run meets a new shape at almost every micro-batch and prefill (their lengths vary), so
the caches grew by about 1 MiB per shape: 382 MiB after 200 shapes of one layer's matmuls in a probe, and a
steadily growing resident set over the main job's steps. Decoding reuses a handful of shapes per batch size, which
a cache of 64 holds; the shapes that vary were never reused. Both are read once, when the first kernel is built, so
the caps must be set before any bf16 matmul runs (the ``agentrl`` command sets them first thing).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import threading
from collections.abc import Callable, MutableMapping
from pathlib import Path

KERNEL_CACHE_CAPACITY = 64  # entries of each oneDNN kernel cache (1,024 by default)


def bound_kernel_caches(environ: MutableMapping[str, str] | None = None) -> None:
    """Cap oneDNN's two kernel caches at `KERNEL_CACHE_CAPACITY` entries (see the module docstring); a value the
    user set wins. Effective only before the process builds its first oneDNN kernel."""
    env = os.environ if environ is None else environ
    if "DNNL_PRIMITIVE_CACHE_CAPACITY" not in env:  # oneDNN's older name: a user who set it keeps it
        env.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(KERNEL_CACHE_CAPACITY))
    env.setdefault("LRU_CACHE_CAPACITY", str(KERNEL_CACHE_CAPACITY))


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_memory() -> bool:
    """Collect the young generations' garbage and return free heap pages to the OS. True when glibc's
    ``malloc_trim`` ran."""
    gc.collect(1)
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def resident_mib(status: Path = Path("/proc/self/status")) -> tuple[float, float] | None:
    """This process's resident set size now and its peak so far (``VmRSS``, ``VmHWM``), in MiB; None where there is
    no procfs (the figures are Linux's). The peak is the kernel's high-water mark, the figure GNU ``time -v`` reports
    at exit; it is never reset here (``/proc/self/clear_refs`` would reset what ``time -v`` reads too)."""
    try:
        fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        now, peak = (int(fields[key].split()[0]) / 1024 for key in ("VmRSS", "VmHWM"))  # kB
    except (OSError, KeyError, ValueError, IndexError):
        return None
    return now, peak


class PeakRise:
    """Which phase of a run raised the process's peak resident set, and by how much.

    At every phase boundary (`boundary`, called with the phase that was running) the kernel's high-water mark
    (``VmHWM``) is read; its rise since the previous boundary is charged to that phase. The high-water mark only
    rises, so the charges are exact (no sampling: a spike of a millisecond counts) and add up to the run's peak
    minus its value when the account opened. What is charged to a phase is the part of the peak it *set*: a phase
    whose own peak stayed under an earlier phase's is charged nothing. Several threads may call `boundary` (the
    rollouts of an asynchronous collection overlap the update); a rise is charged to the phase named by the call
    that reads it. Without procfs (not Linux) nothing is ever charged.
    """

    def __init__(self, read: Callable[[], tuple[float, float] | None] = resident_mib) -> None:
        self._read = read
        self._lock = threading.Lock()
        self._mark = self._peak()
        self._charged: dict[str, float] = {}

    def _peak(self) -> float | None:
        memory = self._read()
        return None if memory is None else memory[1]

    def boundary(self, ending: str | None) -> None:
        """A phase boundary: charge the peak's rise since the last boundary to ``ending`` (None: between phases)."""
        with self._lock:
            peak = self._peak()
            if peak is None or self._mark is None:
                self._mark = peak
                return
            if peak > self._mark:
                name = ending or "between"
                self._charged[name] = self._charged.get(name, 0.0) + peak - self._mark
                self._mark = peak

    def take(self, *phases: str) -> dict[str, float]:
        """The MiB charged to each of ``phases`` since they were last taken (0.0 for none), and reset them."""
        with self._lock:
            return {name: self._charged.pop(name, 0.0) for name in phases}
