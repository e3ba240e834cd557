"""A real Lightning fit of a LangChain agent: `RolloutDataModule(LangChainAgent(...))` and `AgentRLModule` train
the policy for two steps, with tool calls in the training episodes (teacher-forced by `ScriptedEngine`)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from langchain.agents import create_agent
from lc_support import QuestionTasks, letter_reward, weather, weather_script
from tests.support.scripted import ScriptedEngineSpec

from agentrl.engines.base import SamplingParams
from agentrl.models.policy import Policy
from agentrl.training.rollout.datamodule import RolloutDataModule
from agentrl.training.schedules.base import Schedule
from agentrl.training.schedules.rtpo import RTPO
from agentrl.training.schedules.turn_ppo import TurnPPO
from agentrl.training.system.module import AgentRLModule
from agentrl.training.update.settings import OptimSettings, PPOSettings
from agentrl_langchain import LangChainAgent


def build(model: Any) -> Any:
    return create_agent(model, tools=[weather], system_prompt="You report the weather.")


@pytest.mark.parametrize("schedule", [TurnPPO(ppo=PPOSettings(epochs=2)), RTPO(group_size=3)],
                         ids=["turn_ppo", "rtpo"])
def test_two_training_steps_change_the_policy(schedule: Schedule) -> None:
    pl.seed_everything(0, verbose=False)
    module = AgentRLModule(Policy("tiny-random", seed=0), schedule, engine=ScriptedEngineSpec(weather_script(1)),
                           optim=OptimSettings(lr=1e-3, critic_lr=5e-3), peak_flops=1e11)
    before = {k: v.clone() for k, v in module.policy.model.state_dict().items()}
    data = RolloutDataModule(LangChainAgent(build, letter_reward), QuestionTasks(), batch_size=2, steps=2,
                             sampling=SamplingParams(max_tokens=80))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=data)
    assert module.rl_step == 2
    after = module.policy.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "the policy did not change"
    for traj in module.last_trajectories:  # the episodes of the last collection went through the weather tool
        assert not traj.failed, traj.error
        assert traj.info["tools"] == {"weather": 1} and traj.num_turns == 2
        assert traj.turns[0].tool_calls is not None and traj.turns[0].tool_calls[0]["name"] == "weather"
