"""The training gateway on 127.0.0.1 with a tiny model: OpenAI-shape errors, streaming equal to non-streaming,
turns recorded from requests, the trainer's sampling enforced, truncation, replay mismatch and timeouts of
`HTTPAgent` episodes. Real HTTP (httpx and the ``openai`` client), the real engine; a scripted engine where a
tool call is needed (`tests.support.scripted`)."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from agentrl.agents.base import Task
from agentrl.agents.env_agent import EnvAgent
from agentrl.agents.http_agent import HTTPAgent
from agentrl.agents.llm import LLMClient
from agentrl.chat.tools import HermesToolParser
from agentrl.collect.collector import Collector
from agentrl.engines.base import SamplingParams
from agentrl.envs import GuessNumberEnv
from agentrl.models.policy import Policy
from agentrl.seeding import derive_seed
from agentrl.serve.gateway import TrainingGateway
from agentrl.serve.serving import render_chat
from agentrl.training.rollout.datamodule import RolloutDataModule
from tests.support.scripted import ScriptedEngine

TOOLS: list[ChatCompletionToolParam] = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}]


def call_script(prompt: str, seed: int | None) -> str | None:
    """A tool call whenever the last user message asks for one, else free sampling."""
    tail = prompt.rsplit("<|im_start|>user", 1)[-1]
    return HermesToolParser.render_call("lookup", {"word": f"w{seed}"}) if "please call" in tail else None


def _within_gateway(policy: Policy, body: Callable[[TrainingGateway, ScriptedEngine], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        gateway = TrainingGateway()
        engine = ScriptedEngine(policy, call_script)
        try:
            return await body(gateway, engine)
        finally:
            await gateway.aclose()
            await engine.shutdown()

    return asyncio.run(main())


def _llm(engine: ScriptedEngine, seed: int = 7) -> LLMClient:
    return LLMClient(engine, engine.tokenizer, SamplingParams(max_tokens=96), session=f"s{seed}", seed=seed)


def test_unknown_finished_and_unauthorised_requests_answer_in_openai_error_shape(tiny_policy: Policy) -> None:
    async def body(gateway: TrainingGateway, engine: ScriptedEngine) -> None:
        route = await gateway.open(_llm(engine))
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        auth = {"Authorization": f"Bearer {route.api_key}"}
        async with httpx.AsyncClient(timeout=60) as http:
            ok = await http.post(f"{route.base_url}/chat/completions", json=chat, headers=auth)
            models = await http.get(f"{route.base_url}/models", headers=auth)
            assert [m["id"] for m in models.json()["data"]] == ["agentrl"]
            assert ok.status_code == 200 and ok.json()["object"] == "chat.completion"
            unknown = await http.post(f"{gateway.url}/episodes/nope/v1/chat/completions", json=chat, headers=auth)
            wrong_key = await http.post(f"{route.base_url}/chat/completions", json=chat,
                                        headers={"Authorization": "Bearer wrong"})
            no_episode = await http.post(f"{gateway.url}/v1/chat/completions", json=chat, headers=auth)
            await gateway.close(route)
            finished = await http.post(f"{route.base_url}/chat/completions", json=chat, headers=auth)
        assert unknown.status_code == 404 and unknown.json() == {"error": {
            "message": "The episode `nope` does not exist.", "type": "NotFoundError", "param": "episode_id",
            "code": 404}}
        assert finished.status_code == 404
        assert finished.json()["error"]["message"] == f"The episode `{route.episode_id}` has finished."
        assert wrong_key.status_code == 401 and wrong_key.json()["error"]["type"] == "AuthenticationError"
        assert no_episode.status_code == 404 and no_episode.json()["error"]["type"] == "NotFoundError"
        client = openai.AsyncOpenAI(base_url=route.base_url, api_key=route.api_key, max_retries=0)
        with pytest.raises(openai.NotFoundError, match="has finished"):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])

    _within_gateway(tiny_policy, body)


def test_a_body_over_the_limit_is_refused_in_openai_error_shape(tiny_policy: Policy) -> None:
    async def body(gateway: TrainingGateway, engine: ScriptedEngine) -> None:
        route = await gateway.open(_llm(engine))
        headers = {"Authorization": f"Bearer {route.api_key}", "Content-Type": "application/json"}
        big = b'{"messages": [{"role": "user", "content": "' + b"a" * (17 << 20) + b'"}]}'
        async with httpx.AsyncClient(timeout=60) as http:
            r = await http.post(f"{route.base_url}/chat/completions", content=big, headers=headers)
        assert r.status_code == 413
        assert r.json()["error"]["type"] == "RequestTooLargeError"
        await gateway.close(route)

    _within_gateway(tiny_policy, body)


@pytest.mark.parametrize("ask", ["say something", "please call the tool"])
def test_a_streaming_request_yields_the_same_tokens_as_a_non_streaming_one(tiny_policy: Policy, ask: str) -> None:
    """Two episodes with the same seed: one asked without streaming, one with; same ids, text and tool calls."""

    async def body(gateway: TrainingGateway, engine: ScriptedEngine) -> None:
        plain, streamed = await gateway.open(_llm(engine)), await gateway.open(_llm(engine))
        request: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": ask}], "tools": TOOLS,
                                   "return_token_ids": True}
        auth = {"Authorization": f"Bearer {plain.api_key}"}
        async with httpx.AsyncClient(timeout=60) as http:
            whole = (await http.post(f"{plain.base_url}/chat/completions", json=request, headers=auth)).json()
            async with http.stream("POST", f"{streamed.base_url}/chat/completions", headers=auth,
                                   json={**request, "stream": True, "stream_options": {"include_usage": True}}) as r:
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(line[6:]) for line in lines[:-1]]
        deltas = [c["choices"][0] for c in chunks if c["choices"]]
        choice = whole["choices"][0]
        assert [i for d in deltas for i in d.get("token_ids", [])] == choice["token_ids"]
        assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
        assert "".join(d["delta"].get("content") or "" for d in deltas) == (choice["message"]["content"] or "")
        calls = [c for d in deltas for c in d["delta"].get("tool_calls", [])]
        assert [(c["id"], c["function"]) for c in calls] == [
            (c["id"], c["function"]) for c in choice["message"].get("tool_calls", [])]
        assert deltas[-1]["finish_reason"] == choice["finish_reason"]
        usage = chunks[-1]["usage"]
        assert [usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")] == [
            whole["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")]
        if ask.startswith("please"):
            assert choice["finish_reason"] == "tool_calls"
            assert choice["message"]["tool_calls"][0]["id"] == "call_0_0"
            arguments = choice["message"]["tool_calls"][0]["function"]["arguments"]
            assert json.loads(arguments) == {"word": f"w{derive_seed(7, 0)}"}  # the scripted call, parsed
        # one rendering: the first turn's prompt is what `agentrl serve` renders for the same request
        served = render_chat(engine.tokenizer, request["messages"], request["tools"], True, HermesToolParser())
        assert whole["prompt_token_ids"] == engine.tokenizer.encode(served, add_special_tokens=False)
        # both requests are recorded turns whose prompts are what the engine received
        assert engine.received == [whole["prompt_token_ids"]] * 2

    _within_gateway(tiny_policy, body)


def test_the_openai_client_parses_streamed_and_plain_answers_alike(tiny_policy: Policy) -> None:
    async def body(gateway: TrainingGateway, engine: ScriptedEngine) -> None:
        plain, streamed = await gateway.open(_llm(engine)), await gateway.open(_llm(engine))
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "please call the tool"}]
        whole = await openai.AsyncOpenAI(base_url=plain.base_url, api_key=plain.api_key).chat.completions.create(
            model="m", messages=messages, tools=TOOLS)
        client = openai.AsyncOpenAI(base_url=streamed.base_url, api_key=streamed.api_key)
        stream = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                                      stream=True)
        names, args, finish = [], [], None
        async for chunk in stream:
            for call in chunk.choices[0].delta.tool_calls or []:
                names.append(call.function.name if call.function else None)
                args.append(call.function.arguments if call.function else None)
            finish = chunk.choices[0].finish_reason or finish
        message = whole.choices[0].message
        assert message.tool_calls and names == [c.function.name for c in message.tool_calls]  # type: ignore[union-attr]
        assert args == [c.function.arguments for c in message.tool_calls]  # type: ignore[union-attr]
        assert finish == whole.choices[0].finish_reason == "tool_calls"

    _within_gateway(tiny_policy, body)


@pytest.mark.parametrize(("field", "value"), [
    ("temperature", 0.3), ("n", 2), ("seed", 1), ("stop", ["x"]), ("max_tokens", 5), ("logprobs", True),
    ("tool_choice", "required"), ("presence_penalty", 0.5), ("stream", "yes"), ("messages", "hi"),
])
def test_requests_the_gateway_would_answer_differently_are_refused(tiny_policy: Policy, field: str,
                                                                   value: Any) -> None:
    async def body(gateway: TrainingGateway, engine: ScriptedEngine) -> None:
        llm = _llm(engine)
        route = await gateway.open(llm)
        request = {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, field: value}
        async with httpx.AsyncClient(timeout=60) as http:
            bad = await http.post(f"{route.base_url}/chat/completions", json=request,
                                  headers={"Authorization": f"Bearer {route.api_key}"})
            same = await http.post(f"{route.base_url}/chat/completions", headers={
                "Authorization": f"Bearer {route.api_key}"}, json={
                "messages": [{"role": "user", "content": "hi"}], "temperature": 1.0, "max_tokens": 500})
        assert bad.status_code == 400, bad.text
        assert bad.json()["error"]["param"] == field
        assert same.status_code == 200  # the trainer's own values (or a larger max_tokens) are fine
        assert len(llm.turns) == 1

    _within_gateway(tiny_policy, body)


def _collector(policy: Policy, agent: HTTPAgent, **kw: Any) -> Collector:
    agent.attach(TrainingGateway())
    kw.setdefault("max_failed_fraction", 1.0)
    return Collector(ScriptedEngine(policy, call_script), agent, policy.tokenizer,
                     sampling=SamplingParams(max_tokens=96), **kw)


async def _looping_agent(task: Task, base_url: str, api_key: str) -> int:
    """Calls the model until it stops calling the tool (at most 5 times), swallowing the gateway's errors."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "please call the tool"}]
    for _ in range(5):
        try:
            reply = (await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)).choices[0]
        except openai.BadRequestError:
            return -1
        messages.append(reply.message.model_dump(exclude_none=True))
        for call in reply.message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "a word"})
        messages.append({"role": "user", "content": "please call the tool"})
    return len(messages)


def test_the_turn_limit_truncates_the_episode_even_when_the_agent_swallows_the_error(tiny_policy: Policy) -> None:
    col = _collector(tiny_policy, HTTPAgent(_looping_agent, lambda task, result: 1.0), max_turns=2)
    (traj,) = asyncio.run(col.collect_groups([Task("t")], 1, step=0))
    assert traj.truncated and not traj.failed and not traj.terminated
    assert traj.num_turns == 2 and "turn limit of 2" in traj.info["truncation"]


_drift = itertools.count()


async def _drifting_agent(task: Task, base_url: str, api_key: str) -> str:
    """Two model calls; the tool's result changes every time (not deterministic for a task)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "please call the tool"}]
    first = (await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)).choices[0].message
    calls = first.tool_calls or []
    messages += [first.model_dump(exclude_none=True),
                 *({"role": "tool", "tool_call_id": c.id, "content": f"{next(_drift)} words"} for c in calls)]
    second = (await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)).choices[0].message
    return second.content or ""


def test_a_non_deterministic_agent_fails_its_sibling_with_replay_mismatch(tiny_policy: Policy) -> None:
    col = _collector(tiny_policy, HTTPAgent(_drifting_agent, lambda task, result: 0.5))
    tasks = [Task("t")]

    async def main() -> tuple[Any, Any]:
        trunks = await col.collect_groups(tasks, 1, step=0)
        return trunks, await col.branch(trunks, {"t": tasks[0]}, 1, 1, step=0)

    trunks, (sibling,) = asyncio.run(main())
    assert not trunks[0].failed and trunks[0].num_turns == 2
    assert sibling.failed and (sibling.error or "").startswith("ReplayMismatchError: replaying turn 1")


def test_a_sync_run_runs_off_the_loop_and_the_episode_timeout_holds(tiny_policy: Policy) -> None:
    done = threading.Event()
    late: list[BaseException] = []

    def slow(task: Task, base_url: str, api_key: str) -> str:
        client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        messages: list[Any] = [{"role": "user", "content": "hi"}]
        try:
            client.chat.completions.create(model="m", messages=messages)
            time.sleep(4.0)  # blocks this worker thread, not the rollout loop; twice the episode timeout
            client.chat.completions.create(model="m", messages=messages)
        except openai.APIError as exc:
            late.append(exc)
        finally:
            done.set()
        return "never scored"

    # 2 s: the first reply must come back inside the timeout (0.5 s failed under a load average of 15)
    col = _collector(tiny_policy, HTTPAgent(slow, lambda task, result: 1.0), episode_timeout=2.0)
    (traj,) = asyncio.run(col.collect_groups([Task("t")], 1, step=0))
    assert traj.failed and (traj.error or "").startswith("timeout:")
    assert traj.num_turns == 1
    assert done.wait(30)
    # the orphaned thread's later request found its episode finished (or the gateway gone with the loop)
    assert len(late) == 1 and isinstance(late[0], openai.NotFoundError | openai.APIConnectionError)


def test_the_data_module_gives_the_gateway_to_http_agents_only(tiny_policy: Policy) -> None:
    http_agent = HTTPAgent(_looping_agent, lambda task, result: 1.0, api_key="k-123")
    engine = ScriptedEngine(tiny_policy)
    RolloutDataModule(http_agent).make_collector(engine, tiny_policy.tokenizer)
    assert isinstance(http_agent.routes, TrainingGateway) and http_agent.routes.api_key == "k-123"
    env_agent = EnvAgent(GuessNumberEnv())
    RolloutDataModule(env_agent).make_collector(engine, tiny_policy.tokenizer)
    assert not hasattr(env_agent, "routes")


def test_a_busy_port_is_a_clear_error_and_the_loop_survives() -> None:
    async def main() -> str:
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            gateway = TrainingGateway(port=busy.getsockname()[1])
            with pytest.raises(RuntimeError, match="could not listen on 127.0.0.1"):
                await gateway.open(LLMClient(None, None))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        return "loop alive"

    assert asyncio.run(main()) == "loop alive"
