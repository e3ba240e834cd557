"""Held-out evaluation and the generated-token budget of a run.

An evaluation plays ``data.eval_episodes`` held-out tasks once each with the current weights and logs ``eval/*``
(success, reward, ...). With ``data.eval_greedy`` it plays them a second time greedily (temperature 0) and logs
``eval/greedy_*``. Every evaluation also logs ``eval/generated_tokens``: the tokens the run had sampled for
training when it was taken, so learning curves of schedules that spend tokens at different rates can be drawn
on one axis (the learning benchmark compares them at equal generation budgets).

When evaluations run (`EvalPlan`): at the start (the base model), every ``data.eval_every`` steps, every
``data.eval_every_tokens`` generated tokens, and at the end. ``data.max_generated_tokens`` ends the run (with its
final evaluation) at the first step that reaches the budget; ``data.steps`` stays an upper bound.

Everything here takes values (the plan, the rollout session, counts) and returns values; the trainer logs the
metrics and decides to stop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentrl.training.schedules import rollout_metrics

if TYPE_CHECKING:
    from agentrl.agents.base import Task
    from agentrl.training.datamodule import RolloutDataModule
    from agentrl.training.session import RolloutSession


@dataclass(frozen=True)
class EvalPlan:
    """When to evaluate and when the budget ends the run (the ``data.*`` settings of the same names)."""

    episodes: int = 0
    greedy: bool = False
    every: int = 0
    every_tokens: int = 0
    steps: int = 1
    max_generated_tokens: int | None = None

    @classmethod
    def of(cls, data: RolloutDataModule) -> EvalPlan:
        """The plan of a data module's settings."""
        return cls(episodes=data.eval_episodes, greedy=data.eval_greedy, every=data.eval_every,
                   every_tokens=data.eval_every_tokens, steps=data.steps,
                   max_generated_tokens=data.max_generated_tokens)

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


def evaluate(session: RolloutSession, tasks: Sequence[Task], *, greedy: bool,
             generated_tokens: int) -> dict[str, float]:
    """Play ``tasks`` with the served weights (sampled, and greedily if asked): ``eval/*`` metrics."""
    metrics = {k.replace("rollout/", "eval/"): v for k, v in rollout_metrics(session.play(tasks)).items()}
    if greedy:
        played = session.play(tasks, temperature=0.0)
        metrics.update({k.replace("rollout/", "eval/greedy_"): v for k, v in rollout_metrics(played).items()})
    metrics["eval/generated_tokens"] = float(generated_tokens)
    return metrics


def summary_line(label: str, episodes: int, metrics: Mapping[str, float], greedy: bool) -> str:
    """The line an evaluation prints."""
    nan = float("nan")
    line = f"success {metrics.get('eval/success', nan):.3f}, reward {metrics.get('eval/reward', nan):.3f}"
    if greedy:
        line += f", greedy success {metrics.get('eval/greedy_success', nan):.3f}"
    return f"[agentrl] {label} evaluation on {episodes} held-out episodes: {line}"
