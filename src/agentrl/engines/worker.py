"""Where the embedded engine's model work runs (`agentrl.engines.hf.HFEngine`).

One dedicated worker thread, always the same: the event loop goes on with tool calls and env steps while a forward
pass runs, and every step's allocations (the KV caches, the activations) come from that thread's one glibc arena
instead of spreading over the arenas of the event loop's pool of threads (``asyncio.to_thread``), each keeping its
own free space. Each step runs inside the caller's step context (``agentrl serve`` serialises two engines over one
peft model with it), in inference mode, with the model in eval mode for the step, and its time is added to the
engine's counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import torch

from agentrl.engines.hf_requests import EngineStats

T = TypeVar("T")


class ModelWorker:
    """The engine's model thread.

    Args:
        step_context: Context manager factory entered around every step, in the worker thread.
    """

    def __init__(self, step_context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None) -> None:
        self._step_context = step_context
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentrl-engine")

    async def run(self, model: Any, stats: EngineStats, prefill: bool, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the worker thread (with the caller's context variables), ``model`` in eval mode for the
        step; its seconds counted in ``stats`` as prefill (``prefill``) or decode time."""
        call = contextvars.copy_context().run
        return await asyncio.get_running_loop().run_in_executor(self._executor, call, self._step, model, stats,
                                                                prefill, fn, *args)

    def _step(self, model: Any, stats: EngineStats, prefill: bool, fn: Callable[..., T], *args: Any) -> T:
        with self._step_context() if self._step_context is not None else contextlib.nullcontext():
            start = time.perf_counter()
            was_training = model.training  # a weight copy is always in eval mode; shared modules switch for the step
            model.eval()
            try:
                with torch.inference_mode():
                    return fn(*args)
            finally:
                model.train(was_training)
                spent = time.perf_counter() - start
                stats.busy_seconds += spent
                if prefill:
                    stats.prefill_seconds += spent
                else:
                    stats.decode_seconds += spent
