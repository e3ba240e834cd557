"""The MLflow logger's store, in one process: relative sqlite URIs mean the working directory of each run."""

from __future__ import annotations

import importlib
import sqlite3
from pathlib import Path

import pytest

from agentrl.tracking import MLflowLogger


def test_relative_sqlite_stores_follow_the_working_directory_of_each_run(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow caches a sqlite store per URI string: before the fix, a second run in another directory with the
    same relative ``sqlite:///mlflow.db`` wrote into the first directory's file (seen in CI as an empty store)."""
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        logger = MLflowLogger(experiment_name=name, run_name=name)
        logger.log_metrics({"x": 1.0}, step=0)
        logger.finalize("success")
    for name in ("first", "second"):
        with sqlite3.connect(tmp_path / name / "mlflow.db") as con:
            names = [n for (n,) in con.execute("SELECT name FROM experiments WHERE name != 'Default'")]
            metrics = con.execute("SELECT COUNT(*) FROM metrics").fetchone()[0]
        assert names == [name] and metrics == 1



def test_a_logger_list_gets_the_run_name_and_on_resume_the_checkpoints_run(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``trainer.logger`` as a list (the learning benchmark's CSV + MLflow pair): the MLflow entry is named after
    what runs and, with ``--ckpt_path``, continues the run the checkpoint records (before: only a single logger)."""
    import torch
    from jsonargparse import Namespace

    from agentrl.tracking import reopen_run
    from agentrl.training.command.cli import _default_run_name

    monkeypatch.chdir(tmp_path)
    torch.save({"mlflow": {"run_id": "a" * 32, "tracking_uri": f"sqlite:///{tmp_path / 'runs.db'}"}}, "c.ckpt")
    csv_entry = Namespace(class_path="lightning.pytorch.loggers.CSVLogger", init_args=Namespace(save_dir="csv"))
    mlflow_entry = Namespace(class_path="agentrl.tracking.MLflowLogger",
                             init_args=Namespace(tracking_uri="sqlite:///runs.db", run_name=None, run_id=None))
    config = Namespace(ckpt_path="c.ckpt", seed_everything=0, trainer=Namespace(logger=[csv_entry, mlflow_entry]),
                       model=Namespace(algorithm=Namespace(class_path="agentrl.training.schedules.turn_ppo.TurnPPO")),
                       data=Namespace(agent=Namespace(class_path="agentrl.agents.env_agent.EnvAgent",
                                                      init_args=Namespace(env=Namespace(
                                                          class_path="agentrl.envs.GuessNumberEnv")))))
    for path in ("trainer.logger", "model.algorithm", "data.agent", "data.agent.init_args.env"):
        entries = config[path] if isinstance(config[path], list) else [config[path]]
        for entry in entries:  # every class path is a real class, as `agentrl fit` would resolve it
            module, _, name = entry.class_path.rpartition(".")
            assert isinstance(getattr(importlib.import_module(module), name), type), entry.class_path
    _default_run_name(config)
    reopen_run(config)
    assert mlflow_entry.init_args.run_name == "turnppo-guessnumber-s0"
    assert mlflow_entry.init_args.run_id == "a" * 32
    assert "run_name" not in csv_entry.init_args
