"""The two OpenAI-API examples trained two RTPO steps with a tiny model, through the real training gateway on
127.0.0.1: the Agents SDK agent (async ``run``) and the plain ``openai`` client loop (sync ``run``, in a thread).

A tiny random model writes no tool calls, so the engine teacher-forces them (`tests.support.scripted`): two
searches with a query drawn from the sampling seed, then an answer. Everything else is real: the SDK or client,
HTTP, the gateway, the episode's LLM client, the tools, RTPO's replay branching and the Lightning trainer.
"""

from __future__ import annotations

import importlib
import random
from collections import Counter
from typing import Any

import pytest
from tests.support.scripted import ScriptedEngineSpec
from tests.training.helpers import fit

from agentrl.agents.http_agent import HTTPAgent
from agentrl.chat.tools import HermesToolParser
from agentrl.engines.base import SamplingParams
from agentrl.models.policy import Policy
from agentrl.training.rollout.datamodule import RolloutDataModule
from agentrl.training.schedules.rtpo import RTPO
from agentrl.training.system.module import AgentRLModule
from agentrl.training.update.settings import PPOSettings
from agentrl.types import Trajectory
from agentrl_examples.searchqa import SearchQATasks

QUERIES = ["Burby river", "Zorkfeven founder", "Ratrio weaver", "Dorktrand region"]


def search_script(prompt: str, seed: int | None) -> str | None:
    """Search twice (the worked example already holds one tool result), then answer; later calls sample."""
    rounds = prompt.count("<tool_response>") - 1
    rng = random.Random(seed)
    if rounds < 2:
        return HermesToolParser.render_call("search", {"query": rng.choice(QUERIES)})
    if rounds == 2:
        return HermesToolParser.render_call("answer", {"text": rng.choice(["Daendbenis", "a weaver"])})
    return None


class RecordingModule(AgentRLModule):
    """The real module, keeping every collection it made (step, trajectories)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.collections: list[tuple[int, list[Trajectory]]] = []

    def collect(self, coro: Any) -> list[Trajectory]:
        trajs = super().collect(coro)
        self.collections.append((self.rl_step, trajs))
        return trajs

    def collect_batch(self, tasks: list[Any], make: Any, *, bounded: bool = True) -> list[Trajectory]:
        trajs = super().collect_batch(tasks, make, bounded=bounded)  # a step's first collection (RTPO: the trunks)
        self.collections.append((self.rl_step, trajs))
        return trajs


def _train(example: str) -> tuple[RecordingModule, ScriptedEngineSpec]:
    module_ = importlib.import_module(f"agentrl_examples.{example}")
    spec = ScriptedEngineSpec(search_script)
    data = RolloutDataModule(HTTPAgent(module_.run, module_.reward), SearchQATasks(hops=1, stop=8), batch_size=2,
                             steps=2, sampling=SamplingParams(max_tokens=96), max_turns=4, max_failed_fraction=0.0)
    module = RecordingModule(Policy("tiny-random", seed=0), RTPO(group_size=3, ppo=PPOSettings(epochs=1)),
                             engine=spec, peak_flops=1e11)
    fit(module, data)
    return module, spec


@pytest.mark.parametrize("example", ["openai_agents_search", "openai_client_loop"])
def test_example_trains_two_rtpo_steps_with_exact_turns_and_replay(example: str) -> None:
    module, spec = _train(example)
    assert module.rl_step == 2
    trajs = [t for _, c in module.collections for t in c]
    assert trajs and not [t.error for t in trajs if t.failed]
    # one recorded turn per model call the agent made (the agent counts its own calls)
    for t in trajs:
        assert t.info["agent_llm_calls"] == t.num_turns == 3, (t.info, t.num_turns)
        assert [turn.tool_calls[0]["name"] for turn in t.turns if turn.tool_calls] == ["search", "search", "answer"]
        # whatever shape the agent sent the history back in, turn i+1's prompt extends turn i's ids verbatim
        assert t.info["prefix_breaks"] == 0
        for a, b in zip(t.turns, t.turns[1:], strict=False):
            assert b.prompt_ids[: len(a.prompt_ids) + len(a.response_ids)] == a.prompt_ids + a.response_ids
    # the prompt ids recorded for sampled turns are exactly the prompts the engine received
    (engine,) = spec.built
    sampled = Counter(tuple(turn.prompt_ids) for t in trajs for turn in t.turns if not turn.forced)
    assert sampled == Counter(tuple(p) for p in engine.received)
    # RTPO siblings replay their trunk's turns before k exactly and reach the trunk's context at k
    siblings = 0
    for step, collection in module.collections:
        for sib in (t for t in collection if t.branch_turn is not None):
            k = sib.branch_turn
            (trunk,) = [t for s, c in module.collections if s == step for t in c
                        if t.branch_turn is None and t.tree == sib.tree]
            for i in range(k):
                mine, theirs = sib.turns[i], trunk.turns[i]
                assert mine.forced and not theirs.forced
                assert (mine.prompt_ids, mine.response_ids, mine.logprobs) == (
                    theirs.prompt_ids, theirs.response_ids, theirs.logprobs)
            assert sib.turns[k].prompt_ids == trunk.turns[k].prompt_ids and not sib.turns[k].forced
            siblings += 1
    assert siblings == 2 * 2 * 3 * 2  # steps x trunks per step x boundaries x (group_size - 1) siblings
