"""Issue 29, items 2 and 5: the training gateway fails the way ``agentrl serve`` does (the shared guards of
`agentrl.serve.http_guards`): the key is checked before the body is read, a 500 names the exception's type and
never its text, ``param`` names a field (never a JSON byte offset), strings that are not Unicode are a 400 naming
the field. Real HTTP on 127.0.0.1, the real engine under a tiny model."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from agentrl.agents.llm import LLMClient
from agentrl.engines.base import SamplingParams
from agentrl.models.policy import Policy
from agentrl.serve.gateway import TrainingGateway
from tests.support.health import STALL_S, health_watch
from tests.support.scripted import ScriptedEngine


class _BrokenEngine(ScriptedEngine):
    async def generate(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret detail /home/someone/.cache/model")


def _run(policy: Policy, engine_cls: type[ScriptedEngine],
         requests: list[tuple[str, Any, bool]]) -> list[httpx.Response]:
    """POST each (content, json-or-bytes, with key) to a fresh episode's chat completions."""

    async def main() -> list[httpx.Response]:
        gateway, engine = TrainingGateway(), engine_cls(policy)
        try:
            llm = LLMClient(engine, engine.tokenizer, SamplingParams(max_tokens=4), session="s", seed=1)
            route = await gateway.open(llm)
            out = []
            async with httpx.AsyncClient(timeout=60) as http:
                for kind, body, with_key in requests:
                    headers = {"Content-Type": "application/json"}
                    if with_key:
                        headers["Authorization"] = f"Bearer {route.api_key}"
                    content = body if kind == "raw" else json.dumps(body).encode()
                    out.append(await http.post(f"{route.base_url}/chat/completions", content=content,
                                               headers=headers))
            await gateway.close(route)
            return out
        finally:
            await gateway.aclose()
            await engine.shutdown()

    return asyncio.run(main())


def test_the_key_is_checked_before_the_body_is_parsed(tiny_policy: Policy) -> None:
    no_key_not_json, key_not_json = _run(tiny_policy, ScriptedEngine, [("raw", b'{"messages": [', False),
                                                                      ("raw", b'{"messages": [', True)])
    assert no_key_not_json.status_code == 401, no_key_not_json.text  # before: 400 (the body was parsed first)
    assert no_key_not_json.json()["error"]["type"] == "AuthenticationError"
    assert key_not_json.status_code == 400
    assert key_not_json.json()["error"]["param"] is None, key_not_json.text  # before: "14", a byte offset


def test_a_500_names_the_exception_type_never_its_text(tiny_policy: Policy) -> None:
    (r,) = _run(tiny_policy, _BrokenEngine, [("json", {"messages": [{"role": "user", "content": "hi"}]}, True)])
    assert r.status_code == 500
    error = r.json()["error"]
    assert error["type"] == "InternalServerError" and "RuntimeError" in error["message"]
    assert "secret" not in r.text and "/home" not in r.text, r.text


def test_strings_that_are_not_unicode_are_400s_naming_the_field(tiny_policy: Policy) -> None:
    bad = "x\udfffy"
    bodies = [{"messages": [{"role": "user", "content": bad}]},
              {"messages": [{"role": bad, "content": "hi"}]},
              {"messages": [{"role": "user", "content": [{"type": "text", "text": bad}]}]},
              {"messages": [{"role": "user", "content": "hi"}], "model": bad}]
    answers = _run(tiny_policy, ScriptedEngine, [("json", b, True) for b in bodies])
    assert [r.status_code for r in answers] == [400] * 4, [r.text for r in answers]
    assert [r.json()["error"]["param"] for r in answers] == [
        "messages[0].content", "messages[0].role", "messages[0].content[0].text", "model"]


def test_a_huge_message_truncates_its_episode_at_once_and_the_loop_keeps_answering(tiny_policy: Policy) -> None:
    """Before, a 4 MB chat message was rendered and tokenized on the rollout loop (6 s held). The message is 12 MiB
    so that the old bug holds ``/health`` far over `STALL_S` (planted back: 14.7 s of tokenizing on the loop)."""

    async def main() -> tuple[httpx.Response, list[float], Any]:
        gateway, engine = TrainingGateway(), ScriptedEngine(tiny_policy)
        try:
            llm = LLMClient(engine, engine.tokenizer, SamplingParams(max_tokens=4), session="s", seed=1)
            route = await gateway.open(llm)
            # The poller is a thread of its own: a poller task on this loop would sleep through a blocked loop and
            # time only the polls after it (seen: a planted 14.7 s block on the loop, slowest poll 0.02 s).
            with health_watch(gateway.url, every=0.05) as latencies:
                async with httpx.AsyncClient(timeout=120) as http:
                    await asyncio.sleep(0.2)
                    r = await http.post(f"{route.base_url}/chat/completions", headers={
                        "Authorization": f"Bearer {route.api_key}"}, json={"messages": [
                            {"role": "user", "content": "b" * (12 << 20)}]})
                    await asyncio.sleep(0.2)
            await gateway.close(route)
            return r, latencies, route.stopped
        finally:
            await gateway.aclose()
            await engine.shutdown()

    r, latencies, stopped = asyncio.run(main())
    assert r.status_code == 400 and r.json()["error"]["type"] == "EpisodeTruncated", r.text[:300]
    assert "characters" in r.json()["error"]["message"]
    assert stopped is not None  # the episode ends truncated, as for a full context
    assert latencies and max(latencies) < STALL_S, max(latencies)
