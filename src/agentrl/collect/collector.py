"""The collector: many episodes at once over one engine, grouped for GRPO and branched for RTPO.

* `Collector.collect_groups` — ``n`` samples of each task (a GRPO group shares a task; PPO uses n = 1).
* `Collector.collect_trunks` — one (or more) trunk per task for RTPO.
* `Collector.branch` — RTPO siblings at boundary k of each trunk: the agent runs the same task again, the
  client replays the trunk's first k responses (or the agent restores a snapshot), turn k is sampled fresh and
  the episode continues with the current policy to its end.

Seeds: the environment seed is the task's (every sample of a task plays the same instance); the sampling seed of
an episode is derived from (run seed, step, task, role, sample), so a rerun or a resumed run draws the same
rollouts. Failures: an exception in the agent, a tool or the environment, or a timeout, ends that episode as
``failed`` (error recorded, turns kept for review, excluded from the loss); the others are unaffected. Only when
more than ``max_failed_fraction`` of a collection fails does it raise `CollectionError`.

Timeouts: ``episode_timeout`` bounds the episode's own time — its agent code, tools, environment and reward — and
leaves out the time it waits on the engine, so a loaded machine does not fail episodes that are only slow to be
served (a stalled engine is bounded by the engine's own timeout). Past it the agent's coroutine is cancelled;
blocking work in a worker thread (EnvAgent's environment, sync tools or rewards) is abandoned and counted failed.
Blocking code inside an ``async`` agent or tool runs on the event loop and stalls every episode until it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.agents.base import Agent, EpisodeTruncated, Task, check_reward
from agentrl.agents.llm import LLMClient, Replay
from agentrl.chat.tools import HermesToolParser, ToolParser
from agentrl.collect.failures import format_innermost, where_raised
from agentrl.engines.base import RolloutEngine, SamplingParams
from agentrl.runview import StepProgress
from agentrl.seeding import derive_seed
from agentrl.types import Trajectory

log = logging.getLogger(__name__)


class CollectionError(RuntimeError):
    """Too many episodes of one collection failed.

    Attributes:
        trajectories: Every episode of the collection, finished and failed, so that a caller can keep (save,
            log) the completed ones instead of losing them with the exception.
    """

    def __init__(self, message: str, trajectories: Sequence[Trajectory] = ()) -> None:
        super().__init__(message)
        self.trajectories = list(trajectories)


@dataclass
class CollectStats:
    """What one collection cost and how it went."""

    episodes: int = 0
    failed: int = 0
    truncated: int = 0
    turns: int = 0
    sampled_turns: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    def add(self, trajs: Sequence[Trajectory], seconds: float) -> None:
        self.episodes += len(trajs)
        self.failed += sum(t.failed for t in trajs)
        self.truncated += sum(t.truncated for t in trajs)
        self.turns += sum(t.num_turns for t in trajs)
        sampled = [turn for t in trajs for turn in t.turns if not turn.forced]
        self.sampled_turns += len(sampled)
        self.generated_tokens += sum(len(turn.response_ids) for turn in sampled)
        self.seconds += seconds
        self.errors += [t.error for t in trajs if t.failed and t.error][:5]


class Collector:
    """Runs episodes of an agent concurrently and returns token-exact trajectories.

    Args:
        engine: The rollout engine.
        agent: The agent (shared by all episodes; it must keep per-episode state inside ``run``).
        tokenizer: The policy's tokenizer (chat template).
        sampling: Sampling parameters of every LLM call.
        concurrency: Most episodes in flight at once.
        episode_timeout: Seconds before an episode is ended as failed.
        max_failed_fraction: A collection with more failed episodes than this fraction raises.
        max_turns: Hard cap on LLM calls per episode (truncation), on top of the agent's own limit.
        seed: Run seed, mixed into every episode's sampling seed.
        tool_parser: Tool-call format of the LLM client.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        agent: Agent,
        tokenizer: Any,
        *,
        sampling: SamplingParams | None = None,
        concurrency: int = 32,
        episode_timeout: float = 600.0,
        max_failed_fraction: float = 0.5,
        max_turns: int | None = None,
        seed: int = 0,
        tool_parser: ToolParser | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"collector concurrency must be >= 1, got {concurrency}")
        if not 0.0 <= max_failed_fraction <= 1.0:
            raise ValueError(f"max_failed_fraction must be in [0, 1], got {max_failed_fraction}")
        self.engine = engine
        self.agent = agent
        self.tokenizer = tokenizer
        self.sampling = sampling or SamplingParams()
        self.concurrency = concurrency
        self.episode_timeout = episode_timeout
        self.max_failed_fraction = max_failed_fraction
        self.max_turns = max_turns
        self.seed = seed
        self.tool_parser = tool_parser or HermesToolParser()
        self.stats = CollectStats()
        self.progress = StepProgress()  # episodes done and in flight, as they happen (the session sets the run's)

    # ------------------------------------------------------------------ one episode

    async def episode(
        self,
        task: Task,
        *,
        sample_seed: int,
        session: str,
        group: int = 0,
        tree: int | None = None,
        replay: Replay | None = None,
        sampling: SamplingParams | None = None,
    ) -> Trajectory:
        """Run one episode (at ``sampling``, default the collector's); never raises for agent, tool or environment
        errors."""
        llm = LLMClient(self.engine, self.tokenizer, sampling or self.sampling, session=session, seed=sample_seed,
                        tool_parser=self.tool_parser, replay=replay, max_turns=self.max_turns)
        traj = Trajectory(task_id=task.id, seed=sample_seed, group=group, tree=tree,
                          branch_turn=None if replay is None else replay.branch_turn)
        try:
            outcome = await self._run_within_timeout(self.agent.run(task, llm), llm)
            traj.reward = check_reward(outcome.reward, f"the Outcome of {type(self.agent).__name__}.run")
            traj.terminated, traj.truncated = outcome.terminated, outcome.truncated
            traj.info.update(outcome.info)
            if traj.terminated and traj.truncated:
                traj.terminated = False
        except EpisodeTruncated as exc:
            traj.truncated = True
            traj.info["truncation"] = str(exc)
        except TimeoutError:
            traj.failed, traj.info["timed_out"] = True, True
            traj.error = (f"timeout: the episode's own work (agent, tools, environment; time waiting on the engine "
                          f"not counted) passed episode_timeout={self.episode_timeout:g} s and it was abandoned "
                          "(blocking code still running in a worker thread finishes in the background)")
        except Exception as exc:  # any agent/tool/env error fails only this episode
            traj.failed = True
            traj.error = f"{type(exc).__name__}: {exc}{where_raised(exc)}"
            traj.info["traceback"] = format_innermost(exc)  # the frames where it was raised, not the outermost
        traj.turns = llm.turns
        traj.snapshots = llm.snapshots
        traj.info.setdefault("success", False)
        traj.info["prefix_breaks"] = llm.prefix_breaks
        if not traj.failed and not traj.turns:
            traj.failed, traj.error = True, "the agent finished without calling the LLM"
        Trajectory.__post_init__(traj)  # validate the assembled episode
        return traj

    async def _run_within_timeout(self, run: Any, llm: LLMClient) -> Any:
        """Await the agent's ``run`` until its own time (wall time less ``llm.engine_seconds()``) passes
        ``episode_timeout``; then cancel it and raise `TimeoutError`."""
        task = asyncio.ensure_future(run)
        start = time.monotonic()
        try:
            while True:
                left = self.episode_timeout - (time.monotonic() - start - llm.engine_seconds())
                if left <= 0:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                    raise TimeoutError
                done, _ = await asyncio.wait({task}, timeout=left)
                if done:
                    return task.result()
        finally:
            if not task.done():
                task.cancel()

    async def _gather(self, jobs: list[Any]) -> list[Trajectory]:
        gate = asyncio.Semaphore(self.concurrency)

        async def bounded(job: Any) -> Trajectory:
            async with gate:
                self.progress.episode_started()
                traj: Trajectory = await job
                self.progress.episode_finished(sum(len(t.response_ids) for t in traj.turns if not t.forced),
                                               failed=traj.failed)
                return traj

        self.progress.episodes_expected(len(jobs))
        start = time.perf_counter()
        trajs = list(await asyncio.gather(*(bounded(j) for j in jobs)))
        self.stats.add(trajs, time.perf_counter() - start)
        self._check_failures(trajs)
        return trajs

    def _check_failures(self, trajs: list[Trajectory]) -> None:
        failed = [t for t in trajs if t.failed]
        if trajs and len(failed) / len(trajs) > self.max_failed_fraction:
            examples = "; ".join(sorted({t.error or "?" for t in failed})[:3])
            first = next((t for t in failed if t.info.get("traceback")), None)
            where = f"\ntraceback of episode {first.task_id}:\n{first.info['traceback']}" if first else ""
            raise CollectionError(
                f"{len(failed)} of {len(trajs)} episodes failed (more than max_failed_fraction="
                f"{self.max_failed_fraction}); first errors: {examples}{where}",
                trajs,
            )
        for t in failed:
            log.warning("episode %s (seed %d) failed: %s", t.task_id, t.seed, t.error)

    def reset_stats(self) -> CollectStats:
        stats, self.stats = self.stats, CollectStats()
        return stats

    # ------------------------------------------------------------------ collections

    async def collect_groups(self, tasks: Sequence[Task], n: int, *, step: int,
                             sampling: SamplingParams | None = None) -> list[Trajectory]:
        """``n`` episodes of each task (at ``sampling``, default the collector's); trajectories of task i get
        group id i."""
        if n < 1:
            raise ValueError(f"group size must be >= 1, got {n}")
        jobs = [
            self.episode(task, sample_seed=derive_seed(self.seed, step, task.id, "group", j),
                         session=f"{step}/{task.id}/g{j}", group=i, sampling=sampling)
            for i, task in enumerate(tasks) for j in range(n)
        ]
        return await self._gather(jobs)

    async def collect_trunks(self, tasks: Sequence[Task], *, step: int, per_task: int = 1) -> list[Trajectory]:
        """RTPO trunks: ``per_task`` episodes of each task; trunk m gets ``tree = m``."""
        jobs = [
            self.episode(task, sample_seed=derive_seed(self.seed, step, task.id, "trunk", j),
                         session=f"{step}/{task.id}/t{j}", group=i, tree=i * per_task + j)
            for i, task in enumerate(tasks) for j in range(per_task)
        ]
        return await self._gather(jobs)

    async def branch(
        self, trunks: Sequence[Trajectory], tasks: dict[str, Task], k: int, n: int, *, step: int
    ) -> list[Trajectory]:
        """``n`` siblings at boundary ``k`` of every trunk with more than k turns (and not failed).

        Sibling group ids are the trunk's position in ``trunks``, so ``sibling_advantages`` compares the
        siblings of one trunk at one depth.
        """
        jobs = []
        for m, trunk in enumerate(trunks):
            if trunk.failed or trunk.num_turns <= k:
                continue
            snapshot = trunk.snapshots.get(k)
            replay = Replay(trunk.turns, k, snapshot)
            task = tasks[trunk.task_id]
            for j in range(n):
                jobs.append(self.episode(
                    task, sample_seed=derive_seed(self.seed, step, task.id, "branch", trunk.tree, k, j),
                    session=f"{step}/{task.id}/t{trunk.tree}/k{k}/s{j}", group=m, tree=trunk.tree, replay=replay,
                ))
        return await self._gather(jobs)

