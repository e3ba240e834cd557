"""From an update's rows to the per-turn `agentrl.credit.TurnCredit` of the step's record.

`agentrl.training.update.ppo.PPOUpdate.run` calls `record_update` with the rows as the schedule planned them (its
targets) and as the loss will use them (identical turns folded, π_old and the correction weights attached), so the
record says both what the schedule computed and what the update did with it.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentrl.credit import StepRecord, TurnCredit
from agentrl.training.update.batching import Row, TurnKey, TurnTargets
from agentrl.types import Trajectory


def _mean(x: float | list[float]) -> float:
    if isinstance(x, list):
        return sum(x) / len(x) if x else 0.0
    return float(x)


def _first(x: float | list[float] | None) -> float | None:
    if isinstance(x, list):
        return float(x[0]) if x else None
    return None if x is None else float(x)


def turn_credit(planned: TurnTargets, used: TurnTargets, n_tokens: int, update: str) -> TurnCredit:
    """The credit of one turn of ``n_tokens`` response tokens: ``planned`` is the schedule's target, ``used`` the
    target the loss reads (folded advantage, correction weights)."""
    adv_used = used.advantage if isinstance(used.advantage, list) else [used.advantage]
    weighted = used.token_weights is not None or used.weight != 1.0
    is_weight = used.weight * (_mean(used.token_weights) if used.token_weights else 1.0) if weighted else None
    return TurnCredit(
        advantage=_mean(planned.advantage), advantage_used=_mean(used.advantage),
        value=_first(planned.old_values) if planned.returns is not None else None,
        returns=_first(planned.returns), is_weight=is_weight,
        trained=n_tokens > 0 and any(a != 0.0 for a in adv_used), update=update,
    )


def record_update(record: StepRecord, trajectories: Sequence[Trajectory], planned: Sequence[Row],
                  used: Sequence[Row], update: str) -> None:
    """Record the credit of every turn of ``used`` (the rows of one update, keyed like ``planned``) against the
    episode it belongs to (``trajectories[b]`` for key ``(b, n)``)."""
    targets: dict[TurnKey, TurnTargets] = {key: tgt for r in planned for key, _, tgt in r.turns}
    for row in used:
        for key, turn, tgt in row.turns:
            record.record(trajectories[key[0]], key[1],
                          turn_credit(targets.get(key, tgt), tgt, len(turn.response_ids), update))
