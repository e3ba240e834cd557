"""Fuzzing the OpenAI request schema of ``agentrl serve`` (completions and chat) and of the training gateway with
hypothesis.

Each field of the completions and chat schemas has valid values and edge values (out of range, extreme floats,
empty, fields vLLM has and agentrl refuses). A request is valid, or has one or a few fields at an edge value, or
replaced by arbitrary JSON (wrong types, huge and negative numbers, NaN, nested lists and objects), or dropped; or
the body is not an object at all. Strings include lone UTF-16 surrogates (``st.text()`` leaves them out, which is
how the old fuzz missed the 500s they caused), and prompts include huge shapes: many prompts × a large ``n``
(``[[1]] * 10000`` with ``n: 64``) and multi-MiB strings.

Generation stays small (``max_tokens`` is never a number above 8, and chat always sets it). Each request must answer
before its 60 s timeout, never with a 5xx, and any error in the OpenAI shape; all of them go over one kept-alive
connection, which must never be dropped (a drop is counted as a reset, and there must be none); ``/health`` is
polled on its own connection the whole time and must answer every time within ``STALL_S`` (5 s: far above
scheduling jitter, far below the 45 s stalls issue 29 removed); afterwards the server's log holds no traceback.
``FUZZ_SERVE_EXAMPLES`` / ``FUZZ_GATEWAY_EXAMPLES`` (per endpoint) scale a longer run; the defaults (600
completions + 400 chat against ``agentrl serve``, 300 against the gateway) are CI's. The examples are derandomized:
CI runs the same ones every time.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.health import STALL_S, health_watch
from tests.support.server import Server

SERVE_EXAMPLES = int(os.environ.get("FUZZ_SERVE_EXAMPLES", "500"))
GATEWAY_EXAMPLES = int(os.environ.get("FUZZ_GATEWAY_EXAMPLES", "300"))


def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def _with_surrogate(parts: tuple[str, str, str]) -> str:
    return parts[0] + parts[1] + parts[2]


lone = st.characters(categories=["Cs"])  # U+D800..U+DFFF: what JSON's \ud800 escapes decode to
texts = st.text(max_size=12) | st.tuples(st.text(max_size=4), lone, st.text(max_size=4)).map(_with_surrogate)


def text(min_size: int = 0, max_size: int = 12) -> st.SearchStrategy[str]:
    """Text, now and then with a lone surrogate inside."""
    return st.text(min_size=min_size, max_size=max_size) | st.tuples(
        st.text(max_size=max_size // 2), lone, st.text(max_size=max_size // 2)).map(_with_surrogate)


scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | texts)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(text(max_size=6), inner, max_size=3), max_leaves=8)
small_work = json_values.filter(lambda v: not isinstance(v, int | float) or isinstance(v, bool) or not v > 8)


Field = tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]
"""A field's valid values and its edge values (out of range, special, or refused by agentrl)."""

ids = st.lists(st.integers(0, 319), min_size=1, max_size=10)
# huge shapes: many prompts (x a large n, drawn for "n" separately), multi-MiB text, a prompt past the context
HUGE_PROMPTS = st.sampled_from([[[1]] * 10000, [[1, 2]] * 300, [[5] * 5000], "a" * (4 << 20), ["b" * (1 << 20)] * 3,
                                "\u00e9" * (1 << 20)])
SAMPLING: dict[str, Field] = {
    "model": (st.just("tiny-random"), st.sampled_from(["no-such-model", "", "tiny\ud800random"])),
    "n": (st.integers(1, 4), st.sampled_from([0, -1, 65, 64])),
    "seed": (st.integers(-(2**63), 2**63 - 1), st.sampled_from([2**63, 2**64 - 1, 2**70, -(2**63) - 1])),
    "temperature": (st.floats(0, 3), st.sampled_from([1e-45, 1e-8, 5e-324, -0.5, 1e308])),
    "top_p": (st.floats(1e-9, 1.0), st.sampled_from([0.0, 1.5, 5e-324, -1.0])),
    "top_k": (st.integers(-1, 300), st.sampled_from([-2, 2**70, 0])),
    "stop": (text(min_size=1, max_size=3) | st.lists(text(min_size=1, max_size=3), max_size=3),
             st.sampled_from(["", [""], ["a"] * 500, ["\udfff"]])),
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
    "prompt": (ids | text(min_size=1, max_size=30) | st.lists(ids, min_size=1, max_size=3)
               | st.lists(text(min_size=1, max_size=10), min_size=1, max_size=3),
               st.sampled_from([[], "", [[]], [[1], "a"], [-1], [2**70], [1.5], [[1, 2], [3, [4]]], "\ud800",
                                ["ok", "\udbff"]]) | HUGE_PROMPTS),
    "max_tokens": (st.integers(1, 8), st.sampled_from([-1, 0, None])),
    "logprobs": (st.integers(0, 5), st.sampled_from([-1, 21, True])),
    "add_special_tokens": (st.booleans(), st.just(None)),
}
arguments = st.sampled_from(['{"city": "Paris"}', {"city": "Paris"}, "", "{", "[[[]]]", "null", "1e999", '"x"'])
tool_call = st.fixed_dictionaries(
    {"function": st.fixed_dictionaries({"name": st.sampled_from(["get_weather", ""]), "arguments": arguments})},
    optional={"id": text(max_size=5), "type": st.just("function")})
content = st.none() | text(max_size=20) | st.lists(st.fixed_dictionaries(
    {"type": st.just("text"), "text": text(max_size=10)}), min_size=1, max_size=2) | st.sampled_from(
    ["c" * (4 << 20)])
roles = st.sampled_from(["system", "user", "assistant", "tool"])
message = st.fixed_dictionaries({"role": roles | st.just("us\ud800er"), "content": content},
                                optional={"tool_calls": st.lists(tool_call, max_size=2)})
odd_message = st.sampled_from([
    {"role": "robot", "content": "x"}, {"content": "x"}, {"role": "user", "content": [{"type": "image_url"}]},
    {"role": "user", "content": 5}, {"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]},
    {"role": "tool", "content": None, "tool_call_id": None}, {"role": "user", "content": [{"type": "text"}]}])
tool = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": st.sampled_from(["get_weather", "search"])},
    optional={"parameters": st.just({"type": "object", "properties": {"city": {"type": "string"}}}),
              "description": text(max_size=10)})})
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
                                     {"function": {}}, {"type": "function", "function": {"name": "get\udc00"}}])),
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


@dataclass
class Tally:
    """What a fuzz run saw: bodies sent, answers by status class, dropped connections."""

    bodies: int = 0
    ok: int = 0
    client_errors: int = 0
    server_errors: int = 0
    resets: int = 0

    def line(self, target: str) -> str:
        return (f"fuzz {target}: {self.bodies} bodies, {self.ok} x 200, {self.client_errors} x 4xx, "
                f"{self.server_errors} x 5xx, {self.resets} connection resets")


class KeptAlive:
    """One HTTP/1.1 connection for every request (`http.client` never reconnects behind our back): a connection
    the server dropped is counted, then replaced.

    The one drop that is not counted is HTTP's own idle timeout: uvicorn closes a kept-alive connection after
    5 s without a request (``timeout_keep_alive``, as vLLM's server), and on a loaded machine hypothesis can take
    that long to draw a multi-MiB body. So a connection idle for ``IDLE_S`` or more is replaced *before* the next
    request (seen under a load average of 15: a BrokenPipe on a body the server then answered fine)."""

    IDLE_S = 4.0

    def __init__(self, url: str, headers: dict[str, str], tally: Tally) -> None:
        parts = urlsplit(url)
        self.host, self.port, self.prefix = parts.hostname or "127.0.0.1", parts.port or 80, parts.path
        self.headers, self.tally = headers, tally
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        self.last = time.monotonic()

    def post(self, path: str, body: Any) -> tuple[int, bytes]:
        # json.dumps writes NaN and Infinity (not JSON, but Python's parser, the server's, reads them) and lone
        # surrogates as \ud800 escapes
        data = json.dumps(body)
        if time.monotonic() - self.last >= self.IDLE_S:  # the server may have closed it as idle: not a reset
            self.conn.close()
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            self.conn.request("POST", self.prefix + path, body=data,
                              headers={**self.headers, "Content-Type": "application/json"})
            r = self.conn.getresponse()
            answer = r.status, r.read()
            self.last = time.monotonic()
            return answer
        except (http.client.RemoteDisconnected, ConnectionError, http.client.BadStatusLine):
            self.tally.resets += 1
            self.conn.close()
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            raise

    def close(self) -> None:
        self.conn.close()


def check(client: KeptAlive, path: str, body: Any) -> None:
    client.tally.bodies += 1
    status, data = client.post(path, body)
    client.tally.ok += status == 200
    client.tally.client_errors += 400 <= status < 500
    client.tally.server_errors += status >= 500
    assert status < 500, (body if len(json.dumps(body)) < 2000 else "(huge body)", data[:500])
    if status != 200:
        error = json.loads(data)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == status, data[:500]


def _assert_healthy(tally: Tally, latencies: list[float], target: str, minimum: int) -> None:
    print(tally.line(target) + f"; /health: {len(latencies)} polls, slowest {max(latencies):.3f} s")
    assert tally.bodies >= minimum, tally.line(target)
    assert tally.server_errors == 0 and tally.resets == 0, tally.line(target)
    assert max(latencies) < STALL_S, f"/health took up to {max(latencies):.2f} s during the {target} fuzz"


def test_fuzzed_requests_never_break_the_server(victim: Server) -> None:
    start = len(victim.output(tail=None))
    tally = Tally()
    client = KeptAlive(victim.url, victim.headers, tally)

    @fuzz(SERVE_EXAMPLES)
    @given(body=bodies(COMPLETION, ("prompt", "max_tokens")))
    def completions(body: Any) -> None:
        check(client, "/v1/completions", body)

    @fuzz(SERVE_EXAMPLES)
    @given(body=bodies(CHAT, ("messages", "max_tokens")))
    def chat(body: Any) -> None:
        check(client, "/v1/chat/completions", body)

    try:
        with health_watch(victim.url) as latencies:
            completions()
            chat()
    finally:
        client.close()
    _assert_healthy(tally, latencies, "agentrl serve", min(1000, 2 * SERVE_EXAMPLES))
    assert httpx.get(victim.url + "/health", timeout=10).status_code == 200
    assert "Traceback" not in victim.output(tail=None)[start:]


class _GatewayThread:
    """A training gateway (tiny model, the real engine) on its own event loop in a thread; episodes opened on it."""

    def __init__(self) -> None:
        from agentrl.engines.base import SamplingParams
        from agentrl.engines.hf import HFEngine
        from agentrl.models.policy import Policy
        from agentrl.serve.gateway import TrainingGateway

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        policy = Policy("tiny-random", seed=0)
        self.sampling = SamplingParams(max_tokens=4)
        self.engine, self.gateway = HFEngine(policy), TrainingGateway()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(120)

    def open(self) -> Any:
        from agentrl.agents.llm import LLMClient

        async def opened() -> Any:
            llm = LLMClient(self.engine, self.engine.tokenizer, self.sampling, session=uuid.uuid4().hex, seed=1)
            return await self.gateway.open(llm)

        return self.run(opened())

    def close(self) -> None:
        self.run(self.gateway.aclose())
        self.run(self.engine.shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


def test_fuzzed_requests_never_break_the_gateway() -> None:
    gw = _GatewayThread()
    tally = Tally()
    try:
        route = gw.open()
        client = KeptAlive(gw.gateway.url, {"Authorization": f"Bearer {route.api_key}"}, tally)
        per_route: list[int] = [0]

        @fuzz(GATEWAY_EXAMPLES)
        @given(body=bodies(CHAT, ("messages",)))
        def chat(body: Any) -> None:
            nonlocal route
            if per_route[0] >= 8 or route.stopped is not None:  # a fresh episode now and then (turn limits)
                route = gw.open()
                per_route[0] = 0
            per_route[0] += 1
            check(client, f"/episodes/{route.episode_id}/v1/chat/completions", body)

        with health_watch(gw.gateway.url) as latencies:
            chat()
        client.close()
    finally:
        gw.close()
    _assert_healthy(tally, latencies, "training gateway", GATEWAY_EXAMPLES)
