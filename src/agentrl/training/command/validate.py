"""``agentrl validate``: play the held-out tasks with a checkpoint's weights and log them as an evaluation run.

It is LightningCLI's own ``validate`` subcommand over the same `AgentRLModule` and `RolloutDataModule` as ``agentrl
fit`` (same config, same checks, same defaults): Lightning loads the checkpoint's weights, the module's
``validation_step`` plays ``data.eval_episodes`` held-out tasks (``data.eval_tasks``, ``data.eval_greedy``) once,
exactly as ``fit``'s base and final evaluations do
(`agentrl.training.system.evaluation`), prints the same one-line result
and logs ``eval/*``; `agentrl.tracking.TrajectoryLogger` records each episode as a trace tagged ``agentrl.phase =
eval``. The MLflow run is a new one, named ``<training run name>-eval`` and tagged with what it evaluated
(``agentrl.evaluation_of``: the checkpoint; ``agentrl.evaluated_run``: the training run id the checkpoint
records). Without ``--ckpt_path`` it evaluates the config's model as is: a saved ``final_model/`` folder with
``--model.policy.init_args.model path/to/final_model``.

This module holds what is particular to ``validate``: its checks and how its MLflow run is named and tagged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from jsonargparse import Namespace

from agentrl.tracking.store import logger_entries


def checkpoint_file(config: Namespace) -> Path | None:
    """The checkpoint ``--ckpt_path`` names: a file, ``last`` (``<checkpoint.dirpath>/last.ckpt``), or None."""
    ckpt = config.get("ckpt_path")
    if ckpt is None:
        return None
    if str(ckpt) == "last":
        return Path(config.get("checkpoint.dirpath") or "checkpoints") / "last.ckpt"
    return Path(ckpt)


def check_validate(config: Namespace) -> None:
    """What ``agentrl validate`` needs beyond a valid ``fit`` config.

    Raises:
        ValueError: naming the key (``data.eval_episodes``, ``ckpt_path``).
    """
    episodes = config.get("data.eval_episodes") or 0
    if episodes < 1:
        raise ValueError(f"data.eval_episodes must be >= 1 for agentrl validate (the held-out tasks it plays), got "
                         f"{episodes}: add --data.eval_episodes N")
    ckpt = config.get("ckpt_path")
    if ckpt is not None and str(ckpt) in ("best", "hpc", "registry"):
        raise ValueError(f"ckpt_path: agentrl validate takes a checkpoint file or 'last', got {ckpt!r}")
    path = checkpoint_file(config)
    if path is not None and not path.is_file():
        raise ValueError(f"ckpt_path {ckpt}: no checkpoint file {path}" + (" (it is a folder)" if path.is_dir()
                                                                             else ""))
    if path is not None:
        config["ckpt_path"] = str(path)  # `last` resolved here: Lightning's own lookup depends on the trainer fn


def _checkpoint_run(path: Path) -> str | None:
    """The MLflow run id a checkpoint records (`agentrl.tracking.TrajectoryLogger` writes it), or None."""
    import torch

    saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("mlflow") or {}
    run_id = saved.get("run_id")
    return str(run_id) if run_id else None


def tag_evaluation_run(config: Namespace) -> None:
    """Name the MLflow run ``<run name>-eval`` and tag it with the checkpoint (or model) it evaluates."""
    path = checkpoint_file(config)
    tags: dict[str, Any] = {"agentrl.phase": "evaluation"}
    if path is not None:
        tags["agentrl.evaluation_of"] = str(path.resolve())
        run_id = _checkpoint_run(path)
        if run_id:
            tags["agentrl.evaluated_run"] = run_id
    else:
        tags["agentrl.evaluation_of"] = str(config.get("model.policy.init_args.model") or "model")
    for entry in logger_entries(config):
        init = entry.get("init_args") if isinstance(entry, Namespace) else None
        if init is None or "tags" not in init:  # not an MLflow logger
            continue
        init["tags"] = {**(init.get("tags") or {}), **tags}
        name = init.get("run_name")
        if name and not str(name).endswith("-eval"):
            init["run_name"] = f"{name}-eval"


def run_line(trainer: pl.Trainer) -> str | None:
    """``run NAME (id ID) in MLflow experiment E; open it with: mlflow ui ...`` for the trainer's MLflow logger."""
    from agentrl.tracking.store import run_page_url
    from agentrl.training.command.progress import mlflow_ui_command

    logger = next((lg for lg in trainer.loggers if hasattr(lg, "run_id") and hasattr(lg, "experiment_id")), None)
    if logger is None or getattr(logger, "disabled", False):
        return None
    try:
        client = logger.experiment  # type: ignore[attr-defined]  # an MLFlowLogger (checked above)
        name = client.get_run(logger.run_id).info.run_name
        experiment = client.get_experiment(logger.experiment_id).name
    except Exception as exc:  # a failed store costs the line, not the evaluation
        return f"MLflow run unavailable ({type(exc).__name__})"
    return (f"evaluation run {name} (id {logger.run_id}) in MLflow experiment {experiment}; open it with:\n"
            f"  {mlflow_ui_command(client.tracking_uri)}\n  then {run_page_url(logger.experiment_id, logger.run_id)}")
