"""What an `agentrl fit` run changed: its checkpoint's policy weights against the tiny random model it started from.

A smoke run whose rewards are all equal has zero advantages and takes no optimizer step (an AdamW step with no
signal would still move the weights, so the update skips it); a test that says a run *trains* gives it a signal
(`ENTROPY_BONUS`, a CLI override) and checks the weights moved (`assert_smoke_run_trained`).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import torch

from agentrl.models.policy import Policy

ENTROPY_BONUS = ("--model.algorithm.init_args.ppo.entropy_coef", "0.01")
"""The override that gives a smoke run's update a gradient whatever the rewards."""


def changed_policy_tensors(checkpoint: Path, seed: int = 0) -> tuple[int, int]:
    """``(changed, total)``: how many of ``Policy("tiny-random", seed=seed)``'s tensors differ in ``checkpoint``
    (a Lightning checkpoint of `AgentRLModule`, whose policy weights are under ``policy.``)."""
    saved = torch.load(checkpoint, weights_only=True, map_location="cpu")["state_dict"]
    start = Policy("tiny-random", seed=seed).state_dict()
    return sum(not torch.equal(saved[f"policy.{name}"], value) for name, value in start.items()), len(start)


def assert_smoke_run_trained(run_dir: Path, steps: int = 2) -> dict[str, str]:
    """A smoke config's run in ``run_dir`` (checkpoints/smoke/last.ckpt, mlflow.db) took ``steps`` RL steps, each
    with a gradient, and every policy tensor moved from the tiny model it started from. Returns the run's params."""
    checkpoint = run_dir / "checkpoints/smoke/last.ckpt"
    assert torch.load(checkpoint, weights_only=True, map_location="cpu")["agentrl"]["rl_step"] == steps
    changed, total = changed_policy_tensors(checkpoint)
    assert changed == total > 0, f"{changed} of {total} policy tensors changed"
    with sqlite3.connect(run_dir / "mlflow.db") as con:
        logged = [s for (s,) in con.execute("SELECT step FROM metrics WHERE key = 'rollout/reward' ORDER BY step")]
        grad_norms = [v for (v,) in con.execute("SELECT value FROM metrics WHERE key = 'train/grad_norm'")]
        params = dict(con.execute("SELECT key, value FROM params").fetchall())
    assert logged == list(range(steps))
    assert len(grad_norms) == steps and all(g > 0 for g in grad_norms), grad_norms
    return params
