"""What one training step did with each turn: the record the trajectory logger puts into the traces.

A schedule turns episodes into per-turn training targets (`agentrl.training.update.batching.TurnTargets`, keyed by the
turn's place in the list handed to the update); the update folds identical turns and attaches π_old and the
behaviour-correction weights. `StepRecord` keeps, for the last RL step, every episode collected (RTPO: the trunks
and every depth's siblings, in collection order) and, for each turn an update saw, a small `TurnCredit` —
floats, ints and bools only — keyed by the episode itself, so a reader never has to know the positions the
schedule used. `agentrl.training.update.credit` fills it; `agentrl.tracking.chat` writes it as span attributes.

It lives in the lowest layer (beside `agentrl.runview`, which exposes it) so that the tracking code can read it
without importing the training package.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agentrl.types import Trajectory


@dataclass(frozen=True)
class TurnCredit:
    """What an update did with one turn.

    Attributes:
        advantage: The schedule's advantage of the turn (GRPO: the group-normalised return; Turn-PPO: turn GAE;
            RTPO: the depth-k sibling advantage); the mean over the turn's tokens for per-token advantages.
        advantage_used: The advantage the loss used, after identical turns (same context and reply) were folded
            to their mean (`agentrl.training.update.objective.fold_identical`): 0 for a cancelled pair.
        value: The critic's value at rollout time at the turn's first response token (V(s_n)), or None without a
            critic.
        returns: The critic's target there (the GAE return), or None without a critic.
        is_weight: Importance weight of the turn's loss: the schedule's weight times the mean of the TIS/MIS
            token weights from the π_old recompute (RTPO's off-policy ablation: the clamped downstream ratio);
            None when no correction applied (the weight is 1).
        trained: The turn carried a non-zero policy advantage into the update (a turn with zero advantage, or
            one folded away, is not trained; turns an update never saw have no `TurnCredit` at all).
        update: Which update of the step trained it (RTPO: ``k<depth>``; one-update schedules: ``""``).
    """

    advantage: float
    advantage_used: float
    value: float | None
    returns: float | None
    is_weight: float | None
    trained: bool
    update: str = ""


class StepRecord:
    """The episodes of one RL step and the credit each update gave their turns (see the module docstring)."""

    def __init__(self) -> None:
        self.episodes: list[Trajectory] = []
        # by id() of the episode, with the episode itself kept: the id cannot be reused while the record lives
        self._turns: dict[int, tuple[Trajectory, dict[int, TurnCredit]]] = {}

    def add_episodes(self, episodes: Iterable[Trajectory]) -> None:
        """Episodes collected in this step (in collection order)."""
        self.episodes.extend(episodes)

    def record(self, episode: Trajectory, turn_index: int, credit: TurnCredit) -> None:
        """``credit`` for turn ``turn_index`` of ``episode`` (a later update of the same turn replaces it)."""
        _, turns = self._turns.setdefault(id(episode), (episode, {}))
        turns[turn_index] = credit

    def credit(self, episode: Trajectory) -> Sequence[TurnCredit | None]:
        """One entry per turn of ``episode``: its credit, or None for a turn no update saw."""
        entry = self._turns.get(id(episode))
        turns = entry[1] if entry is not None and entry[0] is episode else {}
        return [turns.get(turn.index) for turn in episode.turns]
