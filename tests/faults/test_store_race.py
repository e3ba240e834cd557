"""Issue 29, item 6: runs that start together on a fresh sqlite MLflow store all get it.

Before, two ``agentrl fit`` started at once on a new ``mlflow.db`` both created MLflow's tables; one died in
MLflow's migration (``duplicate column name: step``, a traceback) without falling back. Here two processes open
the same fresh store at the same instant (after their imports), as two runs started by one script would.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RUNS = 2


MIGRATING = "Creating initial MLflow database tables"  # MLflow's own line as it migrates a new file


@pytest.mark.parametrize("store", ["copied", "migrated", "fallback"])
def test_runs_starting_together_on_a_fresh_store_all_use_it(tmp_path: Path, store: str) -> None:
    """``copied``: the new store is a copy of agentrl's migrated template (`agentrl.tracking.store_template`, made
    here first), which the first run makes under the lock, and no run migrates; ``migrated``: no cache folder can be
    made (a file stands in its place), so MLflow migrates the file itself, one run at a time; ``fallback``: the
    tracking server is dead, so every run opens the same fresh fallback store (before, two of three died in its
    migration: it was opened without the lock)."""
    from agentrl.tracking.store_template import empty_store_template
    from tests.support.processes import free_port

    db, go = tmp_path / "mlflow.db", tmp_path / "GO"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    uri = f"sqlite:///{db}"
    if store == "migrated":
        (tmp_path / "not-a-folder").write_text("")
        env["AGENTRL_CACHE"] = str(tmp_path / "not-a-folder")
    else:
        empty_store_template()  # the session's template exists before the runs start
    if store == "fallback":
        uri, db = f"http://127.0.0.1:{free_port()}", tmp_path / "mlflow-fallback.db"
    procs = [subprocess.Popen([sys.executable, str(HERE / "store_start.py"), uri, str(go)],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(RUNS)]
    for proc in procs:  # every interpreter has imported mlflow: then all start at once
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
    go.touch()
    outputs = [p.communicate(timeout=180)[0] for p in procs]
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out[-3000:]
        assert "Traceback" not in out and ("fallback" in out) == (store == "fallback"), out[-3000:]
        assert f"ok sqlite:///{db}" in out, out[-3000:]
    assert sum(MIGRATING in out for out in outputs) == (1 if store == "migrated" else 0), outputs
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == RUNS
