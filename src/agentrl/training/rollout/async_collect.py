"""Bounded-staleness collection: the engine collects the next steps' batches while the trainer updates.

``data.max_staleness = s``. With s = 0 nothing here runs ahead: every step's batch is collected inside the step
with the weights the trainer is at (`RolloutSession.collect`). With s ≥ 1, right
after step i's batch is taken (and before its update), the batches of steps i+1 … i+s are *launched* on the rollout
loop (`RolloutSession.launch`) and run while the trainer updates; weights pushed meanwhile are picked up by the
episodes in flight at their next engine call, so the turns of one episode may carry different versions (partial
rollouts). When step i+j starts, its batch is taken from the launched collection.

**The bound.** Every sampled turn records the version of the weights that sampled it (`Turn.policy_version`). A
turn more than s versions behind the trainer when its batch is taken is never trained on: its *whole episode is
dropped* (``rollout/stale_dropped_episodes``): its stale turns are its first ones, and its return belongs to the
whole episode (docs/async.md). Group schedules push once per step, so the bound holds by
construction and the check is its guard (``rollout/staleness_max`` ≤ s).

**Which batches run ahead** is the schedule's choice through `Learner.collect_batch`: GRPO, Turn-PPO and token-PPO
run their whole batch ahead (``bounded=True``). RTPO runs its *trunks* ahead (``bounded=False``): trunks get no
gradient, they only supply the boundary states S_k, and RTPO pushes once per depth, so a trunk's lag in versions
is a lag in the state distribution, reported as ``rollout/trunk_lag_{mean,max}``; its siblings stay on-policy.

**Correction.** The recorded log-probs are the behaviour policy's; the trainer recomputes π_old whenever a trained
turn is stale (`agentrl.training.update.mismatch`, even when the engine shares the trainer's code) and the truncated
importance weights correct behaviour ≠ π_old. `check_async` refuses settings that would skip either.
"""

from __future__ import annotations

import concurrent.futures
import copy
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrl.agents.base import Task
from agentrl.collect.collector import Collector, CollectStats
from agentrl.engines.worker import lend_until
from agentrl.runview import StepProgress
from agentrl.types import Trajectory

if TYPE_CHECKING:
    from agentrl.engines.specs import EngineSpec
    from agentrl.training.rollout.session import RolloutSession

MakeBatch = Callable[[Collector, list[Task], int], Coroutine[Any, Any, list[Trajectory]]]
"""What a schedule collects first in a step: ``make(collector, tasks, step)`` (GRPO: the groups; RTPO: trunks)."""


def check_async(max_staleness: int, engine_spec: EngineSpec, ppo: Any) -> None:
    """Refuse settings under which ``max_staleness`` ≥ 1 would be wrong: an engine that decodes with the trainer's
    own weights while an optimizer step changes them, or an update that would not recompute π_old and correct
    stale turns."""
    if max_staleness < 1:
        return
    if getattr(engine_spec, "shares_trainer_code", False) and getattr(engine_spec, "weights", None) == "auto":
        engine_spec.weights = "copy"  # type: ignore[attr-defined]  # the embedded engine's default resolves to its own copy under overlap
    if getattr(engine_spec, "shares_trainer_code", False) and getattr(engine_spec, "weights", "shared") != "copy":
        raise ValueError(
            f"data.max_staleness={max_staleness} needs an engine that does not read the trainer's weights while an "
            "optimizer step changes them: set model.engine.init_args.weights: copy (the embedded engine's own copy, "
            "refreshed at every push), or use agentrl serve / vLLM (VLLMEngineSpec)")
    if ppo is not None and getattr(ppo, "recompute_old_logprobs", None) is False:
        raise ValueError(f"data.max_staleness={max_staleness}: algorithm.ppo.recompute_old_logprobs must not be false "
                         "(stale turns are sampled by older weights: pi_old must be recomputed); leave it null")
    if ppo is not None and getattr(ppo, "correction", True) is None:
        raise ValueError(f"data.max_staleness={max_staleness}: algorithm.ppo.correction must not be null (stale turns "
                         "need the truncated importance weights); leave the default truncated_is")


def no_lookahead(step: int) -> list[Task]:
    """The task source of a synchronous run (``max_staleness`` 0): nothing is ever asked for ahead."""
    raise RuntimeError(f"data.max_staleness = 0 collects nothing ahead (asked for step {step}'s tasks)")


def too_stale(trajs: Sequence[Trajectory], version: int, max_staleness: int) -> list[bool]:
    """Per episode: whether a sampled (not replayed) turn was sampled more than ``max_staleness`` versions before
    ``version``."""
    return [any(version - t.policy_version > max_staleness for t in tr.turns if not t.forced) for tr in trajs]


def staleness(trajs: Sequence[Trajectory], version: int, name: str) -> dict[str, float]:
    """``{name}_mean`` and ``{name}_max``: versions behind ``version`` of the episodes' sampled turns."""
    lags = [version - t.policy_version for tr in trajs for t in tr.turns if not t.forced]
    if not lags:
        return {}
    return {f"{name}_mean": sum(lags) / len(lags), f"{name}_max": float(max(lags))}


@dataclass
class _Ahead:
    """One launched batch: for which step and tasks, on which collector copy (its own counters)."""

    step: int
    task_ids: list[str]
    collector: Collector
    future: concurrent.futures.Future[list[Trajectory]]


class Lookahead:
    """The batches launched ahead of the trainer (see the module docstring).

    Args:
        session: The rollout session (loop, engine, collector).
        max_staleness: s; 0 collects every batch inside its step.
        tasks_for: The tasks of a step (the data module's task stream).
        steps: Steps of the run (nothing is launched past the last).
        episodes_per_task: Episodes a task's collection plays (GRPO: the group size; RTPO: trunks per task).
    """

    def __init__(self, session: RolloutSession, max_staleness: int, tasks_for: Callable[[int], list[Task]],
                 steps: int, episodes_per_task: int = 1) -> None:
        self.session = session
        self.max_staleness = max_staleness
        self.tasks_for = tasks_for
        self.steps = steps
        self.episodes_per_task = episodes_per_task
        self._ahead: dict[int, _Ahead] = {}

    def batch(self, step: int, tasks: list[Task], make: MakeBatch, version: int, *,
              bounded: bool = True) -> tuple[list[Trajectory], dict[str, float]]:
        """Step ``step``'s first batch at trainer ``version`` (launched earlier, or collected now), then launch
        the batches of the next s steps. Returns the episodes to train on and the staleness metrics."""
        ahead = self._ahead.pop(step, None)
        if ahead is not None and ahead.task_ids != [t.id for t in tasks]:
            ahead.future.cancel()  # not this step's tasks (the stream moved): collect them now instead
            ahead = None
        if ahead is None:
            trajs = self.session.collect(make(self.session.collector, tasks, step), version)
        else:
            trajs = self._take(ahead, version)
        for later in range(step + 1, min(step + self.max_staleness, self.steps - 1) + 1):
            if later not in self._ahead:
                self._launch(later, make)
        if not bounded:
            return trajs, staleness(trajs, version, "rollout/trunk_lag")
        drop = too_stale(trajs, version, self.max_staleness)
        kept = [t for t, d in zip(trajs, drop, strict=True) if not d]
        metrics = staleness(kept, version, "rollout/staleness")
        metrics["rollout/stale_dropped_episodes"] = float(sum(drop))
        return kept, metrics

    def _launch(self, step: int, make: MakeBatch) -> None:
        tasks = self.tasks_for(step)
        collector = copy.copy(self.session.collector)  # same engine and agent; its own counters and progress
        collector.stats, collector.progress = CollectStats(), StepProgress()
        future = self.session.launch(make(collector, tasks, step))
        self._ahead[step] = _Ahead(step, [t.id for t in tasks], collector, future)

    def _take(self, ahead: _Ahead, version: int) -> list[Trajectory]:
        start = time.perf_counter()
        with self.session.progress.phase("collecting"):
            trajs = lend_until(ahead.future)  # the engine's steps run on this (waiting) thread
        self.session.add_wait(time.perf_counter() - start)
        self.session.add_costs(ahead.collector.reset_stats())
        ahead_of = {t.policy_version for tr in trajs for t in tr.turns if t.policy_version > version}
        if ahead_of:
            raise RuntimeError(f"a launched batch holds turns of versions {sorted(ahead_of)}, newer than the "
                               f"trainer's {version}")
        return trajs

    @property
    def idle(self) -> bool:
        """No launched collection is still running (the engine has nothing of the trainer's to generate)."""
        return all(ahead.future.done() for ahead in self._ahead.values())

    @property
    def pending(self) -> list[int]:
        """Steps whose batches are launched and not yet taken."""
        return sorted(self._ahead)

    def launched(self) -> LaunchedAhead:
        """The batches launched and not yet taken: what a stop now would lose (and a resume collect again)."""
        steps = self.pending
        episodes = sum(len(self._ahead[s].task_ids) * self.episodes_per_task for s in steps)
        finished = sum(self._ahead[s].collector.progress.snapshot().done for s in steps)
        return LaunchedAhead(steps, episodes, min(finished, episodes))

    def cancel(self) -> LaunchedAhead:
        """Cancel every launched batch (the run stops); returns what was launched and not yet taken."""
        launched = self.launched()
        for ahead in self._ahead.values():
            ahead.future.cancel()
        self._ahead.clear()
        return launched


@dataclass(frozen=True)
class LaunchedAhead:
    """Batches launched ahead and not yet trained on. They are not in a checkpoint: a stop loses them and a resume
    collects them again (same tasks and sampling seeds, the restored weights).

    Attributes:
        steps: Their steps (0-based RL step indices).
        episodes: Episodes they hold, finished or not.
        finished: Of those, episodes already finished when this was read (the rest were in flight).
    """

    steps: list[int]
    episodes: int
    finished: int

    def state(self) -> dict[str, Any]:
        """For the checkpoint (plain ints: loads with ``weights_only=True``)."""
        return {"steps": list(self.steps), "episodes": self.episodes, "finished": self.finished}

    @staticmethod
    def of(state: dict[str, Any] | None) -> LaunchedAhead:
        state = state or {}
        return LaunchedAhead([int(s) for s in state.get("steps", [])], int(state.get("episodes", 0)),
                             int(state.get("finished", 0)))
