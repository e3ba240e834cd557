"""Issue 14, item 3: a client that gives up costs the server nothing more.

Ten clients ask for 3,000 tokens each and leave after one second. The server must cancel their requests, drop
them from the decode batch, and stop sampling for them: its ``/metrics`` count ten cancelled requests and far fewer
than the 30,000 tokens asked for. No timing is asserted: the test waits (bounded) until nothing runs, then reads
counters.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.faults.conftest import metrics
from tests.support.server import Server

PROMPT = [1, 87, 85, 71, 84, 201, 74, 75, 2, 201, 1, 67]
ASKED = 3000


async def _give_up_after_a_second(server: Server, clients: int) -> int:
    async def one(i: int) -> bool:
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=1.0) as client:
            try:
                await client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": ASKED, "seed": i,
                                                           "ignore_eos": True})
            except httpx.TimeoutException:
                return True
            return False

    return sum(await asyncio.gather(*(one(i) for i in range(clients))))


def _wait_idle(server: Server, limit_s: float = 300.0) -> dict[str, float]:
    deadline = time.monotonic() + limit_s
    while True:
        now = metrics(server)
        if now["num_requests_running"] == 0 and now["num_requests_waiting"] == 0:
            return now
        assert time.monotonic() < deadline, f"requests still running after {limit_s} s: {now}"
        time.sleep(0.5)


def test_requests_of_clients_that_left_are_cancelled(victim: Server) -> None:
    before = _wait_idle(victim)
    left = asyncio.run(_give_up_after_a_second(victim, 10))
    assert left == 10  # every client gave up before its 3,000 tokens came
    after = _wait_idle(victim)
    assert after["request_cancelled_total"] - before["request_cancelled_total"] == 10
    generated = after["generation_tokens_total"] - before["generation_tokens_total"]
    assert generated < 10 * ASKED / 2, generated
    assert httpx.get(victim.url + "/health", timeout=10).status_code == 200
