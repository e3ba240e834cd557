"""`agentrl fit` on the examples' smoke configs through a subprocess, as a user runs it: the YAML names the
agent's ``run`` and ``reward`` by dotted path, the trainer starts the gateway, the run trains two steps (its weights
move), checkpoints and logs to MLflow."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.trained import ENTROPY_BONUS, assert_smoke_run_trained

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["openai_agents_rtpo", "openai_client_rtpo"])
def test_smoke_config_trains_two_steps_through_the_gateway(tmp_path: Path, name: str) -> None:
    """The smoke config's random model earns equal rewards (zero advantages, no optimizer step), so an entropy
    bonus gives the update a signal: every policy tensor must then have moved."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    config = str(ROOT / f"configs/smoke/{name}.yaml")
    proc = subprocess.run([sys.executable, "-m", "agentrl.cli", "fit", "--config", config, *ENTROPY_BONUS],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    params = assert_smoke_run_trained(tmp_path)
    with sqlite3.connect(tmp_path / "mlflow.db") as con:
        failed = [v for (v,) in con.execute("SELECT value FROM metrics WHERE key = 'rollout/failed'")]
    assert failed == [0.0, 0.0]
    assert params["data.agent.class_path"] == "agentrl.agents.http_agent.HTTPAgent"
