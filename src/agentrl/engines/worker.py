"""Where the embedded engine's model work runs (`agentrl.engines.hf.HFEngine`).

Never on the event loop's thread: the loop goes on with tool calls and env steps while a forward pass runs. A step
runs on **the thread that waits for the rollouts**, when one does (`lend_until`: the trainer's thread blocked in
`agentrl.collect.runtime.RolloutRuntime.run` or on a launched collection), and otherwise on the engine's one
dedicated worker thread (``agentrl-engine``; ``agentrl serve``, ``asyncio.run`` in a script, a collection running
ahead of the trainer).

Why the waiting thread: torch's CPU kernels run on an OpenMP team, and every thread that runs one gets its own team.
With the trainer's team and a worker's team both alive, GNU OpenMP has more threads than cores and stops spinning
between parallel regions, so each of a decode step's ~300 small operators pays a thread wake-up and the step
runs markedly slower (measured with ``benchmarks/decode_step.py``: docs/benchmarks-log.md, "AMD EPYC (Zen 5),
idle"). The trainer's thread is idle while it waits, so lending it costs nothing. The dedicated thread also keeps
the steps' allocations in one glibc arena, where a ``to_thread`` pool would spread them over several.

Each step runs inside the caller's step context (``agentrl serve`` serialises two engines over one peft model with
it), in inference mode, without the lending thread's autocast, with the model in eval mode for the step, and its
time is added to the engine's counters.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import torch

from agentrl.engines.hf_requests import EngineStats

T = TypeVar("T")

_lock = threading.Lock()
_lenders: list[queue.SimpleQueue[Any]] = []  # one queue per thread waiting in `lend_until`, newest last


class _Job:
    """One model step and the future its engine awaits; run by a lending thread or, failing one, by the worker."""

    def __init__(self, fn: Callable[[], Any], fallback: ThreadPoolExecutor) -> None:
        self.fn = fn
        self.fallback = fallback
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            self.future.set_result(self.fn())
        except BaseException as exc:
            self.future.set_exception(exc)
            if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: the lending thread's to handle
                raise


def lend_until(work: concurrent.futures.Future[T] | Callable[[], concurrent.futures.Future[T]],
               timeout: float | None = None) -> T:
    """The result of ``work`` (a future, or a callable that starts the work and returns its future: called once this
    thread is registered, so that even the work's first model step runs here), running the engines' model steps on
    this thread meanwhile (see the module docstring). Steps submitted after it returns go to their engine's worker
    thread.

    Raises:
        TimeoutError: ``timeout`` seconds passed first (the work goes on).
    """
    inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    deadline = None if timeout is None else time.monotonic() + timeout
    with _lock:
        _lenders.append(inbox)
    try:
        future = work if isinstance(work, concurrent.futures.Future) else work()
        future.add_done_callback(lambda _: inbox.put(None))  # wakes the wait below
        while not future.done():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            try:
                job = inbox.get(timeout=left)
            except queue.Empty:
                break
            if job is not None:
                job.run()
    finally:
        with _lock:
            _lenders.remove(inbox)
        while True:  # queued between the last get and the removal: nobody else will see them
            try:
                job = inbox.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.fallback.submit(job.run)
    return future.result(timeout=0)


class ModelWorker:
    """The engine's model thread.

    Args:
        step_context: Context manager factory entered around every step, in the worker thread.
    """

    def __init__(self, step_context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None) -> None:
        self._step_context = step_context
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentrl-engine")
        self.lent_steps = 0  # steps run on a thread waiting in `lend_until`
        self.worker_steps = 0  # steps run on the worker thread

    async def run(self, model: Any, stats: EngineStats, prefill: bool, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the thread waiting in `lend_until`, if any, else in the worker thread (with the caller's
        context variables), ``model`` in eval mode for the step; its seconds counted in ``stats`` as prefill
        (``prefill``) or decode time."""
        return await self.call(self._step, model, stats, prefill, fn, *args)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` where model steps run (a lending thread, else the worker thread), as it is: the engine's
        other tensor work (a weight push, the batch's KV bookkeeping) goes there too, so that the event loop's
        thread never runs a parallel torch kernel (it would start an OpenMP team of its own)."""
        context = contextvars.copy_context()
        job = _Job(lambda: context.run(fn, *args), self._executor)
        with _lock:
            if _lenders:
                _lenders[-1].put(job)
            else:
                self._executor.submit(job.run)
        return await asyncio.wrap_future(job.future)

    def _step(self, model: Any, stats: EngineStats, prefill: bool, fn: Callable[..., T], *args: Any) -> T:
        if threading.current_thread().name.startswith("agentrl-engine"):
            self.worker_steps += 1
        else:
            self.lent_steps += 1
        with self._step_context() if self._step_context is not None else contextlib.nullcontext():
            start = time.perf_counter()
            # a weight copy is always in eval mode; shared modules switch for the step (each switch walks every
            # module: 2 ms a step for SmolLM2, so not when the model is in eval mode already)
            was_training = model.training
            if was_training:
                model.eval()
            try:  # a lending thread may be inside the trainer's autocast: the engine decides its own dtype
                with torch.inference_mode(), _no_autocast():
                    return fn(*args)
            finally:
                if was_training:
                    model.train(True)
                spent = time.perf_counter() - start
                stats.busy_seconds += spent
                if prefill:
                    stats.prefill_seconds += spent
                else:
                    stats.decode_seconds += spent


def _no_autocast() -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    stack.enter_context(torch.autocast("cpu", enabled=False))
    if torch.cuda.is_available():
        stack.enter_context(torch.autocast("cuda", enabled=False))
    return stack
