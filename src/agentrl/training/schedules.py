"""Algorithm schedules: what to collect each step, which turns to train, with which advantages.

Chosen with ``class_path`` in the config (CONVENTIONS rule 4). Each is short and reads top to bottom:

* `GRPO` — trajectory-level baseline: n samples per task, group-normalised episode return broadcast to every turn.
* `TurnPPO` — Turn-PPO (arXiv 2512.17008): learned turn critic V(s_n), GAE over turns, the turn's advantage
  broadcast to its tokens, PPO clipped objective.
* `TokenPPO` — classic token-level PPO baseline: one sequence per episode, a value per response token, token GAE
  with observation tokens masked (as verl).
* `RTPO` lives in `agentrl.training.rtpo` (reverse-turn updates over sparse trees).

Schedules talk to the trainer only through the `Learner` protocol (``agentrl.training.learner``):
``collect_batch``, ``collect``, ``values``, ``logprobs``, ``update``, ``push_weights``, ``sync_max``, ``rl_step``,
``policy_version``.
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from agentrl.agents.base import Task
from agentrl.algorithms.advantages import grpo_advantages, masked_moments, token_gae, turn_gae, whiten
from agentrl.algorithms.losses import Aggregator, explained_variance, token_mean, turn_mean
from agentrl.training.batching import TurnKey, TurnTargets, keys_of
from agentrl.training.learner import Learner
from agentrl.training.settings import PPOSettings
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

    def step(self, learner: Learner, tasks: list[Task]) -> dict[str, float]:
        trajs = learner.collect_batch(tasks, self.batch)
        ok = [t for t in trajs if not t.failed and any(turn.response_ids for turn in t.turns)]
        metrics = rollout_metrics(trajs)
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


class GRPO(GroupSchedule):
    """Trajectory-level GRPO: ``A = (R − mean_group R) / (std_group R + eps)`` on every turn of the episode.

    Weighting (docs/algorithms/grpo.md): by default every *trajectory* weighs the same — the loss is a mean over
    a trajectory's turns (or tokens, with token aggregation) first, then over trajectories — so a 4-turn
    failure does not outweigh a 1-turn success of its group four to one. ``trajectory_weighting: false`` keeps
    the flat mean over all turns (or tokens) of the batch.

    Args:
        group_size: Episodes per task (the group).
        eps: Added to the group standard deviation.
        trajectory_weighting: Mean within each trajectory first, then over trajectories.
        ppo: Clipped-update settings.
    """

    def __init__(self, group_size: int = 8, eps: float = 1e-6, trajectory_weighting: bool = True,
                 ppo: PPOSettings | None = None) -> None:
        if group_size < 2:
            raise ValueError("algorithm.group_size must be >= 2 for GRPO (a group of one has no baseline)")
        super().__init__(group_size, ppo)
        self.eps = eps
        self.trajectory_weighting = trajectory_weighting

    def targets(self, learner: Learner, ok: list[Trajectory]) -> tuple[Targets, dict[str, float]]:
        if not ok:
            return {}, {}
        returns = torch.tensor([t.total_reward for t in ok], dtype=torch.float64)
        adv = grpo_advantages(returns, torch.tensor([t.group for t in ok]), eps=self.eps)
        targets = {(b, turn.index): TurnTargets(float(adv[b]), unit=self._unit(t))
                   for b, t in enumerate(ok) for turn in t.turns}
        return targets, {"train/zero_advantage_frac": float((adv == 0).double().mean())}

    def _unit(self, traj: Trajectory) -> float:
        """Each turn's share of its trajectory (1 without trajectory weighting)."""
        if not self.trajectory_weighting:
            return 1.0
        if self.ppo.units == "turn":
            return 1.0 / max(sum(1 for t in traj.turns if t.response_ids), 1)
        return 1.0 / max(sum(len(t.response_ids) for t in traj.turns), 1)


class CriticSchedule(GroupSchedule):
    """What Turn-PPO and token-level PPO share: a critic, a discount and λ, optional whitening, and taking part in
    the collectives (scoring, whitening) on a rank without episodes."""

    needs_critic = True

    def __init__(self, gamma: float, lam: float, group_size: int, whiten_advantages: bool,
                 ppo: PPOSettings | None, value_warmup_epochs: int = 0, whiten_equal_returns: bool = True) -> None:
        _check_discount(gamma, lam)
        if value_warmup_epochs < 0:
            raise ValueError(f"algorithm.value_warmup_epochs must be >= 0, got {value_warmup_epochs}")
        super().__init__(group_size, ppo)
        self.gamma, self.lam = gamma, lam
        self.whiten_advantages = whiten_advantages
        self.whiten_equal_returns = whiten_equal_returns
        self.value_warmup_epochs = value_warmup_epochs

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
        stats = self._warm_up_values(learner, ok) if learner.rl_step == 0 and self.value_warmup_epochs else {}
        if not ok:
            targets, more = self._no_episodes(learner)
        else:
            targets, more = self.critic_targets(learner, ok)
        return targets, stats | more

    def critic_targets(self, learner: Learner, ok: list[Trajectory]) -> tuple[Targets, dict[str, float]]:
        raise NotImplementedError

    def _warm_up_values(self, learner: Learner, ok: list[Trajectory]) -> dict[str, float]:
        """Before the run's first policy update: ``value_warmup_epochs`` critic-only epochs on the first batch's
        discounted returns-to-go (zero advantages: the policy's optimizer takes no step), so the first advantages
        come from a critic that has seen returns rather than from the neutral start. Every rank takes part."""
        targets: Targets = {}
        for b, traj in enumerate(ok):
            ret = 0.0
            for turn, r in reversed(list(zip(traj.turns, traj.turn_rewards(), strict=True))):
                ret = r + self.gamma * ret
                n = len(turn.response_ids)
                targets[(b, turn.index)] = self._warmup_target(ret, n)
        ppo = replace(self.ppo, epochs=self.value_warmup_epochs, value_clip=None, entropy_coef=0.0, kl_coef=0.0,
                      target_kl=None)
        out = learner.update(ok, targets, ppo, tag="value-warmup")
        return {"train/value_warmup_loss": out.get("train/value_loss", float("nan"))}

    def _warmup_target(self, ret: float, n_tokens: int) -> TurnTargets:
        return TurnTargets(0.0, ret, 0.0)

    def _no_episodes(self, learner: Learner) -> tuple[Targets, dict[str, float]]:
        """No episodes on this rank: still take part in what is collective (scoring under sharded weights, and
        whitening)."""
        learner.values([], [])
        self._scale(learner, [], torch.zeros(0, 0), torch.zeros(0, 0, dtype=torch.bool))
        return {}, {}


class TurnPPO(CriticSchedule):
    """Turn-PPO: turn critic V(s_n) read at the last prompt token, GAE over turns, PPO on the turns' tokens.

    Args:
        gamma: Turn discount γ (1.0; the paper's best was 0.99).
        lam: Turn GAE λ (1.0; the paper's best was 0.9, on tasks of at most five turns). With a critic that does not
            yet know a decision's value, λ < 1 passes only (γλ)^D of the reward back to a decision D turns before
            it; on CreditChain γ = λ = 1 was ahead at D = 8 and no worse at D = 4, M = 3 or with noisy later
            rewards (docs/algorithms/turn_ppo.md, "Choosing γ and λ").
        group_size: Episodes per task (1: Turn-PPO prefers more distinct tasks to more samples per task).
        whiten_advantages: Normalise advantages over the batch's turns.
        ppo: Clipped-update settings.
        value_warmup_epochs: Critic-only epochs on the first batch's returns before the run's first policy update
            (0: none); the critic starts neutral (V = 0), so this is what makes the first advantages informed.
        whiten_equal_returns: Whiten a batch whose episodes all have the same return too (true, the usual PPO
            rule); false leaves its advantages R − V unscaled (the critic's error: small), where whitening makes
            them unit-sized noise (docs/algorithms/update.md, "Batches with one return").
    """

    def __init__(self, gamma: float = 1.0, lam: float = 1.0, group_size: int = 1, whiten_advantages: bool = True,
                 ppo: PPOSettings | None = None, value_warmup_epochs: int = 0,
                 whiten_equal_returns: bool = True) -> None:
        super().__init__(gamma, lam, group_size, whiten_advantages, ppo, value_warmup_epochs, whiten_equal_returns)

    def critic_targets(self, learner: Learner, ok: list[Trajectory]) -> tuple[Targets, dict[str, float]]:
        """Advantages and returns from the critic's values *before* any policy update of this step."""
        values = learner.values(ok, keys_of(ok))
        B, T = len(ok), max(t.num_turns for t in ok)
        rewards, v, mask = torch.zeros(B, T), torch.zeros(B, T), torch.zeros(B, T, dtype=torch.bool)
        for b, traj in enumerate(ok):
            for n, r in enumerate(traj.turn_rewards()):
                rewards[b, n], v[b, n], mask[b, n] = r, values[(b, n)][0], True
        adv, ret = turn_gae(rewards, v, mask, gamma=self.gamma, lam=self.lam)
        adv, scaled = self._scale(learner, ok, adv, mask)
        targets = {(b, n): TurnTargets(float(adv[b, n]), float(ret[b, n]), float(v[b, n]))
                   for b, traj in enumerate(ok) for n in range(traj.num_turns)}
        return targets, {"train/explained_variance": float(explained_variance(v, ret, mask)),
                         "train/value_mean": float(v[mask].mean())} | scaled


class TokenPPO(CriticSchedule):
    """Token-level PPO: a value per response token, GAE over the episode's response tokens (observation tokens
    masked), one packed sequence per episode.

    Args:
        gamma: Token discount (the Turn-PPO paper: token PPO needs γ = 1).
        lam: Token GAE λ (likewise 1).
        group_size: Episodes per task.
        whiten_advantages: Normalise advantages over the batch's tokens.
        ppo: Clipped-update settings (default aggregation: global token mean).
        value_warmup_epochs: Critic-only epochs on the first batch's returns before the first policy update.
        whiten_equal_returns: As Turn-PPO's: false leaves a batch with one return for all its episodes unscaled.
    """

    def __init__(self, gamma: float = 1.0, lam: float = 1.0, group_size: int = 1, whiten_advantages: bool = True,
                 ppo: PPOSettings | None = None, value_warmup_epochs: int = 0,
                 whiten_equal_returns: bool = True) -> None:
        super().__init__(gamma, lam, group_size, whiten_advantages, ppo, value_warmup_epochs, whiten_equal_returns)

    def _warmup_target(self, ret: float, n_tokens: int) -> TurnTargets:
        # a value per response token: the turn's return-to-go at each (the reward comes at the turn's last token)
        return TurnTargets([0.0] * n_tokens, [ret] * n_tokens, [0.0] * n_tokens, per_token_values=True)

    def default_aggregate(self) -> Aggregator:
        return token_mean

    def critic_targets(self, learner: Learner, ok: list[Trajectory]) -> tuple[Targets, dict[str, float]]:
        values = learner.values(ok, keys_of(ok))
        # each episode's response tokens in order: observation tokens are simply absent (masked)
        lengths = [sum(len(t.response_ids) for t in traj.turns) for traj in ok]
        B, L = len(ok), max(lengths)
        rewards, v, mask = torch.zeros(B, L), torch.zeros(B, L), torch.zeros(B, L, dtype=torch.bool)
        for b, traj in enumerate(ok):
            pos = 0
            for turn, r in zip(traj.turns, traj.turn_rewards(), strict=True):
                n = len(turn.response_ids)
                v[b, pos : pos + n] = torch.tensor(values[(b, turn.index)])
                mask[b, pos : pos + n] = True
                if n:
                    rewards[b, pos + n - 1] = r
                pos += n
        adv, ret = token_gae(rewards, v, mask, gamma=self.gamma, lam=self.lam)
        adv, scaled = self._scale(learner, ok, adv, mask)
        targets = {}
        for b, traj in enumerate(ok):
            pos = 0
            for turn in traj.turns:
                s = slice(pos, pos + len(turn.response_ids))
                targets[(b, turn.index)] = TurnTargets(adv[b, s].tolist(), ret[b, s].tolist(), v[b, s].tolist(),
                                                       per_token_values=True)
                pos = s.stop
        return targets, {"train/explained_variance": float(explained_variance(v, ret, mask)),
                         "train/value_mean": float(v[mask].mean())} | scaled
