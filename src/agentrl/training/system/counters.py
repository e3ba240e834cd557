"""`RunCounters`: the counts a run carries across a resume, and what the stopped run had launched ahead.

They live in one dataclass so that the module's checkpoint hooks are a line each (`state` / `restore`, under the
checkpoint key ``agentrl``), and `Counted` lets the module read and write them as its own attributes, which the
`Learner` protocol and the `RunView` name. What was launched ahead is counted, never saved: a resume collects
those episodes again with the restored weights, and says so (`warn_recollecting`, `report_cancelled`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, overload

import lightning.pytorch as pl

from agentrl.training.rollout.async_collect import LaunchedAhead

log = logging.getLogger(__name__)


@dataclass
class RunCounters:
    """RL steps done, weight pushes (the policy version), tokens sampled for training (all ranks: the learning
    budget's axis), and, on a resume, what the checkpointed run had launched ahead (``lost_ahead``)."""

    rl_step: int = 0
    policy_version: int = 0
    generated_tokens: int = 0
    lost_ahead: LaunchedAhead = field(default_factory=lambda: LaunchedAhead([], 0, 0))

    def state(self, launched_ahead: LaunchedAhead | None) -> dict[str, Any]:
        """The checkpoint's ``agentrl`` entry. Of the batches launched ahead, not the episodes (a resume collects
        them again): how many (rank 0's; every rank launches as many), so that the resume can say so."""
        return {"rl_step": self.rl_step, "policy_version": self.policy_version,
                "generated_tokens": self.generated_tokens,
                "launched_ahead": launched_ahead.state() if launched_ahead is not None else {}}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Take the counts of a checkpoint's ``agentrl`` entry (absent: a fresh run's)."""
        self.rl_step = int(state.get("rl_step", 0))
        self.policy_version = int(state.get("policy_version", 0))
        self.generated_tokens = int(state.get("generated_tokens", 0))
        self.lost_ahead = LaunchedAhead.of(state.get("launched_ahead"))

    def count_tokens(self, metrics: dict[str, float]) -> dict[str, float]:
        """Add a step's ``perf/generated_tokens`` (over all ranks) to the run's count; ``metrics`` with the total."""
        self.generated_tokens += int(metrics.get("perf/generated_tokens", 0))
        metrics["perf/generated_tokens_total"] = float(self.generated_tokens)
        return metrics

    def take_lost_ahead(self, rl_step: int) -> LaunchedAhead | None:
        """What the checkpointed run had launched ahead, once, at the resumed run's first step (else None)."""
        lost = self.lost_ahead
        if rl_step not in lost.steps:
            return None
        self.lost_ahead = LaunchedAhead([], 0, 0)
        return lost


class HasCounters(Protocol):
    counters: RunCounters


class Counted:
    """A class attribute that reads and writes one int of the instance's ``counters`` (a `RunCounters`)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> Counted: ...
    @overload
    def __get__(self, obj: HasCounters, objtype: type | None = None) -> int: ...
    def __get__(self, obj: HasCounters | None, objtype: type | None = None) -> int | Counted:
        return self if obj is None else int(getattr(obj.counters, self.name))

    def __set__(self, obj: HasCounters, value: int) -> None:
        setattr(obj.counters, self.name, value)


def warn_recollecting(lost: LaunchedAhead, world_size: int) -> None:
    """The first step of a resumed run collects again what the stopped run had launched ahead: say so."""
    log.warning("resumed: re-collecting %d episode(s)%s of step(s) %s that the stopped run had launched "
                "ahead (%d in flight, %d finished at the checkpoint)", lost.episodes,
                f" on each of {world_size} ranks" if world_size > 1 else "",
                ", ".join(str(s + 1) for s in lost.steps), lost.episodes - lost.finished, lost.finished)


def report_cancelled(lost: LaunchedAhead, *, ended: bool, trainer: pl.Trainer | None) -> None:
    """Say what a stop discarded of the batches launched ahead: nothing to worry about when the run ended (its
    token budget ended it before those steps), a warning when it stopped (a resume collects them again). On several
    ranks each says its own counts."""
    if not lost.episodes:
        return
    rank_prefix = f"rank {trainer.global_rank}: " if trainer is not None and trainer.world_size > 1 else ""
    steps = ", ".join(str(s + 1) for s in lost.steps)
    if ended:
        log.info("the run ended with %d episode(s) launched ahead for step(s) %s: discarded", lost.episodes, steps)
    else:
        log.warning("%sstopped with %d episode(s) launched ahead for step(s) %s (%d in flight, %d finished): "
                    "not in the checkpoint, a resume collects them again", rank_prefix, lost.episodes, steps,
                    lost.episodes - lost.finished, lost.finished)
