"""What the embedded engine (`agentrl.engines.hf.HFEngine`) keeps per request and in total: a `Request` from
`generate` until its future is resolved (its sampling, generator, stop ids, the tokens and log-probs so far, how it
finished or failed), the stored prefix an admitted request reuses (`Lookup`), and the engine's counters
(`EngineStats`). Plain state: the scheduling and the model work are `HFEngine`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from agentrl.engines.base import Completion, SamplingParams
from agentrl.engines.kvcache import KV
from agentrl.types import FinishReason


@dataclass
class Request:
    """One `generate` call inside the engine: what it asked for and what it has produced so far."""

    prompt_ids: list[int]
    sampling: SamplingParams
    session: str | None
    future: asyncio.Future[Completion]
    generator: torch.Generator
    stop: frozenset[int]
    stop_when: Callable[[list[int]], bool] | None = None
    top_logprobs: int = 0
    out_ids: list[int] = field(default_factory=list)
    out_logprobs: list[float] = field(default_factory=list)
    out_top: list[list[tuple[int, float]]] = field(default_factory=list)
    cached: int = 0
    finish: FinishReason | None = None
    error: Exception | None = None  # set in the worker thread when this request alone failed
    version: int | None = None  # the engine's weight version when it was admitted (its oldest weights)

    @property
    def gone(self) -> bool:
        """Finished, failed, or cancelled by its caller: it leaves the batch at the next retire."""
        return self.finish is not None or self.error is not None or self.future.done()

    def completion(self, finish: FinishReason, version: int) -> Completion:
        """What the caller gets: the tokens so far, their log-probs, and the weight version they started with (the
        engine's ``version`` if it was never admitted)."""
        return Completion(token_ids=list(self.out_ids), logprobs=list(self.out_logprobs), finish_reason=finish,
                          policy_version=version if self.version is None else self.version,
                          prompt_len=len(self.prompt_ids), cached_tokens=self.cached, top_logprobs=list(self.out_top))


@dataclass
class EngineStats:
    """Counters since construction (or the last `HFEngine.reset_stats`)."""

    requests: int = 0
    generated_tokens: int = 0
    prefill_tokens: int = 0
    prefill_forwards: int = 0
    cached_tokens: int = 0
    decode_steps: int = 0
    cancelled: int = 0
    failed: int = 0
    busy_seconds: float = 0.0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    pushes: int = 0
    push_seconds: float = 0.0  # refreshing a weight copy (`update_weights`); 0 with shared weights


@dataclass
class Lookup:
    """An admitted request and the stored prefix it reuses."""

    req: Request
    cached: int
    kv: KV | None
