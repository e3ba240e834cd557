"""`RowPlan`: how selected turns become forward passes — packing into rows, micro-batches under a token budget,
and, under sharded weights, the lockstep that makes every rank run the same number of forwards.

Both the update (`agentrl.training.update.ppo`) and no-gradient scoring (critic values, π_old recompute) go through
one plan, so a turn is packed, padded and cut back out the same way whichever asks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from agentrl.training.update import distributed
from agentrl.training.update.batching import (
    Row,
    TurnKey,
    TurnTargets,
    collate,
    context_targets,
    micro_batches,
    pack_rows,
    score_turns,
)
from agentrl.training.update.sharding import pad_micro_batches
from agentrl.types import Trajectory, TurnBatch


@dataclass(frozen=True)
class RowPlan:
    """Packing and micro-batching of one trainer.

    Attributes:
        micro_batch_tokens: Padded-token budget of one forward/backward.
        pack: Pack the turns of a trajectory that share an exact prefix into one row.
        pad_id: Token id of padding.
        device: Where batches go.
        lockstep: Weights are sharded: every rank runs as many forwards as the rank with the most micro-batches
            (`agentrl.training.update.sharding`).
        shared: Rows with equal contexts share their prefix in a micro-batch (`batching.share_prefixes`).
    """

    micro_batch_tokens: int
    pack: bool
    pad_id: int
    device: torch.device
    lockstep: bool = False
    shared: bool = False

    def rows(self, trajectories: Sequence[Trajectory], targets: dict[TurnKey, TurnTargets]) -> list[Row]:
        """Rows of the turns named in ``targets`` (rows without a response token dropped)."""
        rows = pack_rows(trajectories, targets, pack=self.pack)
        return [r for r in rows if any(t.response_ids for _, t, _ in r.turns)]

    def micro_batches(self, rows: Sequence[Row]) -> list[list[Row]]:
        """``rows`` split by the token budget; under lockstep padded with empty micro-batches to the largest count
        over the ranks (a collective)."""
        micro = micro_batches(rows, self.micro_batch_tokens, shared=self.shared)
        if not self.lockstep:
            return micro
        return pad_micro_batches(micro, distributed.sync_max(len(micro), self.device), self.pad_id)

    def batch(self, micro: Sequence[Row]) -> TurnBatch:
        return collate(micro, self.pad_id).to(self.device)

    def score(self, trajectories: Sequence[Trajectory], keys: Iterable[TurnKey],
              fn: Callable[[TurnBatch], Tensor]) -> dict[TurnKey, Tensor]:
        """``fn`` (a ``(N, L)`` score per batch) cut back to each named turn's response positions."""
        rows = pack_rows(trajectories, context_targets(keys), pack=self.pack)
        # forwards are collectives under lockstep: as many as the rank with the most micro-batches. The ranks agree
        # on that count (itself a collective) before any forward, so that no rank's count meets another's forward.
        padding = self.micro_batches(rows)[len(micro_batches(rows, self.micro_batch_tokens, shared=self.shared)):]
        out = score_turns(rows, self.micro_batch_tokens, self.pad_id, self.device, fn, shared=self.shared)
        for micro in padding:
            fn(self.batch(micro))
        return out
