"""`ScriptedVLLMEngine`: the real `VLLMEngine`, teacher-forcing replies a script chooses (a tool call the tiny random
model never writes by itself), with the log-probabilities the vLLM server itself gives those tokens.

The counterpart of `tests.support.scripted.ScriptedEngine` for the real-vLLM tier: when ``script(prompt_text, seed)``
returns a text, its tokens (and the stop token) are the completion, and their behaviour log-probs are the served
model's (the current adapter's), read from ``prompt_logprobs`` of one ``/v1/completions`` call on the episode's
server over the prompt followed by those tokens. Unscripted calls are the engine's own sampling on vLLM, at most
``free_tokens`` tokens. Everything downstream — the gateway, the Hermes parser, LangChain's tool calling, the tool,
the next turn's context, the recording and training — is the real code path; only the choice of tokens is scripted.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agentrl.engines.base import Completion, RolloutEngine, SamplingParams
from agentrl.engines.vllm import VLLMEngine, VLLMEngineSpec
from tests.support.scripted import Script


class ScriptedVLLMEngine(VLLMEngine):
    """`VLLMEngine` teacher-forcing the replies ``script`` returns, scored by the server (see the module doc)."""

    def __init__(self, base_urls: list[str], *, script: Script, tokenizer: Any, stop_id: int,
                 free_tokens: int = 12, **kwargs: Any) -> None:
        super().__init__(base_urls, **kwargs)
        self.script, self.tokenizer, self.stop_id, self.free_tokens = script, tokenizer, stop_id, free_tokens
        self.forced = 0  # replies the script chose

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, *,
                       session: str | None = None) -> Completion:
        text = self.script(self.tokenizer.decode(prompt_ids), sampling.seed)
        if text is None:
            free = replace(sampling, max_tokens=min(sampling.max_tokens, self.free_tokens))
            return await super().generate(prompt_ids, free, session=session)
        if sampling.temperature != 1.0:  # vLLM's prompt log-probs are the raw model's
            raise ValueError(f"a scripted reply is scored at temperature 1, got {sampling.temperature}")
        ids = [*self.tokenizer.encode(text, add_special_tokens=False)[: sampling.max_tokens - 1], self.stop_id]
        await self._ensure_info()
        version, model = self.version, self.model
        assert model is not None
        body = {"model": model, "prompt": [*prompt_ids, *ids], "max_tokens": 1, "temperature": 1.0,
                "prompt_logprobs": 0, "return_token_ids": True, "skip_special_tokens": False}
        answer = (await self._post(self._url_for(session), body, model)).json()["choices"][0]
        scored = answer["prompt_logprobs"][len(prompt_ids):]
        logprobs = [float(entry[str(t)]["logprob"]) for entry, t in zip(scored, ids, strict=True)]
        self.forced += 1
        return Completion(ids, logprobs, "stop", policy_version=version, prompt_len=len(prompt_ids))


class ScriptedVLLMSpec(VLLMEngineSpec):
    """``model.engine``: a `VLLMEngineSpec` that builds a `ScriptedVLLMEngine` (kept in ``built``)."""

    def __init__(self, base_urls: list[str], script: Script, **kwargs: Any) -> None:
        super().__init__(base_urls, **kwargs)
        self.script = script
        self.built: list[ScriptedVLLMEngine] = []

    def build(self, policy: Any) -> RolloutEngine:
        engine = ScriptedVLLMEngine(
            self.base_urls, script=self.script, tokenizer=policy.tokenizer, stop_id=policy.stop_token_ids[-1],
            adapter_dir=self.adapter_dir, timeout=self.timeout, retries=self.retries, backoff=self.backoff,
            logprobs_mode=self.logprobs_mode, push_check=self.push_check)
        self.built.append(engine)
        return engine
