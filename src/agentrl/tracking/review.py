"""Review runs in MLflow: episodes as chat traces with reward assessments, a trajectory table, run tags, figures,
the final model (optionally registered).

`TrajectoryLogger` is a Lightning callback (on by default in ``agentrl fit``, configured under ``tracking:``). With
an MLflow logger it records:

* at the start: run tags (schedule, agent, environment, model, engine, world size, git commit) and a run
  description with the command line;
* at the first step and every ``every_n_steps`` steps, up to ``max_trajectories`` episodes of the step (RTPO: whole
  trees, a trunk and its siblings, at least one; `sample_episodes`) as **MLflow traces** in MLflow's chat format
  (`agentrl.tracking.chat`: a span per turn with the messages, the reply, its tool calls and its
  ``agentrl.credit.*`` attributes; a TOOL span per call; reward and success as assessments) and as rows of the
  ``trajectories.json`` table; these traces are tagged ``agentrl.phase = train``; their credit also as the
  ``credit.json`` table and the ``credit.png`` figure on the run's page (`agentrl.tracking.credit_view`);
* at every held-out evaluation (base, periodic, final, and ``agentrl validate``'s; the module hands it over through
  ``on_heldout_evaluation``), each episode as a trace tagged ``agentrl.phase = eval`` and ``agentrl.eval =
  <label>``, and as rows of ``eval_trajectories.json``;
* at the end (`on_fit_end`, after the module's final held-out evaluation): ``reward_curve.png`` (with that final
  evaluation), ``rtpo_depths.png`` (RTPO runs: zero-advantage fraction, mean |A| and clipfrac per depth), the final
  policy as ``final_model/`` (loadable with ``transformers``/``peft``) for runs of at least ``final_model_min_steps``
  steps (a short trial's checkpoint already holds its weights), registered as a version of ``register_model`` when
  that is set (always logged then).

It also writes the MLflow run id into every checkpoint (``checkpoint["mlflow"]``) so ``--ckpt_path`` continues
the same run, and tells the logger how the run ended (KILLED when it stopped before ``data.steps``
(and before its token budget, ``data.max_generated_tokens``, was spent): a requested stop, resumable).
"""

from __future__ import annotations

import logging
import shlex
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException

from agentrl.credit import TurnCredit
from agentrl.runview import RunView, run_view
from agentrl.tracking import figures
from agentrl.tracking.chat import link_tree, log_episode, reward_source
from agentrl.tracking.credit_view import credit_rows, log_credit
from agentrl.tracking.store import MLflowLogger
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


def sample_episodes(episodes: Sequence[Trajectory], n: int) -> list[Trajectory]:
    """The episodes of a step to log: the first ``n``; for RTPO whole trees (a trunk followed by its siblings,
    deepest boundary first, as collected), as many trees as fit in ``n`` episodes and at least one."""
    trunks = [t for t in episodes if t.tree is not None and t.branch_turn is None]
    if not trunks:
        return list(episodes[:n])
    out: list[Trajectory] = []
    for trunk in trunks:
        tree = [trunk, *(t for t in episodes if t.tree == trunk.tree and t.branch_turn is not None)]
        if out and len(out) + len(tree) > n:
            break
        out += tree
    return out


def safe_call(logger: MLFlowLogger, what: str, fn: Any) -> Any:
    """``fn(client, run_id)`` through `MLflowLogger.call` (fallback store, never raises); with Lightning's own
    logger, a store error becomes one warning."""
    if isinstance(logger, MLflowLogger):
        return logger.call(what, fn)
    try:
        return fn(logger.experiment, logger.run_id)
    except Exception as exc:
        log.warning("MLflow: %s failed (%s: %s); training continues", what, type(exc).__name__, exc)
        return None


def log_config(logger: MLFlowLogger, text: str, params: dict[str, Any]) -> None:
    """The resolved config as ``config.yaml`` and its flattened values as parameters."""
    def write(client: Any, run_id: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "config.yaml"
            path.write_text(text)
            client.log_artifact(run_id, str(path))

    safe_call(logger, "logging the config", write)
    logger.log_hyperparams(params)


def log_error(client: Any, run_id: str, exception: BaseException) -> None:
    """The error that ended a run: its first line as the ``agentrl.error`` tag, the
    whole traceback (with the failed episodes' own, `agentrl.collect.collector.CollectionError`) as ``error.txt``."""
    text = "".join(traceback.format_exception(exception))
    first = f"{type(exception).__name__}: {str(exception).splitlines()[0] if str(exception) else ''}"
    client.set_tag(run_id, "agentrl.error", first[:4900])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "error.txt"
        path.write_text(text)
        client.log_artifact(run_id, str(path))


def _git_commit() -> str | None:
    for where in (Path.cwd(), Path(__file__).parent):
        try:
            out = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True,
                                 timeout=5, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if out.returncode == 0:
            return out.stdout.strip()
    return None


def run_tags(trainer: pl.Trainer, view: RunView) -> dict[str, str]:
    """What identifies a run in the runs table: schedule, agent, environment, model, engine, world size, commit,
    and the command line as the run's description."""
    env = getattr(view.agent, "env", None)  # agents that play an environment have one; others do not
    tags = {
        "agentrl.schedule": view.schedule_name,
        "agentrl.agent": type(view.agent).__name__,
        "agentrl.environment": type(env).__name__ if env is not None else "none",
        "agentrl.model": view.model_name,
        "agentrl.engine": view.engine_name,
        "agentrl.world_size": str(trainer.world_size),
        "mlflow.note.content": f"Command:\n\n    agentrl {shlex.join(sys.argv[1:] if len(sys.argv) > 1 else ['fit'])}",
    }
    commit = _git_commit()
    if commit:
        tags["agentrl.git_commit"] = commit
    return tags


class TrajectoryLogger(pl.Callback):
    """Log run tags, sample episodes, figures and the final model to MLflow.

    Args:
        every_n_steps: Steps between samples (0 disables trajectory logging).
        max_trajectories: Episodes logged per sampled step (RTPO: whole trees, a trunk and its siblings, as
            many as fit and at least one).
        traces: Log MLflow traces (besides the table).
        log_final_model: Log the trained policy as the ``final_model`` artifact at the end.
        final_model_min_steps: Log it only for runs of at least this many RL steps (``data.steps``): shorter trial
            runs keep their weights in the last checkpoint only. 0: every run. A ``register_model`` run always logs it.
        register_model: Also register the final model under this name (the Models tab); None: do not register.
    """

    def __init__(self, every_n_steps: int = 5, max_trajectories: int = 4, traces: bool = True,
                 log_final_model: bool = True, final_model_min_steps: int = 10,
                 register_model: str | None = None) -> None:
        if every_n_steps < 0 or max_trajectories < 0:
            raise ValueError("tracking.every_n_steps and tracking.max_trajectories must be >= 0")
        if final_model_min_steps < 0:
            raise ValueError(f"tracking.final_model_min_steps must be >= 0, got {final_model_min_steps}")
        if register_model is not None and (not register_model.strip() or not log_final_model):
            raise ValueError("tracking.register_model needs a non-empty name and tracking.log_final_model: true")
        self.every_n_steps = every_n_steps
        self.max_trajectories = max_trajectories
        self.traces = traces
        self._log_final_model = log_final_model
        self.final_model_min_steps = final_model_min_steps
        self.register_model = register_model
        self._run_steps: int | None = None  # data.steps of the run, known at the start
        self._rows: list[dict[str, Any]] = []
        self._eval_rows: list[dict[str, Any]] = []
        self._credit_rows: list[dict[str, Any]] = []

    @staticmethod
    def _mlflow(trainer: pl.Trainer) -> MLFlowLogger | None:
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                return logger
        return None

    @property
    def log_final_model(self) -> bool:
        """Whether this run logs ``final_model/`` (`agentrl.training.command.progress` prints its path when it does)."""
        if not self._log_final_model:
            return False
        short = self._run_steps is not None and self._run_steps < self.final_model_min_steps
        return self.register_model is not None or not short

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        view = run_view(pl_module)
        self._run_steps = view.total_steps if view is not None else None
        if self._log_final_model and not self.log_final_model:
            log.info("the final model is not logged: %s steps < tracking.final_model_min_steps (%d); the last "
                     "checkpoint holds the weights", self._run_steps, self.final_model_min_steps)
        logger = self._mlflow(trainer)
        if logger is not None and view is not None and trainer.is_global_zero:
            tags = run_tags(trainer, view)
            safe_call(logger, "setting run tags", lambda c, r: [c.set_tag(r, k, v) for k, v in tags.items()])

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        logger, view = self._mlflow(trainer), run_view(pl_module)
        if logger is None or view is None or not trainer.is_global_zero:
            return
        step = view.rl_step
        if not (self.every_n_steps and (step == 1 or step % self.every_n_steps == 0)):
            return
        trajs = sample_episodes(view.step_record.episodes or view.last_trajectories, self.max_trajectories)
        if self.traces:
            self._log_traces(logger, view, trajs, step)
        for traj in trajs:
            self._rows.append({"step": step, "task": traj.task_id, "reward": traj.total_reward,
                               "success": traj.success, "turns": traj.num_turns, "failed": traj.failed,
                               "transcript": transcript(traj)})
        if self._rows:
            columns = {key: [r[key] for r in self._rows] for key in self._rows[0]}
            safe_call(logger, "logging the trajectory table",
                      lambda c, r: c.log_table(r, data=columns, artifact_file="trajectories.json"))
        self._credit_rows += credit_rows(view.step_record, trajs, step)
        safe_call(logger, "logging the credit table", lambda c, r: log_credit(c, r, self._credit_rows, step))

    def _log_traces(self, logger: MLFlowLogger, view: RunView, trajs: Sequence[Trajectory], step: int) -> None:
        """``trajs`` as traces with their turns' credit; RTPO siblings name their trunk, trunks list siblings."""
        record = view.step_record
        trunks: dict[int, str] = {}  # RTPO: tree -> its trunk's trace id
        siblings: dict[int, list[str]] = {}
        for traj in trajs:
            trunk = trunks.get(traj.tree) if traj.tree is not None and traj.branch_turn is not None else None
            trace_id = self._trace(logger, view, traj, step, {"agentrl.phase": "train"},
                                   credit=record.credit(traj), trunk_trace=trunk)
            if trace_id and traj.tree is not None:
                if traj.branch_turn is None:
                    trunks[traj.tree] = trace_id
                else:
                    siblings.setdefault(traj.tree, []).append(trace_id)
        for tree, trunk_id in trunks.items():
            ids = siblings.get(tree, [])
            safe_call(logger, "linking an RTPO tree", lambda c, r, t=trunk_id, s=ids: link_tree(c, t, s))

    @staticmethod
    def _trace(logger: MLFlowLogger, view: RunView, traj: Trajectory, step: int, tags: dict[str, str], *,
               credit: Sequence[TurnCredit | None] = (), trunk_trace: str | None = None) -> str | None:
        """One episode as a trace (`agentrl.tracking.chat.log_episode`) with ``tags`` (the phase) on it and, for
        a training episode, its turns' credit and RTPO trunk. Returns the trace id (None if the store failed)."""
        model, source = view.model_name, reward_source(view.agent)

        def log(client: Any, run_id: str) -> str:
            trace_id = log_episode(client, traj, experiment_id=logger.experiment_id or "0", run_id=run_id,
                                   step=step, model=model, reward_source=source, credit=credit,
                                   trunk_trace=trunk_trace)
            for key, value in tags.items():
                client.set_trace_tag(trace_id, key, value)
            return trace_id

        trace_id: str | None = safe_call(logger, "logging a trace", log)
        return trace_id

    def on_heldout_evaluation(self, trainer: pl.Trainer, pl_module: pl.LightningModule, held_out: Any) -> None:
        """A held-out evaluation (`agentrl.training.system.evaluation.HeldOut`: base, periodic, final, or ``agentrl
        validate``'s): every episode as a trace tagged ``agentrl.phase = eval`` and ``agentrl.eval = <label>``
        (``<label> greedy`` for the greedy replay), and as rows of the ``eval_trajectories.json`` table."""
        logger, view = self._mlflow(trainer), run_view(pl_module)
        if logger is None or view is None or not trainer.is_global_zero or not self.traces:
            return
        for suffix, trajs in (("", held_out.episodes), (" greedy", held_out.greedy_episodes)):
            label = f"{held_out.label}{suffix}"
            for traj in trajs:
                self._trace(logger, view, traj, held_out.step, {"agentrl.phase": "eval", "agentrl.eval": label})
                self._eval_rows.append({"eval": label, "step": held_out.step, "task": traj.task_id,
                                        "reward": traj.total_reward, "success": traj.success,
                                        "turns": traj.num_turns, "failed": traj.failed, "transcript": transcript(traj)})
        if self._eval_rows:
            columns = {key: [r[key] for r in self._eval_rows] for key in self._eval_rows[0]}
            safe_call(logger, "logging the evaluation table",
                      lambda c, r: c.log_table(r, data=columns, artifact_file="eval_trajectories.json"))

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """``agentrl validate``: the evaluation run gets the run tags of a training run."""
        logger, view = self._mlflow(trainer), run_view(pl_module)
        if logger is not None and view is not None and trainer.is_global_zero and trainer.validating:
            tags = run_tags(trainer, view)
            safe_call(logger, "setting run tags", lambda c, r: [c.set_tag(r, k, v) for k, v in tags.items()])

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        logger = self._mlflow(trainer)
        run_id = getattr(logger, "_run_id", None)
        if isinstance(logger, MLflowLogger) and run_id and not logger.disabled:
            checkpoint["mlflow"] = {"run_id": run_id, "tracking_uri": logger.tracking_uri}

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        """A resume logs the steps after the checkpoint again: the continued run drops the stopped run's points
        for them (`MLflowLogger.supersede`)."""
        logger = self._mlflow(trainer)
        if isinstance(logger, MLflowLogger) and trainer.state.fn == "fit":
            logger.supersede(int((checkpoint.get("agentrl") or {}).get("rl_step", 0)))

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        logger = self._mlflow(trainer)
        if isinstance(logger, MLflowLogger) and isinstance(exception, KeyboardInterrupt | SIGTERMException):
            logger.end_status = "KILLED"  # stopped by a signal (after a checkpoint): resumable, not a failure
        elif logger is not None and trainer.is_global_zero:  # a failed run's entry says why it failed
            safe_call(logger, "logging the error", lambda c, r: log_error(c, r, exception))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        logger, view = self._mlflow(trainer), run_view(pl_module)
        if isinstance(logger, MLflowLogger) and view is not None and not view.completed():
            logger.end_status = "KILLED"  # a budget-ended run (`data.max_generated_tokens`) is FINISHED

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # here, not in on_train_end: Lightning calls the callbacks' on_train_end before the module's, which plays
        # the final held-out evaluation; the figure would miss it (the logger is finalized after this hook)
        logger, view = self._mlflow(trainer), run_view(pl_module)
        if logger is None or view is None or not trainer.is_global_zero:
            return
        safe_call(logger, "logging the reward curve", figures.reward_curve)
        safe_call(logger, "logging the RTPO per-depth figure", figures.rtpo_depths)
        if self.log_final_model:
            safe_call(logger, "logging the final model", lambda c, r: self._final_model(c, r, view))

    def _final_model(self, client: Any, run_id: str, view: RunView) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "final_model"
            view.final_policy().save(out, tokenizer=True)
            client.log_artifacts(run_id, str(out), artifact_path="final_model")
        if self.register_model:
            from mlflow.exceptions import MlflowException

            try:
                client.create_registered_model(self.register_model,
                                               description="agentrl policies (transformers/peft folders)")
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
            source = f"{client.get_run(run_id).info.artifact_uri}/final_model"
            version = client.create_model_version(self.register_model, source, run_id=run_id)
            log.info("MLflow: registered %s version %s (%s)", self.register_model, version.version, source)
