"""Several machines, shown on loopback (issue 28): ``agentrl fit`` launched by ``torchrun --nnodes 2
--nproc-per-node 1 --rdzv-backend c10d`` twice — two "nodes" with their own working directories, one rank each,
gloo — makes the update one process makes over the same global batch, logs one MLflow run (global rank 0's), and
hands each rank the tasks of its *global* rank."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
# whole-batch minibatches: ``ppo.minibatch_size`` counts each rank's rows, so split minibatches would differ
ARGS = ["--config", str(ROOT / "configs/smoke/turn_ppo.yaml"), "--data.steps", "2",
        "--model.algorithm.init_args.ppo.minibatch_size", "null",
        "--trainer.callbacks+=tests.support.rank_log.RankTaskLog"]
ENV = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", AGENTRL_VERBOSE="1",
           PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def _start(cwd: Path, cmd: list[str]) -> subprocess.Popen[str]:
    cwd.mkdir()
    return subprocess.Popen(cmd, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen[str], timeout: int = 300) -> str:
    try:
        out = proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("a run did not finish in time:\n" + proc.communicate()[0][-3000:])
    assert proc.returncode == 0, out[-3000:]
    return out


def _metrics(db: Path) -> dict[str, dict[int, float]]:
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT key, step, value FROM metrics").fetchall()
    out: dict[str, dict[int, float]] = {}
    for key, step, value in rows:
        out.setdefault(key, {})[int(step)] = float(value)
    return out


def _runs(db: Path) -> list[str]:
    if not db.exists():
        return []
    with sqlite3.connect(db) as con:
        return [status for (status,) in con.execute("SELECT status FROM runs")]


def _weights(cwd: Path) -> dict[str, torch.Tensor]:
    return torch.load(cwd / "checkpoints/smoke/last.ckpt", weights_only=True)["state_dict"]


@pytest.mark.slow
def test_two_nodes_make_the_one_process_update_log_one_run_and_shard_by_global_rank(tmp_path: Path) -> None:
    """Turn-PPO smoke config, 2 steps: two nodes × 4 tasks against one process × 8 tasks (the same global batch).
    Measured on a 2-core CPU machine: the same episodes (token counts identical, the mean reward within 2.4e-8,
    float32), policy and value losses within 6e-8, gradient norms within 1.5e-7 (asserted: rel 1e-6 or abs 1e-6;
    the summation order across ranks differs), parameters after two steps within 2e-5 (asserted: 1e-4, a tenth of
    one AdamW step at lr 1e-3: Adam moves an element whose gradient is ~0 by up to lr, so float noise in a
    near-zero gradient shows there; the grad-norm check is the one that catches a wrong scale, which Adam hides).
    With the task stream sharded by the local rank (0 on both nodes) both ranks were handed tasks 0–3 and this test
    failed."""
    port = free_port()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "agentrl-2n",
                "-m", "agentrl.cli", "fit", *ARGS,
                "--trainer.strategy", "ddp", "--trainer.num_nodes", "2", "--trainer.devices", "1"]
    nodes = [_start(tmp_path / f"node{i}", torchrun) for i in (0, 1)]
    one = _start(tmp_path / "one", [sys.executable, "-m", "agentrl.cli", "fit", *ARGS, "--data.batch_size", "8"])
    outs = [_finish(p) for p in nodes]
    _finish(one)

    records = {}
    for i in (0, 1):
        (log,) = (tmp_path / f"node{i}").glob("tasks-rank*.json")
        record = json.loads(log.read_text())
        records[record["global_rank"]] = record | {"dir": tmp_path / f"node{i}"}
    assert sorted(records) == [0, 1], outs[0][-2000:]
    assert {r["node_rank"] for r in records.values()} == {0, 1}
    assert all(r["local_rank"] == 0 and r["world_size"] == 2 for r in records.values())
    (reference,) = [json.loads((tmp_path / "one/tasks-rank0.json").read_text())["steps"]]
    for step, tasks in enumerate(reference):  # global rank r takes the r-th half of the one-process batch
        assert records[0]["steps"][step] == tasks[:4] and records[1]["steps"][step] == tasks[4:], step

    rank0, rank1 = records[0]["dir"], records[1]["dir"]
    assert _runs(rank0 / "mlflow.db") == ["FINISHED"] and _runs(rank1 / "mlflow.db") == []  # one MLflow run
    assert not (rank1 / "checkpoints").exists()
    two, single = _metrics(rank0 / "mlflow.db"), _metrics(tmp_path / "one/mlflow.db")
    for key in ("rollout/episodes", "perf/generated_tokens", "rollout/sampled_turns"):
        assert two[key] == single[key], key
    for step in (0, 1):  # the same episodes; the two-rank mean is reduced in float32 (torchmetrics)
        assert two["rollout/reward"][step] == pytest.approx(single["rollout/reward"][step], abs=1e-6)
    assert two["rollout/episodes"] == {0: 8.0, 1: 8.0}
    for key in ("train/policy_loss", "train/value_loss", "train/approx_kl", "train/grad_norm"):
        assert sorted(two[key]) == [0, 1], key
        for step in (0, 1):
            assert two[key][step] == pytest.approx(single[key][step], rel=1e-6, abs=1e-6), (key, step)

    from agentrl.models.policy import Policy

    w2, w1 = _weights(rank0), _weights(tmp_path / "one")
    init = Policy("tiny-random", seed=0).model.state_dict()
    policy = [k for k in w1 if k.startswith("policy.model.")]
    assert any(not torch.equal(init[k.removeprefix("policy.model.")], w1[k]) for k in policy)  # it trained
    assert w1.keys() == w2.keys()
    gap = max((w1[k] - w2[k]).abs().max().item() for k in w1)
    assert gap <= 1e-4, gap


# ---------------------------------------------------------------------------------------------------- async, 2 ranks


@pytest.mark.slow
def test_two_ranks_with_async_collection_keep_the_bound_globally(tmp_path: Path) -> None:
    """GRPO, ``data.max_staleness 1``, two DDP ranks (Lightning's launcher, gloo), each with its own `agentrl serve`
    and the update slowed by 1 s: on every rank every trained turn is at most one version behind the trainer and
    some are exactly one behind (the overlap is real on both), the ranks train different tasks at the same versions,
    and the logged ``rollout/staleness_max`` of each step (reduced over the ranks) is the largest lag of either
    rank. With collection launched two steps ahead and the drop guard off, rank lags of 2 were trained and this
    test failed."""
    from tests.support.server import LORA_ARGS, start_server

    servers = [start_server(tmp_path, *LORA_ARGS, lora_root=tmp_path) for _ in range(2)]
    try:
        out = tmp_path / "async"
        proc = subprocess.run([sys.executable, "-m", "tests.training.async_ranks_run", "--urls",
                               *(s.url for s in servers), "--adapter-root", str(tmp_path), "--out", str(out)],
                              cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    finally:
        for server in servers:
            server.stop()
    ranks = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in (0, 1)]
    lags = [[[u["version"] - v for v in u["turn_versions"]] for u in rank["trained"]] for rank in ranks]
    for rank, per_update in zip(ranks, lags, strict=True):
        assert len(rank["trained"]) == 4 and all(per_update), rank["global_rank"]
        assert max(max(u) for u in per_update) <= 1, per_update
        assert any(1 in u for u in per_update), per_update  # this rank trained turns generated during an update
    assert [u["version"] for u in ranks[0]["trained"]] == [u["version"] for u in ranks[1]["trained"]]
    assert all(not set(a["tasks"]) & set(b["tasks"])
               for a, b in zip(ranks[0]["trained"], ranks[1]["trained"], strict=True))  # sharded
    logged = [m["rollout/staleness_max"] for m in ranks[0]["steps"]]
    assert logged == [m["rollout/staleness_max"] for m in ranks[1]["steps"]]
    assert logged == [float(max(*a, *b)) for a, b in zip(lags[0], lags[1], strict=True)]
    assert all(m["rollout/stale_dropped_episodes"] == 0 for m in ranks[0]["steps"])
