"""The lean decode step (`agentrl.engines.lean`): transformers' numbers on a tiny Llama with grouped key/value heads,
used by the engine where it applies, and refused (with its reason) where it would compute something else."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from agentrl.engines import lean as lean_module
from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.engines.kvcache import cache_kv, make_cache, prefill_batch
from agentrl.engines.lean import LeanDecoder, fuse_rows, packs, prefill_keep, supports
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


def _prefill(policy: Policy, lean: bool) -> tuple[torch.Tensor, list[list[tuple[torch.Tensor, torch.Tensor]]]]:
    """Last-position logits and the cache after a batched prefill in which two rows continue cached prefixes of
    different lengths (the prefix store's case) and two start empty: both kinds of left padding."""
    backbone, head = policy.backbone, policy.lm_head
    layers = backbone.config.num_hidden_layers
    with torch.inference_mode():
        first = prefill_batch(PROMPTS[:2], [(0, None)] * 2, layers, torch.device("cpu"))
        backbone(input_ids=first.ids, attention_mask=first.mask, position_ids=first.positions, cache=first.cache,
                 use_cache=True)
        rows = [first.row_kv(i) for i in range(2)]  # the prompts' KV, as the prefix store keeps it
        # the last row has neither a cached prefix nor as many new tokens: its padding positions see no real token
        prompts = [PROMPTS[0] + [11, 12, 13], PROMPTS[1] + [21, 22, 23, 24, 25, 26], PROMPTS[2], [30, 31]]
        batch = prefill_batch(prompts, [(len(PROMPTS[0]), rows[0]), (len(PROMPTS[1]), rows[1]), (0, None),
                                        (0, None)], layers, torch.device("cpu"))
        if lean:
            logits = LeanDecoder(backbone, head).prefill(batch.ids, batch.positions, batch.mask, batch.cache)
        else:
            hidden = backbone(input_ids=batch.ids, attention_mask=batch.mask, position_ids=batch.positions,
                              cache=batch.cache, use_cache=True).last_hidden_state
            logits = head(hidden[:, -1])
        return logits.float(), [batch.row_kv(i) for i in range(len(prompts))]


@pytest.mark.parametrize("queries", [256, 3])  # one attention call a layer; slices of 3 new positions
def test_the_lean_prefill_gives_transformers_logits_and_cache_after_cached_prefixes_and_padding(
        queries: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lean_module, "PREFILL_QUERIES", queries)
    policy = Policy("tiny-random", seed=0)
    (ref, ref_kv), (lean, lean_kv) = _prefill(policy, lean=False), _prefill(policy, lean=True)
    assert ref.abs().max() > 0.1 and lean.isfinite().all()
    assert (lean - ref).abs().max() < 1e-5
    for ref_row, lean_row in zip(ref_kv, lean_kv, strict=True):  # every layer's keys and values of each row
        for (rk, rv), (lk, lv) in zip(ref_row, lean_row, strict=True):
            assert rk.shape == lk.shape and (rk - lk).abs().max() < 1e-5 and (rv - lv).abs().max() < 1e-5


def test_each_new_position_sees_the_real_tokens_up_to_itself_and_always_itself() -> None:
    """Two cached columns and three new ones: row 0 all real; row 1 one cached token and one new one (padding in
    both parts), whose two padding positions see only themselves (an empty row would be NaN in some kernels)."""
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 0, 0, 1]])
    keep = prefill_keep(mask, 3).int().tolist()
    assert keep[0] == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert keep[1] == [[0, 1, 1, 0, 0], [0, 1, 0, 1, 0], [0, 1, 0, 0, 1]]


def test_the_engine_decodes_through_it_with_the_same_tokens_and_logprobs(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = Policy("tiny-random", seed=0)
    calls: list[int] = []
    step = LeanDecoder.step

    def counted_step(self: LeanDecoder, *a: Any) -> torch.Tensor:
        calls.append(1)
        return step(self, *a)

    monkeypatch.setattr(LeanDecoder, "step", counted_step)

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
    """On a bf16 copy the lean step holds the projections in oneDNN's layout only (where this CPU's oneDNN has bf16
    kernels, `packs`; the plain ones are freed, a head tied to the embedding left plain): the same tokens and
    log-probs as the unpacked engine (whose prefills go through transformers) on this model; a push repacks (stale
    blocked weights would decode the old policy), a release frees them, and a push after it packs again."""
    policy = Policy("tiny-random", seed=0)
    packed = HFEngine(policy, weights="copy", decode_dtype="bfloat16", pack_weights=True)
    unpacked = HFEngine(policy, weights="copy", decode_dtype="bfloat16", pack_weights=False)
    out, ref = _generate(packed), _generate(unpacked)
    decoder = packed._lean._for[1] if packed._lean._for else None
    assert decoder is not None and unpacked._lean._for is not None and unpacked._lean._for[1] is not None
    assert unpacked._lean._for[1].packed is None
    head = packed.weights.lm_head.weight
    if packs(head) is None:  # oneDNN with bf16 kernels: this CPU packs
        assert decoder.packed is not None
        layers = packed.weights.backbone.layers
        assert layers[0].self_attn.q_proj.weight.numel() == 0 == layers[-1].mlp.down_proj.weight.numel()  # only packed
        assert head is packed.weights.backbone.embed_tokens.weight and head.numel() > 0  # tied: the lookup's matrix
        assert decoder.packed_head is None  # so not packed a second time
    else:
        assert decoder.packed is None
    assert packed.weights_bytes == unpacked.weights_bytes  # the projections held once either way
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
    buffers = sum(b.numel() * b.element_size() for b in packed.weights.model.buffers())  # rotary frequencies
    held = packed.weights_bytes - buffers
    assert asyncio.run(packed.release_weights()) == held > 0  # the copy's parameters and the packed weights
    assert asyncio.run(packed.release_weights()) == held  # again before a push (Turn-PPO's warm-up and update)
    assert packed._lean._for is None and packed.weights_bytes == buffers
    asyncio.run(packed.update_weights(policy))  # a push after a release: new storage, packed again
    assert [o.token_ids for o in _generate(packed)] == [o.token_ids for o in fresh]


def test_an_untied_head_is_held_packed_only_too() -> None:
    """A model whose LM head is not its embedding: the head is packed and its plain weight freed like the
    projections' (no lookup needs it), with the unpacked engine's tokens and log-probs and its bytes."""
    policy = Policy("tiny-random", seed=0)
    head = policy.lm_head
    head.weight = torch.nn.Parameter(head.weight.detach().clone())  # untied from the embedding
    assert head.weight is not policy.backbone.embed_tokens.weight
    packed = HFEngine(policy, weights="copy", decode_dtype="bfloat16", pack_weights=True)
    unpacked = HFEngine(policy, weights="copy", decode_dtype="bfloat16", pack_weights=False)
    out, ref = _generate(packed), _generate(unpacked)
    assert [o.token_ids for o in out] == [o.token_ids for o in ref]
    assert [o.logprobs for o in out] == [o.logprobs for o in ref]
    decoder = packed._lean._for[1] if packed._lean._for else None
    assert decoder is not None
    if packs(packed.weights.backbone.embed_tokens.weight) is None:  # this CPU packs bf16
        assert decoder.packed_head is not None and packed.weights.lm_head.weight.numel() == 0
    assert packed.weights_bytes == unpacked.weights_bytes
