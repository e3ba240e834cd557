"""From trajectories to padded `TurnBatch` tensors, without wasting compute.

**Packing.** With full-history contexts, turn k+1's prompt starts with turn k's prompt + response (the
`LLMClient` guarantees it by reusing token ids). The turns of a trajectory that chain this way are
packed into one row — the longest context — and each turn's response tokens are scored at their own positions:
causal attention makes every token's context exactly the turn's recorded context, so the log-probs, entropies and
values are the same as per-turn rows (a test checks it).

**Shared prefixes.** Rows whose contexts are the same tokens up to their first response token (RTPO's siblings
and the trunk's turn at one depth; a GRPO group's first prompt) can go into one *shared-prefix row*: the context
once, then each row's remaining tokens as a branch (`share_prefixes`; attention, positions and scoring in
`agentrl.models.tree`). This happens per micro-batch, after the minibatches are drawn, so what is trained together
does not change, only how many tokens the forward reads. Off by default (``model.share_prefixes``).

**Bucketing.** Micro-batches (the unit of one forward/backward) are cut from a minibatch sorted by length and
bounded by a token budget, so rows of similar length are padded together.

**Keys.** A turn is named by its key ``(b, n)``: the trajectory's position in the list handed to `pack_rows` and
the turn's index. Rows carry each turn's key, so whoever reads results back (`score_turns`) finds a turn by its
key — never by counting turns in some assumed order. `pack_rows` checks that every requested key names a turn.

Each trained turn carries its targets (`TurnTargets`): one advantage per turn (broadcast to its tokens) or one
per token (token-level PPO), and value targets at the first response token (turn critic) or at every response
token (token critic).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from agentrl.types import Trajectory, Turn, TurnBatch

TurnKey = tuple[int, int]
"""(position of the trajectory in the list, turn index)."""


@dataclass
class TurnTargets:
    """Training targets of one turn.

    Attributes:
        advantage: One advantage for the whole turn, or one per response token.
        returns: Value target(s) (same layout as ``old_values``), or None without a critic.
        old_values: Critic value(s) at rollout time, or None.
        per_token_values: Values sit at every response token (token critic) instead of the first one.
        weight: Loss weight of the turn's tokens (off-policy correction), 1 by default.
        unit: How many aggregation units the turn counts for (1; GRPO's trajectory weighting: 1 / the
            trajectory's turn count), see `agentrl.training.update.objective`.
        old_logprobs: π_old of each response token recomputed by the trainer; None takes the engine's recorded
            (behaviour) log-probs (`agentrl.training.update.mismatch`).
        token_weights: Per-token behaviour-correction weights (TIS/MIS), multiplied into ``weight``; None: ones.
    """

    advantage: float | list[float]
    returns: float | list[float] | None = None
    old_values: float | list[float] | None = None
    per_token_values: bool = False
    weight: float = 1.0
    unit: float = 1.0
    old_logprobs: list[float] | None = None
    token_weights: list[float] | None = None


@dataclass
class Row:
    """One packed sequence and the trained turns inside it.

    A shared-prefix row (`share_prefixes`) also has ``branch`` (per token: 0 on the prefix, b on its b-th
    sequence) and ``starts`` (where each turn's response begins in ``ids``); elsewhere a turn's response begins
    after its prompt."""

    ids: list[int]
    turns: list[tuple[TurnKey, Turn, TurnTargets]] = field(default_factory=list)
    branch: list[int] | None = None
    starts: dict[TurnKey, int] | None = None

    def start(self, key: TurnKey, turn: Turn) -> int:
        """Position of ``turn``'s first response token in ``ids``."""
        return self.starts[key] if self.starts is not None else len(turn.prompt_ids)


def _extends(row_ids: list[int], turn: Turn) -> bool:
    n = len(row_ids)
    return len(turn.prompt_ids) >= n and turn.prompt_ids[:n] == row_ids


def pack_rows(
    trajectories: Sequence[Trajectory], targets: dict[TurnKey, TurnTargets], *, pack: bool = True
) -> list[Row]:
    """Rows holding every selected turn. ``targets`` maps a turn's key to its targets; turns without targets
    are context only. Raises ValueError for a key that names no turn (a caller's bookkeeping error)."""
    rows: list[Row] = []
    placed = 0
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
            row.turns.append(((b, turn.index), turn, tgt))
            placed += 1
    if placed != len(targets):
        known = {(b, t.index) for b, traj in enumerate(trajectories) for t in traj.turns}
        missing = sorted(set(targets) - known)[:5]
        raise ValueError(f"targets name turns that are not in the trajectories: {missing}")
    return rows


def _context_length(row: Row) -> int:
    return min(len(t.prompt_ids) for _, t, _ in row.turns) if row.turns else len(row.ids)


def share_prefixes(rows: Sequence[Row], max_tokens: int) -> list[Row]:
    """``rows`` with those whose contexts (the tokens before their first response token) are equal merged into
    shared-prefix rows of at most ``max_tokens`` tokens, in order of first appearance; a row alone keeps its form.
    Every turn keeps its tokens and its context (`agentrl.models.tree`)."""
    groups: dict[tuple[int, ...], list[Row]] = {}
    for row in rows:
        groups.setdefault(tuple(row.ids[:_context_length(row)]), []).append(row)
    out: list[Row] = []
    for prefix, members in groups.items():
        chunk: list[Row] = []
        for row in members:
            if chunk and len(prefix) + sum(len(r.ids) - len(prefix) for r in [*chunk, row]) > max_tokens:
                out.append(_merged(prefix, chunk))
                chunk = []
            chunk.append(row)
        out.append(_merged(prefix, chunk))
    return out


def _merged(prefix: tuple[int, ...], rows: list[Row]) -> Row:
    if len(rows) == 1:
        return rows[0]
    ids, branch = list(prefix), [0] * len(prefix)
    starts: dict[TurnKey, int] = {}
    turns: list[tuple[TurnKey, Turn, TurnTargets]] = []
    for b, row in enumerate(rows, start=1):
        shift = len(ids) - len(prefix)  # where this row's own tokens begin, past the prefix and earlier branches
        ids += row.ids[len(prefix):]
        branch += [b] * (len(row.ids) - len(prefix))
        for key, turn, tgt in row.turns:
            starts[key] = row.start(key, turn) + shift
            turns.append((key, turn, tgt))
    return Row(ids, turns, branch, starts)


def score_turns(rows: Sequence[Row], max_tokens: int, pad_id: int, device: torch.device,
                score: Callable[[TurnBatch], Tensor], *, shared: bool = False) -> dict[TurnKey, Tensor]:
    """Run ``score`` (a ``(N, L)`` tensor per collated micro-batch: log-probs, values, …) over ``rows`` and cut
    out each turn's response positions: ``{key: (len(response_ids),) tensor}``. The one place that maps packed
    positions back to turns. ``shared``: rows with equal contexts share their prefix (`share_prefixes`)."""
    out: dict[TurnKey, Tensor] = {}
    for micro in micro_batches(rows, max_tokens, shared=shared):
        scores = score(collate(micro, pad_id).to(device))
        for i, row in enumerate(micro):
            for key, turn, _ in row.turns:
                start = row.start(key, turn)
                out[key] = scores[i, start : start + len(turn.response_ids)]
    return out


def keys_of(trajectories: Sequence[Trajectory], where: Callable[[Turn], bool] = lambda t: True) -> list[TurnKey]:
    """Keys of the turns of ``trajectories`` for which ``where`` holds, in order."""
    return [(b, t.index) for b, traj in enumerate(trajectories) for t in traj.turns if where(t)]


def context_targets(keys: Iterable[TurnKey]) -> dict[TurnKey, TurnTargets]:
    """Placeholder targets that select turns for scoring only (no advantage)."""
    return {key: TurnTargets(0.0) for key in keys}


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
    branch = torch.zeros(N, L, dtype=torch.long) if any(r.branch is not None for r in rows) else None
    floats = {k: torch.zeros(N, L) for k in ("old_logprobs", "advantages", "returns", "old_values")}
    weights = torch.ones(N, L)
    units = torch.ones(N, L)
    tid = 0  # turn ids only group tokens within this batch (the loss aggregations); keys name turns
    for i, row in enumerate(rows):
        input_ids[i, : len(row.ids)] = torch.tensor(row.ids)
        attention[i, : len(row.ids)] = 1
        if branch is not None and row.branch is not None:
            branch[i, : len(row.ids)] = torch.tensor(row.branch)
        for key, turn, tgt in row.turns:
            n = len(turn.response_ids)
            if n == 0:
                continue
            start = row.start(key, turn)
            s = slice(start, start + n)
            response[i, s] = True
            turn_ids[i, s] = tid
            tid += 1
            weights[i, s] = tgt.weight * tgt.unit * torch.tensor(_as_list(tgt.token_weights or 1.0, n, "weights"))
            units[i, s] = tgt.unit
            floats["old_logprobs"][i, s] = torch.tensor(_as_list(tgt.old_logprobs or turn.logprobs, n, "logprobs"))
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
                     floats["returns"], floats["old_values"], value_mask, weights, units, branch)


def micro_batches(rows: Sequence[Row], max_tokens: int, *, shared: bool = False) -> list[list[Row]]:
    """Split ``rows`` (sorted longest first) into micro-batches whose padded size stays within ``max_tokens``
    (a row longer than the budget gets a micro-batch of its own); ``shared``: after merging the rows with equal
    contexts (`share_prefixes`)."""
    ordered = sorted(share_prefixes(rows, max_tokens) if shared else rows, key=lambda r: len(r.ids), reverse=True)
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
