"""Core data types: a `Turn` (one LLM call), a `Trajectory` (one episode) and a `TurnBatch` (padded tensors).

Principle 1 of the design, *token-in, token-out*: a turn stores the exact prompt token ids sent to the engine,
the exact response token ids it returned and the engine's log-probs for them. Training uses these ids verbatim;
nothing is re-rendered or re-tokenized. The validation here rejects data that would break that contract.

Shape letters: B trajectories, T turns, N rows of a batch, L tokens.

Alignment convention of `TurnBatch` (every (N, L) tensor): position ``t`` describes token ``input_ids[:, t]``.
``old_logprobs[:, t] = log π_old(input_ids[t] | input_ids[:t])``; ``values[:, t]`` is the critic's estimate of the
state *before* token ``t`` is emitted, i.e. read from the hidden state at ``t - 1``. The value of a turn
V(s_n) therefore sits at the turn's first response token, which reads the last prompt token (design: V(s_n) is
read at the last prompt token of turn n).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import torch

FinishReason = Literal["stop", "length", "abort"]
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort")


class DataError(ValueError):
    """Raised when rollout data is inconsistent (the message names the field and what was expected)."""


@dataclass
class Turn:
    """One LLM call of an episode: the action of turn-level RL.

    Attributes:
        prompt_ids: Exact token ids sent to the engine (the context c_k of the turn).
        response_ids: Exact token ids the engine returned.
        logprobs: Behaviour-policy log-probability of each response token (one per response id).
        index: Position k of the turn in its trajectory (0-based).
        reward: Per-turn reward r_k (0 for intermediate turns unless the environment gives one).
        finish_reason: ``stop`` (stop token), ``length`` (token budget or context window) or ``abort``.
        policy_version: Version of the policy weights that produced the response.
        forced: True when the response was replayed from a recorded trunk rather than sampled (RTPO branching).
        messages: Chat messages the prompt was rendered from (display only, never used for training): all of
            them on the first turn, then those new since the previous turn's reply.
        text: Decoded response text (display only).
        tool_calls: Tool calls parsed from the response (display only).
        tools: Tool schemas (OpenAI ``{"type": "function", ...}``) offered with the prompt (display only).
        started_ns: Wall-clock time (``time.time_ns()``) the engine call began (display only: the trace's span
            times; None where nothing timed it).
        ended_ns: Wall-clock time the engine call returned (display only; None where nothing timed it).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    index: int = 0
    reward: float = 0.0
    finish_reason: FinishReason = "stop"
    policy_version: int = 0
    forced: bool = False
    messages: list[dict[str, Any]] | None = None
    text: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    started_ns: int | None = None
    ended_ns: int | None = None

    def __post_init__(self) -> None:
        if len(self.prompt_ids) == 0:
            raise DataError("Turn.prompt_ids is empty: every turn needs the context it was generated from")
        if len(self.logprobs) != len(self.response_ids):
            raise DataError(
                f"Turn.logprobs has {len(self.logprobs)} entries but Turn.response_ids has "
                f"{len(self.response_ids)}: expected one behaviour log-prob per response token"
            )
        for name in ("prompt_ids", "response_ids"):
            ids = getattr(self, name)
            if any((not isinstance(i, int)) or i < 0 for i in ids):
                raise DataError(f"Turn.{name} must hold non-negative int token ids")
        if any(not math.isfinite(lp) or lp > 1e-6 for lp in self.logprobs):
            raise DataError("Turn.logprobs must be finite log-probabilities (<= 0)")
        if self.finish_reason not in FINISH_REASONS:
            raise DataError(f"Turn.finish_reason is {self.finish_reason!r}; expected one of {FINISH_REASONS}")
        if self.index < 0:
            raise DataError(f"Turn.index must be >= 0, got {self.index}")
        if not math.isfinite(self.reward):
            raise DataError(f"Turn.reward must be finite, got {self.reward}")

    @property
    def num_tokens(self) -> int:
        """Prompt plus response length."""
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass
class Trajectory:
    """One episode: the turns an agent took on a task and the outcome.

    ``terminated`` (the task reached a terminal state: success, failure, answer given) and ``truncated`` (the
    episode was cut by a turn or token limit, so the future is unknown) are kept separate everywhere: only a
    truncated trajectory may be bootstrapped with a value estimate.

    Attributes:
        turns: The LLM calls in order.
        reward: Terminal (outcome) reward of the episode.
        terminated: The episode ended in a terminal state.
        truncated: The episode was cut off before a terminal state.
        task_id: Identifier of the task the episode came from.
        seed: Seed of the episode (environment and sampling).
        group: Group id: trajectories of one group share a task (GRPO groups, RTPO sibling sets).
        tree: Trunk id for RTPO trees (None outside RTPO).
        branch_turn: Turn index k at which this trajectory branched from its trunk (None for trunks and groups).
        failed: The episode raised (agent, tool or environment error, timeout); it is excluded from the loss.
        error: The error message when ``failed``.
        info: Free-form episode information (success flag, tool calls, environment info).
        snapshots: Agent state recorded at turn boundaries (RTPO fast branching); never logged.
    """

    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    task_id: str = ""
    seed: int = 0
    group: int = 0
    tree: int | None = None
    branch_turn: int | None = None
    failed: bool = False
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    snapshots: dict[int, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.terminated and self.truncated:
            raise DataError("Trajectory.terminated and Trajectory.truncated cannot both be True")
        for position, turn in enumerate(self.turns):
            if turn.index != position:
                raise DataError(
                    f"Trajectory.turns[{position}].index is {turn.index}; expected {position} "
                    "(turns must be stored in order)"
                )
        if not math.isfinite(self.reward):
            raise DataError(f"Trajectory.reward must be finite, got {self.reward}")

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def total_reward(self) -> float:
        """Terminal reward plus per-turn rewards (the undiscounted return)."""
        return self.reward + sum(t.reward for t in self.turns)

    def turn_rewards(self) -> list[float]:
        """Per-turn rewards with the terminal reward added to the last turn (the r_n of turn GAE)."""
        rewards = [t.reward for t in self.turns]
        if rewards:
            rewards[-1] += self.reward
        return rewards

    @property
    def success(self) -> bool:
        return bool(self.info.get("success", False))


@dataclass
class TurnBatch:
    """Padded tensors built from turns. Each row holds one sequence (one turn, or several packed turns of one
    trajectory that share an exact prefix). All (N, L) tensors follow the module-level alignment convention.

    Attributes:
        input_ids: (N, L) token ids, right-padded.
        attention_mask: (N, L) 1 for real tokens.
        response_mask: (N, L) True where the token is a trained response token.
        turn_ids: (N, L) int: id of the turn (sample) each response token belongs to, -1 elsewhere. Losses
            aggregate per turn with it (RTPO Eq. 6).
        old_logprobs: (N, L) behaviour log-probs at response tokens, 0 elsewhere.
        advantages: (N, L) advantage of each response token (a turn's advantage broadcast to its tokens).
        returns: (N, L) value targets at ``value_mask`` positions.
        old_values: (N, L) critic values at rollout time, at ``value_mask`` positions.
        value_mask: (N, L) True where the value loss applies (turn critic: first response token of each turn).
        weights: (N, L) extra per-token loss weights (e.g. off-policy importance weights); ones by default.
        units: (N, L) the unit each response token's sample counts for (`TurnTargets.unit`: GRPO's trajectory
            weighting gives each of a trajectory's T turns 1/T); ones by default. Entropy and KL terms are weighted
            by it, so they are means at the same scale as the policy loss.
        branch: (N, L) int or None: in shared-prefix rows, 0 on the shared prefix and b ≥ 1 on the tokens of the
            row's b-th sequence (`agentrl.models.tree`: attention, positions and scoring follow it); None when no
            row of the batch shares a prefix.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    turn_ids: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    old_values: torch.Tensor
    value_mask: torch.Tensor
    weights: torch.Tensor
    units: torch.Tensor
    branch: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.input_ids.dim() != 2:
            raise DataError(f"TurnBatch.input_ids must be (N, L), got shape {tuple(self.input_ids.shape)}")
        shape = self.input_ids.shape
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor) and value.shape != shape:
                raise DataError(f"TurnBatch.{f.name} has shape {tuple(value.shape)}; expected {tuple(shape)}")

    def to(self, device: torch.device) -> TurnBatch:
        """The same batch with every tensor on ``device``."""
        moved: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        return TurnBatch(**{k: v.to(device) for k, v in moved.items() if v is not None})
