"""Shared-prefix rows (`model.share_prefixes`): one row holds a context once and each sample's tokens as a branch;
every token must keep exactly its own sequence's context, position and scoring state."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.testing import assert_close

from agentrl.models import tree
from agentrl.models.critic import TurnCritic
from agentrl.models.policy import LoRASettings, Policy
from agentrl.training.schedules.grpo import GRPO
from agentrl.training.schedules.rtpo import RTPO
from agentrl.training.update import rowplan
from agentrl.training.update.batching import TurnTargets, collate, micro_batches, pack_rows, score_turns, share_prefixes
from agentrl.training.update.settings import PPOSettings
from agentrl.types import Trajectory, Turn
from tests.training.helpers import GradProbe, fit, guess_data, letter_data, make_module, prefixed


def test_layout_by_hand() -> None:
    """Prefix p0 p1 p2, branch 1 = a0 a1, branch 2 = b0 b1 b2, then one padding token."""
    attention = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 1, 0]])
    branch = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 0]])
    assert tree.position_ids(attention, branch).tolist() == [[0, 1, 2, 3, 4, 3, 4, 5, 2]]  # padding: unused
    # a0 is scored from p2, a1 from a0, b0 from p2 (not from a1), b1 from b0
    assert tree.predecessors(attention, branch).tolist() == [[-1, 0, 1, 2, 3, 2, 5, 6, 2]]
    seen = tree.visibility(attention, branch)[0].int().tolist()
    assert seen[5] == [1, 1, 1, 0, 0, 1, 0, 0, 0]  # b0: the prefix and itself
    assert seen[7] == [1, 1, 1, 0, 0, 1, 1, 1, 0]  # b2: the prefix and its own branch
    assert seen[8] == [1, 1, 1, 0, 0, 0, 0, 0, 0]  # padding: the prefix only (never an empty row)
    with pytest.raises(ValueError, match="attention_mask"):  # scoring a shared-prefix row needs its padding mask
        tree.scoring_states(torch.zeros(1, 9, 4), attention.bool(), None, branch)
    # no branches: the ordinary padding-safe positions
    assert tree.position_ids(attention, None)[0, :8].tolist() == list(range(8))


def _siblings(prompt: list[int], replies: list[list[int]]) -> list[Trajectory]:
    """Episodes that share their first prompt and differ in the reply (RTPO's siblings at one depth)."""
    return [Trajectory([Turn(list(prompt), r, [-1.0] * len(r))], group=0) for r in replies]


@pytest.mark.parametrize("attention,lora", [("sdpa", False), ("eager", False), ("sdpa", True)])
def test_shared_rows_score_like_separate_rows(attention: str, lora: bool) -> None:
    tiny_policy = Policy("tiny-random", seed=0, lora=LoRASettings(r=4, alpha=8) if lora else None)
    for model in (tiny_policy.model, tiny_policy.backbone):
        model.config._attn_implementation = attention
    critic = TurnCritic(tiny_policy)
    torch.nn.init.normal_(critic.head.weight)  # a non-zero head: the values must depend on the states
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 200, (11,), generator=g).tolist()
    trajs = _siblings(prompt, [[5, 6, 7], [8, 9], [10, 11, 12, 13]]) + _siblings(prompt[:7], [[14, 15]])
    targets = {(b, 0): TurnTargets(0.5, 1.0, 0.0) for b in range(len(trajs))}
    rows = pack_rows(trajs, targets)
    merged = share_prefixes(rows, 10**6)
    assert len(merged) == 2 and merged[0].branch == [0] * 11 + [1] * 3 + [2] * 2 + [3] * 4
    assert merged[1] is rows[3]  # a context of its own keeps its plain row

    def score(batch: Any) -> torch.Tensor:
        lp = tiny_policy.logprobs(batch, with_entropy=True)
        assert lp.entropy is not None  # asked for with_entropy=True
        return torch.stack([lp.logprobs, lp.entropy, critic(batch.input_ids, batch.attention_mask, batch.branch)], -1)

    with torch.no_grad():
        alone = score_turns(rows, 10**6, 0, torch.device("cpu"), score)
        shared = score_turns(rows, 10**6, 0, torch.device("cpu"), score, shared=True)
    assert alone.keys() == shared.keys() == targets.keys()
    for key in targets:
        assert shared[key].shape == (len(trajs[key[0]].turns[0].response_ids), 3)
        assert_close(shared[key], alone[key], atol=1e-5, rtol=1e-5)


def test_share_prefixes_keeps_the_budget_and_every_turn() -> None:
    trajs = _siblings(list(range(1, 41)), [[50 + i] * 10 for i in range(5)])
    rows = pack_rows(trajs, {(b, 0): TurnTargets(1.0) for b in range(5)})
    merged = share_prefixes(rows, 69)  # 40 + 10 + 10 fits, a third branch would not
    assert [len(r.ids) for r in merged] == [60, 60, 50]
    assert sorted(k for r in merged for k, _, _ in r.turns) == [(b, 0) for b in range(5)]
    batch = collate(micro_batches(rows, 69, shared=True)[0], pad_id=0)
    assert batch.branch is not None and batch.response_mask.sum() == 20
    assert collate(rows, pad_id=0).branch is None  # plain rows: the ordinary path


def _grads(schedule: Any, data: Any, shared: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], int]:
    branched = 0
    real_collate = rowplan.collate

    def counting(rows: Any, pad_id: int) -> Any:
        nonlocal branched
        batch = real_collate(rows, pad_id)
        branched += batch.branch is not None
        return batch

    monkeypatch.setattr(rowplan, "collate", counting)
    probe = GradProbe()
    fit(make_module(schedule, micro_batch_tokens=1 << 20, share_prefixes=shared), data, callbacks=[probe])
    return probe.grads, branched


@pytest.mark.parametrize("schedule", ["grpo", "rtpo"])
def test_shared_prefixes_do_not_change_the_update(schedule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first optimizer step's gradient with shared-prefix rows equals the one with separate rows (GRPO: a
    group's episodes share their first prompt; RTPO: the siblings and the trunk's turn share the context)."""
    def make() -> tuple[Any, Any]:
        if schedule == "grpo":
            return GRPO(group_size=2, ppo=PPOSettings(epochs=1)), letter_data(batch_size=4, steps=1)
        # seed 1: its first depth's siblings differ in reward (seed 0's three tie under the one-uniform sampler,
        # so its first step has no gradient and nothing to compare)
        return RTPO(group_size=3, ppo=PPOSettings(epochs=1)), guess_data(batch_size=2, steps=1, seed=1)

    plain, none = _grads(*make(), False, monkeypatch)
    shared, branched = _grads(*make(), True, monkeypatch)
    assert none == 0 and branched > 0  # the shared run did forward shared-prefix rows
    assert plain and any(g.abs().max() > 0 for g in plain.values())
    assert plain.keys() == shared.keys()
    for name, g in plain.items():
        assert_close(shared[name], g, atol=1e-6, rtol=1e-4, msg=prefixed(name))
