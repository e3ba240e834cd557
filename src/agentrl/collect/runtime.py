"""A persistent asyncio event loop in a background thread, shared by every rollout of a run.

Training code is synchronous (Lightning's ``training_step``); rollouts are asynchronous (many episodes, HTTP
clients, an engine scheduler). One loop for the whole run keeps the engine's scheduler, HTTP connection pools and
caches alive across steps, instead of tearing them down with an ``asyncio.run`` per step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


class RolloutRuntime:
    """Run coroutines on a dedicated event loop thread: ``runtime.run(coro)`` blocks until it finishes."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agentrl-rollout-loop", daemon=True)
        self._thread.start()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for it, running the embedded engine's model steps on this thread
        meanwhile (`agentrl.engines.worker.lend_until`)."""
        from agentrl.engines.worker import lend_until

        return lend_until(lambda: self.submit(coro), timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the loop and return at once (the caller waits on the future when it needs the result;
        ``future.cancel()`` cancels the coroutine). Bounded-staleness collection runs ahead this way."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("RolloutRuntime.run called from its own loop thread; await the coroutine instead")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def close(self) -> None:
        """Cancel what still runs on the loop (engine schedulers, HTTP clients), then stop it."""
        if self._loop.is_closed():
            return
        if self._thread.is_alive():
            with contextlib.suppress(Exception):  # closing must not fail; the loop is discarded anyway
                self.run(_cancel_pending(), timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if self._thread.is_alive():  # blocking code on the loop did not return: leave the daemon thread to it
            log.warning("the rollout loop is still blocked after close (blocking code in an async agent or tool?); "
                        "abandoning it")
            return
        self._loop.close()

    def __enter__(self) -> RolloutRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _cancel_pending() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
