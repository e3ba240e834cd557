"""Issue 29, item 3: a reward that is not a finite number fails its episode, with a message naming where it came
from, and never the run.

Before, an environment returning NaN or inf for a quarter of the tasks reached the loss (`NonFiniteUpdateError` at
step 1, exit 1, no checkpoint); an `HTTPAgent` reward returning NaN raised `DataError` at step 2; a ``str`` reward
was read as a float without a word. The collector tests use the real engine under a tiny model; the last test is a
real ``agentrl fit`` (smoke config, Lightning trainer) where a quarter of the episodes return NaN.
"""

from __future__ import annotations

import asyncio
import math
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentrl.agents.base import Outcome, Task
from agentrl.agents.env_agent import EnvAgent
from agentrl.agents.http_agent import HTTPAgent
from agentrl.agents.llm import LLMClient
from agentrl.agents.scoring import Score, score
from agentrl.collect.collector import Collector
from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.models.policy import Policy
from agentrl.serve.gateway import TrainingGateway
from tests.faults.nan_env import NaNRewardEnv

ROOT = Path(__file__).resolve().parents[2]


def _collect(policy: Policy, agent: Any, seeds: list[int]) -> list[Any]:
    async def main() -> list[Any]:
        engine = HFEngine(policy)
        gateway = TrainingGateway()
        if isinstance(agent, HTTPAgent):
            agent.attach(gateway)
        try:
            collector = Collector(engine, agent, policy.tokenizer, sampling=SamplingParams(max_tokens=4),
                                  max_failed_fraction=1.0)
            return await collector.collect_groups([Task(id=f"t{s}", seed=s) for s in seeds], 1, step=0)
        finally:
            await gateway.aclose()
            await engine.shutdown()

    return asyncio.run(main())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "1.0"], ids=["nan", "inf", "str"])
def test_a_bad_environment_reward_fails_only_its_episode_naming_the_environment(tiny_policy: Policy,
                                                                                  bad: Any) -> None:
    agent = EnvAgent(NaNRewardEnv(every=2, bad=bad, low=1, high=5, max_turns=2))
    trajs = _collect(tiny_policy, agent, [0, 1, 2, 3])
    assert [t.failed for t in trajs] == [True, False, True, False]
    for t in trajs[::2]:
        assert t.error.startswith("RewardError: reward from NaNRewardEnv.step is"), t.error
    assert all(math.isfinite(t.reward) and all(math.isfinite(x.reward) for x in t.turns) for t in trajs)


class _BadOutcome:
    async def run(self, task: Task, llm: LLMClient) -> Outcome:
        await llm.chat([{"role": "user", "content": "hi"}])
        return Outcome(float("nan"))


def test_a_nan_outcome_fails_its_episode_naming_the_agent(tiny_policy: Policy) -> None:
    (traj,) = _collect(tiny_policy, _BadOutcome(), [0])
    assert traj.failed and "the Outcome of _BadOutcome.run is nan" in (traj.error or ""), traj.error


def _ask(task: Task, base_url: str, api_key: str) -> str:
    r = httpx.post(f"{base_url}/chat/completions", headers={"Authorization": f"Bearer {api_key}"}, timeout=60,
                   json={"messages": [{"role": "user", "content": "hi"}]})
    r.raise_for_status()
    return str(r.json()["choices"][0]["message"]["content"])


def nan_for_odd_seeds(task: Task, result: str) -> float:
    return float("nan") if task.seed % 2 else 1.0


def test_an_http_agent_reward_of_nan_fails_only_its_episode(tiny_policy: Policy) -> None:
    trajs = _collect(tiny_policy, HTTPAgent(_ask, nan_for_odd_seeds), [0, 1])
    assert [t.failed for t in trajs] == [False, True]
    assert "RewardError: reward from the reward function nan_for_odd_seeds is nan" in (trajs[1].error or "")
    assert trajs[0].reward == 1.0


@pytest.mark.parametrize("value", ["1.0", b"1", None, True, Score(float("inf")), Score(1.0, turn_rewards=[math.nan])])
def test_score_refuses_what_is_not_a_finite_number(value: Any) -> None:
    from agentrl.agents.base import RewardError

    with pytest.raises(RewardError, match="reward from the reward function"):
        asyncio.run(score(lambda task, result: value, Task("t"), None))


def _metric(db: Path, key: str) -> list[tuple[int, float]]:
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT step, value FROM metrics WHERE key = ? ORDER BY step", (key,)).fetchall()
    return [(int(s), float(v)) for s, v in rows]


def test_a_run_where_a_quarter_of_the_episodes_return_nan_finishes_every_step(tmp_path: Path) -> None:
    """GRPO smoke config, 3 steps of 4 tasks × 2 samples; the tasks of seeds 0, 4 and 8 reward NaN (one a step)."""
    args = ["--config", str(ROOT / "configs/smoke/grpo.yaml"), "--data.batch_size", "8",
            "--data.agent.init_args.env.class_path", "tests.faults.nan_env.NaNRewardEnv"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "agentrl.cli", "fit", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "done: 3 steps" in out, out[-3000:]
    assert "NonFiniteUpdateError" not in out and "Traceback" not in out
    named = [line for line in out.splitlines() if "failed: RewardError: reward from NaNRewardEnv.step is nan" in line]
    assert {line.split()[line.split().index("episode") + 1] for line in named} == {"seed-0", "seed-4", "seed-8"}, out
    assert [v for _, v in _metric(tmp_path / "mlflow.db", "rollout/failed")] == [0.25, 0.25, 0.25]
    assert (tmp_path / "checkpoints/smoke/last.ckpt").is_file()
