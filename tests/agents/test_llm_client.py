"""LLMClient on the embedded engine with a tiny model: exact prompt ids, incremental rendering, tools, limits."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrl.agents.base import EpisodeTruncated
from agentrl.agents.llm import LLMClient
from agentrl.engines.base import Completion, SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.models.policy import Policy
from agentrl.seeding import derive_seed


class RecordingEngine(HFEngine):
    """The real HFEngine, also keeping every prompt it received."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.received: list[list[int]] = []
        self.seeds: list[int | None] = []

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, *, session: str | None = None,
                       **kwargs: Any) -> Completion:
        self.received.append(list(prompt_ids))
        self.seeds.append(sampling.seed)
        return await super().generate(prompt_ids, sampling, session=session, **kwargs)


def test_prompt_ids_are_what_the_engine_received_and_grow_by_prefix(tiny_policy: Policy) -> None:
    engine = RecordingEngine(tiny_policy)
    llm = LLMClient(engine, tiny_policy.tokenizer, SamplingParams(max_tokens=8), session="ep", seed=1)

    async def episode() -> None:
        messages = [{"role": "system", "content": "Play."}, {"role": "user", "content": "start"}]
        for i in range(3):
            reply = await llm.chat(messages)
            messages += [reply.message(), {"role": "user", "content": f"obs {i}"}]

    asyncio.run(episode())
    assert [t.prompt_ids for t in llm.turns] == engine.received
    for prev, nxt in zip(llm.turns, llm.turns[1:], strict=False):
        assert nxt.prompt_ids[: prev.num_tokens] == prev.prompt_ids + prev.response_ids
    assert llm.prefix_breaks == 0
    assert [t.index for t in llm.turns] == [0, 1, 2]
    assert all(t.policy_version == 0 and len(t.logprobs) == len(t.response_ids) for t in llm.turns)


def test_concurrent_calls_of_one_episode_are_separate_turns(tiny_policy: Policy) -> None:
    """An agent that fires two LLM calls at once (parallel branches) gets two turns, each with its own index and
    seed, in the order the engine received them."""
    engine = RecordingEngine(tiny_policy)
    llm = LLMClient(engine, tiny_policy.tokenizer, SamplingParams(max_tokens=6), session="ep", seed=4)
    messages = [{"role": "user", "content": "start"}]

    async def episode() -> None:
        await asyncio.gather(llm.chat([*messages, {"role": "user", "content": "a"}]),
                             llm.chat([*messages, {"role": "user", "content": "b"}]))

    asyncio.run(episode())
    assert [t.index for t in llm.turns] == [0, 1]
    assert [t.prompt_ids for t in llm.turns] == engine.received
    assert engine.seeds == [derive_seed(4, 0), derive_seed(4, 1)]  # the episode seed, then the turn index
    assert all(len(t.logprobs) == len(t.response_ids) for t in llm.turns)


def test_rewritten_history_falls_back_to_full_render(tiny_policy: Policy) -> None:
    engine = RecordingEngine(tiny_policy)
    llm = LLMClient(engine, tiny_policy.tokenizer, SamplingParams(max_tokens=4), seed=2)

    async def episode() -> None:
        first = [{"role": "user", "content": "a"}]
        await llm.chat(first)
        # the agent drops the history (a sliding window): a fresh render, not a continuation
        await llm.chat([{"role": "user", "content": "b"}])

    asyncio.run(episode())
    text = tiny_policy.tokenizer.decode(llm.turns[1].prompt_ids)
    assert text == "<|im_start|>user\nb<|im_end|>\n<|im_start|>assistant\n"
    assert llm.turns[1].prompt_ids == engine.received[1]


def test_tools_injected_when_template_ignores_them(tiny_policy: Policy) -> None:
    engine = HFEngine(tiny_policy)
    llm = LLMClient(engine, tiny_policy.tokenizer, SamplingParams(max_tokens=2))
    tool = {"type": "function", "function": {"name": "lookup", "description": "find", "parameters": {}}}
    asyncio.run(llm.chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
                         tools=[tool]))
    text = tiny_policy.tokenizer.decode(llm.turns[0].prompt_ids)
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou can call tools.")
    assert '"name": "lookup"' in text


def test_turn_limit_and_reward(tiny_policy: Policy) -> None:
    llm = LLMClient(HFEngine(tiny_policy), tiny_policy.tokenizer, SamplingParams(max_tokens=2), max_turns=1)
    with pytest.raises(RuntimeError, match="before any LLM call"):
        llm.reward(1.0)

    async def episode() -> None:
        await llm.chat([{"role": "user", "content": "x"}])
        llm.reward(0.5)
        llm.reward(0.25)
        await llm.chat([{"role": "user", "content": "y"}])

    with pytest.raises(EpisodeTruncated, match="turn limit"):
        asyncio.run(episode())
    assert llm.turns[0].reward == 0.75


def test_context_window_truncates(tiny_policy: Policy) -> None:
    llm = LLMClient(HFEngine(tiny_policy, max_context=40), tiny_policy.tokenizer, SamplingParams(max_tokens=4))
    with pytest.raises(EpisodeTruncated, match="context window"):
        asyncio.run(llm.chat([{"role": "user", "content": "x" * 100}]))


def test_each_turn_is_stamped_with_its_engine_call(tiny_policy: Policy) -> None:
    """The wall-clock times the traces show: each sampled turn spans its own engine call, in order."""

    class SlowEngine(HFEngine):
        async def generate(self, prompt_ids: list[int], sampling: SamplingParams, *, session: str | None = None,
                           **kwargs: Any) -> Completion:
            await asyncio.sleep(0.2)
            return await super().generate(prompt_ids, sampling, session=session, **kwargs)

    llm = LLMClient(SlowEngine(tiny_policy), tiny_policy.tokenizer, SamplingParams(max_tokens=2), seed=3)

    async def episode() -> None:
        messages = [{"role": "user", "content": "start"}]
        for _ in range(2):
            reply = await llm.chat(messages)
            await asyncio.sleep(0.1)  # the environment's time between turns is in no turn
            messages += [reply.message(), {"role": "user", "content": "next"}]

    asyncio.run(episode())
    first, second = llm.turns
    assert first.started_ns is not None and first.ended_ns is not None and second.started_ns is not None
    assert first.ended_ns - first.started_ns >= 200_000_000  # the engine call's 0.2 s
    assert second.started_ns - first.ended_ns >= 100_000_000  # the 0.1 s between the calls
