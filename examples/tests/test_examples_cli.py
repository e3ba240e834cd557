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
import torch
from tests.support.trained import changed_policy_tensors

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["openai_agents_rtpo", "openai_client_rtpo"])
def test_smoke_config_trains_two_steps_through_the_gateway(tmp_path: Path, name: str) -> None:
    """The smoke config's random model earns equal rewards (zero advantages, no optimizer step), so an entropy
    bonus gives the update a signal: every policy tensor must then have moved."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    config = str(ROOT / f"configs/smoke/{name}.yaml")
    proc = subprocess.run([sys.executable, "-m", "agentrl.cli", "fit", "--config", config,
                           "--model.algorithm.init_args.ppo.entropy_coef", "0.01"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = torch.load(tmp_path / "checkpoints/smoke/last.ckpt", weights_only=True, map_location="cpu")
    assert state["agentrl"]["rl_step"] == 2
    changed, total = changed_policy_tensors(tmp_path / "checkpoints/smoke/last.ckpt")
    assert changed == total > 0, f"{changed} of {total} policy tensors changed"
    with sqlite3.connect(tmp_path / "mlflow.db") as con:
        steps = [s for (s,) in con.execute("SELECT step FROM metrics WHERE key = 'rollout/reward' ORDER BY step")]
        failed = [v for (v,) in con.execute("SELECT value FROM metrics WHERE key = 'rollout/failed'")]
        grad_norms = [v for (v,) in con.execute("SELECT value FROM metrics WHERE key = 'train/grad_norm'")]
        params = dict(con.execute("SELECT key, value FROM params").fetchall())
    assert steps == [0, 1]
    assert failed == [0.0, 0.0]
    assert len(grad_norms) == 2 and all(g > 0 for g in grad_norms)
    assert params["data.agent.class_path"] == "agentrl.agents.http_agent.HTTPAgent"
