"""A ``/health`` poller for fault tests: the server must keep answering while it refuses what a test sends."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx


@contextmanager
def health_watch(url: str, every: float = 0.1) -> Iterator[list[float]]:
    """Poll ``url/health`` on its own connection while the block runs; yields the latencies (a failed poll: inf)."""
    latencies: list[float] = []
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=30) as client:
            while not done.is_set():
                began = time.perf_counter()
                try:
                    ok = client.get(url + "/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                latencies.append(time.perf_counter() - began if ok else float("inf"))
                done.wait(every)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield latencies
    finally:
        done.set()
        thread.join(30)
