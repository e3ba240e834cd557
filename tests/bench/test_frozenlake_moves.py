"""`benchmarks/frozenlake_moves.py` reads a FrozenLake cell's held-out evaluations back from a real MLflow store:
episodes written as the trainer writes them (`log_episode`, the ``agentrl.eval`` tag), moves tallied by lake
position, worked out by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentrl.tracking.chat import log_episode
from agentrl.types import Trajectory, Turn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from frozenlake_moves import moves

SYSTEM = {"role": "system", "content": "Reply with one move."}


def _episode(replies: list[str]) -> Trajectory:
    turns = [Turn([1, 2], [3], [-0.5], index=k, text=text,
                  messages=[SYSTEM, {"role": "user", "content": "P."}] if k == 0 else
                  [{"role": "user", "content": "moved"}]) for k, text in enumerate(replies)]
    return Trajectory(turns=turns, reward=0.0, terminated=True, task_id="seed-0", seed=1, info={"success": False})


def test_moves_are_tallied_by_position_per_sampled_evaluation(tmp_path: Path) -> None:
    import mlflow
    from mlflow import MlflowClient

    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    episodes = [
        ("base", ["down", "right"]),  # (0,0) down -> (1,0) right
        ("final", ["Right.", "up", "down"]),  # (0,0) right -> (0,1) up: a wall, stays -> (0,1) down
        ("final", ["jump", "left"]),  # (0,0) not a move, stays -> (0,0) left: a wall
        ("step 5 (820 tokens)", ["down"]),  # the label before " (" names the evaluation
        ("final greedy", ["down", "down"]),  # greedy evaluations are left out
        (None, ["up", "up"]),  # a training episode: left out
    ]
    mlflow.set_tracking_uri(uri)
    try:
        client = MlflowClient(uri)
        exp = client.create_experiment("moves")
        run = client.create_run(exp, run_name="frozenlake-rtpo-seed0")
        for label, replies in episodes:
            trace_id = log_episode(client, _episode(replies), experiment_id=exp, run_id=run.info.run_id, step=0,
                                   model="tiny", reward_source="env")
            if label is not None:
                client.set_trace_tag(trace_id, "agentrl.eval", label)
    finally:
        mlflow.set_tracking_uri(None)  # type: ignore[arg-type]  # None unsets it; mlflow's hint omits None
    table = moves(str(db), "frozenlake-rtpo-seed0")
    assert set(table) == {"base", "final", "step 5"}
    assert {pos: dict(c) for pos, c in table["base"].items()} == {(0, 0): {"down": 1}, (1, 0): {"right": 1}}
    assert {pos: dict(c) for pos, c in table["final"].items()} == {
        (0, 0): {"right": 1, "other": 1, "left": 1}, (0, 1): {"up": 1, "down": 1}}
    assert {pos: dict(c) for pos, c in table["step 5"].items()} == {(0, 0): {"down": 1}}
    with pytest.raises(SystemExit, match="no run named 'nope'"):
        moves(str(db), "nope")
