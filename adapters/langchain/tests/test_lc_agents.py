"""Real LangChain / LangGraph agents over real ``@tool`` functions, run by the collector as agentrl episodes.

The tool calls are teacher-forced by `tests.support.scripted.ScriptedEngine` (a tiny random model writes none);
the parsing, the tool runs, the next turn's context and the recording are the real code paths.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from lc_support import CITIES, CountModelCalls, letter_reward, tasks, weather, weather_script
from tests.support.scripted import ScriptedEngine

from agentrl.agents.base import Task
from agentrl.collect.collector import Collector
from agentrl.engines.base import SamplingParams
from agentrl.models.policy import Policy
from agentrl.types import Trajectory
from agentrl_langchain import LangChainAgent, Score

Build = Callable[[BaseChatModel], Any]


def _prebuilt(model: BaseChatModel, tools: list[Any]) -> Any:
    with warnings.catch_warnings():  # deprecated in favour of create_agent, still what many agents use
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

        return create_react_agent(model, tools=tools, prompt="You report the weather.")


def _sync_node_graph(model: BaseChatModel, tools: list[Any]) -> Any:
    """A hand-written graph whose model node is a plain function: LangGraph runs it in a worker thread, so the
    chat model's sync ``invoke`` path is the one exercised."""
    bound = model.bind_tools(tools)

    def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [bound.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile()


BUILDERS: dict[str, Callable[[BaseChatModel, list[Any]], Any]] = {
    "create_agent": lambda model, tools: create_agent(model, tools=tools, system_prompt="You report the weather."),
    "langgraph_prebuilt": _prebuilt,
    "sync_node_graph": _sync_node_graph,
}


def _collect(policy: Policy, agent: LangChainAgent, script: Any, n_tasks: int = 2, **kw: Any) -> tuple[
        list[Trajectory], ScriptedEngine]:
    engine = ScriptedEngine(policy, script)
    collector = Collector(engine, agent, policy.tokenizer, sampling=SamplingParams(max_tokens=80),
                          max_failed_fraction=1.0, **kw)
    return asyncio.run(collector.collect_groups(tasks(n_tasks), 1, step=0)), engine


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_turns_are_the_agents_model_calls_and_tool_results_reach_the_next_turn(tiny_policy: Policy,
                                                                               kind: str) -> None:
    counters: dict[str, CountModelCalls] = {}
    results: dict[str, Any] = {}

    def build(model: BaseChatModel) -> Any:
        counter = counters.setdefault(model.client.session, CountModelCalls())  # type: ignore[attr-defined]
        return BUILDERS[kind](model, [weather]).with_config(callbacks=[counter])

    def reward(task: Task, result: Any) -> float:
        results[task.id] = result
        return letter_reward(task, result)

    agent = LangChainAgent(build, reward)
    trajs, engine = _collect(tiny_policy, agent, weather_script(rounds=2), concurrency=1)
    # concurrency 1: the engine saw exactly the recorded prompts, in order
    assert [t.prompt_ids for traj in trajs for t in traj.turns] == engine.received
    for traj in trajs:
        assert not traj.failed, traj.error
        counter = counters[f"0/{traj.task_id}/g0"]
        replies = [m for m in results[traj.task_id]["messages"] if isinstance(m, AIMessage)]
        assert traj.num_turns == counter.calls == len(replies) == 3  # two forced tool rounds, then a free reply
        assert traj.info["tool_calls"] == traj.info["tool_calls_requested"] == 2
        assert traj.info["tools"] == {"weather": 2}
        assert traj.info["prefix_breaks"] == 0
        for k, (prev, turn) in enumerate(zip(traj.turns, traj.turns[1:], strict=False)):
            assert turn.prompt_ids[: prev.num_tokens] == prev.prompt_ids + prev.response_ids
            new_context = tiny_policy.tokenizer.decode(turn.prompt_ids[prev.num_tokens:])
            city = replies[k].tool_calls[0]["args"]["city"]
            assert prev.tool_calls == [{"name": "weather", "arguments": {"city": city}}]
            assert f"<tool_response>\n{CITIES[city]}\n</tool_response>" in new_context
        assert traj.reward == pytest.approx(letter_reward(Task(traj.task_id), results[traj.task_id]))


@tool
def flaky(city: str) -> str:
    """Weather from a backend that is down."""
    raise ConnectionError(f"weather backend down for {city}")


def _weather_agent(tools: list[Any], **kw: Any) -> LangChainAgent:
    return LangChainAgent(lambda model: create_agent(model, tools=tools), letter_reward, **kw)


def test_a_failing_tool_fails_its_episode_with_a_useful_error(tiny_policy: Policy) -> None:
    script = weather_script(rounds=1)
    trajs, _ = _collect(tiny_policy, _weather_agent([flaky]),
                        lambda prompt, seed: (script(prompt, seed) or "").replace('"weather"', '"flaky"') or None)
    for traj in trajs:
        assert traj.failed and traj.num_turns == 1  # turns kept for review
        assert traj.error is not None and traj.error.startswith("LangChainAgentError: tool 'flaky' raised "
                                                                "ConnectionError: weather backend down for ")
        assert "after 1 LLM calls" in traj.error


def test_limits_truncate_the_episode(tiny_policy: Policy) -> None:
    always = weather_script(rounds=100)
    trajs, _ = _collect(tiny_policy, _weather_agent([weather], recursion_limit=5), always)
    for traj in trajs:  # create_agent: model, tools, model, tools, model -> the 6th super-step is refused
        assert traj.truncated and not traj.terminated and not traj.failed
        assert traj.info["truncation"] == "recursion_limit=5 reached" and traj.num_turns == 3
        assert traj.info["tool_calls"] == 2
    trajs, _ = _collect(tiny_policy, _weather_agent([weather]), always, max_turns=2)
    for traj in trajs:
        assert traj.truncated and not traj.failed and traj.num_turns == 2
        assert "turn limit of 2" in traj.info["truncation"]


@tool
async def slow(city: str) -> str:
    """Weather from a slow backend."""
    await asyncio.sleep(30)
    return "late"


def test_timeout_fails_the_episode(tiny_policy: Policy) -> None:
    script = weather_script(rounds=1)
    trajs, _ = _collect(tiny_policy, _weather_agent([slow], timeout=0.5),
                        lambda prompt, seed: (script(prompt, seed) or "").replace('"weather"', '"slow"') or None,
                        n_tasks=1)
    (traj,) = trajs
    assert traj.failed and "did not finish within timeout=0.5 s (1 LLM calls made)" in (traj.error or "")


def test_score_sets_success_and_per_turn_rewards(tiny_policy: Policy) -> None:
    def reward(task: Task, result: Any) -> Score:
        return Score(1.0, success=True, turn_rewards=[0.25, 0.5], info={"judge": "ok"})

    agent = LangChainAgent(lambda model: create_agent(model, tools=[weather]), reward)
    trajs, _ = _collect(tiny_policy, agent, weather_script(rounds=1), n_tasks=1)
    (traj,) = trajs
    assert [t.reward for t in traj.turns] == [0.25, 0.5] and traj.reward == 1.0
    assert traj.turn_rewards() == [0.25, 1.5]  # the terminal reward lands on the last turn
    assert traj.success and traj.info["judge"] == "ok" and traj.terminated


def test_bad_reward_and_sync_call_on_the_loop_fail_clearly(tiny_policy: Policy) -> None:
    agent = LangChainAgent(lambda model: create_agent(model, tools=[weather]), lambda task, result: "high")
    (traj,), _ = _collect(tiny_policy, agent, None, n_tasks=1)
    assert traj.failed and "reward must return a float or a Score, got str" in (traj.error or "")

    def build(model: BaseChatModel) -> Any:
        async def node(state: MessagesState) -> dict[str, Any]:
            return {"messages": [model.invoke(state["messages"])]}  # sync call inside async code

        graph = StateGraph(MessagesState)
        graph.add_node("model", node)
        graph.add_edge(START, "model")
        graph.add_edge("model", END)
        return graph.compile()

    (traj,), _ = _collect(tiny_policy, LangChainAgent(build, letter_reward), None, n_tasks=1)
    assert traj.failed and "use `await model.ainvoke(...)`" in (traj.error or "")
