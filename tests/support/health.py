"""A ``/health`` poller for fault tests: the server must keep answering while it refuses what a test sends."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

STALL_S = 5.0
"""The slowest ``/health`` answer a fault test accepts while the server refuses what the test sends.

A stall this detects is the event loop blocked behind one request: before issue 29 that held ``/health`` for 45 to
106 s (a 15 MiB prompt tokenized on the loop, a 640,000-sequence fan-out). A bound of one second also caught
scheduling jitter: on the 2-core CI machine, with pytest-xdist's second worker busy and the training gateway sharing
the test's process (and its GIL) with hypothesis building multi-MiB bodies, one poll took 1.22 s and failed CI.
Five seconds is far above that jitter and far below any stall the tests were written for.
"""


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
