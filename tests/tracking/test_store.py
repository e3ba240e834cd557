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


def _tables(db: Path) -> tuple[set[str], str]:
    with sqlite3.connect(db) as con:
        tables = {n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        (revision,) = con.execute("SELECT version_num FROM alembic_version").fetchone()
    return tables, revision


def _default_artifacts(db: Path) -> str:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT artifact_location FROM experiments WHERE experiment_id = 0").fetchone()[0]


def test_a_new_store_is_seeded_from_the_migrated_template_and_opens_as_one_mlflow_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow migrates every new sqlite file itself (3-6 s); agentrl copies a template it migrated once. The copy
    must be what MLflow makes: the same tables at the same schema revision, and the default experiment's
    artifacts under this store's folder (not the template's); a second new store is copied, not migrated."""
    import mlflow.store.db.utils
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in ("reference", "first", "second"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path / "reference")
    SqlAlchemyStore(f"sqlite:///{tmp_path / 'reference/mlflow.db'}", "./mlruns")  # as MLflow makes a store
    monkeypatch.chdir(tmp_path / "first")
    assert MLflowLogger(experiment_name="first").experiment is not None
    assert (tmp_path / "cache/agentrl").is_dir()

    def no_migrations(engine: object) -> None:
        raise AssertionError("a second new store ran MLflow's migrations")

    monkeypatch.setattr(mlflow.store.db.utils, "_initialize_tables", no_migrations)
    monkeypatch.chdir(tmp_path / "second")
    logger = MLflowLogger(experiment_name="second")
    logger.log_metrics({"x": 1.0}, step=0)
    logger.finalize("success")
    assert logger._tracking_uri == logger.configured_uri and not (tmp_path / "second/mlflow-fallback.db").exists()
    reference = _tables(tmp_path / "reference/mlflow.db")
    for name in ("first", "second"):
        assert _tables(tmp_path / name / "mlflow.db") == reference
        assert _default_artifacts(tmp_path / name / "mlflow.db") == str(tmp_path / name / "mlruns/0")
    with sqlite3.connect(tmp_path / "second/mlflow.db") as con:
        assert con.execute("SELECT key, value FROM metrics").fetchall() == [("x", 1.0)]


def test_a_cache_folder_that_cannot_be_made_leaves_the_new_store_to_mlflow(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-folder"))
    monkeypatch.chdir(tmp_path)
    logger = MLflowLogger(experiment_name="e")
    logger.log_metrics({"x": 2.0}, step=0)
    logger.finalize("success")
    assert logger._tracking_uri == logger.configured_uri
    with sqlite3.connect(tmp_path / "mlflow.db") as con:
        assert con.execute("SELECT key, value FROM metrics").fetchall() == [("x", 2.0)]
