"""The MLflow logger's store, in one process: relative sqlite URIs mean the working directory of each run."""

from __future__ import annotations

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
