"""Guess-the-number: the smallest multi-turn task, a bandit with feedback.

Mirrors the "guess a number with higher/lower feedback" toy task used to sanity-check multi-turn RL (it is the
binary-search game of RAGEN-style toy suites). A hidden integer is drawn uniformly from ``[low, high]`` with a
NumPy generator seeded by the episode seed; after each wrong guess the agent is told "higher" or "lower".

Action format: the **first integer** anywhere in the reply ("7", "I guess 7", "<answer>7</answer>"). A reply
without an integer, or with a first integer outside ``[low, high]``, is a format error (penalty, state unchanged,
the turn still counts). Rewards: 1.0 for the correct guess (terminated, success), 0.0 for a wrong guess.

The range is the curriculum knob: ``low=1, high=3`` is nearly always solved, ``1..10`` in 5 turns needs binary
search, ``1..30`` in 6 turns is hard for a 135M model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

from agentrl.envs.base import EpisodeSnapshots, StepResult, format_error

_INT = re.compile(r"-?\d+")
_MAX_RANGE = 1_000_000


@dataclass(frozen=True)
class _GuessState:
    target: int
    turn: int = 0
    done: bool = False
    started: bool = False


class GuessNumberEnv(EpisodeSnapshots):
    """Guess a hidden integer in ``[low, high]`` with higher/lower feedback.

    Args:
        low: Smallest possible number.
        high: Largest possible number (``low < high <= low + 1e6``).
        max_turns: Guesses (and format errors) allowed before the episode is truncated.
        format_penalty: Reward of a reply without a valid number (should be <= 0).
        prompt_example: Put one example reply in the system prompt. Off by default: SmolLM2-135M tends to repeat
            the example number, and its base success was lower with it (1..10: 12 % vs 19 %; 1..5: 31 % vs 47 %;
            docs/examples/base_success.md).
    """

    episode_type = _GuessState

    def __init__(
        self,
        low: int = 1,
        high: int = 10,
        max_turns: int = 5,
        format_penalty: float = -0.1,
        prompt_example: bool = False,
    ) -> None:
        if not low < high <= low + _MAX_RANGE:
            raise ValueError(f"env.high must satisfy env.low < env.high <= env.low + {_MAX_RANGE}, got low={low}, "
                             f"high={high}")
        if not 1 <= max_turns <= 1000:
            raise ValueError(f"env.max_turns must be in [1, 1000], got {max_turns}")
        if not -10.0 <= format_penalty <= 0.0:
            raise ValueError(f"env.format_penalty must be in [-10, 0], got {format_penalty}")
        self.low = low
        self.high = high
        self.max_turns = max_turns
        self.format_penalty = format_penalty
        self.system_prompt = (
            f"Guess the secret number between {low} and {high}. "
            "Reply with one number only. After a wrong guess you are told if the secret is higher or lower."
        )
        if prompt_example:
            self.system_prompt += f"\nExample reply: {(low + high) // 2}"
        self._episode = _GuessState(target=low)

    def reset(self, seed: int) -> str:
        """Draw the hidden number from ``seed`` and return the first observation."""
        target = int(np.random.default_rng(seed).integers(self.low, self.high + 1))
        self._episode = _GuessState(target=target, started=True)
        return (
            f"I am thinking of a number between {self.low} and {self.high}. "
            f"You have {self.max_turns} guesses. Your guess:"
        )

    def step(self, action: str) -> StepResult:
        """Apply the first integer of ``action`` as a guess."""
        state = self._episode
        if not state.started or state.done:
            raise RuntimeError("GuessNumberEnv.step called before reset() or after the episode ended")
        guess = self._parse(action)
        turn = state.turn + 1
        truncated = turn >= self.max_turns
        if guess is None:
            self._episode = replace(state, turn=turn, done=truncated)
            obs = f"Invalid reply. Reply with one number between {self.low} and {self.high}, e.g. {self.low}."
            return format_error(obs, self.format_penalty, truncated)
        if guess == state.target:
            self._episode = replace(state, turn=turn, done=True)
            return StepResult(f"{guess} is correct!", 1.0, True, False, {"format_error": False, "success": True})
        self._episode = replace(state, turn=turn, done=truncated)
        hint = "higher" if state.target > guess else "lower"
        info = {"format_error": False}
        if truncated:
            info["success"] = False
            return StepResult(f"Wrong. The number was {state.target}.", 0.0, False, True, info)
        left = self.max_turns - turn
        obs = f"{guess} is wrong. The secret number is {hint} than {guess}. Guesses left: {left}. Your guess:"
        return StepResult(obs, 0.0, False, False, info)

    def _parse(self, action: str) -> int | None:
        match = _INT.search(action[:10_000])
        if match is None or len(match.group()) > 12:
            return None
        value = int(match.group())
        return value if self.low <= value <= self.high else None
