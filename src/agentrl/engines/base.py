"""The rollout-engine protocol: token ids in, token ids and log-probs out.

Two engines implement it: `agentrl.engines.hf.HFEngine` (in process, the default, CPU works) and
`agentrl.engines.vllm.VLLMEngine` (HTTP client of vLLM's OpenAI-compatible server). Agents never see an engine
directly: they talk to an `agentrl.agents.llm.LLMClient`, which renders chat messages to token ids and records
every call as a `Turn`.

Log-prob convention: ``Completion.logprobs[i]`` is the log-probability of ``token_ids[i]`` under the sampling
distribution *after temperature* and before top-k/top-p truncation, which is what the trainer recomputes
(`Policy.logprobs(..., temperature=...)`). At temperature 1.0 (the default, and what Turn-PPO recommends) this is
simply the model's distribution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from agentrl.types import FinishReason

MIN_TEMPERATURE = 1e-2
"""Smallest non-zero temperature: below it ``logits / temperature`` overflows float32 (vLLM raises smaller
temperatures to this value; `SamplingParams` refuses them)."""
SEED_RANGE = (-(2**63), 2**64 - 1)
"""Seeds a ``torch.Generator`` accepts."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion.

    Attributes:
        max_tokens: Most new tokens to generate.
        temperature: Softmax temperature (0 is greedy).
        top_p: Nucleus sampling mass (1.0 disables).
        top_k: Keep the k most likely tokens (0 disables).
        seed: Seed of this request's sampler; None draws from the engine's generator.
        stop_token_ids: Tokens that end the completion (included in the output); None uses the model's.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"sampling.max_tokens must be >= 1, got {self.max_tokens}")
        if not (self.temperature == 0 or MIN_TEMPERATURE <= self.temperature < math.inf):
            raise ValueError(f"sampling.temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE}, "
                             f"got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"sampling.top_k must be >= 0, got {self.top_k}")
        if self.seed is not None and not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise ValueError(f"sampling.seed must be in [{SEED_RANGE[0]}, {SEED_RANGE[1]}], got {self.seed}")

    def with_seed(self, seed: int | None) -> SamplingParams:
        return replace(self, seed=seed)


@dataclass
class Completion:
    """One engine completion.

    Attributes:
        token_ids: Generated token ids (a stop token, when one ended the completion, is the last id).
        logprobs: Log-probability of each generated token (see the module docstring for which distribution).
        finish_reason: ``stop``, ``length`` (max_tokens or the context window) or ``abort``.
        policy_version: Version of the weights that generated it.
        prompt_len: Number of prompt tokens.
        cached_tokens: Prompt tokens whose KV came from the prefix cache (not recomputed).
        top_logprobs: Per generated token, the most likely tokens and their log-probs under the same
            distribution (when the caller asked the engine for them; empty otherwise).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    policy_version: int = 0
    prompt_len: int = 0
    cached_tokens: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)


@runtime_checkable
class RolloutEngine(Protocol):
    """What the collector and `LLMClient` need from an engine."""

    @property
    def version(self) -> int:
        """Version of the weights currently served; bumped by every `update_weights`."""
        ...

    @property
    def max_context(self) -> int:
        """Longest prompt + completion the engine accepts, in tokens."""
        ...

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session: str | None = None
    ) -> Completion:
        """Sample one completion of ``prompt_ids``. ``session`` names the episode (cache reuse, server pinning).

        A prompt that does not fit the context window gives an empty completion with ``finish_reason="length"``,
        not an exception.
        """
        ...

    async def update_weights(self, policy: Any, *, version: int | None = None) -> None:
        """Make the engine serve the policy's current weights; ``version`` becomes the new version (default: the
        current one + 1; a resumed run passes its restored count). Async because a remote engine pushes weights
        over HTTP; run it on the rollout loop (`agentrl.collect.runtime.RolloutRuntime`)."""
        ...
