"""`GRPO`: trajectory-level baseline: n samples per task, the group-normalised episode return on every turn.

Chosen with ``class_path: agentrl.training.GRPO`` in the config (docs/algorithms/grpo.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from agentrl.algorithms.advantages import grpo_advantages
from agentrl.training.schedules.base import GroupSchedule, Targets
from agentrl.training.schedules.learner import Learner
from agentrl.training.update.batching import TurnTargets
from agentrl.training.update.settings import PPOSettings
from agentrl.types import Trajectory

if TYPE_CHECKING:
    pass

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
