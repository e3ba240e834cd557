"""In-process training runs with a tiny random model (real Lightning Trainer, real engine, real environment)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from agentrl.agents.base import Outcome, Task
from agentrl.agents.env_agent import EnvAgent
from agentrl.agents.llm import LLMClient
from agentrl.engines.base import SamplingParams
from agentrl.envs import FrozenLakeEnv, GuessNumberEnv
from agentrl.models.policy import Policy
from agentrl.training.rollout.datamodule import RolloutDataModule
from agentrl.training.schedules.base import Schedule
from agentrl.training.system.module import AgentRLModule


class LetterAgent:
    """A three-turn chat whose per-turn reward is the fraction of ASCII letters in the reply: a dense signal
    that a random byte-level model can move, so every schedule gets non-zero advantages in a few steps."""

    def __init__(self, turns: int = 3) -> None:
        self.turns = turns

    async def run(self, task: Task, llm: LLMClient) -> Outcome:
        messages = [{"role": "system", "content": "Reply with letters."}, {"role": "user", "content": task.id}]
        for i in range(self.turns):
            reply = await llm.chat(messages)
            text = reply.text
            llm.reward(sum(c.isascii() and c.isalpha() for c in text) / max(len(text), 1))
            messages += [reply.message(), {"role": "user", "content": f"again {i}"}]
        return Outcome(0.0, info={"success": False})


def letter_data(batch_size: int = 4, steps: int = 2, **kw: Any) -> RolloutDataModule:
    return RolloutDataModule(LetterAgent(), batch_size=batch_size, steps=steps, sampling=SamplingParams(max_tokens=6),
                             **kw)


def guess_data(batch_size: int = 4, steps: int = 2, **kw: Any) -> RolloutDataModule:
    agent = EnvAgent(GuessNumberEnv(low=1, high=5, max_turns=3))
    return RolloutDataModule(agent, batch_size=batch_size, steps=steps, sampling=SamplingParams(max_tokens=8), **kw)


def lake_data(batch_size: int = 4, steps: int = 2, **kw: Any) -> RolloutDataModule:
    agent = EnvAgent(FrozenLakeEnv(size=3, holes=0, max_turns=4))
    return RolloutDataModule(agent, batch_size=batch_size, steps=steps, sampling=SamplingParams(max_tokens=6), **kw)


class GradProbe(pl.Callback):
    """The accumulated gradient of the first optimizer step, per parameter (before clipping and Adam)."""

    def __init__(self) -> None:
        self.grads: dict[str, torch.Tensor] = {}

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: Any, optimizer: Any) -> None:
        for name, p in pl_module.named_parameters():
            if p.grad is not None and name not in self.grads:
                self.grads[name] = p.grad.detach().clone()


class PolicyLRs(pl.Callback):
    """The policy optimizer's learning rate at every optimizer step that runs."""

    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: Any, optimizer: Any) -> None:
        if optimizer is trainer.optimizers[0]:
            self.lrs.append(float(optimizer.param_groups[0]["lr"]))


def make_module(schedule: Schedule, *, seed: int = 0, **kw: Any) -> AgentRLModule:
    kw.setdefault("peak_flops", 1e11)
    pl.seed_everything(seed, verbose=False)  # the critic head's initialisation draws from the global generator
    return AgentRLModule(Policy("tiny-random", seed=seed), schedule, **kw)


def fit(module: AgentRLModule, data: RolloutDataModule, callbacks: list[pl.Callback] | None = None,
        **trainer_kw: Any) -> pl.Trainer:
    trainer_kw.setdefault("logger", False)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks or [],
                         **trainer_kw)
    trainer.fit(module, datamodule=data)
    return trainer


def prefixed(name: str) -> Callable[[str], str]:
    """An `assert_close` ``msg`` that puts ``name`` before torch's own mismatch message."""
    return lambda message: f"{name}: {message}"


def fit_in_process(cwd: Path, args: list[str], capsys: pytest.CaptureFixture[str],
                   monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    """``agentrl fit`` in this process (its entry point, `fit_main`): exit code, stdout, stderr. The same code as
    the command without the interpreter start (10 s each); the libraries' logging of this process is left as is."""
    from agentrl.training.command.cli import fit_main

    monkeypatch.chdir(cwd)
    monkeypatch.setattr("agentrl.training.command.cli.quiet_libraries", lambda: None)
    try:
        code = fit_main(args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    out = capsys.readouterr()
    return code, out.out, out.err
