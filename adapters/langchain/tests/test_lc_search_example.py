"""The shipped example (`agentrl_langchain_examples.search_agent`): its tools over the real corpus, its reward,
its task splits, and one whole episode where the teacher-forced model searches and then answers right."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from agentrl_langchain_examples.search_agent import (
    DEMO_QUESTION,
    SEARCH_BONUS,
    SearchQATasks,
    build,
    reward,
    search,
    with_demonstration,
)
from langchain_core.messages import AIMessage, HumanMessage, ToolCall
from lc_support import tool_call_text
from tests.support.scripted import ScriptedEngine

from agentrl.agents.base import Task
from agentrl.collect.collector import Collector
from agentrl.engines.base import SamplingParams
from agentrl.models.policy import Policy
from agentrl_langchain import LangChainAgent

TASK = Task("q005", data={"question": "On which river is the town of Dreirkstead?", "answer": "Zildralis"})


def _result(*replies: AIMessage) -> dict[str, Any]:
    return {"messages": [*with_demonstration(TASK)["messages"], *replies]}


def _call(name: str, **args: str) -> AIMessage:
    return AIMessage("", tool_calls=[ToolCall(name=name, args=args, id=f"c_{name}")])


def test_search_finds_the_document_with_the_answer() -> None:
    assert "Zildralis" in search.invoke({"query": "Dreirkstead river"})
    assert "No documents match" in search.invoke({"query": "the"})


def test_reward_is_f1_plus_a_search_bonus_and_ignores_the_demonstration() -> None:
    right = reward(TASK, _result(_call("search", query="Dreirkstead"), _call("answer", text="the Zildralis")))
    assert right.reward == pytest.approx(1.0 + SEARCH_BONUS) and right.success
    plain = reward(TASK, _result(AIMessage("It is the Zildralis river")))
    assert 0 < plain.reward < 1 and not plain.success and plain.info["answer"] == "It is the Zildralis river"
    # the demonstration's search and answer calls are not the model's
    nothing = reward(TASK, _result())
    assert nothing.reward == 0.0 and nothing.info["answer"] is None


def test_task_splits_hold_out_the_demonstration() -> None:
    train, held_out = SearchQATasks(hops=1, stop=80), SearchQATasks(hops=1, start=80, stop=99)
    questions = {row["question"] for row in train.rows} | {row["question"] for row in held_out.rows}
    assert len(train.rows) == 80 and len(held_out.rows) == 19 and DEMO_QUESTION not in questions
    assert train.task(80).id == train.task(0).id and train.task(3).data["hops"] == 1
    with pytest.raises(ValueError, match="hops must be"):
        SearchQATasks(hops=3)


def test_an_episode_that_searches_then_answers_earns_the_full_reward(tiny_policy: Policy) -> None:
    rows = {row["question"]: row for row in SearchQATasks(hops=1).rows}

    def script(prompt: str, seed: int | None) -> str:
        question, _, after = prompt.rpartition("<|im_start|>user\n")[2].partition("<|im_end|>")
        row = rows[question]
        if "<tool_response>" not in after:
            return tool_call_text("search", {"query": question})
        return tool_call_text("answer", {"text": row["answer"]})

    agent = LangChainAgent(build, reward, input_mapping=with_demonstration)
    engine = ScriptedEngine(tiny_policy, script)
    collector = Collector(engine, agent, tiny_policy.tokenizer, sampling=SamplingParams(max_tokens=120))
    task = SearchQATasks(hops=1).task(2)
    (traj,) = asyncio.run(collector.collect_groups([task], 1, step=0))
    assert not traj.failed, traj.error
    assert traj.num_turns == 2 and traj.info["tools"] == {"search": 1, "answer": 1}  # answer returns directly
    assert traj.reward == pytest.approx(1.0 + SEARCH_BONUS) and traj.success
    second = tiny_policy.tokenizer.decode(traj.turns[1].prompt_ids)
    assert str(task.data["answer"]) in second.rpartition("<tool_response>")[2]
    assert json.loads(json.dumps(traj.info["gold"])) == task.data["answer"]
    assert isinstance(with_demonstration(task)["messages"][-1], HumanMessage)
