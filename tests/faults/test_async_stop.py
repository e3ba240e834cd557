"""SIGTERM with episodes in flight (issue 28): ``agentrl fit`` with ``data.max_staleness: 1`` against a real
``agentrl serve`` process on 127.0.0.1 is stopped while the next step's batch is launched ahead; it checkpoints and
exits 0, and ``--ckpt_path last`` continues the same MLflow run from the checkpointed step with no step lost and
none repeated, saying how many launched episodes it collects again (they are not in the checkpoint)."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
import torch

from tests.support.fit_runs import fit_until, logged_steps, mlflow_runs
from tests.support.server import LORA_ARGS, start_server

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs/smoke/grpo_async_serve.yaml")
ENV = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", AGENTRL_VERBOSE="0")


def _fit(cwd: Path, args: list[str], stop_at: str | None, timeout: int = 300) -> tuple[int, str]:
    """``agentrl fit``; SIGTERM when a line starts with ``stop_at``; (returncode, output)."""
    return fit_until(CONFIG, cwd, args, ENV, marker=stop_at, on_marker=lambda p: p.send_signal(signal.SIGTERM),
                     timeout=timeout)


# train/* is absent at steps whose update had no signal (all GRPO advantages zero), so the test reads the
# rollout/perf metrics every step logs


@pytest.mark.slow
def test_sigterm_with_episodes_in_flight_resumes_without_losing_a_step(tmp_path: Path) -> None:
    """GRPO (2 tasks × group 2 = 4 episodes a step), s = 1, 5 steps, SIGTERM after step 2's progress line: the run
    stops after a step k in 2..4 with step k+1's 4 episodes launched ahead, saves them (the count, not the
    episodes) in ``last.ckpt`` and says so; the MLflow run ends KILLED with steps 0..k−1. The resume says it
    collects those 4 episodes again, logs steps k..4, and the one run ends FINISHED with every step 0..4 exactly
    once in every metric."""
    server = start_server(tmp_path, *LORA_ARGS)
    try:
        urls = ["--model.engine.init_args.base_urls", f"[{server.url}]", "--data.steps", "5"]
        rc, out = _fit(tmp_path, urls, stop_at="step 2/5")
        assert rc == 0, out[-3000:]
        stopped = re.search(r"stopped after step (\d)", out)
        assert stopped, out[-3000:]
        k = int(stopped.group(1))
        assert 2 <= k < 5
        assert f"stopped with 4 episode(s) launched ahead for step(s) {k + 1} (" in out, out[-3000:]
        state = torch.load(tmp_path / "checkpoints/smoke/last.ckpt", weights_only=True)["agentrl"]
        assert state["rl_step"] == k
        assert state["launched_ahead"]["steps"] == [k] and state["launched_ahead"]["episodes"] == 4
        db = tmp_path / "mlflow.db"
        ((run_id, status),) = mlflow_runs(db)
        assert status == "KILLED"
        assert logged_steps(db, "rollout/reward") == list(range(k))

        rc, out = _fit(tmp_path, [*urls, "--ckpt_path", "last"], stop_at=None)
        assert rc == 0, out[-3000:]
        for key in ("rollout/reward", "perf/generated_tokens", "perf/step_seconds", "rollout/staleness_max"):
            assert logged_steps(db, key) == [0, 1, 2, 3, 4], key  # no gap, no duplicate
        assert f"resumed at step {k}" in out
        assert f"resumed: re-collecting 4 episode(s) of step(s) {k + 1} that the stopped run had launched ahead" \
            in out, out[-3000:]
        assert mlflow_runs(db) == [(run_id, "FINISHED")]
        assert torch.load(tmp_path / "checkpoints/smoke/last.ckpt", weights_only=True)["agentrl"]["rl_step"] == 5
    finally:
        server.stop()
