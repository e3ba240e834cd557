"""Engine specs: the config objects that build a rollout engine for a policy (``model.engine`` in YAML).

The embedded engine needs the policy's modules, which exist only once the model is built, so the config names a
*spec* and the trainer calls ``spec.build(policy)``.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

import torch

from agentrl.engines.base import RolloutEngine
from agentrl.engines.weights import DecodeDType, WeightsMode, WeightsSetting


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
        compute_dtype: With ``weights: shared`` only. ``float32`` decodes in fp32 whatever the trainer computes in;
            ``policy`` decodes under the policy's compute dtype (bf16 autocast when ``policy.compute_dtype``
            resolves to bf16). bf16 *autocast* over fp32 weights decodes no faster than fp32 on a CPU (it casts the
            weights every step): a bf16 decode pays only with bf16 *weights*, which is what ``weights: copy`` gives
            (figures: docs/benchmarks-log.md, "Rollouts").
        weights: ``auto`` (the default) is ``copy`` where the copy decodes in a cheaper dtype than fp32 — bf16 on
            a device with native bf16 matmuls and a model at least `agentrl.models.precision.MIN_WIDTH` wide, and
            an unsharded policy — and ``shared`` elsewhere (`agentrl.engines.weights.resolve_weights`; with
            ``data.max_staleness >= 1`` it is always ``copy``). ``copy`` decodes with the engine's own copy of the
            model in ``decode_dtype``, refreshed at every push (`agentrl.engines.weights`; its cost is logged as
            ``perf/engine_push_s``, its size as ``perf/engine_weights_mib``): faster decoding on a CPU with native
            bf16 (docs/benchmarks.md, "Rollouts"), at the cost of the copy's memory and a π_old recompute by the
            trainer. ``shared`` runs the trainer's own modules (no extra
            memory, fp32 rollouts from an fp32 policy whose log-probs are the trainer's π_old).
        decode_dtype: With ``weights: copy`` or ``auto``: the copy's dtype. ``auto`` is bf16 where the device has native
            bf16 matmuls (CPU flags ``avx512_bf16`` / ``amx_bf16``, CUDA's bf16 support) and the model is at least
            `agentrl.models.precision.MIN_WIDTH` wide, else fp32 (the policy's ``auto`` rule); an explicit
            ``bfloat16`` on a CPU without native bf16 stops in preflight.
        lean_decode: Decode steps of a Llama-architecture model run `agentrl.engines.lean.LeanDecoder` (the same
            arithmetic in a few torch calls a layer, on the same weights) instead of transformers' modules; models it
            does not support (`agentrl.engines.lean.supports`: peft adapters, other architectures, hooked modules)
            decode through transformers whatever this says. False decodes through transformers always.
        pack_weights: With the lean step on a bf16 copy, hold the copy's projections in oneDNN's blocked layout
            instead of the plain one (`agentrl.engines.lean.packs`: where this CPU's oneDNN has bf16 kernels;
            elsewhere the copy stays plain), with the same weight bytes (projections held once, packed layer by
            layer at each push), prefills through the lean step. Off by default: it speeds up the decode step's
            matrix products on a Xeon with AMX, but in the main job it gave no faster rollouts and a higher peak
            (docs/benchmarks-log.md, "Packed only"); worth trying where decoding dominates.

    Whenever the engine does not decode in fp32 from an fp32 policy computing in fp32, the trainer recomputes
    π_old (`agentrl.training.update.mismatch`); an fp32 copy of an fp32 policy runs the trainer's code on equal weights.
    """

    shares_trainer_code = True
    """The engine runs the trainer's own code (its modules, or a copy of them): decoding in fp32 from an fp32
    policy, its log-probs are the trainer's π_old (to about 1e-5), so the trainer need not recompute them
    (`agentrl.training.update.mismatch`, which also asks `decode_dtype_for`)."""

    def __init__(self, max_batch_size: int = 32, prefix_cache_tokens: int = 32768, max_context: int | None = None,
                 compute_dtype: Literal["float32", "policy"] = "float32", weights: WeightsSetting = "auto",
                 decode_dtype: DecodeDType = "auto", lean_decode: bool = True,
                 pack_weights: bool = False):
        if compute_dtype not in ("float32", "policy"):
            raise ValueError(f"engine.compute_dtype must be 'float32' or 'policy', got {compute_dtype!r}")
        if weights == "auto" and compute_dtype == "policy":
            weights = "shared"  # decoding under the policy's autocast is what shared weights do
        if weights not in ("auto", "shared", "copy"):
            raise ValueError(f"engine.weights must be 'auto', 'shared' or 'copy', got {weights!r}")
        if decode_dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"engine.decode_dtype must be 'auto', 'float32' or 'bfloat16', got {decode_dtype!r}")
        if weights == "copy" and compute_dtype != "float32":
            raise ValueError("engine.compute_dtype applies to weights: shared; a weight copy decodes in "
                             "engine.decode_dtype (set weights: shared to decode under the policy's autocast)")
        if weights == "shared" and decode_dtype != "auto":
            raise ValueError("engine.decode_dtype applies to weights: copy; shared weights decode in their own dtype "
                             "or under engine.compute_dtype")
        if max_batch_size < 1:
            raise ValueError(f"engine.max_batch_size must be >= 1, got {max_batch_size}")
        if prefix_cache_tokens < 0:
            raise ValueError(f"engine.prefix_cache_tokens must be >= 0, got {prefix_cache_tokens}")
        self.compute_dtype = compute_dtype
        self.weights: WeightsSetting = weights
        self.decode_dtype = decode_dtype
        self.max_batch_size = max_batch_size
        self.prefix_cache_tokens = prefix_cache_tokens
        self.max_context = max_context
        self.lean_decode = lean_decode
        self.pack_weights = pack_weights

    def weights_for(self, policy: Any) -> WeightsMode:
        """``shared`` or ``copy`` for ``policy`` (``auto`` resolved: `agentrl.engines.weights.resolve_weights`)."""
        from agentrl.engines.weights import resolve_weights

        return resolve_weights(self.weights, self.decode_dtype, policy)

    def resolved(self, policy: Any) -> dict[str, str]:
        """What ``weights`` and the decode dtype resolve to for ``policy`` (the run records them as parameters)."""
        return {"engine_weights": self.weights_for(policy),
                "engine_decode_dtype": str(self.decode_dtype_for(policy)).removeprefix("torch.")}

    def decode_dtype_for(self, policy: Any) -> torch.dtype:
        """The dtype the engine will decode ``policy`` in: the copy's, or (shared) the policy's compute dtype under
        ``compute_dtype: policy``, else the weights' own."""
        if self.weights_for(policy) == "copy":
            from agentrl.engines.weights import resolve_decode_dtype

            return resolve_decode_dtype(self.decode_dtype, policy).dtype
        if self.compute_dtype == "policy" and policy.compute_dtype != torch.float32:
            return policy.compute_dtype
        floating = {p.dtype for p in policy.model.parameters() if p.is_floating_point()}
        return torch.float32 if floating == {torch.float32} else next(iter(floating - {torch.float32}))

    def build(self, policy: Any) -> RolloutEngine:
        from agentrl.engines.hf import HFEngine

        return HFEngine(policy, max_batch_size=self.max_batch_size, prefix_cache_tokens=self.prefix_cache_tokens,
                        max_context=self.max_context, autocast=self.compute_dtype == "policy",
                        weights=self.weights_for(policy), decode_dtype=self.decode_dtype,
                        lean_decode=self.lean_decode, pack_weights=self.pack_weights)
