"""Exact at scale: a two-rank update (gloo, CPU, tiny model) equals one process's update over the same turns.

`tests/training/exactness_run.py` runs one step of a schedule on fixed trajectories — rank 0 holds one group (RTPO:
one trunk of one turn, so it has no siblings at depths 2 and 1), rank 1 the other three — and saves every
optimizer step's summed gradient and the parameters after the step; one process over all four groups must give
the same. Before the fix (ranks divided by their own unit counts, then averaged) these differed at the first
gradient already.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", AGENTRL_VERBOSE="1")
    proc = subprocess.run([sys.executable, "-m", "tests.training.exactness_run", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc


class Update(TypedDict):
    """One run's record, as `exactness_run` saves it on rank 0."""

    grads: list[dict[str, torch.Tensor]]  # every optimizer step's summed gradient
    params: dict[str, torch.Tensor]  # the trainable parameters after the step
    metrics: dict[str, float]
    shared_batches: int
    world_size: int
    strategy: str


_RUNS: dict[tuple[int, str], dict[str, Update]] = {}


def _updates(tmp_path: Path, devices: int, strategy: str, schedule: str) -> Update:
    """One step of ``schedule`` ("turn_ppo", or "turn_ppo.mismatch" for the shifted behaviour log-probs) on
    ``devices`` ranks. Every schedule's run, the mismatch runs too, is made in one launch per (devices, strategy)
    on first use: one interpreter start and one process group instead of one per test."""
    key = (devices, "one" if devices == 1 else strategy)
    if key not in _RUNS:
        out = tmp_path / f"{key[0]}-{key[1]}"
        _run(tmp_path, "--schedule", "all", "--devices", str(devices), "--strategy", strategy, "--out", str(out))
        _RUNS[key] = {name: torch.load(f"{out}.{name}.pt", weights_only=True)
                      for name in ("grpo", "turn_ppo", "token_ppo", "rtpo", "turn_ppo.mismatch", "rtpo.mismatch",
                                   "grpo.contexts", "rtpo.contexts", "grpo.shared", "rtpo.shared",
                                   "turn_ppo.rawequal")}
        strategy_class = {"one": "SingleDeviceStrategy", "ddp": "DDPStrategy", "fsdp": "ModelParallelStrategy"}
        for record in _RUNS[key].values():  # each run was made where it says: not one process standing in for two
            assert (record["world_size"], record["strategy"]) == (devices, strategy_class[key[1]])
    return _RUNS[key][schedule]


def _one_process(tmp_path: Path, schedule: str) -> Update:
    return _updates(tmp_path, 1, "ddp", schedule)


def _step(tmp_path: Path, schedule: str, devices: int, strategy: str = "ddp", *,
          mismatch: bool = False) -> Update:
    return _updates(tmp_path, devices, strategy, f"{schedule}.mismatch" if mismatch else schedule)


def _assert_same_update(one: Update, two: Update, steps: int) -> None:
    assert len(one["grads"]) == len(two["grads"]) == steps
    for g1, g2 in zip(one["grads"], two["grads"], strict=True):
        assert g1.keys() == g2.keys()
        assert max(g.abs().max().item() for g in g1.values()) > 1e-3  # a real gradient, not zeros on both sides
        for name in g1:
            assert (g1[name] - g2[name]).abs().max().item() <= 1e-6, name
    p1, p2 = one["params"], two["params"]
    assert max((p1[n] - p2[n]).abs().max().item() for n in p1) <= 1e-6


@pytest.mark.slow
@pytest.mark.xdist_group("exactness")  # one worker makes each launch once (`_updates`)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("schedule", ["grpo", "turn_ppo", "token_ppo", "rtpo"])
def test_two_ranks_make_the_one_process_update(tmp_path: Path, schedule: str, strategy: str) -> None:
    """``fsdp``: FSDP2 (decoder layers sharded) through Lightning's ModelParallelStrategy."""
    one, two = _one_process(tmp_path, schedule), _step(tmp_path, schedule, 2, strategy)
    # 2 epochs; × 2 optimizers (policy, critic) for the PPO schedules; × 3 depths for RTPO
    _assert_same_update(one, two, {"grpo": 2, "turn_ppo": 4, "token_ppo": 4, "rtpo": 6}[schedule])
    # the step's logged metrics describe both ranks' trajectories
    assert one["metrics"]["rollout/reward"] == pytest.approx(two["metrics"]["rollout/reward"])
    # the loss is a mean of O(1) terms ratio·A whose advantages nearly cancel (|loss| ~ 1e-4): float32 summation
    # order (per rank, then across ranks) moves it by ~1e-8, more on some CPUs' kernels (1.8e-8 on an AVX-512 EPYC)
    assert one["metrics"]["train/policy_loss"] == pytest.approx(two["metrics"]["train/policy_loss"],
                                                                rel=1e-4, abs=1e-7)


@pytest.mark.slow
@pytest.mark.xdist_group("exactness")
@pytest.mark.parametrize(("schedule", "strategy"), [("turn_ppo", "ddp"), ("rtpo", "fsdp")])
def test_two_ranks_recompute_and_correct_as_one_process_does(tmp_path: Path, schedule: str, strategy: str) -> None:
    """Behaviour log-probs shifted by up to ±1 nat: each rank recomputes π_old for its own rows (under FSDP a
    collective forward), TIS truncates the same tokens, and the update and the logged mismatch metrics are the
    one-process ones (the maximum gap is the maximum over the ranks, the means are token-weighted)."""
    one, two = _one_process(tmp_path, f"{schedule}.mismatch"), _step(tmp_path, schedule, 2, strategy, mismatch=True)
    _assert_same_update(one, two, {"turn_ppo": 4, "rtpo": 6}[schedule])
    m1, m2 = one["metrics"], two["metrics"]
    # the planted shift is at most 1 nat; RTPO's later depths recompute after the earlier depths' updates moved the
    # weights a little
    assert m1["rollout/logprob_max_abs_diff"] == pytest.approx(1.0, abs=1e-2)
    assert 0 < m1["rollout/is_corrected_frac"] < 1  # some tokens truncated, not all
    for name in ("rollout/recomputed_tokens", "rollout/logprob_max_abs_diff", "rollout/logprob_mismatch_kl",
                 "rollout/is_corrected_frac", "rollout/is_weight_mean"):
        assert m2[name] == pytest.approx(m1[name], rel=1e-6, abs=1e-6), name


@pytest.mark.slow
@pytest.mark.xdist_group("exactness")
@pytest.mark.parametrize(("schedule", "strategy"), [("grpo", "ddp"), ("rtpo", "fsdp")])
def test_shared_prefixes_on_two_ranks_make_the_one_process_update(tmp_path: Path, schedule: str,
                                                                   strategy: str) -> None:
    """`model.share_prefixes` on two ranks (under FSDP the lockstep counts the merged micro-batches) gives the
    update one process makes with separate rows, on episodes whose contexts are shared (a GRPO group's first prompt,
    RTPO's siblings' replayed prefix)."""
    one, two = _one_process(tmp_path, f"{schedule}.contexts"), _updates(tmp_path, 2, strategy, f"{schedule}.shared")
    assert one["shared_batches"] == 0 and two["shared_batches"] > 0
    _assert_same_update(one, two, {"grpo": 2, "rtpo": 6}[schedule])


@pytest.mark.slow
@pytest.mark.xdist_group("exactness")
def test_two_ranks_agree_that_returns_differ_only_across_them(tmp_path: Path) -> None:
    """Turn-PPO with ``whiten_equal_returns: false``: rank 0 holds one episode (return 1), rank 1 three with return
    0. Each rank alone sees one return and would leave its advantages unscaled; the batch's returns differ, so one
    process whitens, and two ranks must decide from the moments of both (`_returns_vary` sums them)."""
    one, two = _one_process(tmp_path, "turn_ppo.rawequal"), _updates(tmp_path, 2, "ddp", "turn_ppo.rawequal")
    assert one["metrics"]["train/whitened"] == two["metrics"]["train/whitened"] == 1.0
    _assert_same_update(one, two, 4)


@pytest.mark.slow
def test_logged_reward_of_a_two_rank_step_is_the_mean_over_both_ranks(tmp_path: Path) -> None:
    """Real rollouts on two ranks: the logged ``rollout/reward`` is the mean over both ranks' episodes."""
    out = tmp_path / "rollouts"
    _run(tmp_path, "--schedule", "grpo", "--devices", "2", "--rollouts", "--out", str(out))
    ranks = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in (0, 1)]
    rewards = ranks[0]["rewards"] + ranks[1]["rewards"]
    assert ranks[0]["rewards"] and ranks[1]["rewards"]
    logged = ranks[0]["metrics"]["rollout/reward"]
    assert logged == pytest.approx(sum(rewards) / len(rewards), abs=1e-6)
    assert ranks[1]["metrics"]["rollout/reward"] == logged  # every rank logs the same global value
    assert ranks[0]["metrics"]["rollout/episodes"] == len(rewards)


FSDP2 = ["--trainer.devices", "2", "--trainer.strategy", "lightning.pytorch.strategies.ModelParallelStrategy",
         "--trainer.strategy.data_parallel_size", "2", "--trainer.strategy.tensor_parallel_size", "1"]


def _launch(cwd: Path, args: list[str], marker: str | None, on_marker: Callable[[subprocess.Popen[str]], None],
            timeout: int = 300) -> str:
    """``agentrl fit *args`` on its own process group; ``on_marker(proc)`` at the first line starting with
    ``marker``; the whole output. Fails the test past ``timeout`` seconds (the group killed)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "fit", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if marker is not None and line.startswith(marker):
            on_marker(proc)
            break
    try:
        rest = proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the two-rank run did not end within {timeout} s:\n" + "".join(lines)[-3000:])
    return "".join(lines) + rest


@pytest.mark.slow
def test_sharded_run_stops_on_sigterm_survives_a_kill_and_resumes(tmp_path: Path) -> None:
    """``agentrl fit`` on the RTPO smoke config with FSDP2 on two CPU ranks, launched three times in one folder:

    1. SIGTERM to the launching rank only (what a scheduler or ``kill`` sends) after step 1: both ranks finish the
       same step k, save one sharded checkpoint and exit 0. Before agentrl replaced Lightning's SIGTERM handler for
       the training loop, this run hung (Lightning's handler broadcasts from inside the signal handler).
    2. ``--ckpt_path last`` resumes at k and is killed hard during step k + 2 (both ranks, no chance to save): the
       periodic sharded checkpoint of step k + 1 is what is left.
    3. Resumed again, it finishes, making the same step k + 2 as before the kill (the restored weights are the
       same), and the base model was evaluated only by the first launch."""
    ckpt = tmp_path / "checkpoints/smoke/last.ckpt"
    args = ["--config", str(ROOT / "configs/smoke/rtpo.yaml"), *FSDP2, "--data.steps", "5",
            "--data.eval_episodes", "2"]
    # rank 0 only; rank 1 learns of it through the step's collective
    first = _launch(tmp_path, args, "step 1/5", lambda proc: proc.send_signal(signal.SIGTERM), timeout=180)
    stopped = re.search(r"stopped after step (\d)", first)
    assert stopped, first[-3000:]
    k = int(stopped.group(1))
    assert 1 <= k <= 3 and f"step {k + 1}/5" not in first, first[-3000:]
    assert ckpt.is_dir() and any(ckpt.glob("*.distcp"))  # a sharded (distributed) checkpoint
    assert torch.load(ckpt / "meta.pt", weights_only=True)["agentrl"]["rl_step"] == k  # the step both stopped after

    def kill(proc: subprocess.Popen[str]) -> None:
        os.killpg(proc.pid, signal.SIGKILL)  # both ranks

    killed = _launch(tmp_path, [*args, "--ckpt_path", "last"], f"step {k + 2}/5", kill)
    assert f"resumed at step {k}" in killed, killed[-3000:]
    before = next(line for line in killed.splitlines() if line.startswith(f"step {k + 2}/5"))
    assert torch.load(ckpt / "meta.pt", weights_only=True)["agentrl"]["rl_step"] == k + 1

    resumed = subprocess.run([sys.executable, "-m", "agentrl.cli", "fit", *args, "--ckpt_path", "last"], cwd=tmp_path,
                             env=dict(os.environ, PYTHONUNBUFFERED="1"), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert f"resumed at step {k + 1}" in resumed.stdout
    base = "[agentrl] base evaluation"
    assert any(line.startswith(base) for line in first.splitlines())
    assert base not in killed and base not in resumed.stdout  # the base model only once
    after = next(line for line in resumed.stdout.splitlines() if line.startswith(f"step {k + 2}/5"))
    assert after.split()[:6] == before.split()[:6]  # same reward and success: the restored weights are the same
    assert torch.load(ckpt / "meta.pt", weights_only=True)["agentrl"]["rl_step"] == 5
