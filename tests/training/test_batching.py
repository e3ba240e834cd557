"""Packing turns of a trajectory into one row gives exactly the per-turn log-probs, entropies and values."""

from __future__ import annotations

import asyncio

import pytest
import torch
from torch.testing import assert_close

from agentrl.agents.base import Task
from agentrl.agents.env_agent import EnvAgent
from agentrl.collect.collector import Collector
from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.envs import FrozenLakeEnv
from agentrl.models.critic import TurnCritic
from agentrl.models.policy import Policy
from agentrl.training.update.batching import (
    Row,
    TurnKey,
    TurnTargets,
    collate,
    micro_batches,
    pack_rows,
    score_turns,
    token_counts,
)
from agentrl.types import Trajectory, TurnBatch


def _trajectories(policy: Policy) -> list[Trajectory]:
    col = Collector(HFEngine(policy), EnvAgent(FrozenLakeEnv(size=3, holes=0, max_turns=4)), policy.tokenizer,
                    sampling=SamplingParams(max_tokens=6))
    return asyncio.run(col.collect_groups([Task("a", 1), Task("b", 2)], 2, step=0))


def _score(
    policy: Policy, critic: TurnCritic, rows: list[Row], budget: int = 10**6
) -> dict[TurnKey, tuple[torch.Tensor, ...]]:
    """Per turn key: (log-probs, entropies, values), through `score_turns` (the trainer's one slicing place)."""
    def score(batch: TurnBatch) -> torch.Tensor:
        lp = policy.logprobs(batch, with_entropy=True)
        assert lp.entropy is not None  # asked for with_entropy=True
        return torch.stack([lp.logprobs, lp.entropy, critic(batch.input_ids, batch.attention_mask)], dim=-1)

    with torch.no_grad():
        scored = score_turns(rows, budget, 0, torch.device("cpu"), score)
    return {key: tuple(v.unbind(-1)) for key, v in scored.items()}


def test_packed_rows_equal_per_turn_rows(tiny_policy: Policy) -> None:
    trajs = _trajectories(tiny_policy)
    targets = {(b, t.index): TurnTargets(0.5, 1.0, 0.0) for b, tr in enumerate(trajs) for t in tr.turns}
    packed = pack_rows(trajs, targets, pack=True)
    single = pack_rows(trajs, targets, pack=False)
    assert len(packed) == len(trajs) < len(single)  # full history: one row per episode
    n_packed, n_single = token_counts(packed)
    assert n_packed == sum(len(r.ids) for r in packed) and n_single == sum(len(r.ids) for r in single)
    assert n_packed < n_single
    critic = TurnCritic(tiny_policy)
    a, b = _score(tiny_policy, critic, packed), _score(tiny_policy, critic, single, budget=64)
    assert set(a) == set(b) == set(targets)  # every targeted turn scored, whatever the rows and micro-batches
    for key in targets:
        turn = trajs[key[0]].turns[key[1]]
        assert a[key][0].shape == (len(turn.response_ids),)
        for x, y in zip(a[key], b[key], strict=True):
            assert_close(x, y, atol=2e-5, rtol=1e-5)
    # the engine's log-probs are the behaviour log-probs stored in the batch
    batch = collate(packed, 0)
    with torch.no_grad():
        lp = tiny_policy.logprobs(batch).logprobs
    assert (lp - batch.old_logprobs)[batch.response_mask].abs().max() <= 1e-4


def test_only_targeted_turns_are_trained(tiny_policy: Policy) -> None:
    trajs = _trajectories(tiny_policy)
    traj = next(t for t in trajs if t.num_turns >= 3)
    rows = pack_rows([traj], {(0, 1): TurnTargets(1.0)})
    batch = collate(rows, 0)
    turn = traj.turns[1]
    expected = torch.zeros_like(batch.response_mask)
    expected[0, len(turn.prompt_ids) : turn.num_tokens] = True
    assert torch.equal(batch.response_mask, expected)
    assert len(rows[0].ids) == turn.num_tokens  # the row ends with the last trained turn


def test_pack_rows_refuses_keys_that_name_no_turn(tiny_policy: Policy) -> None:
    trajs = _trajectories(tiny_policy)
    with pytest.raises(ValueError, match=r"not in the trajectories: \[\(0, 99\)\]"):
        pack_rows(trajs, {(0, 0): TurnTargets(0.0), (0, 99): TurnTargets(0.0)})


def test_micro_batches_respect_budget_and_keep_every_row(tiny_policy: Policy) -> None:
    trajs = _trajectories(tiny_policy)
    rows = pack_rows(trajs, {(b, t.index): TurnTargets(0.0) for b, tr in enumerate(trajs) for t in tr.turns},
                     pack=False)
    budget = 2 * max(len(r.ids) for r in rows)
    micro = micro_batches(rows, budget)
    assert sorted(id(r) for m in micro for r in m) == sorted(id(r) for r in rows)
    assert all(len(m) * max(len(r.ids) for r in m) <= budget for m in micro)
