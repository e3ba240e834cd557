"""``tool_choice`` "required" and a named choice over real HTTP (``agentrl serve`` on 127.0.0.1, tiny random model):
a forced call comes back as a call of an offered tool with JSON-object arguments, or as a 400 naming
``tool_choice`` — never placeholder or random text as arguments, never raw ``<tool_call>`` text in ``content``.

The tiny random model writes random bytes, so most answers here are the 400; each request is checked for "one or
the other" over several seeds, and at least one 400 must be seen (the check had something to refuse).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.server import Server

MESSAGES = [{"role": "user", "content": "What is the weather in Oslo?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _chat(server: Server, tool_choice: Any, seed: int, stream: bool = False) -> httpx.Response:
    body = {"model": "tiny-random", "messages": MESSAGES, "tools": TOOLS, "tool_choice": tool_choice,
            "max_tokens": 24, "seed": seed, "temperature": 1.0, "stream": stream}
    return httpx.post(server.url + "/v1/chat/completions", json=body, headers=server.headers, timeout=120)


def _refused(r: httpx.Response) -> bool:
    if r.status_code != 400:
        return False
    error = r.json()["error"]
    assert error["param"] == "tool_choice" and "tool_choice" in error["message"], error
    return True


@pytest.mark.parametrize("tool_choice", [NAMED, "required"], ids=["named", "required"])
def test_a_forced_call_is_a_valid_call_or_a_400_naming_tool_choice(served: Server, tool_choice: Any) -> None:
    refused = 0
    for seed in range(6):
        r = _chat(served, tool_choice, seed)
        if _refused(r):
            refused += 1
            continue
        assert r.status_code == 200, r.text
        message = r.json()["choices"][0]["message"]
        assert "<tool_call>" not in (message.get("content") or ""), message
        calls = message["tool_calls"]
        assert calls, message
        for call in calls:
            assert call["function"]["name"] in {"get_weather", "get_time"}
            assert isinstance(json.loads(call["function"]["arguments"]), dict), call
            if tool_choice is NAMED:
                assert call["function"]["name"] == "get_weather"
    assert refused > 0  # the random model's answers were checked, not only lucky ones


def test_a_streamed_forced_call_is_refused_before_any_chunk(served: Server) -> None:
    refused = [_refused(_chat(served, NAMED, seed, stream=True)) for seed in range(3)]
    assert any(refused)
