"""Held-out evaluation and the generated-token budget of a run.

An evaluation plays ``data.eval_episodes`` held-out tasks once each with the current weights and logs ``eval/*``
(success, reward, ..., and the standard errors ``eval/success_se``, ``eval/reward_se``). The episodes' sampling
seeds come from ``data.seed`` and the task, not the step, and they are played ``data.eval_concurrency`` at a time
(1 by default: the tokens then do not depend on timing), so ``agentrl validate`` on the last checkpoint at the
run's seed replays the run's final evaluation. With ``data.eval_greedy`` it plays them a second time greedily
(temperature 0) and logs ``eval/greedy_*``. Every evaluation also logs ``eval/generated_tokens``: the tokens the
run had sampled for training when it was taken, so learning curves of schedules that spend tokens at different
rates can be drawn on one axis (the learning benchmark compares them at equal generation budgets).

When evaluations run (`EvalPlan`): at the start (the base model), every ``data.eval_every`` steps, every
``data.eval_every_tokens`` generated tokens, and at the end. ``data.max_generated_tokens`` ends the run (with its
final evaluation) at the first step that reaches the budget; ``data.steps`` stays an upper bound.

The held-out episodes themselves come back with the metrics (`HeldOut`): ``agentrl fit`` and ``agentrl validate``
hand them to the callbacks (`TrajectoryLogger` records them as MLflow traces tagged ``agentrl.phase = eval``).

Everything here takes values (the plan, the rollout session, counts) and returns values; the trainer logs the
metrics and decides to stop.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl

from agentrl.training.schedules.base import rollout_metrics
from agentrl.training.system.metrics import expose_metrics
from agentrl.training.system.perf import peak_rise_metrics

if TYPE_CHECKING:
    from agentrl.agents.base import Task
    from agentrl.models.memory import PeakRise
    from agentrl.training.rollout.datamodule import RolloutDataModule
    from agentrl.training.rollout.session import RolloutSession
    from agentrl.types import Trajectory


@dataclass(frozen=True)
class EvalPlan:
    """When to evaluate and when the budget ends the run (the ``data.*`` settings of the same names)."""

    episodes: int = 0
    greedy: bool = False
    every: int = 0
    every_tokens: int = 0
    steps: int = 1
    max_generated_tokens: int | None = None
    # episodes played at once. The embedded engine decodes the requests in flight as one batch, and a row's logits
    # depend (in their last bits) on which rows share its batch, which depends on thread timing: batched, two
    # evaluations of one checkpoint at one seed can differ. One at a time, they are the same
    concurrency: int = 1

    @classmethod
    def of(cls, data: RolloutDataModule) -> EvalPlan:
        """The plan of a data module's settings."""
        return cls(episodes=data.eval_episodes, greedy=data.eval_greedy, every=data.eval_every,
                   every_tokens=data.eval_every_tokens, steps=data.steps,
                   max_generated_tokens=data.max_generated_tokens, concurrency=data.eval_concurrency)

    def budget_spent(self, generated_tokens: int) -> bool:
        """True once the run has sampled ``max_generated_tokens`` tokens for training."""
        return self.max_generated_tokens is not None and generated_tokens >= self.max_generated_tokens

    def due_after(self, step: int, tokens_before: int, tokens_after: int) -> bool:
        """Whether an evaluation follows step ``step`` (not the last one: the final evaluation covers it)."""
        if not self.episodes or step >= self.steps:
            return False
        by_steps = bool(self.every) and step % self.every == 0
        by_tokens = bool(self.every_tokens) and tokens_after // self.every_tokens > tokens_before // self.every_tokens
        return by_steps or by_tokens

    def final_due(self, step: int, generated_tokens: int) -> bool:
        """The final evaluation: after the last step or the spent budget, not after a requested stop."""
        return step >= self.steps or self.budget_spent(generated_tokens)


@dataclass(frozen=True)
class HeldOut:
    """One held-out evaluation: its ``eval/*`` metrics and the episodes played (sampled, then greedy if asked)."""

    label: str
    step: int
    metrics: dict[str, float]
    episodes: list[Trajectory] = field(default_factory=list)
    greedy_episodes: list[Trajectory] = field(default_factory=list)


def evaluate(session: RolloutSession, tasks: Sequence[Task], *, greedy: bool, generated_tokens: int,
             label: str = "", step: int = 0, concurrency: int | None = None) -> HeldOut:
    """Play ``tasks`` with the served weights (sampled, and greedily if asked), ``concurrency`` at once:
    ``eval/*`` metrics and episodes."""
    episodes = session.play(tasks, concurrency=concurrency)
    metrics = {k.replace("rollout/", "eval/"): v for k, v in rollout_metrics(episodes).items()}
    metrics.update(standard_errors(episodes))
    greedy_episodes = session.play(tasks, temperature=0.0, concurrency=concurrency) if greedy else []
    if greedy:
        metrics.update({k.replace("rollout/", "eval/greedy_"): v for k, v in rollout_metrics(greedy_episodes).items()})
    metrics["eval/generated_tokens"] = float(generated_tokens)
    return HeldOut(label, step, metrics, episodes, greedy_episodes)


def standard_errors(episodes: Sequence[Trajectory]) -> dict[str, float]:
    """``eval/success_se`` and ``eval/reward_se``: the standard error of the mean over the finished episodes
    (sample standard deviation / sqrt(n); 0 for fewer than two) — how far another seed's evaluation may land."""
    ok = [t for t in episodes if not t.failed]
    out = {}
    for name, values in (("success", [float(t.success) for t in ok]), ("reward", [t.total_reward for t in ok])):
        n = len(values)
        mean = sum(values) / max(n, 1)
        var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
        out[f"eval/{name}_se"] = math.sqrt(var / n) if n > 1 else 0.0
    return out


def summary_line(label: str, episodes: int, metrics: Mapping[str, float], greedy: bool, seed: int | None = None) -> str:
    """The line an evaluation prints: success and reward ± their standard errors, and the episodes' seed."""
    nan = float("nan")
    line = (f"success {metrics.get('eval/success', nan):.3f} ± {metrics.get('eval/success_se', nan):.3f}, "
            f"reward {metrics.get('eval/reward', nan):.3f} ± {metrics.get('eval/reward_se', nan):.3f}")
    if greedy:
        line += f", greedy success {metrics.get('eval/greedy_success', nan):.3f}"
    seeded = f"; seed {seed}" if seed is not None else ""
    return f"[agentrl] {label} evaluation on {episodes} held-out episodes: {line} (± standard error{seeded})"


def publish(trainer: pl.Trainer, held_out: HeldOut, metrics: Mapping[str, float], plan: EvalPlan,
            seed: int | None = None) -> None:
    """Log an evaluation's ``metrics`` to every logger (`trainer.logger` is only the first of several) at its step
    and into ``trainer.callback_metrics``, print its line (with ``seed``, the episodes' ``data.seed``) and hand it
    to the callbacks (`tell_callbacks`: e.g. TrajectoryLogger traces the episodes)."""
    for logger in trainer.loggers:
        logger.log_metrics(dict(metrics), step=held_out.step)
        logger.save()
    expose_metrics(trainer, metrics)
    print(summary_line(held_out.label, plan.episodes, metrics, plan.greedy, seed), flush=True)
    tell_callbacks(trainer, held_out)


def tell_callbacks(trainer: pl.Trainer, held_out: HeldOut) -> None:
    """Hand an evaluation to every callback with an ``on_heldout_evaluation(trainer, pl_module, held_out)`` method.

    Lightning has no hook for it: the base evaluation runs in the module's ``on_train_start``, the final one in its
    ``on_train_end``, both after the callbacks' hooks of the same name, so a callback would see them late or never.
    """
    for callback in trainer.callbacks:  # type: ignore[attr-defined]  # set by Lightning, not declared
        hook = getattr(callback, "on_heldout_evaluation", None)
        if callable(hook):
            hook(trainer, trainer.lightning_module, held_out)


def continue_finished_run(trainer: pl.Trainer | None, checkpoint: Mapping[str, Any], rl_step: int) -> None:
    """Resuming a finished run with a larger ``data.steps`` trains the steps it lacks.

    A run is one Lightning epoch of ``data.steps`` batches; its last checkpoint records that epoch as done, so
    Lightning's loop (``max_epochs: 1``) would stop at once: the resume trained nothing and printed ``done: 6 steps
    in 0:00:00``. The loop gets one more epoch, over what the task stream (restored at its step) has left. With
    nothing left to train (``data.steps`` at the checkpoint's step) it gets none, but at least the epochs done: a
    checkpoint of a run continued this way records 2 epochs, which Lightning refuses under ``max_epochs: 1``.
    """
    if trainer is None or trainer.state.fn != "fit":
        return
    progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress", {}).get("current", {})
    epochs_done = int(progress.get("processed", 0))
    loop = trainer.fit_loop
    if not isinstance(loop.max_epochs, int) or loop.max_epochs < 0:
        return
    if rl_step >= getattr(trainer.datamodule, "steps", 0):  # type: ignore[attr-defined]
        loop.max_epochs = max(loop.max_epochs, epochs_done)
    elif loop.max_epochs <= epochs_done:
        loop.max_epochs = epochs_done + 1


class Evaluator:
    """The module's held-out evaluations: plays them with the served weights on rank 0, logs ``eval/*`` (with the
    peak-memory rise of the evaluation) to every logger, prints the line and tells the callbacks."""

    def __init__(self, session: RolloutSession, peak_rise: PeakRise) -> None:
        self.session, self.peak_rise = session, peak_rise

    def run(self, trainer: pl.Trainer, data: RolloutDataModule, label: str, *, step: int,
            generated_tokens: int) -> dict[str, float]:
        """One evaluation labelled ``label`` at RL step ``step``; its metrics ({} when nothing was played)."""
        plan = EvalPlan.of(data)
        if not plan.episodes or not self.session.started or not trainer.is_global_zero:
            return {}
        held_out = evaluate(self.session, data.eval_task_list(), greedy=plan.greedy,
                            generated_tokens=generated_tokens, label=label, step=step, concurrency=plan.concurrency)
        metrics = held_out.metrics | peak_rise_metrics(self.peak_rise, evaluation=True)
        publish(trainer, held_out, metrics, plan, data.seed)
        return metrics
