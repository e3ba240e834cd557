"""Fuzzing the OpenAI request schema of ``agentrl serve`` (completions and chat) with hypothesis.

Requests are drawn from plausible values of every field (some out of range; fields vLLM has and agentrl does not
implement too), and then some fields are replaced by arbitrary JSON (wrong types, huge and negative numbers, NaN,
nested lists and objects) or dropped, or the body is not an object at all.
Generation stays small (``max_tokens`` is never a number above 8, and chat always sets it), so a run takes well
under a minute. Each request must answer before its 60 s timeout, never with a 5xx, and any error in the OpenAI
shape; afterwards the server answers ``/health`` and its log holds no traceback. The examples are derandomized:
CI runs the same ones every time.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.faults.conftest import is_openai_error
from tests.support.server import Server

FUZZ = settings(max_examples=120, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])
scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
small_work = json_values.filter(lambda v: not isinstance(v, int | float) or isinstance(v, bool) or not v > 8)


def mostly(good: st.SearchStrategy[Any], rare: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` about three times in four."""
    return st.sampled_from([good, good, good, rare]).flatmap(lambda strategy: strategy)


token_ids = mostly(st.lists(st.integers(0, 319), min_size=1, max_size=10), st.lists(st.integers(-3, 400), max_size=3))
SAMPLING = {  # plausible values, mostly valid; `bodies` swaps in arbitrary JSON
    "model": mostly(st.just("tiny-random"), st.just("no-such-model")),
    "n": st.integers(1, 4),
    "seed": mostly(st.integers(-(2**63), 2**63 - 1), st.sampled_from([2**64 - 1, 2**70, -(2**64)])),
    "temperature": mostly(st.floats(0, 3), st.sampled_from([0.0, 1e-45, 1e-8, 1.0, -0.5])),
    "top_p": mostly(st.floats(1e-9, 1.0), st.sampled_from([0.0, 1.5])),
    "top_k": st.integers(-2, 300),
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=3),
    "stop_token_ids": token_ids,
    "ignore_eos": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "skip_special_tokens": st.booleans(),
    "return_token_ids": st.booleans(),
    "return_tokens_as_token_ids": st.booleans(),
    "stream": mostly(st.sampled_from([False, None]), st.just(True)),
    "presence_penalty": st.sampled_from([0.0, 0, None, 0.5]),
}
COMPLETION = {
    **SAMPLING,
    "prompt": (token_ids | st.text(min_size=1, max_size=30) | st.lists(token_ids, min_size=1, max_size=3)
               | st.lists(st.text(max_size=10), min_size=1, max_size=3)),
    "max_tokens": mostly(st.integers(1, 8), st.sampled_from([-1, 0])),
    "logprobs": mostly(st.integers(0, 5), st.sampled_from([-1, 21])),
    "add_special_tokens": st.booleans(),
}
arguments = st.sampled_from(['{"city": "Paris"}', "{", "", "[[[]]]", "null", {"city": "Paris"}])
tool_call = st.fixed_dictionaries(
    {"function": st.fixed_dictionaries({"name": st.sampled_from(["get_weather", ""]), "arguments": arguments})},
    optional={"id": st.text(max_size=5), "type": st.just("function")})
content = st.none() | st.text(max_size=20) | st.lists(st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url"]), "text": st.text(max_size=10)}), max_size=2)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "user", "assistant", "tool", "robot"]), "content": content},
    optional={"tool_calls": st.lists(tool_call, max_size=2), "tool_call_id": st.text(max_size=5)})
tool = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": st.sampled_from(["get_weather", "search"])},
    optional={"parameters": st.just({"type": "object", "properties": {"city": {"type": "string"}}}),
              "description": st.text(max_size=10)})})
CHAT = {
    **SAMPLING,
    "messages": st.lists(message, min_size=1, max_size=4),
    "max_tokens": mostly(st.integers(1, 8), st.sampled_from([-1, 0])),
    "logprobs": st.booleans(),
    "top_logprobs": mostly(st.integers(0, 5), st.sampled_from([-1, 21])),
    "tools": st.lists(tool, max_size=2),
    "tool_choice": st.sampled_from(["none", "auto", "required", {"type": "function", "function": {
        "name": "get_weather"}}, {"type": "function", "function": {"name": "missing"}}]),
    "add_generation_prompt": st.booleans(),
}


@st.composite
def bodies(draw: st.DrawFn, fields: dict[str, st.SearchStrategy[Any]], required: tuple[str, ...]) -> Any:
    """A request of plausible fields (the required ones and some others), then as often as not some fields
    replaced by arbitrary JSON or dropped; now and then not an object at all. ``max_tokens`` is never dropped and
    never a number above 8: it bounds the work (chat without it generates up to the context window)."""
    mode = draw(st.sampled_from(["plausible", "plausible", "one-wrong", "some-wrong", "not-an-object"]))
    if mode == "not-an-object":
        return draw(json_values)
    body: dict[str, Any] = draw(st.fixed_dictionaries(
        {k: fields[k] for k in required}, optional={k: v for k, v in fields.items() if k not in required}))
    wrong = (draw(st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=1 if mode == "one-wrong" else 4))
             if mode != "plausible" else [])
    for key in wrong:
        if key == "max_tokens":
            body[key] = draw(small_work.filter(lambda v: v is not None))
        elif draw(st.booleans()):
            body[key] = draw(json_values)
        else:
            body.pop(key, None)
    return body


def _send(server: Server, path: str, body: Any) -> None:
    # json.dumps writes NaN and Infinity (not JSON, but Python's parser, the server's, reads them)
    r = httpx.post(server.url + path, content=json.dumps(body), timeout=60,
                   headers={**server.headers, "Content-Type": "application/json"})
    assert r.status_code < 500, (body, r.text[:500])
    assert r.status_code == 200 or is_openai_error(r), (body, r.text[:500])


def test_fuzzed_requests_never_break_the_server(victim: Server) -> None:
    start = len(victim.output(tail=None))

    @FUZZ
    @given(body=bodies(COMPLETION, ("prompt", "max_tokens")))
    def completions(body: Any) -> None:
        _send(victim, "/v1/completions", body)

    @FUZZ
    @given(body=bodies(CHAT, ("messages", "max_tokens")))
    def chat(body: Any) -> None:
        _send(victim, "/v1/chat/completions", body)

    completions()
    chat()
    assert httpx.get(victim.url + "/health", timeout=10).status_code == 200
    assert "Traceback" not in victim.output(tail=None)[start:]
