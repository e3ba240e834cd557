"""Test support: an engine that teacher-forces scripted replies, real tools, and a tiny create_agent agent.

A tiny random model never writes a valid ``<tool_call>`` by itself, so `ScriptedEngine` makes the tool path real
the honest way: it is the real `HFEngine`, except that when ``script(prompt_text, seed)`` returns a text, that
text is tokenized and returned as the completion (with the stop token), together with the *model's own*
log-probabilities of those tokens at the sampling temperature. Everything downstream — the client's recording,
the Hermes parser, LangChain's tool calling, the tool itself, the next turn's context, replay and training — is
the real code path; only the choice of the tokens is scripted. Unscripted calls sample from the model, at most
``free_tokens`` tokens (random text is only noise, and short keeps the tests fast).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.tools import tool

from agentrl.agents.base import Task
from agentrl.chat.tools import HermesToolParser
from agentrl.engines.base import Completion, SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.models.policy import Policy

Script = Callable[[str, int | None], str | None]

CITIES = {"paris": "Paris: 18 degrees, light rain", "oslo": "Oslo: 4 degrees, snow",
          "lima": "Lima: 22 degrees, sunny"}


@tool
def weather(city: str) -> str:
    """Current weather of a city."""
    return CITIES.get(city.lower(), f"no weather data for {city}")


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    return HermesToolParser.render_call(name, arguments)


def weather_script(rounds: int = 1) -> Script:
    """Force a ``weather`` call (city chosen by the sampling seed) while fewer than ``rounds`` results are in the
    prompt; after that the model samples freely."""

    def script(prompt: str, seed: int | None) -> str | None:
        if prompt.count("<tool_response>") >= rounds:
            return None
        city = random.Random(seed).choice(sorted(CITIES))
        return tool_call_text("weather", {"city": city})

    return script


class ScriptedEngine(HFEngine):
    """The real `HFEngine`, teacher-forcing the replies ``script`` chooses; records every prompt it receives."""

    def __init__(self, policy: Policy, script: Script | None = None, free_tokens: int = 12, **kwargs: Any) -> None:
        super().__init__(policy, **kwargs)
        self.script = script
        self.free_tokens = free_tokens
        self._scored: dict[tuple[int, float, tuple[int, ...], tuple[int, ...]], list[float]] = {}
        self.received: list[list[int]] = []
        self.forced = 0

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, *,  # type: ignore[override]
                       session: str | None = None, **kwargs: Any) -> Completion:
        self.received.append(list(prompt_ids))
        text = self.script(self.tokenizer.decode(prompt_ids), sampling.seed) if self.script else None
        if text is None:
            free = replace(sampling, max_tokens=min(sampling.max_tokens, self.free_tokens))
            return await super().generate(prompt_ids, free, session=session, **kwargs)
        self.forced += 1
        stop = self.policy.stop_token_ids[-1]
        ids = [*self.tokenizer.encode(text, add_special_tokens=False)[: sampling.max_tokens - 1], stop]
        return Completion(ids, self._logprobs(prompt_ids, ids, sampling.temperature or 1.0), "stop",
                          policy_version=self.version, prompt_len=len(prompt_ids))

    def _logprobs(self, prompt: list[int], response: list[int], temperature: float) -> list[float]:
        key = (self.version, temperature, tuple(prompt), tuple(response))  # siblings often force the same reply
        if key not in self._scored:
            self._scored[key] = self._score(prompt, response, temperature)
        return self._scored[key]

    @torch.no_grad()
    def _score(self, prompt: list[int], response: list[int], temperature: float) -> list[float]:
        ids = torch.tensor([prompt + response])
        mask = torch.ones_like(ids, dtype=torch.bool)
        positions = torch.zeros_like(mask)
        positions[0, len(prompt):] = True
        lp = self.policy.token_logprobs(ids, mask, positions, temperature=temperature).logprobs
        return [float(x) for x in lp[0, len(prompt):]]


class ScriptedEngineSpec:
    """``model.engine`` for `AgentRLModule`: builds a `ScriptedEngine` over the policy."""

    def __init__(self, script: Script) -> None:
        self.script = script

    def build(self, policy: Any) -> ScriptedEngine:
        return ScriptedEngine(policy, self.script)


class CountModelCalls(BaseCallbackHandler):
    """Counts chat-model calls as LangChain reports them (independent of agentrl's recording)."""

    run_inline = True

    def __init__(self) -> None:
        self.calls = 0

    def on_chat_model_start(self, serialized: dict[str, Any], messages: Any, **kwargs: Any) -> None:
        self.calls += 1


def letter_reward(task: Task, result: Any) -> float:
    """Fraction of ASCII letters in the final message: a dense signal a random model can move."""
    text = str(result["messages"][-1].content)
    return sum(c.isascii() and c.isalpha() for c in text) / max(len(text), 1)


def tasks(n: int) -> list[Task]:
    return [Task(id=f"q{i}", seed=i, data={"question": f"What is the weather like? ({i})"}) for i in range(n)]


class QuestionTasks:
    """Task source of `tasks`: weather questions, cycled."""

    def task(self, index: int) -> Task:
        return Task(id=f"q{index % 8}", seed=index % 8, data={"question": f"What is the weather like? ({index % 8})"})
