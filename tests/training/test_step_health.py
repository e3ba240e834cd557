"""A step that cannot learn says so (issue 60): real fits with a tiny random model that produce each condition,
the line under the step line, the ``health/*`` metrics in a real MLflow store, the dead-run summary; a healthy
step prints none; the ETA from recent step times and the busy-machine hint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest

from agentrl.agents.base import Outcome, Task
from agentrl.agents.env_agent import EnvAgent
from agentrl.agents.llm import LLMClient
from agentrl.engines.base import SamplingParams
from agentrl.envs.base import StepResult, format_error
from agentrl.tracking import MLflowLogger
from agentrl.training.command.progress import RunProgress, eta_seconds, oversubscribed
from agentrl.training.rollout.datamodule import RolloutDataModule
from agentrl.training.schedules.grpo import GRPO
from agentrl.training.system.health import DeadRun, Finding
from tests.training.helpers import letter_data, make_module

SEARCH = [{"type": "function", "function": {"name": "search", "description": "Search the corpus.",
                                            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]


class ConstantAgent:
    """Every episode returns the same reward: no spread, every GRPO advantage 0."""

    async def run(self, task: Task, llm: LLMClient) -> Outcome:
        await llm.chat([{"role": "user", "content": task.id}])
        return Outcome(0.0, info={"success": False})


class ToolOfferingAgent:
    """Offers a tool on every turn; the reward (letters in the reply) has spread, so only the tools are unused."""

    async def run(self, task: Task, llm: LLMClient) -> Outcome:
        reply = await llm.chat([{"role": "user", "content": task.id}], tools=SEARCH)
        letters = sum(c.isascii() and c.isalpha() for c in reply.text) / max(len(reply.text), 1)
        return Outcome(letters + 0.01 * len(reply.text), info={"success": False})


class StrictEnv:
    """Accepts only ``<move>up</move>``, which a tiny random model never writes: every reply is a format error."""

    system_prompt = "Answer with <move>up</move>."
    max_turns = 2

    def reset(self, seed: int) -> str:
        self.turn = 0
        return "Move."

    def step(self, action: str) -> StepResult:
        self.turn += 1
        if "<move>up</move>" in action:
            return StepResult("", 1.0, True, False, {"success": True})
        return format_error("Answer with <move>up</move>.", -0.1, self.turn >= self.max_turns)


def _fit(tmp_path: Path, data: RolloutDataModule, dead_steps: int = 3) -> tuple[str, dict[str, list[float]]]:
    logger = MLflowLogger(experiment_name="health", tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
                          fallback_uri=f"sqlite:///{tmp_path / 'fallback.db'}")
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=logger, enable_checkpointing=False,
                         enable_model_summary=False, callbacks=[RunProgress(dead_steps=dead_steps)])
    trainer.fit(make_module(GRPO(group_size=2)), datamodule=data)
    client, run_id = logger.experiment, str(logger.run_id)
    keys = [k for k in client.get_run(run_id).data.metrics if k.startswith("health/")]
    return run_id, {k: [m.value for m in sorted(client.get_metric_history(run_id, k), key=lambda m: m.step)]
                    for k in keys}


def _under_step_lines(out: str) -> list[list[str]]:
    """The lines printed right under each ``step k/N`` line (up to the next step line)."""
    blocks: list[list[str]] = []
    for line in out.splitlines():
        if line.startswith("step "):
            blocks.append([])
        elif blocks and line.startswith("  ") and not line.startswith("  step"):
            blocks[-1].append(line)
    return blocks


def test_a_step_without_reward_spread_says_so_and_a_dead_run_says_so_at_the_end(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = RolloutDataModule(ConstantAgent(), batch_size=2, steps=2, sampling=SamplingParams(max_tokens=4))
    _, health = _fit(tmp_path, data, dead_steps=2)
    out = capsys.readouterr().out
    blocks = _under_step_lines(out)
    assert len(blocks) == 2, out
    for block in blocks:
        assert any("no learning signal: all 2 episodes returned +0.000 (every advantage 0)" in b for b in block), out
        assert any("no optimizer step this step: no turn carried a non-zero advantage" in b for b in block), out
    assert "no learning: the last 2 steps could not learn (no_optimizer_step, no_reward_spread)" in out, out
    assert health["health/no_reward_spread"] == [1.0, 1.0]
    assert health["health/no_optimizer_step"] == [1.0, 1.0]
    assert health["health/dead"] == [1.0, 1.0]


def test_a_tool_agent_whose_model_never_calls_a_tool_says_so(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    data = RolloutDataModule(ToolOfferingAgent(), batch_size=2, steps=1, sampling=SamplingParams(max_tokens=6))
    _, health = _fit(tmp_path, data)
    out = capsys.readouterr().out
    (block,) = _under_step_lines(out)
    assert any("no tool call in 2 replies" in b for b in block), out
    assert health["health/no_tool_calls"] == [1.0]
    assert "no learning:" not in out  # one dead step is not a dead run (dead_steps 3)


def test_every_reply_failing_to_parse_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = RolloutDataModule(EnvAgent(StrictEnv()), batch_size=2, steps=1, sampling=SamplingParams(max_tokens=4))
    _, health = _fit(tmp_path, data)
    out = capsys.readouterr().out
    (block,) = _under_step_lines(out)
    assert any("every reply (4) failed to parse as an action" in b for b in block), out
    assert health["health/all_parse_failures"] == [1.0]


def test_a_step_that_learns_prints_nothing_more(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, health = _fit(tmp_path, letter_data(batch_size=2, steps=1))
    out = capsys.readouterr().out
    assert [b for b in _under_step_lines(out)[0] if "!" in b] == [], out
    assert health == {"health/dead": [0.0]}


def test_a_dead_run_counts_consecutive_dead_steps_only() -> None:
    dead, bad = DeadRun(after=2), [Finding("no_tool_calls", "x")]
    for findings in ([], bad, [], bad):
        dead.add(findings)
    assert dead.summary() is None  # never two in a row
    dead.add(bad)
    assert dead.summary() == ("  no learning: the last 2 steps could not learn (no_tool_calls); the trained model "
                              "is the base model or close to it")
    dead.add([])
    assert dead.summary() is not None and "2 steps in a row" in (dead.summary() or "")
    assert DeadRun(after=0).summary() is None


def test_the_eta_follows_recent_steps_not_the_first() -> None:
    # a 450 s first step (loaded machine, cold caches), then 20 s steps: the pace is the recent median
    times = [450.0, 20.0, 21.0, 19.0, 20.0]
    assert eta_seconds(sum(times), 5, 10, recent=times[-5:]) == pytest.approx(20.0 * 10)
    assert eta_seconds(sum(times), 5, 10) == pytest.approx(sum(times) / 5 * 10)  # the mean, without recent times


def test_the_busy_machine_hint_names_the_knobs_only_when_oversubscribed() -> None:
    assert oversubscribed(1.8, threads=2, cores=2) is None
    assert oversubscribed(3.0, threads=2, cores=2) is None  # the run's own helper thread
    hint: Any = oversubscribed(15.2, threads=2, cores=2)
    assert hint.startswith("  machine busy: load 15.2 on 2 cores (2 torch threads here)")
    assert "OMP_NUM_THREADS=1" in hint and "data.batch_size" in hint
