"""`TurnPPO`: Turn-PPO (arXiv 2512.17008): a learned turn critic V(s_n), GAE over turns, the turn's advantage
broadcast to its tokens, PPO's clipped objective.

Chosen with ``class_path: agentrl.training.TurnPPO`` in the config (docs/algorithms/turn_ppo.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from agentrl.algorithms.advantages import turn_gae
from agentrl.algorithms.losses import explained_variance
from agentrl.training.schedules.base import CriticSchedule, Targets
from agentrl.training.schedules.learner import Learner
from agentrl.training.update.batching import TurnTargets, keys_of
from agentrl.training.update.settings import PPOSettings
from agentrl.types import Trajectory

if TYPE_CHECKING:
    pass

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
        value_warmup_steps: The run's first steps train the critic only, each on its own fresh batch of the
            unchanged policy (``value_warmup_epochs`` epochs each, at least one; 0: none): value pretraining, so
            the first policy update bootstraps on a critic fitted on many batches. These steps count as steps and
            their tokens against ``data.max_generated_tokens``.
        critic_lam: λ of the critic's targets (None: ``lam``, the usual coupled GAE). Decoupled GAE (VC-PPO,
            arXiv 2503.01491; VAPO): with ``critic_lam: 1.0`` the critic regresses on the Monte Carlo return-to-go
            while the policy's advantages keep ``lam``. With λ < 1 for both, a critic that starts at V = 0 fits
            targets that are mostly its own values (the first of five turns sees λ^4 of a terminal reward), and
            learns the return slowly (docs/algorithms/turn_ppo.md, "Choosing γ and λ").
        whiten_equal_returns: Whiten a batch whose episodes all have the same return too (true, the usual PPO
            rule); false leaves its advantages R − V unscaled (the critic's error: small), where whitening makes
            them unit-sized noise (docs/algorithms/update.md, "Batches with one return").
        zero_critic: Replace the learned critic by V ≡ 0: no critic is built, scored or trained (no value loss,
            no critic optimizer), so each turn's advantage is its (γλ-discounted) return-to-go, whitened over the
            batch: the batch baseline alone, the ablation that separates a learned baseline from a batch one
            (docs/algorithms/turn_ppo.md, "A zero critic"). Meant with λ = 1: with λ < 1 and V = 0 the advantage
            discards most of the return. Needs ``value_warmup_epochs: 0`` and ``value_warmup_steps: 0``.
    """

    def __init__(self, gamma: float = 1.0, lam: float = 1.0, group_size: int = 1, whiten_advantages: bool = True,
                 ppo: PPOSettings | None = None, value_warmup_epochs: int = 0,
                 whiten_equal_returns: bool = True, zero_critic: bool = False, value_warmup_steps: int = 0,
                 critic_lam: float | None = None) -> None:
        for key, value in (("value_warmup_epochs", value_warmup_epochs), ("value_warmup_steps", value_warmup_steps)):
            if zero_critic and value:
                raise ValueError(f"algorithm.{key} must be 0 with zero_critic: true (no critic to warm up), "
                                 f"got {value}")
        super().__init__(gamma, lam, group_size, whiten_advantages, ppo, value_warmup_epochs, whiten_equal_returns,
                         value_warmup_steps)
        if critic_lam is not None and not 0.0 <= critic_lam <= 1.0:
            raise ValueError(f"algorithm.critic_lam must be in [0, 1] or null (the policy's lam), got {critic_lam}")
        self.zero_critic = zero_critic
        self.needs_critic = not zero_critic
        self.critic_lam = critic_lam

    def critic_targets(self, learner: Learner, ok: list[Trajectory]) -> tuple[Targets, dict[str, float]]:
        """Advantages and returns from the critic's values *before* any policy update of this step."""
        values = learner.values(ok, keys_of(ok)) if self.needs_critic else {k: [0.0] for k in keys_of(ok)}
        B, T = len(ok), max(t.num_turns for t in ok)
        rewards, v, mask = torch.zeros(B, T), torch.zeros(B, T), torch.zeros(B, T, dtype=torch.bool)
        for b, traj in enumerate(ok):
            for n, r in enumerate(traj.turn_rewards()):
                rewards[b, n], v[b, n], mask[b, n] = r, values[(b, n)][0], True
        adv, ret = turn_gae(rewards, v, mask, gamma=self.gamma, lam=self.lam)
        if self.critic_lam is not None and self.critic_lam != self.lam:  # decoupled GAE: the critic's own λ
            ret = turn_gae(rewards, v, mask, gamma=self.gamma, lam=self.critic_lam).returns
        adv, scaled = self._scale(learner, ok, adv, mask)
        targets = {(b, n): TurnTargets(float(adv[b, n]), float(ret[b, n]), float(v[b, n]))
                   for b, traj in enumerate(ok) for n in range(traj.num_turns)}
        return targets, {"train/explained_variance": float(explained_variance(v, ret, mask)),
                         "train/value_mean": float(v[mask].mean())} | scaled
