"""The lean decode step (`agentrl.engines.lean`): transformers' numbers on a tiny Llama with grouped key/value heads,
used by the engine where it applies, and refused (with its reason) where it would compute something else."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.engines.kvcache import cache_kv, make_cache, prefill_batch
from agentrl.engines.lean import LeanDecoder, fuse_rows, packs, supports
from agentrl.models.policy import LoRASettings, Policy

PROMPTS = [[5, 9, 12, 40, 41, 42, 7], [3, 3, 8], [100, 101, 102, 103, 104, 105, 106, 107, 108, 109]]


def _steps(policy: Policy, lean: bool, steps: int = 6) -> torch.Tensor:
    """Logits of ``steps`` decode steps after a left-padded batched prefill, teacher-forced on fixed tokens."""
    backbone, head = policy.backbone, policy.lm_head
    layers = backbone.config.num_hidden_layers
    with torch.inference_mode():
        batch = prefill_batch(PROMPTS, [(0, None)] * len(PROMPTS), layers, torch.device("cpu"))
        backbone(input_ids=batch.ids, attention_mask=batch.mask, position_ids=batch.positions, cache=batch.cache,
                 use_cache=True)
        cache = make_cache(layers, [(k.clone(), v.clone()) for k, v in cache_kv(batch.cache)])
        mask, positions = batch.mask.clone(), batch.positions[:, -1:].clone()
        decoder = LeanDecoder(backbone, head)
        out = []
        for step in range(steps):
            tokens = torch.tensor([[17 + step], [200 - step], [64]])
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            positions = positions + 1
            if lean:
                logits = decoder.step(tokens, positions, mask, cache)
            else:
                hidden = backbone(input_ids=tokens, attention_mask=mask, position_ids=positions, cache=cache,
                                  use_cache=True).last_hidden_state
                logits = head(hidden[:, -1])
            out.append(logits.float())
    return torch.stack(out)


def test_the_lean_step_gives_transformers_logits_on_a_padded_gqa_batch() -> None:
    policy = Policy("tiny-random", seed=0)
    config = policy.backbone.config
    assert config.num_key_value_heads < config.num_attention_heads  # grouped heads: the case written out
    assert supports(policy.backbone, policy.lm_head) is None
    reference, lean = _steps(policy, lean=False), _steps(policy, lean=True)
    assert reference.abs().max() > 0.1
    assert (lean - reference).abs().max() < 1e-5


def test_the_engine_decodes_through_it_with_the_same_tokens_and_logprobs(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = Policy("tiny-random", seed=0)
    calls = []
    step = LeanDecoder.step
    monkeypatch.setattr(LeanDecoder, "step", lambda self, *a: calls.append(1) or step(self, *a))

    def generate(lean: bool) -> list:
        engine = HFEngine(policy, weights="shared", lean_decode=lean)

        async def run() -> list:
            return list(await asyncio.gather(*(engine.generate(p, SamplingParams(max_tokens=8, seed=i,
                                                                                  stop_token_ids=()))
                                               for i, p in enumerate(PROMPTS))))
        return asyncio.run(run())

    plain = generate(False)
    assert not calls
    lean = generate(True)
    assert len(calls) >= 7  # every decode step after the prefill
    assert [o.token_ids for o in lean] == [o.token_ids for o in plain]
    worst = max(abs(a - b) for x, y in zip(lean, plain, strict=True)
                for a, b in zip(x.logprobs, y.logprobs, strict=True))
    assert worst < 1e-5


def test_what_it_does_not_compute_goes_through_transformers() -> None:
    lora = Policy("tiny-random", seed=0, lora=LoRASettings(r=4, target_modules=["q_proj", "v_proj"]))
    assert str(supports(lora.backbone, lora.lm_head)).startswith("a peft.tuners.lora")
    hooked = Policy("tiny-random", seed=0)
    hooked.backbone.layers[1].mlp.register_forward_hook(lambda *a: None)
    assert supports(hooked.backbone, hooked.lm_head) == "module layers.1.mlp has forward hooks"
    scaled = Policy("tiny-random", seed=0)
    scaled.backbone.config.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    assert supports(scaled.backbone, scaled.lm_head) == "rope_type 'linear'"
    other = Policy("tiny-random", seed=0)
    other.backbone.config.model_type = "qwen2"
    assert "qwen2" in str(supports(other.backbone, other.lm_head))


def _generate(engine: HFEngine) -> list:
    async def run() -> list:
        return list(await asyncio.gather(*(engine.generate(p, SamplingParams(max_tokens=6, seed=i, stop_token_ids=()))
                                           for i, p in enumerate(PROMPTS))))
    return asyncio.run(run())


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_fuse_rows_makes_the_weights_views_of_one_matrix_once() -> None:
    policy = Policy("tiny-random", seed=0)
    att = policy.backbone.layers[0].self_attn
    modules = [att.q_proj, att.k_proj, att.v_proj]
    before = [m.weight.detach().clone() for m in modules]
    params = [m.weight for m in modules]
    fused = fuse_rows(modules)
    assert torch.equal(fused, torch.cat(before))
    assert all(m.weight is p for m, p in zip(modules, params, strict=True))  # the same Parameter objects
    assert {_storage(m.weight) for m in modules} == {_storage(fused)}
    again = fuse_rows(modules)
    assert again.data_ptr() == fused.data_ptr() and torch.equal(again, fused)  # found, not copied again
    with torch.no_grad():
        att.k_proj.weight.add_(1.0)  # an in-place refresh of one module shows in the fused matrix
    assert torch.equal(fused[att.q_proj.out_features : att.q_proj.out_features + att.k_proj.out_features],
                       before[1] + 1.0)


def test_a_copy_decodes_through_fused_projections_and_pushes_and_releases_keep_it_exact() -> None:
    """The engine's fp32 copy: fused projections, the tokens and log-probs of transformers' path; after an
    optimizer step and a push (in place), and after a release and a push (new storage), those of a fresh engine; the
    trainer's own modules are never fused."""
    policy = Policy("tiny-random", seed=0)
    engine = HFEngine(policy, weights="copy", decode_dtype="float32")
    plain = HFEngine(policy, weights="copy", decode_dtype="float32", lean_decode=False)
    out = _generate(engine)
    assert [o.token_ids for o in out] == [o.token_ids for o in _generate(plain)]
    att = engine.weights.backbone.layers[0].self_attn
    assert _storage(att.q_proj.weight) == _storage(att.v_proj.weight)  # fused
    trainer_att = policy.backbone.layers[0].self_attn
    assert _storage(trainer_att.q_proj.weight) != _storage(trainer_att.v_proj.weight)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.mul_(1.5)
    asyncio.run(engine.update_weights(policy))
    fresh = _generate(HFEngine(policy, weights="copy", decode_dtype="float32", lean_decode=False))
    pushed = _generate(engine)
    assert [o.token_ids for o in pushed] == [o.token_ids for o in fresh]
    assert max(abs(a - b) for x, y in zip(pushed, fresh, strict=True)
               for a, b in zip(x.logprobs, y.logprobs, strict=True)) < 1e-5
    assert asyncio.run(engine.release_weights()) > 0
    assert engine._lean._for is None  # nothing keeps the released storage
    asyncio.run(engine.update_weights(policy))
    again = _generate(engine)
    assert [o.token_ids for o in again] == [o.token_ids for o in fresh]
    assert _storage(att.q_proj.weight) == _storage(att.v_proj.weight)  # fused again after the new storage


def test_a_bf16_copy_multiplies_packed_weights_with_the_unpacked_results_and_repacks_at_each_push() -> None:
    """On a bf16 copy the lean step holds the projections in oneDNN's layout (where this CPU's oneDNN has bf16
    kernels, `packs`): the same tokens and log-probs as the unpacked step, bit for bit; a push repacks (stale
    blocked weights would decode the old policy) and a release frees them."""
    policy = Policy("tiny-random", seed=0)
    packed = HFEngine(policy, weights="copy", decode_dtype="bfloat16", pack_weights=True)
    unpacked = HFEngine(policy, weights="copy", decode_dtype="bfloat16")  # the default: unpacked
    out, ref = _generate(packed), _generate(unpacked)
    decoder = packed._lean._for[1] if packed._lean._for else None
    assert decoder is not None and unpacked._lean._for is not None and unpacked._lean._for[1] is not None
    assert unpacked._lean._for[1].packed is None
    if packs(packed.weights.lm_head.weight) is None:  # oneDNN with bf16 kernels: this CPU packs
        assert decoder.packed is not None and decoder.packed_head is not None
    else:
        assert decoder.packed is None
    assert [o.token_ids for o in out] == [o.token_ids for o in ref]
    assert [o.logprobs for o in out] == [o.logprobs for o in ref]
    with torch.no_grad():
        for p in policy.model.parameters():
            p.mul_(1.5)
    asyncio.run(packed.update_weights(policy))
    assert packed._lean._for is not None and packed._lean._for[1] is not decoder  # rebuilt at the push
    fresh = _generate(HFEngine(policy, weights="copy", decode_dtype="bfloat16", pack_weights=False))
    pushed = _generate(packed)
    assert [o.token_ids for o in pushed] != [o.token_ids for o in out]  # the push changed what is decoded
    assert [o.token_ids for o in pushed] == [o.token_ids for o in fresh]
    assert [o.logprobs for o in pushed] == [o.logprobs for o in fresh]
    assert asyncio.run(packed.release_weights()) > 0
    assert packed._lean._for is None
