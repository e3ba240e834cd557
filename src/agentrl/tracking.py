"""Review runs in MLflow: sample trajectories as traces and a table, the reward curve, the final model.

`TrajectoryLogger` is a Lightning callback (on by default in ``agentrl fit``, configured under ``tracking:``). With
an `MLFlowLogger` it records, at the first step and every ``every_n_steps`` steps, up to ``max_trajectories``
episodes of the step:

* as **MLflow traces** linked to the run: a root span per episode (task, reward, success, how it ended)
  with a child span per turn (type LLM: the new messages, the reply, tokens, mean log-prob, policy version, reward,
  whether it was replayed) and a grandchild span per parsed tool call (type TOOL);
* as rows of the ``trajectories.json`` table (step, task, reward, success, transcript), which the MLflow UI shows
  in its artifact view and can compare across runs.

At the end of training it logs ``reward_curve.png`` (from the run's own metric history) and the final policy
(``final_model/``: the LoRA adapter, or the full weights, with the tokenizer), loadable with
``transformers``/``peft`` ``from_pretrained``.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import MLFlowLogger

from agentrl.types import Trajectory

log = logging.getLogger(__name__)


def transcript(traj: Trajectory, max_chars: int = 4000) -> str:
    """A readable transcript: the new messages of each turn and the model's reply."""
    parts: list[str] = []
    for turn in traj.turns:
        for m in turn.messages or []:
            parts.append(f"[{m.get('role')}] {m.get('content')}")
        tag = " (replayed)" if turn.forced else ""
        parts.append(f"[assistant{tag}] {turn.text}  <reward {turn.reward:+.2f}, {turn.finish_reason}>")
    if traj.failed:
        parts.append(f"[failed] {traj.error}")
    text = "\n".join(parts)
    return text if len(text) <= max_chars else text[: max_chars - 20] + "\n... (truncated)"


class TrajectoryLogger(pl.Callback):
    """Log sample trajectories, the reward curve and the final model to MLflow.

    Args:
        every_n_steps: Steps between samples (0 disables trajectory logging).
        max_trajectories: Episodes logged per sampled step.
        traces: Log MLflow traces (besides the table).
        log_final_model: Log the trained policy as the ``final_model`` artifact at the end.
    """

    def __init__(self, every_n_steps: int = 5, max_trajectories: int = 4, traces: bool = True,
                 log_final_model: bool = True) -> None:
        if every_n_steps < 0 or max_trajectories < 0:
            raise ValueError("tracking.every_n_steps and tracking.max_trajectories must be >= 0")
        self.every_n_steps = every_n_steps
        self.max_trajectories = max_trajectories
        self.traces = traces
        self.log_final_model = log_final_model
        self._rows: list[dict[str, Any]] = []

    @staticmethod
    def _mlflow(trainer: pl.Trainer) -> MLFlowLogger | None:
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                return logger
        return None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        logger = self._mlflow(trainer)
        step = int(getattr(pl_module, "rl_step", batch_idx + 1))
        due = self.every_n_steps and (step == 1 or step % self.every_n_steps == 0)
        if logger is None or not trainer.is_global_zero or not due:
            return
        trajs = list(getattr(pl_module, "last_trajectories", []))[: self.max_trajectories]
        try:
            for traj in trajs:
                if self.traces:
                    self._trace(logger, traj, step)
                self._rows.append({"step": step, "task": traj.task_id, "reward": traj.total_reward,
                                   "success": traj.success, "turns": traj.num_turns, "failed": traj.failed,
                                   "transcript": transcript(traj)})
            if self._rows:
                logger.experiment.log_table(logger.run_id, data=_columns(self._rows),
                                            artifact_file="trajectories.json")
        except Exception:  # tracking must never stop training
            log.exception("could not log trajectories to MLflow")

    def _trace(self, logger: MLFlowLogger, traj: Trajectory, step: int) -> None:
        client = logger.experiment
        root = client.start_trace(
            f"episode {traj.task_id}", span_type="AGENT", inputs={"task": traj.task_id, "seed": traj.seed},
            attributes={"step": step, "group": traj.group}, tags={"agentrl.step": str(step)},
            experiment_id=logger.experiment_id, run_id=logger.run_id,
        )
        trace_id = root.trace_id
        for turn in traj.turns:
            span = client.start_span(
                f"turn {turn.index}", trace_id=trace_id, parent_id=root.span_id, span_type="LLM",
                inputs={"messages": turn.messages or []},
                attributes={"prompt_tokens": len(turn.prompt_ids), "response_tokens": len(turn.response_ids),
                            "mean_logprob": sum(turn.logprobs) / max(len(turn.logprobs), 1),
                            "policy_version": turn.policy_version, "reward": turn.reward, "replayed": turn.forced,
                            "finish_reason": turn.finish_reason},
            )
            for call in turn.tool_calls or []:
                tool = client.start_span(str(call.get("name")), trace_id=trace_id, parent_id=span.span_id,
                                         span_type="TOOL", inputs=call.get("arguments"))
                client.end_span(trace_id=trace_id, span_id=tool.span_id)
            client.end_span(trace_id=trace_id, span_id=span.span_id, outputs={"text": turn.text})
        client.end_trace(trace_id=trace_id, outputs={"reward": traj.total_reward, "success": traj.success,
                                                     "terminated": traj.terminated, "truncated": traj.truncated,
                                                     "error": traj.error})

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        logger = self._mlflow(trainer)
        if logger is None or not trainer.is_global_zero:
            return
        try:
            self._reward_curve(logger)
            if self.log_final_model:
                self._final_model(logger, pl_module)
        except Exception:
            log.exception("could not log the reward curve or the final model to MLflow")

    @staticmethod
    def _reward_curve(logger: MLFlowLogger) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        client = logger.experiment
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for key, style in (("rollout/reward", "-"), ("eval/reward", "o--"), ("rollout/success", ":")):
            hist = sorted((m.step, m.value) for m in client.get_metric_history(logger.run_id, key))
            if hist:
                ax.plot([s for s, _ in hist], [v for _, v in hist], style, label=key)
        ax.set_xlabel("step")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        client.log_figure(logger.run_id, fig, "reward_curve.png")
        plt.close(fig)

    @staticmethod
    def _final_model(logger: MLFlowLogger, pl_module: pl.LightningModule) -> None:
        policy = getattr(pl_module, "whole_policy", None)  # sharded training: the gathered copy
        if policy is None:
            return
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "final_model"
            policy.save(out, tokenizer=True)
            logger.experiment.log_artifacts(logger.run_id, str(out), artifact_path="final_model")


def _columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {key: [r[key] for r in rows] for key in rows[0]}
