"""The text-environment protocol: gymnasium-like, text in and text out, deterministic for a seed.

An environment receives the model's raw reply text as its action and parses it itself (leniently: each
environment documents what it accepts). A malformed action is never an exception: it earns the environment's
``format_penalty`` (an attribute of every shipped environment), leaves the state unchanged and returns an
observation that explains the expected format, with ``info["format_error"] = True``. It still counts as a turn
toward ``max_turns`` (otherwise a model that never produces a valid action would never end its episode).

``info["success"]`` (bool) is set on the step that ends an episode; the collector reports it as
``rollout/success``.

Environments that can copy their state cheaply implement `SnapshotEnv` (``snapshot()`` / ``restore()``): RTPO
branching then restores the state at boundary k instead of replaying the trunk's first k actions. One snapshot is
restored once per sibling, so a snapshot must be immutable or copied by ``restore``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable


@dataclass
class StepResult:
    """What `TextEnv.step` returns.

    Attributes:
        observation: Text shown to the agent next (empty when the episode ended and there is nothing to show).
        reward: Reward of this step (format penalties included).
        terminated: The episode reached a terminal state (solved, failed, answered).
        truncated: The environment's own step limit cut the episode.
        info: ``success`` (bool, on the last step), ``format_error`` (bool), and environment-specific keys.
    """

    observation: str
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class TextEnv(Protocol):
    """A text environment. ``system_prompt`` tells the agent the rules and the action format."""

    system_prompt: str
    max_turns: int

    def reset(self, seed: int) -> str:
        """Start a new episode, deterministic for ``seed``; returns the first observation."""
        ...

    def step(self, action: str) -> StepResult:
        """Apply the model's reply text as an action."""
        ...


@runtime_checkable
class SnapshotEnv(TextEnv, Protocol):
    """Optional fast path for RTPO branching: copy and restore the whole environment state."""

    def snapshot(self) -> Any:
        ...

    def restore(self, state: Any) -> None:
        ...


def format_error(observation: str, penalty: float, truncated: bool) -> StepResult:
    """The result of a malformed action, as the protocol above says: the penalty, an observation that explains the
    expected format, ``info["format_error"]``, and ``success = False`` when this turn was the last."""
    info: dict[str, Any] = {"format_error": True}
    if truncated:
        info["success"] = False
    return StepResult(observation, penalty, False, truncated, info)


class EpisodeSnapshots:
    """``snapshot()`` / ``restore()`` for an environment whose whole episode state is one dataclass held in
    ``self._episode`` (None before the first reset). A frozen dataclass is shared as it is; a mutable one (e.g. one
    holding a random generator) is copied on the way out and on the way in, so one snapshot can be restored by
    every sibling."""

    _episode: Any
    episode_type: ClassVar[type]

    def snapshot(self) -> Any:
        """The episode state at this boundary."""
        return self._episode if _frozen(self._episode) else copy.deepcopy(self._episode)

    def restore(self, state: Any) -> None:
        """Restore a state returned by `snapshot`."""
        if state is not None and not isinstance(state, self.episode_type):
            raise TypeError(f"expected a {type(self).__name__} snapshot ({self.episode_type.__name__}), "
                            f"got {type(state).__name__}")
        self._episode = state if _frozen(state) else copy.deepcopy(state)


def _frozen(state: Any) -> bool:
    params = getattr(state, "__dataclass_params__", None)
    return state is None or (params is not None and bool(params.frozen))
