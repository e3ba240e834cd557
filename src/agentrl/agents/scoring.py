"""What a user's reward function returns, and how it lands on an episode's turns.

Adapters that wrap agents the user already has (`agentrl.agents.http_agent.HTTPAgent`, ``agentrl_langchain``)
take a ``reward(task, result) -> float | Score`` written by the user; `score` calls it (sync or async) and checks
what came back, `apply_score` adds the optional per-turn rewards to the recorded turns (turn-level credit) and
sets ``success``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.agents.base import RewardError, Task, check_reward
from agentrl.agents.blocking import run_blocking
from agentrl.agents.llm import LLMClient


@dataclass
class Score:
    """What a reward function may return instead of a plain float.

    Attributes:
        reward: Terminal reward of the episode (added to its last turn).
        success: Whether the task was solved (``rollout/success``); None: ``reward >= success_threshold``.
        turn_rewards: Extra per-turn rewards, one per LLM call in order (shorter is fine), for turn-level credit.
        info: Anything worth reviewing, merged into the trajectory's ``info``.
    """

    reward: float
    success: bool | None = None
    turn_rewards: Sequence[float] = ()
    info: dict[str, Any] = field(default_factory=dict)


async def score(reward: Callable[[Task, Any], Any], task: Task, result: Any) -> Score:
    """Call ``reward(task, result)`` and return a `Score`. An ``async`` reward is awaited; a sync one (a checker,
    a subprocess) runs off the event loop, so a hang costs only this episode's timeout."""
    if _is_async(reward):
        value = reward(task, result)
    else:
        value = await run_blocking(reward, task, result)
    if inspect.isawaitable(value):
        value = await value
    source = f"the reward function {_name(reward)}"
    if isinstance(value, Score):
        turn_rewards = [check_reward(r, f"{source} (Score.turn_rewards[{i}])")
                        for i, r in enumerate(value.turn_rewards)]
        return Score(check_reward(value.reward, f"{source} (Score.reward)"), value.success, turn_rewards, value.info)
    if isinstance(value, str | bytes) or value is None:
        raise RewardError(f"reward from {source} is {value!r}: reward must return a float or a Score, got "
                          f"{type(value).__name__} (a string is never read as a number)")
    return Score(check_reward(value, source))


def _name(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__qualname__", None) or type(fn).__qualname__)


def apply_score(llm: LLMClient, result: Score, info: dict[str, Any], success_threshold: float) -> None:
    """Add ``result.turn_rewards`` to the recorded turns, merge ``result.info`` into ``info`` and set
    ``info["success"]`` (the explicit flag, else ``reward >= success_threshold``)."""
    if len(result.turn_rewards) > len(llm.turns):
        raise ValueError(f"reward gave {len(result.turn_rewards)} turn rewards for {len(llm.turns)} LLM calls")
    for i, value in enumerate(result.turn_rewards):
        llm.reward(value, turn=i, source=f"Score.turn_rewards[{i}]")
    info.update(result.info)
    info["success"] = bool(result.reward >= success_threshold if result.success is None else result.success)


def _is_async(fn: Callable[..., Any]) -> bool:
    call = type(fn).__call__ if not inspect.isroutine(fn) else None  # a callable object's async __call__
    return inspect.iscoroutinefunction(fn) or (call is not None and inspect.iscoroutinefunction(call))
