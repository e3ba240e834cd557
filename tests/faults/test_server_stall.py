"""Issue 29, item 1: one request cannot stall ``agentrl serve`` for everyone.

Before, a 15 MiB completion prompt (tokenized on the event loop before its length was compared with the context)
left ``/health`` unanswered for 45 s, a chat message of that size for 62 s, and the 50 KB body
``{"prompt": [[1]] * 10000, "n": 64}`` (640,000 sequences) for 106 s. Now sizes are checked from the lengths
first, rendering and tokenizing run in a worker thread, and prompts × n is capped: each is a 400 naming the field
at once, while ``/health`` keeps answering within ``STALL_S`` (polled the whole time on its own connection).
"""

from __future__ import annotations

import time

import httpx

from tests.faults.conftest import is_openai_error
from tests.support.health import STALL_S, health_watch
from tests.support.server import Server

HUGE = "a" * (15 << 20)  # 15 MiB: under the 16 MiB body limit, far over any context


def test_health_answers_while_a_huge_prompt_and_a_huge_fan_out_are_refused(victim: Server) -> None:
    start = len(victim.output(tail=None))
    cases = [
        ("/v1/completions", {"prompt": HUGE, "max_tokens": 4}, "prompt"),
        ("/v1/completions", {"prompt": ["hi", HUGE], "max_tokens": 4}, "prompt"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": HUGE}], "max_tokens": 4}, "messages"),
        ("/v1/completions", {"prompt": [[1]] * 10000, "n": 64, "max_tokens": 4}, "prompt"),
        ("/v1/completions", {"prompt": [1, 2, 3], "n": 64, "max_tokens": 4}, None),  # allowed: 64 sequences
        ("/v1/completions", {"prompt": [[1, 2]] * 300, "max_tokens": 1}, "prompt"),
    ]
    answers = []
    with health_watch(victim.url, every=0.05) as latencies, httpx.Client(timeout=300, headers=victim.headers) as client:
        time.sleep(0.3)
        for path, body, _ in cases:
            began = time.perf_counter()
            answers.append((client.post(victim.url + path, json=body), time.perf_counter() - began))
        time.sleep(0.3)
    assert len(latencies) > 10
    assert max(latencies) < STALL_S, f"/health took up to {max(latencies):.2f} s (of {len(latencies)} polls)"
    for (path, _, param), (r, took) in zip(cases, answers, strict=True):
        if param is None:
            assert r.status_code == 200, r.text[:300]
            continue
        assert r.status_code == 400 and is_openai_error(r), r.text[:300]
        assert r.json()["error"]["param"] == param, r.text[:300]
        assert took < 10, f"{path} took {took:.1f} s to be refused"
    assert "Traceback" not in victim.output(tail=None)[start:]
