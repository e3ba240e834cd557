"""Training invariants with real Lightning trainers and a tiny random model."""

from __future__ import annotations

from typing import Any, ClassVar

import lightning.pytorch as pl
import pytest
import torch
from torch.testing import assert_close

from agentrl.models.critic import TurnCritic
from agentrl.training.rollout.datamodule import RolloutDataModule
from agentrl.training.schedules.grpo import GRPO
from agentrl.training.schedules.turn_ppo import TurnPPO
from agentrl.training.system.module import AgentRLModule
from agentrl.training.update.settings import PPOSettings
from tests.training.helpers import GradProbe, fit, guess_data, letter_data, make_module, prefixed


def _grads(schedule: str, budget: int, pack: bool = False) -> dict[str, torch.Tensor]:
    algo = GRPO(group_size=2, ppo=PPOSettings(epochs=1)) if schedule == "grpo" else TurnPPO(ppo=PPOSettings(epochs=1))
    probe = GradProbe()
    module = make_module(algo, micro_batch_tokens=budget, pack_turns=pack)
    fit(module, letter_data(batch_size=8, steps=1), callbacks=[probe])
    return probe.grads


@pytest.mark.parametrize("schedule", ["grpo", "turn_ppo"])
def test_micro_batch_accumulation_equals_one_minibatch(schedule: str) -> None:
    """The gradient of one update over a minibatch of 8 rows equals the gradient accumulated over micro-batches
    of about 4 rows and of 1 row (the micro-batch budget is a memory knob, not a hyper-parameter). Gradients are
    compared, not parameters after Adam, whose first step divides by |g| and so magnifies rounding noise."""
    whole = _grads(schedule, 1 << 20)
    assert whole and any(g.abs().max() > 0 for n, g in whole.items() if n.startswith("policy."))
    if schedule == "turn_ppo":
        assert any(n.startswith("critic.") and g.abs().max() > 0 for n, g in whole.items())
    for budget in (1200, 1):
        split = _grads(schedule, budget)
        assert split.keys() == whole.keys()
        for name, g in whole.items():
            assert_close(split[name], g, atol=1e-7, rtol=1e-4, msg=prefixed(name))


def test_packing_does_not_change_the_update() -> None:
    packed, single = _grads("turn_ppo", 1 << 20, pack=True), _grads("turn_ppo", 1 << 20, pack=False)
    for name, g in packed.items():
        assert_close(single[name], g, atol=1e-6, rtol=1e-4, msg=prefixed(name))


class PreUpdateCheck:
    """A `Learner` that forwards to the real module and, at each ``update``, checks that the targets it is handed
    hold the critic's values from *before* that update: after the update it scores the same turns with a copy of
    the pre-update critic (must equal the targets' ``old_values``) and with the updated critic (must differ)."""

    def __init__(self, module: AgentRLModule) -> None:
        self.module = module
        self.checked = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)

    def update(self, trajectories: Any, targets: dict[Any, Any], ppo: Any, *, tag: str = "") -> dict[str, float]:
        m = self.module
        assert m.critic is not None
        frozen = TurnCritic(m.policy)
        frozen.load_state_dict(m.critic.state_dict())
        metrics = m.update(trajectories, targets, ppo, tag=tag)
        keys = list(targets)
        assert keys
        after = m.values(trajectories, keys)
        live, m.scorer.critic = m.scorer.critic, frozen  # the module scores turns through its TurnScorer
        before = m.values(trajectories, keys)
        m.scorer.critic = live
        assert all(abs(before[k][0] - targets[k].old_values) < 1e-6 for k in keys)
        assert any(abs(after[k][0] - targets[k].old_values) > 1e-6 for k in keys)
        self.checked += 1
        return metrics


class CheckedTurnPPO(TurnPPO):
    """The real Turn-PPO step, run against `PreUpdateCheck` instead of the module itself."""

    learners: ClassVar[list[PreUpdateCheck]] = []

    def step(self, learner: Any, tasks: list[Any]) -> dict[str, float]:
        spy = PreUpdateCheck(learner)
        CheckedTurnPPO.learners.append(spy)
        return super().step(spy, tasks)


def test_advantages_use_values_from_before_the_update() -> None:
    CheckedTurnPPO.learners = []
    module = make_module(CheckedTurnPPO(ppo=PPOSettings(epochs=2)), optim=None)
    fit(module, letter_data(steps=2))
    assert [spy.checked for spy in CheckedTurnPPO.learners] == [1, 1]


class VersionProbe(pl.Callback):
    """Records, per step, the policy version at the start and the versions stamped on its rollouts."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, set[int], int]] = []

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.start = pl_module.policy_version
        self.stream_ahead = trainer.datamodule._stream.step  # type: ignore[attr-defined]

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        versions = {t.policy_version for tr in pl_module.last_trajectories for t in tr.turns}
        self.seen.append((self.start, versions, self.stream_ahead - batch_idx))


class UnsizedData(RolloutDataModule):
    """Hands Lightning a stream without a length, which makes it prefetch one batch ahead."""

    def train_dataloader(self) -> Any:
        stream = super().train_dataloader()
        return (tasks for tasks in stream)


@pytest.mark.parametrize("sized", [True, False])
def test_rollouts_never_use_stale_weights_despite_prefetch(sized: bool) -> None:
    probe = VersionProbe()
    module = make_module(GRPO(group_size=2))
    base = guess_data(steps=3)
    data = base if sized else UnsizedData(base.agent, batch_size=4, steps=3, sampling=base.sampling)
    fit(module, data, callbacks=[probe])
    assert [s[0] for s in probe.seen] == [0, 1, 2]
    assert [s[1] for s in probe.seen] == [{0}, {1}, {2}]
    if not sized:  # the next list of tasks was fetched before the step ran, yet its rollouts used fresh weights
        assert all(ahead == 2 for _, _, ahead in probe.seen[:-1])


def test_batch_smaller_than_a_group_stops_before_work() -> None:
    module = make_module(GRPO(group_size=4))
    with pytest.raises(ValueError, match=r"data.batch_size=2 is smaller than one group"):
        fit(module, guess_data(batch_size=2))
    with pytest.raises(ValueError, match="must be a multiple"):
        fit(make_module(GRPO(group_size=4)), guess_data(batch_size=6))


def test_non_finite_updates_are_skipped_then_stop() -> None:
    from agentrl.training.system.module import NonFiniteUpdateError
    from agentrl.training.update.settings import OptimSettings

    module = make_module(TurnPPO(), optim=OptimSettings(max_bad_updates=2))
    with torch.no_grad():  # a broken critic: NaN values, NaN advantages, NaN losses; rollouts are unaffected
        module.critic.head.weight.fill_(float("nan"))  # type: ignore[union-attr]
    with pytest.raises(NonFiniteUpdateError, match="2 non-finite updates in a row"):
        fit(module, guess_data(steps=3))
