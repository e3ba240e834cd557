"""`Learner`: what a schedule may ask of the trainer, and nothing more.

The schedules (`GRPO`, `TurnPPO`, `TokenPPO`, `RTPO`) decide *what* to collect and *which* turns to train with
which targets; the learner (`AgentRLModule`) owns *how*: the engine, packing, micro-batching, losses, optimizers
and ranks. This protocol is the whole conversation between them, so a schedule can be read (and tested) without
the module's internals, and the module can change them freely.

Turns are named by `TurnKey` ``(b, n)``: the trajectory's position in the list passed, and the turn's index.
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from torch import Tensor

from agentrl.training.update.batching import TurnKey, TurnTargets
from agentrl.types import Trajectory

if TYPE_CHECKING:
    from agentrl.agents.base import Task
    from agentrl.collect.collector import Collector
    from agentrl.runview import StepProgress
    from agentrl.training.rollout.async_collect import MakeBatch
    from agentrl.training.update.settings import PPOSettings


class Learner(Protocol):
    """The trainer as a schedule sees it."""

    @property
    def rl_step(self) -> int:
        """Index of the RL step being run (0-based); seeds rollouts and minibatch orders."""
        ...

    @property
    def policy_version(self) -> int:
        """Version of the weights the engine serves (one more after each `push_weights`)."""
        ...

    @property
    def collector(self) -> Collector:
        """Builds episodes: groups, trunks, siblings. Pass its coroutines to `collect`."""
        ...

    @property
    def step_progress(self) -> StepProgress:
        """The run's progress channel (a schedule tells it where its own loops are, e.g. RTPO's depth)."""
        ...

    def collect(self, coro: Coroutine[Any, Any, list[Trajectory]]) -> list[Trajectory]:
        """Run one collection with the served weights; checks every sampled turn's version stamp."""
        ...

    def collect_batch(self, tasks: list[Task], make: MakeBatch, *, bounded: bool = True) -> list[Trajectory]:
        """The step's first collection, ``make(collector, tasks, rl_step)``: collected now, or (``data.max_staleness``
        >= 1) taken from the batch launched while an earlier step updated, its too-stale episodes dropped when
        ``bounded`` (`agentrl.training.rollout.async_collect`)."""
        ...

    def values(self, trajectories: Sequence[Trajectory], keys: Iterable[TurnKey]) -> dict[TurnKey, list[float]]:
        """Critic values at each response token of the named turns (the first is V(s_n)), current weights."""
        ...

    def logprobs(self, trajectories: Sequence[Trajectory], keys: Iterable[TurnKey]) -> dict[TurnKey, list[float]]:
        """The current policy's log-probs of the named turns' response tokens (no gradient)."""
        ...

    def update(self, trajectories: Sequence[Trajectory], targets: dict[TurnKey, TurnTargets], ppo: PPOSettings,
               *, tag: str = "") -> dict[str, float]:
        """PPO epochs × minibatches on the turns named in ``targets``; every rank must call it, with or without
        turns. Returns the averaged ``train/*`` metrics. `push_weights` must follow before the next collection: the
        embedded engine's weight copy may be freed for the update and is allocated again at the push (collecting
        before it raises)."""
        ...

    def push_weights(self) -> None:
        """Serve the updated weights; later collections use them."""
        ...

    def sync_max(self, value: int) -> int:
        """The largest ``value`` over all ranks (schedules use it to agree on loop counts)."""
        ...

    def all_sum(self, values: Tensor) -> Tensor:
        """``values`` summed over all ranks (e.g. whitening moments); every rank must call it."""
        ...
