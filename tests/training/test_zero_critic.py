"""Turn-PPO's ``zero_critic``: V ≡ 0, no critic built, scored or trained, advantages the batch-whitened return.

The credit test's frozen-critic arm (configs/learning/schedules/turn_ppo_v0.yaml) separates a learned baseline from
the batch one; it is only that if the values are exactly 0 at every step and nothing outside the policy is trained.
A real Lightning fit of the tiny random model on a three-turn task with a per-turn reward, three steps: a learned
critic's values are non-zero from the second step (the contrast run below shows the test can see them).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from agentrl.training import TurnPPO
from agentrl.training.schedules.base import Targets
from agentrl.training.schedules.learner import Learner
from agentrl.training.update.settings import PPOSettings
from agentrl.types import Trajectory

from .helpers import fit, letter_data, make_module


class RecordingTurnPPO(TurnPPO):
    """Keeps each step's targets with the turn rewards of the episodes they were computed from."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.log: list[tuple[list[list[float]], Targets]] = []

    def targets(self, learner: Learner, ok: list[Trajectory]) -> tuple[Targets, dict[str, float]]:
        targets, stats = super().targets(learner, ok)
        self.log.append(([t.turn_rewards() for t in ok], targets))
        return targets, stats


def run(zero_critic: bool) -> tuple[RecordingTurnPPO, Any, dict[str, torch.Tensor]]:
    schedule = RecordingTurnPPO(gamma=1.0, lam=1.0, group_size=2, zero_critic=zero_critic,
                                ppo=PPOSettings(epochs=1, minibatch_size=None, minibatches=2))
    module = make_module(schedule)
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    fit(module, letter_data(batch_size=4, steps=3))
    return schedule, module, before


def whitened_returns_to_go(rewards: list[list[float]]) -> dict[tuple[int, int], float]:
    """By hand: each turn's undiscounted return-to-go, less the batch's mean over turns, over its unbiased sd."""
    rtg = {(b, n): sum(r[n:]) for b, r in enumerate(rewards) for n in range(len(r))}
    mean = sum(rtg.values()) / len(rtg)
    sd = math.sqrt(sum((x - mean) ** 2 for x in rtg.values()) / (len(rtg) - 1))
    return {k: (x - mean) / sd for k, x in rtg.items()}


def test_a_zero_critic_has_values_zero_at_every_step_and_trains_nothing_but_the_policy() -> None:
    schedule, module, before = run(zero_critic=True)
    assert module.critic is None
    assert len(module.configure_optimizers()) == 1  # the policy's AdamW alone
    policy_names = {f"policy.{n}" for n, _ in module.policy.named_parameters()}
    assert set(before) == policy_names  # no parameter outside the policy exists to be trained
    assert any(not torch.equal(p, before[n]) for n, p in module.named_parameters()), "the policy never stepped"
    assert len(schedule.log) == 3
    for rewards, targets in schedule.log:
        assert targets and all(t.old_values == 0.0 for t in targets.values())
        expected = whitened_returns_to_go(rewards)
        assert set(targets) == set(expected)
        for key, t in targets.items():
            assert t.advantage == pytest.approx(expected[key], abs=1e-5)
            assert t.returns == pytest.approx(sum(rewards[key[0]][key[1]:]), abs=1e-6)
    assert module.last_metrics["train/value_mean"] == 0.0


def test_the_same_run_with_the_learned_critic_has_nonzero_values_after_its_first_update() -> None:
    schedule, module, before = run(zero_critic=False)
    assert module.critic is not None
    assert [all(t.old_values == 0.0 for t in targets.values()) for _, targets in schedule.log] == [
        True, False, False]  # the head starts at zero, then learns
    assert any(not torch.equal(p, before[n]) for n, p in module.critic.named_parameters(prefix="critic"))


def test_zero_critic_refuses_a_value_warm_up() -> None:
    with pytest.raises(ValueError, match="value_warmup_epochs must be 0 with zero_critic"):
        TurnPPO(zero_critic=True, value_warmup_epochs=8)
