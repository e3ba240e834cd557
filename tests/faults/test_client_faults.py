"""Trainer/client faults (issue 14): a hung agent, a busy, dripping, restarted or confused rollout server must cost
only the episode or call it hits. Real parts: the tiny model, real threads, real HTTP on 127.0.0.1 (scripted
servers for faults `agentrl serve` cannot produce on demand, a real `agentrl serve` killed and restarted)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from langchain.agents import create_agent

from agentrl.agents.base import Task
from agentrl.agents.env_agent import EnvAgent
from agentrl.collect.collector import Collector
from agentrl.collect.runtime import RolloutRuntime
from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.engines.vllm import EngineProtocolError, EngineTimeout, EngineUnavailable, VLLMEngine
from agentrl.envs import GuessNumberEnv
from agentrl.envs.base import StepResult
from agentrl.models.policy import LoRASettings, Policy
from agentrl_langchain import LangChainAgent
from tests.faults.scripted_http import Request, ScriptedServer, answer, response_head
from tests.support.server import LORA_ARGS, start_server

SAMPLING = SamplingParams(max_tokens=6)
HANG_SEED = 102
COMPLETION = {"choices": [{"token_ids": [5, 6], "logprobs": {"token_logprobs": [-1.0, -2.0]},
                           "finish_reason": "length"}]}


class _Hang:
    """A blocking call shared by a test and the thread stuck in it: ``entered`` once inside, ``left`` on exit."""

    def __init__(self) -> None:
        self.entered, self.release, self.left = threading.Event(), threading.Event(), threading.Event()

    def block(self) -> None:
        self.entered.set()
        self.release.wait(20)  # a synchronous hang (like time.sleep(20)), bounded so the test always ends
        self.left.set()


class _HangingGuess(GuessNumberEnv):
    """Task seed HANG_SEED blocks in its first ``step`` (a stuck simulator, a tool waiting on a dead socket)."""

    hang: ClassVar[_Hang]

    def reset(self, seed: int) -> str:
        self._hangs = seed == HANG_SEED
        return super().reset(seed)

    def step(self, action: str) -> StepResult:
        if self._hangs:
            self.hang.block()
        return super().step(action)


def _tasks(n: int) -> list[Task]:
    return [Task(id=f"t{i}", seed=100 + i, data={"question": f"What is {i} + {i}?"}) for i in range(n)]


# ---------------------------------------------------------------------------------------------------- item 2


def test_blocked_environment_step_times_out_its_episode_only(tiny_policy: Policy) -> None:
    """A synchronous hang in ``env.step`` under ``episode_timeout``: that episode is abandoned and failed with
    reason timeout while the call is still blocked; the other episodes finish normally."""
    hang = _HangingGuess.hang = _Hang()
    collector = Collector(HFEngine(tiny_policy), EnvAgent(_HangingGuess(max_turns=2)), tiny_policy.tokenizer,
                          sampling=SAMPLING, episode_timeout=4.0, max_failed_fraction=1.0)
    try:
        trajs = asyncio.run(collector.collect_groups(_tasks(4), 1, step=0))
        still_blocked = hang.entered.is_set() and not hang.left.is_set()
    finally:
        hang.release.set()
    assert still_blocked  # the collection did not wait for the blocked call: the timeout held
    by_seed = {t.seed: t for t in trajs}
    hung = by_seed.pop(next(t.seed for t in trajs if t.task_id == "t2"))
    assert hung.failed and hung.info.get("timed_out") and (hung.error or "").startswith("timeout")
    assert "episode_timeout=4 s" in (hung.error or "") and hung.num_turns == 1  # its turn is kept for review
    assert all(not t.failed and t.num_turns >= 1 for t in by_seed.values())
    assert hang.left.wait(10)  # released, the abandoned thread finishes in the background


def test_blocking_langchain_reward_times_out_its_episode_only(tiny_policy: Policy) -> None:
    """A LangChain agent whose (sync) reward function hangs for one task: the same guarantee."""
    hang = _Hang()

    def reward(task: Task, result: Any) -> float:
        if task.id == "t1":
            hang.block()
        return 1.0

    agent = LangChainAgent(lambda model: create_agent(model, tools=[]), reward)
    collector = Collector(HFEngine(tiny_policy), agent, tiny_policy.tokenizer, sampling=SAMPLING,
                          episode_timeout=4.0, max_failed_fraction=1.0)
    try:
        trajs = asyncio.run(collector.collect_groups(_tasks(3), 1, step=0))
        still_blocked = hang.entered.is_set() and not hang.left.is_set()
    finally:
        hang.release.set()
    assert still_blocked
    assert [t.failed for t in trajs] == [False, True, False]
    assert (trajs[1].error or "").startswith("timeout") and trajs[1].info.get("timed_out")
    assert trajs[0].reward == 1.0 and trajs[2].reward == 1.0


# ---------------------------------------------------------------------------------------------------- items 3, 4, 11


def _engine(url: str, **kw: Any) -> VLLMEngine:
    return VLLMEngine([url], max_context=64, model="m", **kw)


async def _bounded(coro: Any) -> Any:
    return await asyncio.wait_for(coro, 60)  # the test's own bound, far above every engine timeout used


def test_read_timeout_is_not_resent() -> None:
    """The server takes the generation and goes quiet: the client gives up without sending it again (a second copy
    only adds load to a server already busy), while a GET is still retried."""

    async def silent(request: Request, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3600)

    with ScriptedServer(silent) as server:
        engine = _engine(server.url, timeout=1.5, retries=3, backoff=0.05)
        with pytest.raises(EngineUnavailable, match=server.url):
            asyncio.run(_bounded(engine.generate([1, 2, 3], SAMPLING)))
        assert server.posts("/v1/completions") == 1
        # the same with httpx's per-read timeout shorter than the call's deadline: the ReadTimeout itself is final
        engine = _engine(server.url, timeout=30, retries=3, backoff=0.05)
        engine.timeout = httpx.Timeout(30, read=0.5)
        with pytest.raises(EngineUnavailable, match="ReadTimeout.*not resent"):
            asyncio.run(_bounded(engine.generate([1, 2, 3], SAMPLING)))
        assert server.posts("/v1/completions") == 2


def test_connect_errors_are_retried_then_named() -> None:
    """The safe case stays retried: nothing reached the server, so each attempt is resent (bounded)."""
    with ScriptedServer(answer_json(COMPLETION)) as server:
        url = server.url
    engine = _engine(url, timeout=30, retries=2, backoff=0.05)  # the server is gone: connection refused
    with pytest.raises(EngineUnavailable, match=rf"{url} is unavailable after 3 attempt"):
        asyncio.run(_bounded(engine.generate([1, 2, 3], SAMPLING)))


def test_dripping_server_cannot_outlast_the_call_deadline() -> None:
    """A server that answers one byte every 0.1 s (a whole, valid completion after ~10 s) against timeout=1: the
    timeout is for the whole call, so the call raises `EngineTimeout` instead of waiting for the last byte."""

    async def drip(request: Request, writer: asyncio.StreamWriter) -> None:
        body = json.dumps(COMPLETION).encode()
        writer.write(response_head(200, "application/json", len(body)))
        for i in range(len(body)):
            writer.write(body[i:i + 1])
            await writer.drain()
            await asyncio.sleep(0.1)

    with ScriptedServer(drip) as server:
        engine = _engine(server.url, timeout=1.0, retries=2, backoff=0.05)
        with pytest.raises(EngineTimeout, match=rf"{server.url} did not complete /v1/completions within timeout=1 s"):
            asyncio.run(_bounded(engine.generate([1, 2, 3], SAMPLING)))
        assert server.posts("/v1/completions") == 1


def answer_json(data: Any) -> Any:
    async def handler(request: Request, writer: asyncio.StreamWriter) -> None:
        await answer(writer, 200, json.dumps(data).encode())

    return handler


def test_non_json_200_is_a_protocol_error_naming_the_url() -> None:
    """A proxy's login page with status 200, on the model look-up and on a generation."""

    async def html(request: Request, writer: asyncio.StreamWriter) -> None:
        await answer(writer, 200, b"<html><body>Sign in to the corporate proxy</body></html>", "text/html")

    with ScriptedServer(html) as server:
        for engine in (VLLMEngine([server.url], retries=0), _engine(server.url, retries=0)):  # /v1/models, then not
            with pytest.raises(EngineProtocolError, match=server.url) as info:
                asyncio.run(_bounded(engine.generate([1, 2, 3], SAMPLING)))
            assert "Sign in to the corporate proxy" in str(info.value) and "text/html" in str(info.value)
        assert [r.path for r in server.requests] == ["/v1/models", "/v1/completions"]


# ---------------------------------------------------------------------------------------------------- item 5


@pytest.mark.slow
def test_restarted_server_gets_the_adapter_again(tmp_path: Path) -> None:
    """Push an adapter to a real `agentrl serve`, collect, kill the server, start a new one on the same port,
    collect again: the engine pushes the adapter again on the first 404 and the collection succeeds."""
    policy = Policy("tiny-random", lora=LoRASettings(r=8, alpha=16, target_modules=["q_proj", "v_proj"]), seed=0)
    server = start_server(tmp_path, *LORA_ARGS)
    port = int(server.url.rsplit(":", 1)[1])
    engine = VLLMEngine([server.url], adapter_dir=str(tmp_path / "adapters"), retries=1, backoff=0.05, timeout=60)
    collector = Collector(engine, EnvAgent(GuessNumberEnv(max_turns=2)), policy.tokenizer, sampling=SAMPLING,
                          concurrency=4, max_failed_fraction=0.0)
    with RolloutRuntime() as runtime:
        try:
            runtime.run(engine.update_weights(policy, version=1))
            first = runtime.run(collector.collect_groups(_tasks(4), 1, step=0))
            server.stop()
            server = start_server(tmp_path, *LORA_ARGS, port=port)  # restarted: it knows only the base model
            second = runtime.run(collector.collect_groups(_tasks(4), 1, step=1))
            served = [m["id"] for m in httpx.get(server.url + "/v1/models").json()["data"]]
            log = server.output(tail=None)
        finally:
            server.stop()
            runtime.run(engine.shutdown())
    for trajs in (first, second):
        assert all(not t.failed for t in trajs)
        assert {turn.policy_version for t in trajs for turn in t.turns} == {1}
    assert served == ["tiny-random", "agentrl-v1"]
    assert log.count('POST /v1/load_lora_adapter HTTP/1.1" 200') == 1  # pushed once, not once per episode
