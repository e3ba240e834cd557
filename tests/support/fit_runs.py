"""``agentrl fit`` as a real subprocess with a callback on a progress line (a SIGTERM at step k), and the MLflow
runs and logged steps a sqlite tracking store holds afterwards: shared by the fault tests that stop and resume."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest


def fit_until(config: str, cwd: Path, args: list[str], env: Mapping[str, str], *, marker: str | None = None,
              on_marker: Callable[[subprocess.Popen[str]], None] | None = None,
              timeout: int = 300) -> tuple[int, str]:
    """Run ``agentrl fit --config config *args``; call ``on_marker(proc)`` at the first line starting with
    ``marker`` (then read on to the end); (returncode, output). Fails the test past ``timeout`` seconds."""
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "fit", "--config", config, *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(env))
    assert proc.stdout is not None
    lines: list[str] = []
    if marker is not None:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(marker):  # the progress line of that step
                assert on_marker is not None
                on_marker(proc)
                break
    try:
        rest = proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        rest = proc.communicate()[0]
        pytest.fail(f"agentrl fit did not finish within {timeout} s:\n{''.join(lines)[-2000:]}{rest[-2000:]}")
    return proc.returncode, "".join(lines) + rest


def mlflow_runs(db: Path) -> list[tuple[str, str]]:
    """(run id, status) of every run in the sqlite store ``db``, oldest first."""
    with sqlite3.connect(db) as con:
        return con.execute("SELECT run_uuid, status FROM runs ORDER BY start_time").fetchall()


def logged_steps(db: Path, key: str, run_id: str | None = None) -> list[int]:
    """Every logged row's step for ``key`` (a step logged twice appears twice), of one run or of all."""
    query = "SELECT step FROM metrics WHERE key = ?" + (" AND run_uuid = ?" if run_id is not None else "")
    params = (key,) if run_id is None else (key, run_id)
    with sqlite3.connect(db) as con:
        return [int(s) for (s,) in con.execute(query + " ORDER BY step", params)]
