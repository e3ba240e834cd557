"""RTPO branching on a LangChain agent: siblings replay the trunk's first k turns token for token (tools rerun
deterministically), sample turn k fresh from the same context c_k, and a non-deterministic tool is caught."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from langchain.agents import create_agent
from langchain_core.tools import tool
from lc_support import letter_reward, tasks, weather, weather_script
from tests.support.scripted import ScriptedEngine

from agentrl.collect.collector import Collector
from agentrl.engines.base import SamplingParams
from agentrl.models.policy import Policy
from agentrl_langchain import LangChainAgent


def _collector(policy: Policy, tools: list[Any]) -> Collector:
    agent = LangChainAgent(lambda model: create_agent(model, tools=tools, system_prompt="Weather."), letter_reward)
    return Collector(ScriptedEngine(policy, weather_script(rounds=2)), agent, policy.tokenizer,
                     sampling=SamplingParams(max_tokens=80), max_failed_fraction=1.0)


def test_siblings_replay_the_trunk_exactly(tiny_policy: Policy) -> None:
    col = _collector(tiny_policy, [weather])
    task_list = tasks(1)
    by_id = {t.id: t for t in task_list}
    trunks = asyncio.run(col.collect_trunks(task_list, step=4, per_task=2))
    assert all(t.num_turns == 3 and not t.failed for t in trunks)
    for k in range(3):
        siblings = asyncio.run(col.branch(trunks, by_id, k, 1, step=4))
        assert len(siblings) == 2
        for sib in siblings:
            trunk = trunks[sib.group]
            assert not sib.failed, sib.error
            assert sib.branch_turn == k and sib.tree == trunk.tree
            for i in range(k):
                assert sib.turns[i].forced
                assert sib.turns[i].prompt_ids == trunk.turns[i].prompt_ids
                assert sib.turns[i].response_ids == trunk.turns[i].response_ids
                assert sib.turns[i].logprobs == trunk.turns[i].logprobs
                assert sib.turns[i].tool_calls == trunk.turns[i].tool_calls
            assert sib.turns[k].prompt_ids == trunk.turns[k].prompt_ids  # c_k, through the tools' rerun
            assert all(not t.forced for t in sib.turns[k:])
        if k == 2:  # the free last turn is resampled: siblings differ from the trunk there
            assert any(s.turns[2].response_ids != trunks[s.group].turns[2].response_ids for s in siblings)


_clock = itertools.count()


@tool
def drift(city: str) -> str:
    """Weather that changes every time it is asked (not deterministic)."""
    return f"{city}: {next(_clock)} degrees"


def test_a_non_deterministic_tool_fails_the_sibling_with_replay_mismatch(tiny_policy: Policy) -> None:
    col = _collector(tiny_policy, [drift])
    col.engine.script = lambda prompt, seed: (  # type: ignore[attr-defined]
        None if "<tool_response>" in prompt else '<tool_call>\n{"name": "drift", "arguments": '
                                                 '{"city": "Oslo"}}\n</tool_call>')
    task_list = tasks(1)
    trunks = asyncio.run(col.collect_trunks(task_list, step=0))
    (sibling,) = asyncio.run(col.branch(trunks, {t.id: t for t in task_list}, 1, 1, step=0))
    assert sibling.failed and (sibling.error or "").startswith("ReplayMismatchError: replaying turn 1")
