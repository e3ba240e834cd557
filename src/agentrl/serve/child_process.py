"""Child servers: waiting until one is healthy, and not outliving the process that started it.

`wait_healthy` polls a child server's ``/health`` until it answers 200, and fails fast, naming the server and
showing its log's tail, if the child exits first.

``agentrl vllm-serve`` starts vLLM's API server as its child. When the wrapper ends normally it stops the child, but
a wrapper killed outright (``kill -9``, an out-of-memory kill, a CI timeout) runs no clean-up, and the server would
go on holding its port, its cores and gigabytes of memory. `die_with_parent` asks Linux to send the child SIGTERM
when its parent dies (``prctl(PR_SET_PDEATHSIG)``); vLLM stops its engine processes on SIGTERM.

Linux sends that signal when the *thread* that forked the child ends, not the process, so it is asked for only
from the main thread: a server started from a worker thread (a restart in the background) goes without it, or it
would be stopped as soon as that thread returned. On other systems it is a no-op.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

# looked up here, not in the forked child (no dynamic loading between fork and exec)
_PRCTL = ctypes.CDLL(None).prctl if sys.platform == "linux" else None
_PR_SET_PDEATHSIG = 1


def _sigterm_on_parent_death() -> None:
    """In the child between fork and exec: one C call on a function resolved before the fork."""
    assert _PRCTL is not None
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def die_with_parent() -> Callable[[], None] | None:
    """The ``preexec_fn`` for `subprocess.Popen` that gives the child SIGTERM when this process dies, or None where
    that cannot be asked for safely (not Linux, or not the main thread: see the module docstring)."""
    if _PRCTL is None or threading.current_thread() is not threading.main_thread():
        return None
    return _sigterm_on_parent_death


def wait_healthy(name: str, url: str, proc: subprocess.Popen[Any], timeout: float, *, log: Path | None = None,
                 poll: float = 0.5) -> float:
    """Seconds until ``url/health`` answers 200.

    Raises:
        RuntimeError: naming ``name`` (with the last 4,000 characters of ``log``, if given) when ``proc`` exits
            first or ``url`` is not healthy within ``timeout`` seconds; the process is left for the caller to stop.
    """
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} before {url}/health answered{_tail(log)}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return time.monotonic() - began
        except httpx.HTTPError:
            pass
        time.sleep(poll)
    raise RuntimeError(f"{name} did not answer {url}/health within {timeout:g} s{_tail(log)}")


def _tail(log: Path | None, chars: int = 4000) -> str:
    return f":\n{log.read_text(errors='replace')[-chars:]}" if log is not None and log.exists() else ""
