"""`run_blocking`: run a synchronous call (an environment step, a sync tool, a reward function) off the event loop.

Why: every episode of a collection shares one event loop, and ``data.episode_timeout`` is an asyncio timeout. A
synchronous call that blocks (``time.sleep``, a slow subprocess, a lock) on the loop stalls every episode and no
timeout can fire until it returns. Run in a thread, it blocks only its own episode, and the timeout holds.

A thread cannot be killed. When the episode times out, the awaiting coroutine is cancelled and the episode is
abandoned (counted failed); the call goes on in its thread until it returns, and its result is dropped. Each call
gets its own daemon thread rather than a slot in a shared pool: a call that never returns cannot starve the
others (or the engine's own worker threads), nor keep the process alive at exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


async def run_blocking(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``await run_blocking(env.step, action)``: ``fn(*args, **kwargs)`` in a new daemon thread.

    Cancelling the awaiting task (a timeout) returns at once; the thread finishes in the background.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()
    name = getattr(fn, "__qualname__", "call")

    def work() -> None:
        try:
            result = context.run(fn, *args, **kwargs)
        except Exception as exc:  # handed to the awaiting coroutine, which re-raises it
            _settle(loop, future, None, exc)
        except BaseException as exc:  # SystemExit in a worker thread: an error of this episode, not of the loop
            _settle(loop, future, None, RuntimeError(f"{name} raised {type(exc).__name__}: {exc}"))
        else:
            _settle(loop, future, result, None)

    threading.Thread(target=work, name=f"agentrl-blocking:{name}", daemon=True).start()
    return await future


def _settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any,
            exc: BaseException | None) -> None:
    def settle() -> None:
        if future.done():  # the episode was abandoned (timeout): nobody waits for this result
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)

    with contextlib.suppress(RuntimeError):  # the loop is closed (the run ended while it blocked): drop it
        loop.call_soon_threadsafe(settle)
