"""`TokenPPO`: classic token-level PPO baseline: one sequence per episode, a value per response token, token GAE
with observation tokens masked (as verl).

Chosen with ``class_path: agentrl.training.TokenPPO`` in the config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from agentrl.algorithms.advantages import token_gae
from agentrl.algorithms.losses import Aggregator, explained_variance, token_mean
from agentrl.training.schedules.base import CriticSchedule, Targets
from agentrl.training.schedules.learner import Learner
from agentrl.training.update.batching import TurnTargets, keys_of
from agentrl.training.update.settings import PPOSettings
from agentrl.types import Trajectory

if TYPE_CHECKING:
    pass

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
        value_warmup_steps: As Turn-PPO's: the run's first steps train the critic only (value pretraining).
    """

    def __init__(self, gamma: float = 1.0, lam: float = 1.0, group_size: int = 1, whiten_advantages: bool = True,
                 ppo: PPOSettings | None = None, value_warmup_epochs: int = 0,
                 whiten_equal_returns: bool = True, value_warmup_steps: int = 0) -> None:
        super().__init__(gamma, lam, group_size, whiten_advantages, ppo, value_warmup_epochs, whiten_equal_returns,
                         value_warmup_steps)

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
