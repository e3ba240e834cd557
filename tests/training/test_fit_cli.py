"""`agentrl fit` end to end through a subprocess, as a user runs it: every schedule, MLflow, checkpoints, resume,
and clear errors for bad config."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.fit_runs import logged_steps, mlflow_runs
from tests.training.helpers import fit_in_process

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ["grpo", "turn_ppo", "token_ppo"]  # and rtpo: test_fit_output.py runs its smoke config and checks it here


def _fit(cwd: Path, *args: str, timeout: int = 300, verbose: bool = False) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", AGENTRL_VERBOSE="1" if verbose else "0")
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "fit", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def _metrics(db: Path, key: str) -> dict[int, float]:
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT step, value FROM metrics WHERE key = ? ORDER BY step", (key,)).fetchall()
    return {int(s): float(v) for s, v in rows}


@pytest.mark.slow
@pytest.mark.parametrize("name", SMOKE)
def test_smoke_config_trains_end_to_end(tmp_path: Path, name: str) -> None:
    proc = _fit(tmp_path, "--config", str(ROOT / f"configs/smoke/{name}.yaml"),
                "--tracking.final_model_min_steps", "0")  # a 3-step run: no final model by default
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_smoke_run(tmp_path, name)


def check_smoke_run(tmp_path: Path, name: str) -> None:
    """A finished 3-step smoke run of schedule `name` in `tmp_path`: its checkpoint, trained weights, metrics,
    parameters and review artifacts. RTPO's smoke run is the one `test_fit_output.py` reads the output of."""
    ckpt = tmp_path / "checkpoints/smoke/last.ckpt"
    state = torch.load(ckpt, weights_only=True, map_location="cpu")
    assert state["agentrl"]["rl_step"] == 3
    from agentrl.models.policy import Policy

    init = Policy("tiny-random", seed=0).model.state_dict()
    trained = {k.removeprefix("policy.model."): v for k, v in state["state_dict"].items()
               if k.startswith("policy.model.")}
    changed = [k for k, v in init.items() if not torch.equal(v, trained[k])]
    assert changed, "the policy's parameters did not change"
    db = tmp_path / "mlflow.db"
    assert db.exists()
    assert sorted(_metrics(db, "rollout/reward")) == [0, 1, 2]
    for key in ("train/policy_loss", "train/approx_kl", "train/clipfrac", "train/entropy", "train/grad_norm",
                "perf/generated_tokens", "perf/rollout_tokens_per_s", "perf/train_tokens_per_s", "perf/mfu"):
        assert _metrics(db, key), key
    if name in ("turn_ppo", "token_ppo"):
        assert _metrics(db, "train/value_loss") and _metrics(db, "train/explained_variance")
    with sqlite3.connect(db) as con:
        params = dict(con.execute("SELECT key, value FROM params").fetchall())
    assert params["data.batch_size"] == "4"
    _check_review_artifacts(tmp_path, db)


def _check_review_artifacts(cwd: Path, db: Path) -> None:
    """What a reviewer opens in the MLflow UI: config, traces (a span per turn), trajectory table, reward curve,
    final model."""
    import mlflow
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    (exp,) = [e for e in client.search_experiments() if e.name == "agentrl-smoke"]
    (run,) = client.search_runs([exp.experiment_id])
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "trajectories.json", "reward_curve.png", "final_model"} <= names, names
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    traces = mlflow.search_traces(locations=[exp.experiment_id], run_id=run.info.run_id, return_type="list")
    assert traces
    spans = traces[0].data.spans
    assert spans[0].name.startswith("episode") and any(s.name.startswith("turn ") for s in spans)


def test_a_run_ended_by_its_token_budget_is_finished_not_killed(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`data.max_generated_tokens` ends a run before `data.steps` by design: its MLflow run reads FINISHED (KILLED
    is a requested stop, resumable), and its final evaluation is played."""
    code, _, err = fit_in_process(tmp_path, ["--config", str(ROOT / "configs/smoke/grpo.yaml"), "--data.steps", "50",
                                             "--data.max_generated_tokens", "40", "--data.eval_episodes", "2"],
                                  capsys, monkeypatch)
    assert code == 0, err[-3000:]
    state = torch.load(tmp_path / "checkpoints/smoke/last.ckpt", weights_only=True, map_location="cpu")["agentrl"]
    assert 1 <= state["rl_step"] < 50  # the budget ended it
    db = tmp_path / "mlflow.db"
    ((_, status),) = mlflow_runs(db)
    assert status == "FINISHED", status
    assert _metrics(db, "eval/success")  # the final evaluation was played


@pytest.mark.slow
def test_stop_and_resume_reproduce_the_uninterrupted_run(tmp_path: Path) -> None:
    config = str(ROOT / "configs/smoke/turn_ppo.yaml")
    steps = ["--data.steps", "6"]
    full = tmp_path / "full"
    full.mkdir()
    assert _fit(full, "--config", config, *steps).returncode == 0

    part = tmp_path / "part"
    part.mkdir()
    env = dict(os.environ, PYTHONUNBUFFERED="1", AGENTRL_VERBOSE="0")
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "fit", "--config", config, *steps], cwd=part,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout is not None
    for line in proc.stdout:  # stop as soon as step 2 is reported: the run finishes its step, saves, exits
        if line.startswith("step 2/6"):
            # Ctrl-C (SIGTERM: tests/faults/test_tracking_faults.py); before the fix the run ended its epoch on
            # SIGINT, the end-of-epoch checkpoint marked it finished and the resume trained nothing
            proc.send_signal(signal.SIGINT)
            break
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, out[-2000:]
    stopped = torch.load(part / "checkpoints/smoke/last.ckpt", weights_only=True)["agentrl"]["rl_step"]
    assert 2 <= stopped < 6
    db = part / "mlflow.db"
    ((run_id, status),) = mlflow_runs(db)
    assert status == "KILLED", status  # stopped on request after a checkpoint: resumable, not a failure
    assert logged_steps(db, "rollout/reward") == list(range(stopped))
    resumed = _fit(part, "--config", config, *steps, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed at step " in resumed.stdout
    # the resume continues the same MLflow run (tracking fault item 8): one training run, one run, whole history
    assert mlflow_runs(db) == [(run_id, "FINISHED")]
    assert logged_steps(db, "rollout/reward") == logged_steps(db, "train/policy_loss") == list(range(6))
    for key in ("rollout/reward", "train/policy_loss", "train/value_loss", "perf/generated_tokens"):
        a, b = _metrics(full / "mlflow.db", key), _metrics(part / "mlflow.db", key)
        assert sorted(a) == sorted(b) == list(range(6)), key
        for step in a:
            assert b[step] == pytest.approx(a[step], rel=1e-4, abs=1e-5), (key, step)


def test_print_config_shows_the_resolved_config(tmp_path: Path) -> None:
    """One shipped config through the real command; every shipped config is parsed and checked in process by
    `tests/training/test_fit_output.py::test_every_shipped_config_passes_the_checks_before_work`."""
    proc = _fit(tmp_path, "--config", str(ROOT / "configs/rtpo.yaml"), "--print_config", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "class_path: agentrl.training.RTPO" in proc.stdout  # the short form the config names
    assert list(tmp_path.iterdir()) == []  # printing the config starts nothing


@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
@pytest.mark.parametrize(
    "args,expected",
    [
        (["--model.optim.lr", "-0.001"], "optim.lr must be a positive number"),
        (["--data.batch_sizee", "4"], "batch_sizee"),
        (["--data.steps", "many"], "data.steps"),
        (["--data.batch_size", "1", "--model.algorithm.init_args.group_size", "2",
          "--model.algorithm.class_path", "agentrl.training.schedules.grpo.GRPO"], "smaller than one group"),
    ],
    ids=["negative-lr", "unknown-key", "wrong-type", "batch-smaller-than-group"],
)
def test_bad_config_stops_before_work_naming_the_key(tmp_path: Path, args: list[str], expected: str,
                                                     capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = fit_in_process(tmp_path, ["--config", str(ROOT / "configs/smoke/turn_ppo.yaml"), *args],
                                    capsys, monkeypatch)
    assert code != 0
    assert expected in err
    assert "step 1:" not in out + err and "evaluation on" not in out + err  # no rollout, not even the base evaluation
    assert not (tmp_path / "checkpoints").exists()


def test_a_bad_config_fails_the_command_naming_the_key(tmp_path: Path) -> None:
    """The same through the real command: a non-zero exit status and the key on stderr."""
    proc = _fit(tmp_path, "--config", str(ROOT / "configs/smoke/turn_ppo.yaml"), "--model.optim.lr", "-0.001",
                timeout=120)
    assert proc.returncode != 0
    assert "optim.lr must be a positive number" in proc.stderr
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["turn_ppo", "rtpo"])
def test_ddp_on_two_cpu_ranks(tmp_path: Path, name: str) -> None:
    """Two ranks (gloo) collect different tasks, do different amounts of work, and stay in lockstep: the module
    compares a weight checksum across ranks after every step and would stop the run if they diverged."""
    proc = _fit(tmp_path, "--config", str(ROOT / f"configs/smoke/{name}.yaml"), "--trainer.strategy", "ddp",
                "--trainer.devices", "2", "--data.steps", "3", verbose=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "GLOBAL_RANK: 1" in out
    steps = [line for line in out.splitlines() if " step 3:" in line]
    assert len(steps) == 2  # both ranks finished the third step
    state = torch.load(tmp_path / "checkpoints/smoke/last.ckpt", weights_only=True)
    assert state["agentrl"]["rl_step"] == 3
