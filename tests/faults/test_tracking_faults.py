"""Tracking faults (issue 14, items 8 and 10), through ``agentrl fit`` subprocesses on the tiny smoke config:

* item 8 (a graceful stop ends the MLflow run KILLED, not FAILED, and ``--ckpt_path last`` continues the same run
  to FINISHED with the whole metric history) is checked on the stop-and-resume run of
  ``tests/training/test_fit_cli.py::test_stop_and_resume_reproduce_the_uninterrupted_run``, which stops with
  Ctrl-C; SIGTERM takes the same `GracefulStop` path (``tests/faults/test_async_stop.py``);
* item 10: a tracking store that is unusable at the start (an unreachable HTTP server, a sqlite path that cannot be
  opened) or that disappears mid-run (a real ``mlflow server`` killed after step 1) costs a warning, not the run:
  training finishes, the metrics land in the local fallback store, and no traceback floods the output; when the
  fallback fails too, tracking is off and training still finishes.

The subprocess timeouts bound each run; before the fix the first case ran ~250 s and the others crashed.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
import torch

from tests.support.fit_runs import fit_until, logged_steps, mlflow_runs
from tests.support.mlflow_server import start_mlflow_server
from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs/smoke/turn_ppo.yaml")
ENV = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")


def _fit_until(cwd: Path, marker: str | None, args: list[str], on_marker: object, timeout: int) -> tuple[int, str]:
    return fit_until(CONFIG, cwd, args, ENV, marker=marker, on_marker=on_marker,  # type: ignore[arg-type]
                     timeout=timeout)


def _steps(db: Path, run_id: str, key: str = "rollout/reward") -> list[int]:
    return logged_steps(db, key, run_id)


def _assert_fell_back(cwd: Path, out: str, steps: list[int]) -> None:
    assert "logging to the local store" in out and "training continues" in out, out[-3000:]
    assert "Traceback" not in out, out[-5000:]
    fallback = cwd / "mlflow-fallback.db"
    ((run_id, status),) = mlflow_runs(fallback)
    assert status == "FINISHED"
    assert _steps(fallback, run_id) == steps
    with sqlite3.connect(fallback) as con:
        params = dict(con.execute("SELECT key, value FROM params WHERE run_uuid = ?", (run_id,)).fetchall())
    assert params["data.batch_size"] == "4"  # the fallback run has the parameters too


@pytest.mark.slow
@pytest.mark.parametrize("store", ["unreachable-http", "unopenable-sqlite"])
def test_a_store_unusable_at_the_start_falls_back_locally(tmp_path: Path, store: str) -> None:
    if store == "unreachable-http":
        uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    else:
        (tmp_path / "store.db").mkdir()  # a folder where the sqlite file should be: sqlite cannot open it
        uri = f"sqlite:///{tmp_path / 'store.db'}"
    rc, out = _fit_until(tmp_path, None, ["--trainer.logger.init_args.tracking_uri", uri], None, timeout=200)
    assert rc == 0, out[-3000:]
    _assert_fell_back(tmp_path, out, [0, 1, 2])


@pytest.mark.slow
def test_when_the_fallback_fails_too_tracking_is_off_and_training_finishes(tmp_path: Path) -> None:
    (tmp_path / "fallback.db").mkdir()  # the fallback cannot be opened either
    rc, out = _fit_until(tmp_path, None, ["--trainer.logger.init_args.tracking_uri", f"http://127.0.0.1:{free_port()}",
                                          "--trainer.logger.init_args.fallback_uri",
                                          f"sqlite:///{tmp_path / 'fallback.db'}"], None, timeout=200)
    assert rc == 0, out[-3000:]
    assert "tracking is off for this run; training continues" in out, out[-3000:]
    assert "Traceback" not in out, out[-5000:]
    assert "MLflow run unavailable" in out  # the console says so instead of naming a run
    state = torch.load(tmp_path / "checkpoints/smoke/last.ckpt", weights_only=True, map_location="cpu")
    assert state["agentrl"]["rl_step"] == 3 and "mlflow" not in state


@pytest.mark.slow
def test_a_store_that_dies_mid_run_falls_back_locally(tmp_path: Path) -> None:
    server = start_mlflow_server(f"sqlite:///{tmp_path / 'server.db'}", tmp_path)
    try:
        rc, out = _fit_until(tmp_path, "step 1/", ["--trainer.logger.init_args.tracking_uri", server.url],
                             lambda _p: server.stop(), timeout=200)
    finally:
        server.stop()
    assert rc == 0, out[-3000:]
    ((run_id, _),) = mlflow_runs(tmp_path / "server.db")
    before = _steps(tmp_path / "server.db", run_id)
    assert before in ([], [0]), before  # logged before the server went away
    _assert_fell_back(tmp_path, out, [1, 2] if before == [0] else [0, 1, 2])
