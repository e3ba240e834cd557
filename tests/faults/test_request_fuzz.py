"""Fuzzing the OpenAI request schema of ``agentrl serve`` (completions and chat) with hypothesis.

Each field of the completions and chat schemas has valid values and edge values (out of range, extreme floats,
empty, fields vLLM has and agentrl refuses). A request is valid, or has one or a few fields at an edge value, or
replaced by arbitrary JSON (wrong types, huge and negative numbers, NaN, nested lists and objects), or dropped; or
the body is not an object at all.
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

FUZZ = settings(max_examples=150, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])
scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
small_work = json_values.filter(lambda v: not isinstance(v, int | float) or isinstance(v, bool) or not v > 8)


Field = tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]
"""A field's valid values and its edge values (out of range, special, or refused by agentrl)."""

ids = st.lists(st.integers(0, 319), min_size=1, max_size=10)
SAMPLING: dict[str, Field] = {
    "model": (st.just("tiny-random"), st.sampled_from(["no-such-model", ""])),
    "n": (st.integers(1, 4), st.sampled_from([0, -1, 65])),
    "seed": (st.integers(-(2**63), 2**63 - 1), st.sampled_from([2**63, 2**64 - 1, 2**70, -(2**63) - 1])),
    "temperature": (st.floats(0, 3), st.sampled_from([1e-45, 1e-8, 5e-324, -0.5, 1e308])),
    "top_p": (st.floats(1e-9, 1.0), st.sampled_from([0.0, 1.5, 5e-324, -1.0])),
    "top_k": (st.integers(-1, 300), st.sampled_from([-2, 2**70, 0])),
    "stop": (st.text(min_size=1, max_size=3) | st.lists(st.text(min_size=1, max_size=3), max_size=3),
             st.sampled_from(["", [""], ["a"] * 500])),
    "stop_token_ids": (st.lists(st.integers(0, 319), max_size=3), st.sampled_from([[-1], [2**70], [10**6]])),
    "ignore_eos": (st.booleans(), st.sampled_from([None, "yes"])),
    "include_stop_str_in_output": (st.booleans(), st.just(None)),
    "skip_special_tokens": (st.booleans(), st.just(None)),
    "return_token_ids": (st.booleans(), st.just(None)),
    "return_tokens_as_token_ids": (st.booleans(), st.just(None)),
    "stream": (st.sampled_from([False, None, True]), st.sampled_from(["yes", [True]])),
    "stream_options": (st.sampled_from([None, {"include_usage": True}]), st.sampled_from(["all", [1]])),
    "presence_penalty": (st.sampled_from([0.0, 0, None]), st.sampled_from([0.5, -2.0])),
}
COMPLETION: dict[str, Field] = {
    **SAMPLING,
    "prompt": (ids | st.text(min_size=1, max_size=30) | st.lists(ids, min_size=1, max_size=3)
               | st.lists(st.text(min_size=1, max_size=10), min_size=1, max_size=3),
               st.sampled_from([[], "", [[]], [[1], "a"], [-1], [2**70], [1.5], [[1, 2], [3, [4]]]])),
    "max_tokens": (st.integers(1, 8), st.sampled_from([-1, 0, None])),
    "logprobs": (st.integers(0, 5), st.sampled_from([-1, 21, True])),
    "add_special_tokens": (st.booleans(), st.just(None)),
}
arguments = st.sampled_from(['{"city": "Paris"}', {"city": "Paris"}, "", "{", "[[[]]]", "null", "1e999", '"x"'])
tool_call = st.fixed_dictionaries(
    {"function": st.fixed_dictionaries({"name": st.sampled_from(["get_weather", ""]), "arguments": arguments})},
    optional={"id": st.text(max_size=5), "type": st.just("function")})
content = st.none() | st.text(max_size=20) | st.lists(st.fixed_dictionaries(
    {"type": st.just("text"), "text": st.text(max_size=10)}), min_size=1, max_size=2)
message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": content},
                                optional={"tool_calls": st.lists(tool_call, max_size=2)})
odd_message = st.sampled_from([
    {"role": "robot", "content": "x"}, {"content": "x"}, {"role": "user", "content": [{"type": "image_url"}]},
    {"role": "user", "content": 5}, {"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]},
    {"role": "tool", "content": None, "tool_call_id": None}, {"role": "user", "content": [{"type": "text"}]}])
tool = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": st.sampled_from(["get_weather", "search"])},
    optional={"parameters": st.just({"type": "object", "properties": {"city": {"type": "string"}}}),
              "description": st.text(max_size=10)})})
CHAT: dict[str, Field] = {
    **SAMPLING,
    "messages": (st.lists(message, min_size=1, max_size=4),
                 st.lists(message | odd_message, max_size=3) | st.just([])),
    "max_tokens": (st.integers(1, 8), st.sampled_from([-1, 0])),
    "logprobs": (st.booleans(), st.just(None)),
    "top_logprobs": (st.integers(0, 5), st.sampled_from([-1, 21, None])),
    "tools": (st.lists(tool, max_size=2), st.sampled_from([[], [{"type": "function"}], [{"function": {}}]])),
    "tool_choice": (st.sampled_from(["none", "auto", {"type": "function", "function": {"name": "get_weather"}}]),
                    st.sampled_from(["required", "sometimes", {"type": "function", "function": {"name": "missing"}},
                                     {"function": {}}])),
    "add_generation_prompt": (st.booleans(), st.just(None)),
}


@st.composite
def bodies(draw: st.DrawFn, fields: dict[str, Field], required: tuple[str, ...]) -> Any:
    """A valid request (the required fields and some others); then, in most examples, one or a few fields set to
    an edge value, or to arbitrary JSON, or dropped; now and then a body that is not an object at all.
    ``max_tokens`` is never dropped and never a number above 8: it bounds the work (chat without it generates up
    to the context window)."""
    mode = draw(st.sampled_from(["valid", "one-edge", "one-edge", "some-edges", "one-wrong", "some-wrong",
                                 "not-an-object"]))
    if mode == "not-an-object":
        return draw(json_values)
    body: dict[str, Any] = draw(st.fixed_dictionaries(
        {k: fields[k][0] for k in required}, optional={k: v[0] for k, v in fields.items() if k not in required}))
    changed = [] if mode == "valid" else draw(st.lists(st.sampled_from(sorted(fields)), min_size=1,
                                                       max_size=1 if mode.startswith("one") else 4))
    for key in changed:
        if mode.endswith("edge") or mode.endswith("edges"):
            body[key] = draw(fields[key][1])
        elif key == "max_tokens":
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
