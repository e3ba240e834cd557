"""Trace ids are unique per run and per resume, and tracing leaves the training's random stream alone.

OpenTelemetry draws trace and span ids from Python's global `random`, which ``seed_everything`` seeds: before
`agentrl.tracking.chat.fresh_ids`, every seed-0 run drew the same ids (``tr-e3e70682…``) and replaced the traces
of the previous seed-0 run in a shared store, and a resume reused the ids of the steps before the stop."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest

from agentrl.tracking.chat import log_episode
from agentrl.types import Trajectory, Turn
from tests.training.helpers import fit_in_process

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs/smoke/grpo.yaml")


class SigintAfterStep(pl.Callback):
    """Ctrl-C after the given RL step (`GracefulStop` then checkpoints and stops the run)."""

    def __init__(self, step: int = 1) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if getattr(pl_module, "rl_step", 0) == self.step:
            os.kill(os.getpid(), signal.SIGINT)


def _episode() -> Trajectory:
    turn = Turn([1, 2, 3], [4, 5], [-0.5, -0.25], index=0, messages=[{"role": "user", "content": "hi"}],
                text="hello")
    return Trajectory(turns=[turn], reward=1.0, terminated=True, task_id="t0", seed=0, info={"success": True})


def test_seeded_runs_draw_different_ids_and_keep_their_random_stream(tmp_path: Path) -> None:
    import mlflow
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    try:
        client = MlflowClient(uri)
        exp = client.create_experiment("ids")
        ids, draws = [], []
        for _ in range(2):  # two "runs" with the same seed
            run = client.create_run(exp)  # (MLflow names a run with the global `random`)
            random.seed(0)
            ids.append(log_episode(client, _episode(), experiment_id=exp, run_id=run.info.run_id, step=1,
                                   model="tiny", reward_source="r"))
            draws.append(random.random())
    finally:
        mlflow.set_tracking_uri(None)  # type: ignore[arg-type]  # None unsets it; mlflow's hint omits None
    random.seed(0)
    assert ids[0] != ids[1]
    assert draws == [random.random()] * 2  # logging a trace neither read nor advanced the seeded stream


def _trace_ids(db: Path) -> dict[str, list[str]]:
    """Trace ids per run id in the store."""
    import sqlite3

    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT request_id, value FROM trace_request_metadata WHERE key = 'mlflow.sourceRun'")
        out: dict[str, list[str]] = {}
        for trace_id, run_id in rows.fetchall():
            out.setdefault(run_id, []).append(trace_id)
    return out


def _run_ids(db: Path) -> dict[str, str]:
    import sqlite3

    with sqlite3.connect(db) as con:
        return dict(con.execute("SELECT name, run_uuid FROM runs").fetchall())


def _rewards(db: Path, run_id: str) -> list[float]:
    import sqlite3

    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT value FROM metrics WHERE key = 'rollout/reward' AND run_uuid = ? ORDER BY step",
                           (run_id,)).fetchall()
    return [float(v) for (v,) in rows]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
def test_two_seed0_runs_and_a_resume_into_one_store_share_no_trace_id(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    common = ["--config", SMOKE, "--data.steps", "2", "--tracking.every_n_steps", "1",
              "--tracking.log_final_model", "false"]
    for name in ("a", "b"):  # the same seed, the same store, two runs
        code, _, err = fit_in_process(tmp_path, [*common, "--trainer.logger.init_args.run_name", name,
                                                 "--checkpoint.dirpath", f"ckpt-{name}"], capsys, monkeypatch)
        assert code == 0, err[-3000:]
    stopped = [*common, "--trainer.logger.init_args.run_name", "c", "--checkpoint.dirpath", "ckpt-c"]
    code, _, err = fit_in_process(tmp_path, [*stopped, "--trainer.callbacks+=tests.tracking.test_trace_ids"
                                                       ".SigintAfterStep"], capsys, monkeypatch)
    assert code == 0, err[-3000:]
    run_ids = _run_ids(tmp_path / "mlflow.db")
    assert len(_trace_ids(tmp_path / "mlflow.db").get(run_ids["c"], [])) == 4  # step 1 only
    code, out, err = fit_in_process(tmp_path, [*stopped, "--ckpt_path", "last"], capsys, monkeypatch)
    assert code == 0 and "resumed at step 1" in out, err[-3000:]

    assert _run_ids(tmp_path / "mlflow.db") == run_ids  # the resume continued run c
    runs = _trace_ids(tmp_path / "mlflow.db")
    # 4 traces a step, 2 steps a run: no run overwrote another's traces, the resume reused none of its own
    assert {name: len(runs.get(run_id, [])) for name, run_id in run_ids.items()} == {"a": 8, "b": 8, "c": 8}
    every = [trace_id for ids in runs.values() for trace_id in ids]
    assert len(set(every)) == len(every) == 24
    db = tmp_path / "mlflow.db"
    assert _rewards(db, run_ids["a"]) == _rewards(db, run_ids["b"]) == _rewards(db, run_ids["c"])  # deterministic
