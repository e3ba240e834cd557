"""The schedules' common ground: the `Schedule` base, group sampling, the critic schedules' shared steps.

A schedule decides what to collect each step, which turns to train and with which targets; it talks to the trainer
only through the `Learner` protocol (`agentrl.training.schedules.learner`). The concrete schedules each have their
own file and read top to bottom: `grpo`, `turn_ppo`, `token_ppo`, `rtpo`. `CriticSchedule` holds what Turn-PPO and
token-level PPO share (a critic, γ and λ, whitening, taking part in the collectives on a rank without episodes).
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from agentrl.agents.base import Task
from agentrl.algorithms.advantages import masked_moments, whiten
from agentrl.algorithms.losses import Aggregator, turn_mean
from agentrl.training.schedules.learner import Learner
from agentrl.training.update.batching import TurnKey, TurnTargets
from agentrl.training.update.settings import PPOSettings
from agentrl.types import Trajectory

if TYPE_CHECKING:
    from agentrl.collect.collector import Collector

def rollout_metrics(trajs: Sequence[Trajectory], prefix: str = "rollout") -> dict[str, float]:
    """``rollout/{reward,success,turns,tokens_per_turn,...}`` over the non-failed trajectories."""
    ok = [t for t in trajs if not t.failed]
    if not ok:
        return {f"{prefix}/episodes": float(len(trajs)), f"{prefix}/ok_episodes": 0.0}
    sampled = [turn for t in ok for turn in t.turns if not turn.forced]
    return {
        f"{prefix}/reward": sum(t.total_reward for t in ok) / len(ok),
        f"{prefix}/success": sum(t.success for t in ok) / len(ok),
        f"{prefix}/turns": sum(t.num_turns for t in ok) / len(ok),
        f"{prefix}/tokens_per_turn": sum(len(t.response_ids) for t in sampled) / max(len(sampled), 1),
        f"{prefix}/truncated": sum(t.truncated for t in ok) / len(ok),
        f"{prefix}/length_finish": sum(t.finish_reason == "length" for t in sampled) / max(len(sampled), 1),
        f"{prefix}/episodes": float(len(trajs)),
        f"{prefix}/ok_episodes": float(len(ok)),
        f"{prefix}/sampled_turns": float(len(sampled)),
    }


class Schedule:
    """Base of the schedules. ``episodes_per_task`` sizes the batch; ``needs_critic`` builds a `TurnCritic`;
    ``default_aggregate`` is the aggregation used when ``ppo.aggregate`` is left null."""

    needs_critic: bool = False

    def __init__(self, ppo: PPOSettings | None = None) -> None:
        self.ppo = (ppo or PPOSettings()).with_default_aggregate(self.default_aggregate())

    def default_aggregate(self) -> Aggregator:
        """The aggregation used when ``ppo.aggregate`` is null."""
        return turn_mean

    @property
    def episodes_per_task(self) -> int:
        return 1

    @property
    def needs_reference(self) -> bool:
        return self.ppo.kl_coef > 0

    def step(self, learner: Learner, tasks: list[Task]) -> dict[str, float]:
        raise NotImplementedError


Targets = dict[TurnKey, TurnTargets]


class GroupSchedule(Schedule):
    """One collection of ``group_size`` episodes per task, one PPO update on every turn, one weight push.

    Subclasses say how turns are scored: `targets` returns the per-turn training targets and extra metrics.
    """

    def __init__(self, group_size: int, ppo: PPOSettings | None = None) -> None:
        super().__init__(ppo)
        if group_size < 1:
            raise ValueError(f"algorithm.group_size must be >= 1, got {group_size}")
        self.group_size = group_size

    @property
    def episodes_per_task(self) -> int:
        return self.group_size

    def targets(self, learner: Learner, ok: list[Trajectory]) -> tuple[Targets, dict[str, float]]:
        raise NotImplementedError

    def batch(self, collector: Collector, tasks: list[Task], step: int) -> Coroutine[Any, Any, list[Trajectory]]:
        """The step's whole batch: ``group_size`` episodes of each task (launched ahead with max_staleness >= 1)."""
        return collector.collect_groups(tasks, self.group_size, step=step)

    def collect(self, learner: Learner, tasks: list[Task]) -> tuple[list[Trajectory], dict[str, float]]:
        """The step's batch: its trainable episodes (not failed, with a reply) and its ``rollout/*`` metrics."""
        trajs = learner.collect_batch(tasks, self.batch)
        ok = [t for t in trajs if not t.failed and any(turn.response_ids for turn in t.turns)]
        return ok, rollout_metrics(trajs)

    def step(self, learner: Learner, tasks: list[Task]) -> dict[str, float]:
        ok, metrics = self.collect(learner, tasks)
        targets, stats = self.targets(learner, ok)  # on every rank, with or without episodes (collectives)
        metrics.update(stats)
        metrics.update(learner.update(ok, targets, self.ppo))  # every rank takes part, with or without data
        learner.push_weights()
        return metrics


def _whiten(learner: Learner, adv: torch.Tensor, mask: torch.Tensor, enabled: bool) -> torch.Tensor:
    """Whiten ``adv`` with the mean and variance over *every rank's* masked entries (their moments are summed
    across ranks), so each rank normalises exactly as one process over the whole batch would. Collective when
    ``enabled``: every rank calls it, with or without entries."""
    if not enabled:
        return adv
    moments = learner.all_sum(masked_moments(adv, mask))
    return whiten(adv, mask, moments=moments) if float(moments[2]) > 1 else adv


def _returns_vary(learner: Learner, ok: list[Trajectory]) -> bool:
    """Whether the episodes' returns (sum of rewards) differ anywhere in the batch, over *every rank's* episodes
    (their moments are summed across ranks): every rank calls it, with or without episodes, and all agree."""
    returns = torch.tensor([t.total_reward for t in ok], dtype=torch.float64)
    total, total_sq, n = learner.all_sum(masked_moments(returns)).tolist()
    return n > 1 and total_sq - total * total / n > 1e-12 * max(total_sq, 1.0)


def _check_discount(gamma: float, lam: float) -> None:
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"algorithm.gamma and algorithm.lam must be in [0, 1], got {gamma}, {lam}")


class CriticSchedule(GroupSchedule):
    """What Turn-PPO and token-level PPO share: a critic, a discount and λ, optional whitening, and taking part in
    the collectives (scoring, whitening) on a rank without episodes."""

    needs_critic = True

    def __init__(self, gamma: float, lam: float, group_size: int, whiten_advantages: bool,
                 ppo: PPOSettings | None, value_warmup_epochs: int = 0, whiten_equal_returns: bool = True,
                 value_warmup_steps: int = 0) -> None:
        _check_discount(gamma, lam)
        if value_warmup_epochs < 0:
            raise ValueError(f"algorithm.value_warmup_epochs must be >= 0, got {value_warmup_epochs}")
        if value_warmup_steps < 0:
            raise ValueError(f"algorithm.value_warmup_steps must be >= 0, got {value_warmup_steps}")
        super().__init__(group_size, ppo)
        self.gamma, self.lam = gamma, lam
        self.whiten_advantages = whiten_advantages
        self.whiten_equal_returns = whiten_equal_returns
        self.value_warmup_epochs = value_warmup_epochs
        self.value_warmup_steps = value_warmup_steps

    def step(self, learner: Learner, tasks: list[Task]) -> dict[str, float]:
        """A normal step, or, for the run's first ``value_warmup_steps`` steps, a critic-only step: the batch is
        collected as usual (from the unchanged policy; its tokens count against the budget), the critic fits its
        returns-to-go for ``value_warmup_epochs`` epochs (at least one), and the policy does not move (its
        optimizer takes no step: ``train/critic_only`` 1). Value pretraining: the first policy update then reads
        advantages from a critic fitted on many batches of the starting policy, not one."""
        if learner.rl_step >= self.value_warmup_steps:
            return super().step(learner, tasks)
        ok, metrics = self.collect(learner, tasks)
        metrics |= self._warm_up_values(learner, ok, max(self.value_warmup_epochs, 1))  # every rank takes part
        metrics["train/critic_only"] = 1.0
        learner.push_weights()  # the same weights; the engine's copy may have been freed for the update
        return metrics

    def _scale(self, learner: Learner, ok: list[Trajectory], adv: torch.Tensor,
               mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Whiten the advantages (`whiten_advantages`), except, with ``whiten_equal_returns: false``, in a batch
        whose episodes all have the same return: there R − V is the critic's error alone, and whitening scales it
        to unit variance around zero (half the batch's replies, all of them equally good, pushed down). Collective:
        every rank calls it, with or without episodes."""
        if not self.whiten_advantages or self.whiten_equal_returns:
            return _whiten(learner, adv, mask, self.whiten_advantages), {}
        if _returns_vary(learner, ok):
            return _whiten(learner, adv, mask, True), {"train/whitened": 1.0}
        return adv, {"train/whitened": 0.0}

    def targets(self, learner: Learner, ok: list[Trajectory]) -> tuple[Targets, dict[str, float]]:
        first = learner.rl_step == 0 and self.value_warmup_epochs and not self.value_warmup_steps
        stats = self._warm_up_values(learner, ok, self.value_warmup_epochs) if first else {}
        if not ok:
            targets, more = self._no_episodes(learner)
        else:
            targets, more = self.critic_targets(learner, ok)
        return targets, stats | more

    def critic_targets(self, learner: Learner, ok: list[Trajectory]) -> tuple[Targets, dict[str, float]]:
        raise NotImplementedError

    def _warm_up_values(self, learner: Learner, ok: list[Trajectory], epochs: int) -> dict[str, float]:
        """``epochs`` critic-only epochs on the batch's discounted returns-to-go (zero advantages: the policy's
        optimizer takes no step): before the run's first policy update (``value_warmup_epochs`` on the first batch),
        or as a critic-only step (``value_warmup_steps``), so the first advantages come from a critic that has
        seen returns rather than from the neutral start. Every rank takes part."""
        targets: Targets = {}
        for b, traj in enumerate(ok):
            ret = 0.0
            for turn, r in reversed(list(zip(traj.turns, traj.turn_rewards(), strict=True))):
                ret = r + self.gamma * ret
                n = len(turn.response_ids)
                targets[(b, turn.index)] = self._warmup_target(ret, n)
        ppo = replace(self.ppo, epochs=epochs, value_clip=None, entropy_coef=0.0, kl_coef=0.0,
                      target_kl=None)
        out = learner.update(ok, targets, ppo, tag="value-warmup")
        return {"train/value_warmup_loss": out.get("train/value_loss", float("nan"))}

    def _warmup_target(self, ret: float, n_tokens: int) -> TurnTargets:
        return TurnTargets(0.0, ret, 0.0)

    def _no_episodes(self, learner: Learner) -> tuple[Targets, dict[str, float]]:
        """No episodes on this rank: still take part in what is collective (scoring under sharded weights, and
        whitening)."""
        if self.needs_critic:  # (Turn-PPO's zero_critic builds none: no rank scores)
            learner.values([], [])
        self._scale(learner, [], torch.zeros(0, 0), torch.zeros(0, 0, dtype=torch.bool))
        return {}, {}
