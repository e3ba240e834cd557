"""From trajectories to padded `TurnBatch` tensors, without wasting compute.

**Packing.** With full-history contexts, turn k+1's prompt starts with turn k's prompt + response (the
`LLMClient` guarantees it by reusing token ids). Scoring every turn as its own row re-reads the conversation
once per turn (quadratic in the number of turns). Instead, the turns of a trajectory that chain this way are
packed into one row — the longest context — and each turn's response tokens are scored at their own positions:
causal attention makes every token's context exactly the turn's recorded context, so the log-probs, entropies and
values are the same as per-turn rows (a test checks it). A chain breaks (new row) wherever the next prompt does
not start with the previous row.

**Bucketing.** Micro-batches (the unit of one forward/backward) are cut from a minibatch sorted by length and
bounded by a token budget, so rows of similar length are padded together.

Each trained turn carries its targets (`TurnTargets`): one advantage per turn (broadcast to its tokens) or one
per token (token-level PPO), and value targets at the first response token (turn critic) or at every response
token (token critic).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from agentrl.types import Trajectory, Turn, TurnBatch


@dataclass
class TurnTargets:
    """Training targets of one turn.

    Attributes:
        advantage: One advantage for the whole turn, or one per response token.
        returns: Value target(s) (same layout as ``old_values``), or None without a critic.
        old_values: Critic value(s) at rollout time, or None.
        per_token_values: Values sit at every response token (token critic) instead of the first one.
        weight: Loss weight of the turn's tokens (off-policy correction), 1 by default.
    """

    advantage: float | list[float]
    returns: float | list[float] | None = None
    old_values: float | list[float] | None = None
    per_token_values: bool = False
    weight: float = 1.0


@dataclass
class Row:
    """One packed sequence and the trained turns inside it."""

    ids: list[int]
    turns: list[tuple[int, Turn, TurnTargets]] = field(default_factory=list)  # (turn id, turn, targets)


def _extends(row_ids: list[int], turn: Turn) -> bool:
    n = len(row_ids)
    return len(turn.prompt_ids) >= n and turn.prompt_ids[:n] == row_ids


def pack_rows(
    trajectories: Sequence[Trajectory], targets: dict[tuple[int, int], TurnTargets], *, pack: bool = True
) -> list[Row]:
    """Rows holding every selected turn. ``targets`` maps (trajectory position, turn index) to its targets;
    turns without targets are context only. Turn ids are assigned in (trajectory, turn) order."""
    rows: list[Row] = []
    turn_id = 0
    for b, traj in enumerate(trajectories):
        row: Row | None = None
        for turn in traj.turns:
            tgt = targets.get((b, turn.index))
            if tgt is None:
                continue
            ids = turn.prompt_ids + turn.response_ids
            if pack and row is not None and _extends(row.ids, turn):
                row.ids = ids
            else:
                row = Row(ids)
                rows.append(row)
            row.turns.append((turn_id, turn, tgt))
            turn_id += 1
    return rows


def _as_list(x: float | list[float] | None, n: int, name: str) -> list[float]:
    if x is None:
        return [0.0] * n
    if isinstance(x, list):
        if len(x) != n:
            raise ValueError(f"{name} has {len(x)} entries for a turn of {n} response tokens")
        return x
    return [float(x)] * n


def collate(rows: Sequence[Row], pad_id: int) -> TurnBatch:
    """Right-padded `TurnBatch` of ``rows`` (see `agentrl.types` for the alignment of every tensor)."""
    N = len(rows)
    L = max(len(r.ids) for r in rows)
    input_ids = torch.full((N, L), pad_id, dtype=torch.long)
    attention = torch.zeros(N, L, dtype=torch.long)
    response = torch.zeros(N, L, dtype=torch.bool)
    value_mask = torch.zeros(N, L, dtype=torch.bool)
    turn_ids = torch.full((N, L), -1, dtype=torch.long)
    floats = {k: torch.zeros(N, L) for k in ("old_logprobs", "advantages", "returns", "old_values")}
    weights = torch.ones(N, L)
    for i, row in enumerate(rows):
        input_ids[i, : len(row.ids)] = torch.tensor(row.ids)
        attention[i, : len(row.ids)] = 1
        for tid, turn, tgt in row.turns:
            n = len(turn.response_ids)
            if n == 0:
                continue
            s = slice(len(turn.prompt_ids), len(turn.prompt_ids) + n)
            response[i, s] = True
            turn_ids[i, s] = tid
            weights[i, s] = tgt.weight
            floats["old_logprobs"][i, s] = torch.tensor(turn.logprobs)
            floats["advantages"][i, s] = torch.tensor(_as_list(tgt.advantage, n, "advantage"))
            if tgt.returns is None:
                continue
            if tgt.per_token_values:
                value_mask[i, s] = True
                floats["returns"][i, s] = torch.tensor(_as_list(tgt.returns, n, "returns"))
                floats["old_values"][i, s] = torch.tensor(_as_list(tgt.old_values, n, "old_values"))
            else:
                first = s.start
                value_mask[i, first] = True
                floats["returns"][i, first] = float(tgt.returns)  # type: ignore[arg-type]
                floats["old_values"][i, first] = float(tgt.old_values or 0.0)  # type: ignore[arg-type]
    return TurnBatch(input_ids, attention, response, turn_ids, floats["old_logprobs"], floats["advantages"],
                     floats["returns"], floats["old_values"], value_mask, weights)


def micro_batches(rows: Sequence[Row], max_tokens: int) -> list[list[Row]]:
    """Split ``rows`` (sorted longest first) into micro-batches whose padded size stays within ``max_tokens``
    (a row longer than the budget gets a micro-batch of its own)."""
    ordered = sorted(rows, key=lambda r: len(r.ids), reverse=True)
    out: list[list[Row]] = []
    current: list[Row] = []
    width = 0
    for row in ordered:
        width_if_added = max(width, len(row.ids))
        if current and width_if_added * (len(current) + 1) > max_tokens:
            out.append(current)
            current, width = [], 0
            width_if_added = len(row.ids)
        current.append(row)
        width = width_if_added
    if current:
        out.append(current)
    return out


def token_counts(rows: Sequence[Row]) -> tuple[int, int]:
    """(tokens in the packed rows, tokens if every trained turn were its own row): the packing saving."""
    packed = sum(len(r.ids) for r in rows)
    unpacked = sum(t.num_tokens for r in rows for _, t, _ in r.turns)
    return packed, unpacked
