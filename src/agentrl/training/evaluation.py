"""Held-out evaluation and the generated-token budget of a run.

An evaluation plays ``data.eval_episodes`` held-out tasks once each with the current weights and logs ``eval/*``
(success, reward, ...). With ``data.eval_greedy`` it plays them a second time greedily (temperature 0) and logs
``eval/greedy_*``. Every evaluation also logs ``eval/generated_tokens``: the tokens the run had sampled for
training when it was taken, so learning curves of schedules that spend tokens at different rates can be drawn
on one axis (the learning benchmark compares them at equal generation budgets).

When evaluations run: at the start (the base model), every ``data.eval_every`` steps, every
``data.eval_every_tokens`` generated tokens, and at the end. ``data.max_generated_tokens`` ends the run (with its
final evaluation) at the first step that reaches the budget; ``data.steps`` stays an upper bound.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.training.module import AgentRLModule


def _play(module: AgentRLModule, prefix: str, temperature: float | None) -> dict[str, float]:
    from agentrl.training.schedules import rollout_metrics

    dm: Any = module.trainer.datamodule  # type: ignore[attr-defined]
    collector = module.collector
    sampling = collector.sampling
    if temperature is not None:
        collector.sampling = replace(sampling, temperature=temperature)
    try:
        trajs = module.run_async(collector.collect_groups(dm.eval_task_list(), 1, step=-1))
    finally:
        collector.sampling = sampling
        collector.reset_stats()
    return {k.replace("rollout/", prefix): v for k, v in rollout_metrics(trajs).items()}


def evaluate(module: AgentRLModule, label: str) -> dict[str, float]:
    """Play the held-out tasks with the current weights (sampled, and greedily if asked); log and print."""
    dm: Any = module.trainer.datamodule  # type: ignore[attr-defined]
    if not dm.eval_episodes or module._collector is None or not module.trainer.is_global_zero:
        return {}
    metrics = _play(module, "eval/", None)
    if dm.eval_greedy:
        metrics.update(_play(module, "eval/greedy_", 0.0))
    metrics["eval/generated_tokens"] = float(module.generated_tokens)
    for logger in module.trainer.loggers:  # every logger: `trainer.logger` is only the first of several
        logger.log_metrics(metrics, step=module.rl_step)
    nan = float("nan")
    line = f"success {metrics.get('eval/success', nan):.3f}, reward {metrics.get('eval/reward', nan):.3f}"
    if dm.eval_greedy:
        line += f", greedy success {metrics.get('eval/greedy_success', nan):.3f}"
    print(f"[agentrl] {label} evaluation on {dm.eval_episodes} held-out episodes: {line}", flush=True)
    module.last_eval = metrics
    return metrics


def budget_spent(module: AgentRLModule) -> bool:
    """True once the run has sampled ``data.max_generated_tokens`` tokens for training."""
    budget = module.trainer.datamodule.max_generated_tokens  # type: ignore[attr-defined]
    return budget is not None and module.generated_tokens >= budget


def after_step(module: AgentRLModule, tokens_before: int) -> None:
    """Evaluate on the step and token schedule; stop the run once the token budget is spent."""
    dm: Any = module.trainer.datamodule  # type: ignore[attr-defined]
    if budget_spent(module):
        module.trainer.should_stop = True
        return  # the final evaluation follows in on_train_end
    by_steps = dm.eval_every and module.rl_step % dm.eval_every == 0
    every = dm.eval_every_tokens
    by_tokens = every and module.generated_tokens // every > tokens_before // every
    if (by_steps or by_tokens) and module.rl_step < dm.steps:
        evaluate(module, f"step {module.rl_step} ({module.generated_tokens} tokens)")


def at_end(module: AgentRLModule) -> None:
    """The final evaluation: after the last step or the spent budget, not after a requested stop."""
    dm: Any = module.trainer.datamodule  # type: ignore[attr-defined]
    if module.rl_step >= dm.steps or budget_spent(module):
        evaluate(module, "final")
