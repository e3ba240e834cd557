"""Engine specs: the config objects that build a rollout engine for a policy (``model.engine`` in YAML).

The embedded engine needs the policy's modules, which exist only once the model is built, so the config names a
*spec* and the trainer calls ``spec.build(policy)``.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

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
        compute_dtype: ``float32`` decodes in fp32 whatever the trainer computes in; ``policy`` decodes under the
            policy's compute dtype (bf16 autocast when ``policy.compute_dtype`` resolves to bf16). fp32 is the
            default because it was measured faster for decoding on the 2-core CPU (docs/benchmarks.md: bf16
            decoded at 0.94x fp32's tokens/s while the bf16 update ran at 1.32x), and because fp32 rollouts are
            what the exactness tests and the fp32 agreement check use. With a bf16 trainer the engine is then not
            the trainer's code, and the trainer recomputes pi_old (`agentrl.training.mismatch`).
    """

    shares_trainer_code = True
    """The engine runs the trainer's own modules: in fp32 its log-probs are the trainer's π_old (to about 1e-5), so
    the trainer need not recompute them (`agentrl.training.mismatch`)."""

    def __init__(self, max_batch_size: int = 32, prefix_cache_tokens: int = 32768, max_context: int | None = None,
                 compute_dtype: Literal["float32", "policy"] = "float32"):
        if compute_dtype not in ("float32", "policy"):
            raise ValueError(f"engine.compute_dtype must be 'float32' or 'policy', got {compute_dtype!r}")
        self.compute_dtype = compute_dtype
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
                        max_context=self.max_context, autocast=self.compute_dtype == "policy")
