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


def _sql(db: Path) -> set[tuple[str, str, tuple[str, ...]]]:
    """Every table, index and trigger with the lines of its SQL, sorted: MLflow's migrations write a recreated
    table's constraints in an order that differs from one migration to the next (seen in CI), not in content."""
    with sqlite3.connect(db) as con:
        return {(kind, name, tuple(sorted(line.strip().rstrip(",") for line in (sql or "").splitlines())))
                for kind, name, sql in con.execute("SELECT type, name, sql FROM sqlite_master")}


def _schema(db: Path) -> tuple[set[tuple[str, str, tuple[str, ...]]], dict[str, list[tuple[object, ...]]]]:
    """`_sql`, and the rows of every table but the experiments'."""
    schema = _sql(db)
    with sqlite3.connect(db) as con:
        rows = {name: sorted(con.execute(f'SELECT * FROM "{name}"'), key=repr) for (kind, name, _lines) in schema
                if kind == "table" and name not in ("experiments", "experiment_tags")}
    return schema, rows


def _default_artifacts(db: Path) -> str:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT artifact_location FROM experiments WHERE experiment_id = 0").fetchone()[0]


def test_a_new_store_is_seeded_from_the_migrated_template_and_opens_as_one_mlflow_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow migrates every new sqlite file itself (3-6 s); agentrl copies a template it migrated once. The copy
    must be what MLflow makes: the same tables, indexes, triggers and rows (the schema revision among them), and
    the default experiment's artifacts under this store's folder (not the template's); a second new store is
    copied, not migrated."""
    import mlflow.store.db.utils
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    for name in ("reference", "first", "sec#ond %"):  # quoting: "#" and "%" are special in a sqlite URI
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path / "reference")
    SqlAlchemyStore(f"sqlite:///{tmp_path / 'reference/mlflow.db'}", "./mlruns")  # as MLflow makes a store
    reference = _schema(tmp_path / "reference/mlflow.db")
    monkeypatch.chdir(tmp_path / "first")
    assert MLflowLogger(experiment_name="first").experiment is not None
    (template,) = (tmp_path / "cache").glob("mlflow-*-empty.db")
    assert _schema(template) == reference

    def no_migrations(engine: object) -> None:
        raise AssertionError("a second new store ran MLflow's migrations")

    monkeypatch.setattr(mlflow.store.db.utils, "_initialize_tables", no_migrations)
    monkeypatch.chdir(tmp_path / "sec#ond %")
    logger = MLflowLogger(experiment_name="second")
    logger.log_metrics({"x": 1.0}, step=0)
    logger.finalize("success")
    assert logger._tracking_uri == logger.configured_uri and not (tmp_path / "sec#ond %/mlflow-fallback.db").exists()
    for name in ("first", "sec#ond %"):
        assert _sql(tmp_path / name / "mlflow.db") == reference[0]
        assert _default_artifacts(tmp_path / name / "mlflow.db") == str(tmp_path / name / "mlruns/0")
    with sqlite3.connect(tmp_path / "sec#ond %/mlflow.db") as con:
        assert con.execute("SELECT key, value FROM metrics").fetchall() == [("x", 1.0)]


def _assert_logs_to_its_own_store(folder: Path, value: float) -> None:
    """A logger opened in ``folder`` writes a metric to ``folder/mlflow.db``, not to the fallback."""
    logger = MLflowLogger(experiment_name="e")
    logger.log_metrics({"x": value}, step=0)
    logger.finalize("success")
    assert logger._tracking_uri == logger.configured_uri
    with sqlite3.connect(folder / "mlflow.db") as con:
        assert con.execute("SELECT key, value FROM metrics").fetchall() == [("x", value)]


@pytest.mark.parametrize("damage", ["truncated", "stale-schema", "has-an-experiment"])
def test_a_bad_template_is_made_again_and_never_costs_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              damage: str) -> None:
    """A template cut short (a full disk), left at an older schema (MLflow upgraded in place) or holding an
    experiment is not copied: it is made again from MLflow's migrations, and the run's store works."""
    from agentrl.tracking.store_template import check_empty_store, empty_store_template

    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    template, head = empty_store_template()
    if damage == "truncated":
        template.write_bytes(template.read_bytes()[:50_000])
    else:
        with sqlite3.connect(template) as con:
            if damage == "stale-schema":
                con.execute("UPDATE alembic_version SET version_num = 'abc123'")
            else:
                con.execute("INSERT INTO experiments (experiment_id, name, lifecycle_stage) VALUES (5, 'x', 'active')")
    monkeypatch.chdir(tmp_path)
    _assert_logs_to_its_own_store(tmp_path, 3.0)
    check_empty_store(template, head)  # made again, whole


@pytest.mark.parametrize("cache", ["a-file", "others-can-write"])
def test_a_cache_folder_that_cannot_be_used_leaves_the_new_store_to_mlflow(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          cache: str) -> None:
    folder = tmp_path / "cache"
    if cache == "a-file":
        folder.write_text("")
    else:
        folder.mkdir(mode=0o777)
        folder.chmod(0o777)  # past the umask: a template planted by another user would become this user's store
    monkeypatch.setenv("AGENTRL_CACHE", str(folder))
    monkeypatch.chdir(tmp_path)
    _assert_logs_to_its_own_store(tmp_path, 2.0)
    assert cache == "a-file" or not list(folder.iterdir())  # nothing made in a folder others can write
