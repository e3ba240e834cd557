"""Issue 14, item 1: one bad request must not fail the decode batch it shares with others.

Over HTTP, a temperature of 1e-45 (which overflows ``logits / temperature``) is raised to vLLM's 0.01 where the
request enters, so all eleven requests of a batch answer. In the engine, a request whose own processing fails
(here its stop callback raises) fails alone; the others finish with the tokens they get without it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from agentrl.engines.base import Completion, SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.models.policy import Policy
from tests.support.server import Server

PROMPT = [1, 87, 85, 71, 84, 201, 74, 75, 2, 201, 1, 67]


async def _post_all(server: Server, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=120) as client:
        return list(await asyncio.gather(*(client.post("/v1/completions", json=b) for b in bodies)))


def test_a_tiny_temperature_does_not_fail_the_batch(victim: Server) -> None:
    normal = [{"prompt": PROMPT, "max_tokens": 24, "seed": i, "ignore_eos": True, "return_token_ids": True}
              for i in range(10)]
    bad = {"prompt": PROMPT, "max_tokens": 24, "seed": 99, "temperature": 1e-45, "return_token_ids": True}
    together = asyncio.run(_post_all(victim, [*normal[:5], bad, *normal[5:]]))
    assert [r.status_code for r in together] == [200] * 11, [r.text[:200] for r in together]
    alone = asyncio.run(_post_all(victim, normal[:3]))  # seeded: the same tokens without the bad neighbour
    for i, r in enumerate(alone):
        assert r.json()["choices"][0]["token_ids"] == together[i].json()["choices"][0]["token_ids"]


def test_a_request_that_fails_in_the_engine_fails_alone(tiny_policy: Policy) -> None:
    engine = HFEngine(tiny_policy, max_batch_size=8)
    sp = SamplingParams(max_tokens=12, stop_token_ids=())

    def explode(ids: list[int]) -> bool:
        if len(ids) == 3:
            raise RuntimeError("stop callback broke")
        return False

    async def run(with_bad: bool) -> list[Completion | BaseException]:
        calls = [engine.generate(PROMPT, sp.with_seed(i), session=f"s{i}") for i in range(6)]
        if with_bad:
            calls.insert(2, engine.generate(PROMPT, sp.with_seed(50), stop_when=explode))
        return list(await asyncio.gather(*calls, return_exceptions=True))

    mixed = asyncio.run(run(True))
    assert isinstance(mixed[2], RuntimeError) and "stop callback broke" in str(mixed[2])
    good = [m for i, m in enumerate(mixed) if i != 2]
    clean = asyncio.run(run(False))
    assert all(isinstance(c, Completion) and c.finish_reason == "length" for c in good)
    assert [c.token_ids for c in good] == [c.token_ids for c in clean]  # type: ignore[union-attr]
    assert engine.stats.failed == 1 and engine.running == 0


@pytest.mark.parametrize("field, value", [("temperature", 1e-45), ("temperature", float("inf")),
                                          ("temperature", float("nan")), ("seed", 2**70)])
def test_sampling_params_refuse_values_the_engine_cannot_sample(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"sampling.{field}"):
        kwargs: dict[str, Any] = {field: value}
        SamplingParams(**kwargs)
