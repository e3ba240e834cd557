"""Engine specs: the config objects that build a rollout engine for a policy (``model.engine`` in YAML).

The embedded engine needs the policy's modules, which exist only once the model is built, so the config names a
*spec* and the trainer calls ``spec.build(policy)``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from agentrl.engines.base import RolloutEngine


@runtime_checkable
class EngineSpec(Protocol):
    def build(self, policy: Any) -> RolloutEngine:
        ...


class HFEngineSpec:
    """The embedded in-process engine (`agentrl.engines.hf.HFEngine`).

    Args:
        max_batch_size: Most sequences decoded together.
        prefix_cache_tokens: Token budget of the prefix KV store (0 disables reuse).
        max_context: Context window (default: the model's).
    """

    shares_trainer_code = True
    """The engine runs the trainer's own modules: in fp32 its log-probs are the trainer's π_old (to about 1e-5), so
    the trainer need not recompute them (`agentrl.training.mismatch`)."""

    def __init__(self, max_batch_size: int = 32, prefix_cache_tokens: int = 32768, max_context: int | None = None):
        if max_batch_size < 1:
            raise ValueError(f"engine.max_batch_size must be >= 1, got {max_batch_size}")
        if prefix_cache_tokens < 0:
            raise ValueError(f"engine.prefix_cache_tokens must be >= 0, got {prefix_cache_tokens}")
        self.max_batch_size = max_batch_size
        self.prefix_cache_tokens = prefix_cache_tokens
        self.max_context = max_context

    def build(self, policy: Any) -> RolloutEngine:
        from agentrl.engines.hf import HFEngine

        return HFEngine(policy, max_batch_size=self.max_batch_size, prefix_cache_tokens=self.prefix_cache_tokens,
                        max_context=self.max_context)
