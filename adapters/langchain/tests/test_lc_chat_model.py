"""`AgentRLChatModel` on the embedded engine with a tiny model: one turn per call, token-exact continuation through
LangChain messages, tools, threads, concurrency, structured output, and the settings it refuses."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from langchain_core.caches import InMemoryCache
from langchain_core.globals import set_llm_cache
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from lc_support import tool_call_text, weather
from pydantic import BaseModel
from tests.support.scripted import Script, ScriptedEngine

from agentrl.agents.llm import LLMClient
from agentrl.engines.base import SamplingParams
from agentrl.models.policy import Policy
from agentrl_langchain import AgentRLChatModel

T = TypeVar("T")


def _run(policy: Policy, body: Callable[[AgentRLChatModel], Awaitable[T]], script: Script | None = None,
         max_tokens: int = 80) -> tuple[T, LLMClient, ScriptedEngine]:
    engine = ScriptedEngine(policy, script)
    llm = LLMClient(engine, policy.tokenizer, SamplingParams(max_tokens=max_tokens), session="ep", seed=3)

    async def main() -> T:
        return await body(AgentRLChatModel(client=llm))

    return asyncio.run(main()), llm, engine


def test_each_call_is_one_token_exact_turn(tiny_policy: Policy) -> None:
    async def body(model: AgentRLChatModel) -> list[AIMessage]:
        messages: list[Any] = [SystemMessage("Be brief."), HumanMessage("hello")]
        first = await model.ainvoke(messages)
        second = await model.ainvoke([*messages, first, HumanMessage("and then?")])
        return [first, second]

    (first, second), llm, engine = _run(tiny_policy, body, max_tokens=6)
    assert [t.prompt_ids for t in llm.turns] == engine.received
    t0, t1 = llm.turns
    assert t1.prompt_ids[: t0.num_tokens] == t0.prompt_ids + t0.response_ids  # the sampled ids, not re-tokenized
    assert llm.prefix_breaks == 0
    for message, turn in ((first, t0), (second, t1)):
        assert isinstance(message, AIMessage)
        assert message.usage_metadata is not None
        assert message.usage_metadata["input_tokens"] == len(turn.prompt_ids)
        assert message.usage_metadata["output_tokens"] == len(turn.response_ids)
        assert message.response_metadata["turn_index"] == turn.index
        assert message.response_metadata["policy_version"] == 0


def test_bound_tools_are_rendered_and_calls_parsed(tiny_policy: Policy) -> None:
    text = tool_call_text("weather", {"city": "oslo"}) + "\n<tool_call>\n{broken\n</tool_call>"

    async def body(model: AgentRLChatModel) -> tuple[Any, Any]:
        bound = model.bind_tools([weather])
        call = await bound.ainvoke([HumanMessage("weather in Oslo?")])
        result = ToolMessage(weather.invoke(call.tool_calls[0]["args"]), tool_call_id=call.tool_calls[0]["id"])
        return call, await bound.ainvoke([HumanMessage("weather in Oslo?"), call, result])

    script = {0: text}
    (call, _), llm, _ = _run(tiny_policy, body, lambda prompt, seed: script.pop(0, None), max_tokens=120)
    first_prompt = tiny_policy.tokenizer.decode(llm.turns[0].prompt_ids)
    assert '"name": "weather"' in first_prompt and "<tools>" in first_prompt
    assert call.tool_calls == [{"name": "weather", "args": {"city": "oslo"}, "id": "call_0_0", "type": "tool_call"}]
    assert len(call.invalid_tool_calls) == 1
    second_prompt = tiny_policy.tokenizer.decode(llm.turns[1].prompt_ids)
    assert second_prompt.endswith("<|im_start|>tool\n<tool_response>\nOslo: 4 degrees, snow\n</tool_response>"
                                  "<|im_end|>\n<|im_start|>assistant\n")
    assert llm.prefix_breaks == 0


def test_tool_choice_none_hides_the_tools(tiny_policy: Policy) -> None:
    async def body(model: AgentRLChatModel) -> Any:
        return await model.bind_tools([weather], tool_choice="none").ainvoke("hi")

    _, llm, _ = _run(tiny_policy, body, max_tokens=2)
    assert "<tools>" not in tiny_policy.tokenizer.decode(llm.turns[0].prompt_ids)


def test_sync_invoke_works_from_a_worker_thread_and_fails_clearly_on_the_loop(tiny_policy: Policy) -> None:
    async def body(model: AgentRLChatModel) -> Any:
        reply = await asyncio.to_thread(model.invoke, [HumanMessage("from a thread")])
        with pytest.raises(RuntimeError, match=r"await model.ainvoke"):
            model.invoke([HumanMessage("on the loop")])
        return reply

    reply, llm, engine = _run(tiny_policy, body, max_tokens=4)
    assert isinstance(reply, AIMessage)
    assert len(llm.turns) == 1 and llm.turns[0].prompt_ids == engine.received[0]


def test_concurrent_calls_are_recorded_one_turn_each(tiny_policy: Policy) -> None:
    async def body(model: AgentRLChatModel) -> list[Any]:
        return list(await asyncio.gather(*(model.ainvoke(f"question {i}") for i in range(3))))

    replies, llm, engine = _run(tiny_policy, body, max_tokens=4)
    assert [t.index for t in llm.turns] == [0, 1, 2]
    assert [t.prompt_ids for t in llm.turns] == engine.received
    assert [r.response_metadata["turn_index"] for r in replies] == [0, 1, 2]


def test_a_global_llm_cache_never_skips_the_engine(tiny_policy: Policy) -> None:
    async def body(model: AgentRLChatModel) -> None:
        await model.ainvoke("same")
        await model.ainvoke("same")

    set_llm_cache(InMemoryCache())
    try:
        _, llm, _ = _run(tiny_policy, body, max_tokens=3)
    finally:
        set_llm_cache(None)
    assert len(llm.turns) == 2


class Forecast(BaseModel):
    """A weather forecast."""

    city: str
    degrees: int


def test_structured_output_goes_through_a_tool_call(tiny_policy: Policy) -> None:
    script = {0: tool_call_text("Forecast", {"city": "Oslo", "degrees": 4})}

    async def body(model: AgentRLChatModel) -> tuple[Any, Any]:
        structured = model.with_structured_output(Forecast)
        parsed = await structured.ainvoke("forecast for Oslo")
        raw = await model.with_structured_output(Forecast, include_raw=True).ainvoke("and Lima?")
        return parsed, raw

    (parsed, raw), llm, _ = _run(tiny_policy, body, lambda prompt, seed: script.pop(0, None), max_tokens=100)
    assert parsed == Forecast(city="Oslo", degrees=4)
    assert '"name": "Forecast"' in tiny_policy.tokenizer.decode(llm.turns[0].prompt_ids)
    # the random model does not call the schema tool: no parse, but the turn is recorded
    assert raw["parsed"] is None and raw["raw"].response_metadata["turn_index"] == 1
    assert len(llm.turns) == 2


def test_stop_sequences_and_per_call_sampling_are_refused(tiny_policy: Policy) -> None:
    async def body(model: AgentRLChatModel) -> None:
        with pytest.raises(ValueError, match="stop sequences"):
            await model.ainvoke("x", stop=["\n"])
        with pytest.raises(ValueError, match=r"per-call arguments \['temperature'\]"):
            await model.bind(temperature=0.2).ainvoke("x")

    _, llm, _ = _run(tiny_policy, body)
    assert llm.turns == []


def test_a_model_outside_an_episode_says_so(tiny_policy: Policy) -> None:
    llm = LLMClient(ScriptedEngine(tiny_policy), tiny_policy.tokenizer)
    with pytest.raises(RuntimeError, match="no running episode loop"):
        AgentRLChatModel(client=llm).invoke("x")
    with pytest.raises(TypeError, match="LLMClient"):
        AgentRLChatModel(client=object())
    with pytest.raises(ValueError, match="cannot use an LLM cache"):
        AgentRLChatModel(client=llm, cache=True)
