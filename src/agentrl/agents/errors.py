"""The control-flow errors of an episode, raised by the LLM client and by agents, caught by the collector, and
the reward check that raises one.

Kept apart from `agentrl.agents.base` (which re-exports them, the names users import) so that the client
(`agentrl.agents.llm`) can raise them without importing the module whose `Agent` protocol names the client: the
two would import each other.
"""

from __future__ import annotations

import math
import numbers
from typing import Any


class EpisodeTruncated(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by the LLM client when an episode must stop early (turn limit, context window): the collector
    ends the episode as truncated, keeping its turns."""


class ReplayMismatchError(RuntimeError):
    """While replaying a trunk for RTPO branching, the agent produced a prompt that differs from the recorded
    one: the agent or its environment is not deterministic for a seed."""


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
