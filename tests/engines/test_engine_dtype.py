"""The embedded engine's decoding dtype on shared weights (`HFEngineSpec.compute_dtype`): fp32 by default whatever
the trainer computes in, or the policy's own autocast with ``policy``. (The weight copy's dtype:
tests/engines/test_engine_weights.py.)"""

from __future__ import annotations

import asyncio

import pytest

from agentrl.engines.base import Completion, SamplingParams
from agentrl.engines.specs import HFEngineSpec
from agentrl.models.policy import Policy


def _generate(spec: HFEngineSpec, policy: Policy) -> list[Completion]:
    engine = spec.build(policy)

    async def run() -> list[Completion]:
        sp = SamplingParams(max_tokens=12, stop_token_ids=())
        return await asyncio.gather(*[engine.generate(list(range(3 + i, 20 + i)), sp.with_seed(i), session=f"s{i}")
                                      for i in range(3)])

    return asyncio.run(run())


def test_a_bf16_trainer_keeps_fp32_rollouts_by_default_and_bf16_ones_when_asked() -> None:
    fp32 = _generate(HFEngineSpec(weights="shared"), Policy("tiny-random", seed=0))
    bf16_policy = Policy("tiny-random", seed=0, compute_dtype="bfloat16")
    default = _generate(HFEngineSpec(weights="shared"), bf16_policy)
    following = _generate(HFEngineSpec(weights="shared", compute_dtype="policy"), bf16_policy)
    for a, b in zip(fp32, default, strict=True):  # the same fp32 decode: same tokens, same log-probs
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    worst = max(abs(x - y) for a, c in zip(fp32, following, strict=True)
                for x, y in zip(a.logprobs, c.logprobs, strict=False))
    assert worst > 1e-4  # bf16 autocast really changed the numbers


def test_a_bad_engine_dtype_is_named() -> None:
    with pytest.raises(ValueError, match="engine.compute_dtype must be 'float32' or 'policy'"):
        HFEngineSpec(weights="shared", compute_dtype="bfloat16")  # type: ignore[arg-type]
