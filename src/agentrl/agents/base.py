"""The agent protocol and the data an episode starts from and ends with.

An agent is anything with ``async run(task, llm) -> Outcome``. It talks to the model only through the
`agentrl.agents.llm.LLMClient` it is handed, which records every call as a `Turn`; the collector turns the
recorded turns and the outcome into a `Trajectory`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentrl.agents.errors import EpisodeTruncated, ReplayMismatchError, RewardError, check_reward

if TYPE_CHECKING:
    from agentrl.agents.llm import LLMClient

__all__ = ["Agent", "EpisodeTruncated", "Outcome", "ReplayMismatchError", "RewardError", "Task", "check_reward"]


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
