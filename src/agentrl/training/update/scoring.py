"""`TurnScorer`: no-gradient scoring of named turns with the current weights, the `Learner`'s ``values`` (the
critic's, at each response token; the first is V(s_n)) and ``logprobs`` (the policy's, at the sampling
temperature). Turns go through the trainer's `RowPlan`, so they are packed and cut back out as the update does."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from agentrl.models.critic import TurnCritic
    from agentrl.models.policy import Policy
    from agentrl.runview import StepProgress
    from agentrl.training.update.batching import TurnKey
    from agentrl.training.update.rowplan import RowPlan
    from agentrl.types import Trajectory


class TurnScorer:
    """Scores turns with the policy and the critic (None: a schedule without one), in the ``scoring`` phase."""

    def __init__(self, policy: Policy, critic: TurnCritic | None, progress: StepProgress) -> None:
        self.policy, self.critic, self.progress = policy, critic, progress

    @property
    def pad_id(self) -> int:
        """The token rows are padded with: the tokenizer's pad token, else its end of sequence."""
        pad = self.policy.tokenizer.pad_token_id
        return int(pad if pad is not None else self.policy.tokenizer.eos_token_id)

    @torch.no_grad()
    def values(self, plan: RowPlan, trajectories: Sequence[Trajectory],
               keys: Iterable[TurnKey]) -> dict[TurnKey, list[float]]:
        critic = self.critic
        if critic is None:
            raise RuntimeError("this schedule has no critic")
        with self.progress.phase("scoring"):
            scored = plan.score(trajectories, keys, lambda b: critic(b.input_ids, b.attention_mask, b.branch))
        return {key: v.tolist() for key, v in scored.items()}

    @torch.no_grad()
    def logprobs(self, plan: RowPlan, trajectories: Sequence[Trajectory], keys: Iterable[TurnKey],
                 temperature: float) -> dict[TurnKey, list[float]]:
        with self.progress.phase("scoring"):
            scored = plan.score(trajectories, keys,
                                lambda b: self.policy.logprobs(b, temperature=temperature).logprobs)
        return {key: v.tolist() for key, v in scored.items()}
