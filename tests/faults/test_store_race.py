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


@pytest.mark.parametrize("store", ["copied", "migrated"])
def test_runs_starting_together_on_a_fresh_store_all_use_it(tmp_path: Path, store: str) -> None:
    """``copied``: the new store is a copy of agentrl's migrated template (`agentrl.tracking.store_template`), the
    first run copies it under the lock and the second finds it made; ``migrated``: no cache folder can be made (a
    file stands in its place), so MLflow migrates the file itself, one run at a time."""
    db, go = tmp_path / "mlflow.db", tmp_path / "GO"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if store == "migrated":
        (tmp_path / "not-a-folder").write_text("")
        env["AGENTRL_CACHE"] = str(tmp_path / "not-a-folder")
    procs = [subprocess.Popen([sys.executable, str(HERE / "store_start.py"), f"sqlite:///{db}", str(go)],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(RUNS)]
    for proc in procs:  # every interpreter has imported mlflow: then all start at once
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
    go.touch()
    outputs = [p.communicate(timeout=180)[0] for p in procs]
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out[-3000:]
        assert "Traceback" not in out and "fallback" not in out, out[-3000:]
        assert f"ok sqlite:///{db}" in out, out[-3000:]
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == RUNS
