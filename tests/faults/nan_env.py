"""Environments for the reward-fault tests (named by ``class_path`` in ``agentrl fit`` configs)."""

from __future__ import annotations

from typing import Any

from agentrl.envs import GuessNumberEnv
from agentrl.envs.base import StepResult


class NaNRewardEnv(GuessNumberEnv):
    """`GuessNumberEnv` whose every step rewards NaN on seeds divisible by ``every`` (a quarter by default), and
    ``bad`` (NaN, inf or a string) in place of it when given."""

    def __init__(self, *, every: int = 4, bad: Any = float("nan"), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.every, self.bad = every, bad
        self._seed = 0

    def reset(self, seed: int) -> str:
        self._seed = seed
        return super().reset(seed)

    def step(self, action: str) -> StepResult:
        result = super().step(action)
        if self._seed % self.every == 0:
            result.reward = self.bad
        return result
