"""The agent protocol and the data an episode starts from and ends with.

An agent is anything with ``async run(task, llm) -> Outcome``. It talks to the model only through the
`agentrl.agents.llm.LLMClient` it is handed, which records every call as a `Turn`; the collector turns the
recorded turns and the outcome into a `Trajectory`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from agentrl.agents.llm import LLMClient


class RewardError(ValueError):
    """A reward that is not a finite number (NaN, inf, a string); the message names where it came from. It fails
    its episode only (the collector records it), where a NaN used to reach the loss and end the run."""


def check_reward(value: Any, source: str) -> float:
    """``value`` as a float when it is a finite real number (int, float, numpy scalar; not a bool, not a string),
    else `RewardError` naming ``source`` (``GuessNumberEnv.step``, ``the reward function my.reward``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RewardError(f"reward from {source} is {value!r} ({type(value).__name__}): a reward must be a finite "
                          "int or float")
    number = float(value)
    if not math.isfinite(number):
        raise RewardError(f"reward from {source} is {number}: a reward must be a finite number")
    return number


@dataclass(frozen=True)
class Task:
    """One task: an environment seed, a question, a dataset row.

    Attributes:
        id: Stable identifier (used in seeds, logs and groups).
        seed: Environment seed (every sample of a task sees the same environment instance).
        data: Task payload for agents that need one (e.g. ``{"question": ...}`` for a LangChain agent).
    """

    id: str
    seed: int = 0
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    """How an episode ended.

    Attributes:
        reward: Terminal reward, added to the last turn (per-turn rewards go through ``llm.reward``).
        terminated: The task reached a terminal state.
        truncated: The episode was cut off (turn or token limit) before a terminal state.
        info: ``success`` (bool) and anything worth reviewing.
    """

    reward: float = 0.0
    terminated: bool = True
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Agent(Protocol):
    """An agent plays one episode of a task with the LLM client it is given."""

    async def run(self, task: Task, llm: LLMClient) -> Outcome:
        ...


class EpisodeTruncated(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by the LLM client when an episode must stop early (turn limit, context window): the collector
    ends the episode as truncated, keeping its turns."""


class ReplayMismatchError(RuntimeError):
    """While replaying a trunk for RTPO branching, the agent produced a prompt that differs from the recorded
    one: the agent or its environment is not deterministic for a seed."""
