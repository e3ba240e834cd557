"""`RolloutSession`: the rollout side of a run — the asyncio loop, the engine and the collector, from start to stop.

The trainer (`AgentRLModule`) owns one session per fit. The session starts the loop thread and the engine, builds
the collector, runs the engine's own preflight, and serves the weights it is given; after that it does three
things, each checked:

* **collect** — run a collection for training. The engine must serve the version the trainer is at, and every
  sampled (not replayed) turn must carry that version afterwards; the collection's cost (episodes, failures,
  generated tokens, sampled turns, seconds) is added to the step's counters (`take_costs`).
* **push** — serve new weights under a new version number (a version bump for the embedded engine on shared
  weights, a refresh of its weight copy, a LoRA hot-load for vLLM); its wall time is counted.
* **play** — held-out episodes for evaluation, with the sampling passed as a value (greedy evaluation is
  ``temperature=0``), outside the training counters.
* **launch** — start a collection and return at once (bounded-staleness collection,
  `agentrl.training.rollout.async_collect`, waits on it later); no version check: the caller bounds the versions itself.

Every training collection, waited for or launched, is counted in `activity` (when any was in flight), so a step can
say what share of its wall time the engine had no work (``perf/engine_idle_frac``); the time the trainer blocked on
a collection is the step's ``trainer_wait_seconds``.

It knows nothing of optimizers, losses or Lightning.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from agentrl.collect.runtime import RolloutRuntime
from agentrl.runview import StepProgress
from agentrl.types import Trajectory

if TYPE_CHECKING:
    from agentrl.agents.base import Task
    from agentrl.collect.collector import Collector, CollectStats
    from agentrl.engines.base import RolloutEngine
    from agentrl.engines.specs import EngineSpec
    from agentrl.models.policy import Policy

T = TypeVar("T")
MakeCollector = Callable[[Any, Any], "Collector"]


class Activity:
    """When training collections were in flight: intervals of perf-counter time with at least one running.

    Entered and left on the rollout loop (launched collections) and the trainer's thread (waited ones), hence the
    lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._since = 0.0
        self._spans: list[tuple[float, float]] = []

    def enter(self) -> None:
        with self._lock:
            if self._running == 0:
                self._since = time.perf_counter()
            self._running += 1

    def leave(self) -> None:
        with self._lock:
            self._running -= 1
            if self._running == 0:
                self._spans.append((self._since, time.perf_counter()))

    def busy(self, start: float, end: float) -> float:
        """Seconds of ``[start, end]`` with a collection in flight; forgets the spans that ended before ``start``."""
        with self._lock:
            spans = self._spans + ([(self._since, end)] if self._running else [])
            self._spans = [(a, b) for a, b in self._spans if b > start]
        return sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)

    async def track(self, coro: Coroutine[Any, Any, T]) -> T:
        self.enter()
        try:
            return await coro
        finally:
            self.leave()


class RolloutSession:
    """The loop, engine and collector of one fit (see the module docstring).

    Args:
        engine_spec: What engine to build (`agentrl.engines.specs`).
        progress: The run's progress channel: collections and evaluations are told there, episode by episode.
    """

    def __init__(self, engine_spec: EngineSpec, progress: StepProgress | None = None) -> None:
        self.engine_spec = engine_spec
        self.progress = progress or StepProgress()
        self._runtime: RolloutRuntime | None = None
        self._engine: RolloutEngine | None = None
        self._collector: Collector | None = None
        self._costs: defaultdict[str, float] = defaultdict(float)
        self.activity = Activity()
        self.temperature = 1.0  # the training sampling temperature, kept after a stop (scoring uses it)

    @property
    def started(self) -> bool:
        return self._collector is not None

    @property
    def collector(self) -> Collector:
        if self._collector is None:
            raise RuntimeError("the rollout session is not started (fit not started)")
        return self._collector

    @property
    def engine(self) -> RolloutEngine:
        if self._engine is None:
            raise RuntimeError("the rollout session has no engine yet (fit not started)")
        return self._engine

    def start(self, policy: Policy, make_collector: MakeCollector, version: int) -> None:
        """Start the loop and the engine on ``policy``, build the collector, and serve ``policy`` as ``version``."""
        self.stop()
        self._runtime = RolloutRuntime()
        self._engine = self.engine_spec.build(policy)
        self._collector = make_collector(self._engine, policy.tokenizer)
        self._collector.progress = self.progress
        self.temperature = self._collector.sampling.temperature or 1.0
        check = getattr(self._engine, "preflight", None)  # e.g. vLLM's log-prob mode against the temperature
        if check is not None:
            self.run(check(self._collector.sampling))
        self.push(policy, version)

    def stop(self) -> None:
        """Shut the engine down and stop the loop (idempotent)."""
        if self._runtime is not None:
            shutdown = getattr(self._engine, "shutdown", None)
            if shutdown is not None:
                self._runtime.run(shutdown())
            self._runtime.close()
        self._runtime = self._engine = self._collector = None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._runtime is None:
            raise RuntimeError("rollout runtime not started")
        return self._runtime.run(coro)

    def push(self, policy: Policy, version: int) -> None:
        """Serve ``policy``'s weights as ``version``: every later rollout uses them. Its wall time is counted
        (``engine_push_seconds`` / ``engine_pushes``), with the size of the weights the engine holds itself where
        it says (``weights_bytes``: the embedded engine's weight copy, 0 when it shares the policy's)."""
        start = time.perf_counter()
        self.run(self.engine.update_weights(policy, version=version))
        self._costs["engine_push_seconds"] += time.perf_counter() - start
        self._costs["engine_pushes"] += 1
        held = getattr(self.engine, "weights_bytes", None)
        if isinstance(held, int):
            self._costs["engine_weights_bytes"] = float(held)  # a size, not a sum: the latest

    def drop_prefix_cache(self) -> None:
        """Drop the embedded engine's prefix KV cache (stale once the weights change; engines without one: no-op)."""
        drop = getattr(self._engine, "drop_prefix_cache", None)
        if callable(drop):
            drop()

    def before_update(self, engine_idle: bool) -> None:
        """Give back what the engine holds that the trainer's update does not need: its prefix KV cache, and, when
        no collection is launched (``engine_idle``), its weight copy's storage, which the push after the update
        allocates again (`HFEngine.release_weights`; ``engine_released_bytes``: the most any of the step's updates
        freed, 0 when the copy was kept for all of them)."""
        self.drop_prefix_cache()
        release = getattr(self._engine, "release_weights", None)
        if callable(release):
            freed = float(self.run(release())) if engine_idle else 0.0
            self._costs["engine_released_bytes"] = max(self._costs.get("engine_released_bytes", 0.0), freed)

    def _check_weights_served(self, coro: Coroutine[Any, Any, Any] | None = None) -> None:
        """Refuse to generate from a weight copy released for an update (``coro``, not started, is closed)."""
        if getattr(getattr(self._engine, "weights", None), "released", False):
            if coro is not None:
                coro.close()
            raise RuntimeError("the engine's weight copy is released for the trainer's update: push the weights "
                               "(Learner.push_weights) before collecting or playing")

    def collect(self, coro: Coroutine[Any, Any, list[Trajectory]], version: int) -> list[Trajectory]:
        """Run one training collection at ``version``: checks the served version before and every sampled turn's
        stamp after, and adds the collection's cost to the step's counters."""
        self._check_weights_served(coro)
        if self.engine.version != version:
            coro.close()
            raise RuntimeError(f"engine serves version {self.engine.version} but the policy is at {version}: "
                               "push the weights before collecting")
        waited = time.perf_counter()
        with self.progress.phase("collecting"):
            trajs = self.run(self.activity.track(coro))
        self._costs["trainer_wait_seconds"] += time.perf_counter() - waited
        stale = {t.policy_version for tr in trajs for t in tr.turns if not t.forced} - {version}
        if stale:
            raise RuntimeError(f"rollouts used stale weights (versions {sorted(stale)}, current {version})")
        self.add_costs(self.collector.reset_stats())
        return trajs

    def launch(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start a training collection on the loop and return its future at once (counted in `activity`; the
        caller checks the versions and adds the cost with `add_costs`)."""
        if self._runtime is None:
            coro.close()
            raise RuntimeError("rollout runtime not started")
        self._check_weights_served(coro)
        return self._runtime.submit(self.activity.track(coro))

    def add_wait(self, seconds: float) -> None:
        """Count ``seconds`` the trainer blocked on a launched collection."""
        self._costs["trainer_wait_seconds"] += seconds

    def add_costs(self, stats: CollectStats) -> None:
        """Add one collection's cost to the step's counters."""
        c = self._costs
        c["episodes"] += stats.episodes
        c["failed"] += stats.failed
        c["generated_tokens"] += stats.generated_tokens
        c["sampled_turns"] += stats.sampled_turns
        c["rollout_seconds"] += stats.seconds

    def take_costs(self) -> dict[str, float]:
        """The counters of the collections since the last call (and reset them)."""
        costs, self._costs = dict(self._costs), defaultdict(float)
        return costs

    def play(self, tasks: Sequence[Task], *, temperature: float | None = None,
             concurrency: int | None = None) -> list[Trajectory]:
        """One episode of each of ``tasks`` with the served weights, at the training sampling or at
        ``temperature``, at most ``concurrency`` at once (default: the collector's); not counted in the training
        costs. One at a time, the episodes' tokens do not depend on timing: see `EvalPlan.concurrency`."""
        self._check_weights_served()
        sampling = self.collector.sampling
        if temperature is not None:
            sampling = replace(sampling, temperature=temperature)
        collector_concurrency = self.collector.concurrency
        self.collector.concurrency = concurrency or collector_concurrency
        try:
            with self.progress.phase("evaluating"):
                return self.run(self.collector.collect_groups(tasks, 1, step=-1, sampling=sampling))
        finally:
            self.collector.concurrency = collector_concurrency
            self.collector.reset_stats()
