"""`RolloutDataModule`: where tasks come from and how episodes are collected.

The training "dataloader" yields one list of tasks per step (cheap and deterministic); the rollouts themselves
are collected live inside the training step with the current weights, through the collector this module builds.
Lightning may prefetch the next list of tasks; it cannot prefetch rollouts.

Tasks are sharded by rank (rank r of W takes its own slice of each step's tasks), and the stream is stateful
(``state_dict``/``load_state_dict``), so a resumed run continues with the tasks it would have seen.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import lightning.pytorch as pl

from agentrl.agents.base import Agent, Task
from agentrl.agents.http_agent import HTTPAgent
from agentrl.collect.collector import Collector
from agentrl.engines.base import RolloutEngine, SamplingParams


@runtime_checkable
class TaskSource(Protocol):
    def task(self, index: int) -> Task:
        """The task at position ``index`` (any non-negative integer: sources cycle or generate)."""
        ...


class SeedTasks:
    """Environment tasks: task i plays the environment with seed ``offset + i``.

    Args:
        offset: First seed. Keep training and evaluation offsets far apart so they never share a seed.
        prefix: Prefix of task ids.
    """

    def __init__(self, offset: int = 0, prefix: str = "seed") -> None:
        if offset < 0:
            raise ValueError(f"tasks.offset must be >= 0, got {offset}")
        self.offset = offset
        self.prefix = prefix

    def task(self, index: int) -> Task:
        seed = self.offset + index
        return Task(id=f"{self.prefix}-{seed}", seed=seed)


class JsonlTasks:
    """Tasks from a JSON-lines file, one object per line, cycled. Each row becomes ``Task.data``.

    Args:
        path: The file.
        id_field: Field holding the task id (default: the line number).
        seed_field: Field holding the environment seed (default: the line number).
    """

    def __init__(self, path: str, id_field: str | None = None, seed_field: str | None = None) -> None:
        file = Path(path)
        if not file.is_file():
            raise ValueError(f"tasks.path: file not found: {path}")
        self.rows: list[dict[str, Any]] = []
        for n, line in enumerate(file.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"tasks.path {path}, line {n}: not JSON ({exc.msg})") from exc
            if not isinstance(row, dict):
                raise ValueError(f"tasks.path {path}, line {n}: expected a JSON object")
            self.rows.append(row)
        if not self.rows:
            raise ValueError(f"tasks.path {path} holds no tasks")
        self.id_field, self.seed_field = id_field, seed_field

    def task(self, index: int) -> Task:
        i = index % len(self.rows)
        row = self.rows[i]
        tid = str(row[self.id_field]) if self.id_field else f"row-{i}"
        seed = int(row[self.seed_field]) if self.seed_field else i
        return Task(id=tid, seed=seed, data=row)


class TaskStream:
    """One list of tasks per step, sharded by rank; stateful so a resume continues where it stopped."""

    def __init__(self, source: TaskSource, tasks_per_step: int, steps: int, rank: int = 0, world_size: int = 1):
        self.source = source
        self.tasks_per_step = tasks_per_step
        self.steps = steps
        self.rank, self.world_size = rank, world_size
        self.step = 0

    def tasks_for(self, step: int) -> list[Task]:
        first = (step * self.world_size + self.rank) * self.tasks_per_step
        return [self.source.task(first + i) for i in range(self.tasks_per_step)]

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[Task]]:
        while self.step < self.steps:
            tasks = self.tasks_for(self.step)
            self.step += 1
            yield tasks

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = int(state["step"])


class RolloutDataModule(pl.LightningDataModule):
    """Tasks and live rollouts.

    Args:
        agent: The agent (``EnvAgent`` over an environment, a LangChain agent, ...).
        tasks: Training task source (default: environment seeds from 0).
        batch_size: Episodes per step (tasks per step × the schedule's episodes per task).
        steps: Training steps (RL iterations) of the run.
        sampling: Sampling parameters of rollouts (temperature 1.0 by default, as Turn-PPO recommends).
        concurrency: Episodes in flight at once.
        episode_timeout: Seconds before an episode is ended as failed.
        max_failed_fraction: A collection with more failed episodes than this fraction stops the run.
        max_turns: Hard cap on LLM calls per episode (on top of the agent's own limit).
        eval_tasks: Held-out task source (default: environment seeds from 1,000,000).
        eval_episodes: Episodes of the evaluation run at the start (the base success rate) and every
            ``eval_every`` steps; 0 disables.
        eval_every: Steps between evaluations (0: only at the start and the end).
        eval_every_tokens: Also evaluate each time the run's generated training tokens cross a multiple of this
            (0: off); see `agentrl.training.system.evaluation`.
        eval_greedy: Play the held-out tasks a second time greedily (temperature 0) and log ``eval/greedy_*``.
        eval_concurrency: Held-out episodes played at once. 1 (the default): an evaluation gives the same episodes
            at the same ``seed`` (``agentrl validate`` on the last checkpoint = the run's final evaluation); more
            is faster, but the embedded engine's batched decode makes the tokens depend on timing.
        max_generated_tokens: End the run at the first step whose generated training tokens reach this budget
            (None: run ``steps`` steps). Learning comparisons across schedules use it.
        seed: Run seed mixed into every episode's sampling seed.
        max_staleness: How many policy versions the collector may run ahead of the trainer (s). 0: every step's
            episodes are collected inside the step with its weights (synchronous). s >= 1: the next s steps' batches
            are collected while the trainer updates, and a turn sampled more than s versions before the trainer's
            weights is never trained on (docs/async.md, `agentrl.training.rollout.async_collect`).
    """

    def __init__(
        self,
        agent: Agent,
        tasks: TaskSource | None = None,
        *,
        batch_size: int = 8,
        steps: int = 20,
        sampling: SamplingParams | None = None,
        concurrency: int = 32,
        episode_timeout: float = 600.0,
        max_failed_fraction: float = 0.5,
        max_turns: int | None = None,
        eval_tasks: TaskSource | None = None,
        eval_episodes: int = 0,
        eval_every: int = 0,
        eval_every_tokens: int = 0,
        eval_greedy: bool = False,
        eval_concurrency: int = 1,
        max_generated_tokens: int | None = None,
        seed: int = 0,
        max_staleness: int = 0,
    ) -> None:
        super().__init__()
        for name, value, low in (("batch_size", batch_size, 1), ("max_staleness", max_staleness, 0),
                                 ("steps", steps, 1), ("concurrency", concurrency, 1),
                                 ("eval_episodes", eval_episodes, 0), ("eval_every", eval_every, 0),
                                 ("eval_every_tokens", eval_every_tokens, 0), ("eval_concurrency", eval_concurrency, 1),
                                 ("max_generated_tokens", 1 if max_generated_tokens is None else max_generated_tokens,
                                  1)):
            if not isinstance(value, int) or value < low:  # None from a config's null too: not an int
                raise ValueError(f"data.{name} must be an integer >= {low}, got {value!r}")
        if not episode_timeout > 0:
            raise ValueError(f"data.episode_timeout must be > 0 seconds, got {episode_timeout}")
        if not 0.0 <= max_failed_fraction <= 1.0:
            raise ValueError(f"data.max_failed_fraction must be in [0, 1], got {max_failed_fraction}")
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"data.max_turns must be >= 1 or null, got {max_turns}")
        unused = [name for name, value in (("eval_every", eval_every), ("eval_every_tokens", eval_every_tokens),
                                           ("eval_greedy", eval_greedy)) if value]
        if unused and eval_episodes == 0:
            raise ValueError(f"data.{unused[0]} is set but data.eval_episodes is 0, so no evaluation runs: set "
                             "data.eval_episodes > 0, or leave the eval settings unset")
        self.agent = agent
        self.tasks = tasks or SeedTasks()
        self.eval_tasks = eval_tasks or SeedTasks(offset=1_000_000, prefix="eval")
        self.batch_size = batch_size
        self.steps = steps
        self.sampling = sampling or SamplingParams(max_tokens=64)
        self.concurrency = concurrency
        self.episode_timeout = episode_timeout
        self.max_failed_fraction = max_failed_fraction
        self.max_turns = max_turns
        self.eval_episodes = eval_episodes
        self.eval_every = eval_every
        self.eval_every_tokens = eval_every_tokens
        self.eval_greedy = eval_greedy
        self.eval_concurrency = eval_concurrency
        self.max_generated_tokens = max_generated_tokens
        self.seed = seed
        self.max_staleness = max_staleness
        self.episodes_per_task = 1
        self._stream: TaskStream | None = None

    def configure(self, episodes_per_task: int) -> None:
        """Size the batch for the schedule; called before any work, so a bad size stops the run at once."""
        if self.batch_size < episodes_per_task:
            raise ValueError(
                f"data.batch_size={self.batch_size} is smaller than one group of the algorithm "
                f"({episodes_per_task} episodes per task): each step needs at least one whole group"
            )
        if self.batch_size % episodes_per_task:
            raise ValueError(f"data.batch_size={self.batch_size} must be a multiple of the algorithm's "
                             f"{episodes_per_task} episodes per task")
        self.episodes_per_task = episodes_per_task

    @property
    def tasks_per_step(self) -> int:
        return self.batch_size // self.episodes_per_task

    def train_dataloader(self) -> TaskStream:
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        if self._stream is None:
            self._stream = TaskStream(self.tasks, self.tasks_per_step, self.steps, rank, world)
        return self._stream

    def val_dataloader(self) -> TaskStream:
        """``agentrl validate``: one batch, the held-out tasks (`AgentRLModule.validation_step` plays them)."""
        return TaskStream(self.eval_tasks, self.eval_episodes, steps=1)

    def state_dict(self) -> dict[str, Any]:
        return {"stream": self._stream.state_dict() if self._stream else {"step": 0}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.train_dataloader().load_state_dict(state_dict["stream"])

    def make_collector(self, engine: RolloutEngine, tokenizer: Any) -> Collector:
        if isinstance(self.agent, HTTPAgent) and self.agent.routes is None:
            # only agents that speak HTTP get the training gateway; it starts with their first episode
            from agentrl.serve.gateway import TrainingGateway

            self.agent.attach(TrainingGateway(api_key=self.agent.api_key))
        return Collector(engine, self.agent, tokenizer, sampling=self.sampling, concurrency=self.concurrency,
                         episode_timeout=self.episode_timeout, max_failed_fraction=self.max_failed_fraction,
                         max_turns=self.max_turns, seed=self.seed)

    def eval_task_list(self) -> list[Task]:
        return [self.eval_tasks.task(i) for i in range(self.eval_episodes)]
