"""Collector with a tiny model on the embedded engine: groups, determinism, failures, RTPO branching."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrl.agents.base import Outcome, Task
from agentrl.agents.env_agent import EnvAgent
from agentrl.agents.llm import LLMClient
from agentrl.collect.collector import CollectionError, Collector
from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.envs import FrozenLakeEnv, GuessNumberEnv
from agentrl.models.policy import Policy
from agentrl.types import Trajectory

SAMPLING = SamplingParams(max_tokens=6)


def _collector(policy: Policy, agent: Any, **kw: Any) -> Collector:
    return Collector(HFEngine(policy), agent, policy.tokenizer, sampling=SAMPLING, **kw)


def _tasks(n: int) -> list[Task]:
    return [Task(id=f"t{i}", seed=100 + i) for i in range(n)]


def _tokens(trajs: list[Trajectory]) -> list[list[list[int]]]:
    return [[t.prompt_ids + t.response_ids for t in traj.turns] for traj in trajs]


def test_groups_are_deterministic_per_step(tiny_policy: Policy) -> None:
    agent = EnvAgent(GuessNumberEnv(max_turns=3))
    a = asyncio.run(_collector(tiny_policy, agent).collect_groups(_tasks(3), 2, step=5))
    b = asyncio.run(_collector(tiny_policy, agent, concurrency=1).collect_groups(_tasks(3), 2, step=5))
    c = asyncio.run(_collector(tiny_policy, agent).collect_groups(_tasks(3), 2, step=6))
    assert [t.group for t in a] == [0, 0, 1, 1, 2, 2]
    assert _tokens(a) == _tokens(b)  # same step, any concurrency: the same rollouts
    assert _tokens(a) != _tokens(c)
    assert all(1 <= t.num_turns <= 3 and not t.failed for t in a)
    # every turn's context starts with the previous turn's context and response (full history)
    for traj in a:
        for prev, nxt in zip(traj.turns, traj.turns[1:], strict=False):
            assert nxt.prompt_ids[: prev.num_tokens] == prev.prompt_ids + prev.response_ids


class FlakyToolAgent:
    """Calls the LLM, then a tool that raises for some tasks."""

    def __init__(self, bad: set[str]) -> None:
        self.bad = bad

    async def run(self, task: Task, llm: LLMClient) -> Outcome:
        await llm.chat([{"role": "user", "content": task.id}])
        if task.id in self.bad:
            raise ConnectionError(f"tool backend down for {task.id}")
        return Outcome(1.0, info={"success": True})


def test_failing_tool_fails_only_its_episode(tiny_policy: Policy) -> None:
    col = _collector(tiny_policy, FlakyToolAgent({"t1"}))
    trajs = asyncio.run(col.collect_groups(_tasks(4), 1, step=0))
    assert [t.failed for t in trajs] == [False, True, False, False]
    assert "tool backend down for t1" in (trajs[1].error or "")
    assert trajs[1].num_turns == 1  # its turns are kept for review
    assert all(t.reward == 1.0 for t in trajs if not t.failed)
    assert col.stats.failed == 1
    with pytest.raises(CollectionError, match="3 of 4 episodes failed"):
        asyncio.run(_collector(tiny_policy, FlakyToolAgent({"t0", "t1", "t2"})).collect_groups(_tasks(4), 1, step=0))


class SlowAgent:
    async def run(self, task: Task, llm: LLMClient) -> Outcome:
        await llm.chat([{"role": "user", "content": "x"}])
        await asyncio.sleep(5)
        return Outcome()


def test_timeout_fails_the_episode(tiny_policy: Policy) -> None:
    col = _collector(tiny_policy, SlowAgent(), episode_timeout=0.5, max_failed_fraction=1.0)
    (traj,) = asyncio.run(col.collect_groups(_tasks(1), 1, step=0))
    assert traj.failed and "timeout" in (traj.error or "")


class QueuedEngine:
    """The embedded engine behind a queue: every call waits ``delay`` s first, as an episode does behind the
    other episodes of a batch on a loaded machine."""

    def __init__(self, inner: HFEngine, delay: float) -> None:
        self.inner, self.delay = inner, delay

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, *, session: str | None = None) -> Any:
        await asyncio.sleep(self.delay)
        return await self.inner.generate(prompt_ids, sampling, session=session)


class TwoCallAgent:
    async def run(self, task: Task, llm: LLMClient) -> Outcome:
        for _ in range(2):
            await llm.chat([{"role": "user", "content": task.id}])
            await asyncio.sleep(0.05)  # its own work: a tool call
        return Outcome(1.0, info={"success": True})


def test_time_waiting_on_the_engine_does_not_count_toward_the_timeout(tiny_policy: Policy) -> None:
    # a loaded machine: each call queues 0.6 s behind other episodes; the episode's own work is 0.1 s in all
    col = Collector(QueuedEngine(HFEngine(tiny_policy), 0.6), TwoCallAgent(), tiny_policy.tokenizer,
                    sampling=SAMPLING, episode_timeout=0.5, max_failed_fraction=1.0)
    trajs = asyncio.run(col.collect_groups(_tasks(2), 1, step=0))
    assert [t.failed for t in trajs] == [False, False], [t.error for t in trajs]
    assert all(t.num_turns == 2 for t in trajs)
    # its own time still counts: a slow tool behind the same queue times the episode out
    slow = Collector(QueuedEngine(HFEngine(tiny_policy), 0.6), SlowAgent(), tiny_policy.tokenizer,
                     sampling=SAMPLING, episode_timeout=0.5, max_failed_fraction=1.0)
    (traj,) = asyncio.run(slow.collect_groups(_tasks(1), 1, step=0))
    assert traj.failed and "timeout" in (traj.error or "")


def test_the_progress_channel_counts_failed_episodes_as_failed(tiny_policy: Policy) -> None:
    col = _collector(tiny_policy, FlakyToolAgent({"t1", "t2"}), max_failed_fraction=1.0)
    asyncio.run(col.collect_groups(_tasks(4), 1, step=0))
    phase = col.progress.snapshot()
    assert (phase.done, phase.failed, phase.running) == (4, 2, 0)


@pytest.mark.parametrize("use_snapshots", [False, True])
def test_siblings_replay_the_trunk_exactly(tiny_policy: Policy, use_snapshots: bool) -> None:
    agent = EnvAgent(FrozenLakeEnv(size=3, holes=0, max_turns=4), use_snapshots=use_snapshots)
    col = _collector(tiny_policy, agent)
    tasks = _tasks(2)
    trunks = asyncio.run(col.collect_trunks(tasks, step=1))
    by_id = {t.id: t for t in tasks}
    for k in range(3):
        sibs = asyncio.run(col.branch(trunks, by_id, k, 2, step=1))
        assert len(sibs) == 2 * sum(t.num_turns > k for t in trunks)
        for sib in sibs:
            trunk = trunks[sib.group]
            assert sib.branch_turn == k and sib.tree == trunk.tree
            for i in range(k):
                assert sib.turns[i].forced
                assert sib.turns[i].prompt_ids == trunk.turns[i].prompt_ids
                assert sib.turns[i].response_ids == trunk.turns[i].response_ids
                assert sib.turns[i].reward == trunk.turns[i].reward
            assert sib.turns[k].prompt_ids == trunk.turns[k].prompt_ids  # c_k
            assert not sib.turns[k].forced
            assert all(not t.forced for t in sib.turns[k:])


def test_snapshot_and_replay_branching_agree(tiny_policy: Policy) -> None:
    env = FrozenLakeEnv(size=3, holes=1, max_turns=4)
    tasks = _tasks(2)
    by_id = {t.id: t for t in tasks}
    out = []
    for snap in (False, True):
        col = _collector(tiny_policy, EnvAgent(env, use_snapshots=snap))
        trunks = asyncio.run(col.collect_trunks(tasks, step=3))
        out.append(_tokens(asyncio.run(col.branch(trunks, by_id, 1, 2, step=3))))
    assert out[0] == out[1]
