"""`ScriptedEngine`: the real `HFEngine`, teacher-forcing replies a script chooses (tool calls a tiny random model
never writes by itself), with the model's own log-probabilities of the forced tokens.

Everything downstream of the engine — the client's recording, the Hermes parser, the gateway's answers, the
agent's tools, the next turn's context, replay and training — is the real code path; only the choice of tokens
is scripted. Unscripted calls sample from the model, at most ``free_tokens`` tokens (random text is only noise, and
short keeps the tests fast). Every prompt the engine receives is kept in ``received``. The core's, the LangChain
adapter's and the examples' tests all use this one engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from agentrl.engines.base import Completion, SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.models.policy import Policy

Script = Callable[[str, int | None], str | None]


class ScriptedEngine(HFEngine):
    """The real `HFEngine`, teacher-forcing the replies ``script(prompt_text, seed)`` returns."""

    def __init__(self, policy: Policy, script: Script | None = None, free_tokens: int = 12, **kwargs: Any) -> None:
        super().__init__(policy, **kwargs)
        self.script = script
        self.free_tokens = free_tokens
        self.received: list[list[int]] = []
        self._scored: dict[tuple[int, float, tuple[int, ...], tuple[int, ...]], list[float]] = {}

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, *,
                       session: str | None = None, **kwargs: Any) -> Completion:
        self.received.append(list(prompt_ids))
        text = self.script(self.tokenizer.decode(prompt_ids), sampling.seed) if self.script else None
        if text is None:
            free = replace(sampling, max_tokens=min(sampling.max_tokens, self.free_tokens))
            return await super().generate(prompt_ids, free, session=session, **kwargs)
        stop = self.policy.stop_token_ids[-1]
        ids = [*self.tokenizer.encode(text, add_special_tokens=False)[: sampling.max_tokens - 1], stop]
        return Completion(ids, self._logprobs(prompt_ids, ids, sampling.temperature or 1.0), "stop",
                          policy_version=self.version, prompt_len=len(prompt_ids))

    def _logprobs(self, prompt: list[int], response: list[int], temperature: float) -> list[float]:
        key = (self.version, temperature, tuple(prompt), tuple(response))  # siblings often force the same reply
        if key not in self._scored:
            self._scored[key] = self._score(prompt, response, temperature)
        return list(self._scored[key])

    @torch.no_grad()
    def _score(self, prompt: list[int], response: list[int], temperature: float) -> list[float]:
        ids = torch.tensor([prompt + response])
        mask = torch.ones_like(ids, dtype=torch.bool)
        positions = torch.zeros_like(mask)
        positions[0, len(prompt):] = True
        lp = self.policy.token_logprobs(ids, mask, positions, temperature=temperature).logprobs
        return [float(x) for x in lp[0, len(prompt):]]


class ScriptedEngineSpec:
    """``model.engine`` for `AgentRLModule`: builds a `ScriptedEngine` over the policy (kept in ``built``)."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.built: list[ScriptedEngine] = []

    def build(self, policy: Any) -> ScriptedEngine:
        engine = ScriptedEngine(policy, self.script)
        self.built.append(engine)
        return engine
