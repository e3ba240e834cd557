"""The embedded engine's own weight copy (`agentrl.engines.weights`, ``HFEngineSpec(weights="copy")``): separate
storage in the decode dtype, refreshed by `HFEngine.update_weights` and only then; the trainer recomputes π_old
exactly when the copy is not the trainer's fp32 code."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import torch

from agentrl.engines.base import Completion, SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.engines.hf_requests import Request
from agentrl.engines.specs import HFEngineSpec
from agentrl.models import precision
from agentrl.models.policy import LoRASettings, Policy
from agentrl.training.update.mismatch import recompute_on
from agentrl.training.update.settings import PPOSettings

PROMPTS = [list(range(3 + i, 20 + 2 * i)) for i in range(3)]


def _generate(engine: HFEngine) -> list[Completion]:
    async def run() -> list[Completion]:
        sp = SamplingParams(max_tokens=10, stop_token_ids=())
        return await asyncio.gather(*[engine.generate(p, sp.with_seed(i)) for i, p in enumerate(PROMPTS)])

    return asyncio.run(run())


def _logprobs(outs: list[Completion]) -> list[list[float]]:
    return [o.logprobs for o in outs]


def _worst(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=False))


def _trainer_logprobs(policy: Policy, outs: list[Completion]) -> list[list[float]]:
    scored = []
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ids = torch.tensor([prompt + out.token_ids])
        pos = torch.zeros_like(ids, dtype=torch.bool)
        pos[0, len(prompt):] = True
        with torch.no_grad():
            scored.append(policy.token_logprobs(ids, torch.ones_like(ids), pos).logprobs[pos].tolist())
    return scored


def _optimizer_step(policy: Policy) -> None:
    """One real AdamW step on the policy's trainable parameters (a language-model loss on a prompt)."""
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
    ids = torch.tensor([PROMPTS[0]])
    pos = torch.zeros_like(ids, dtype=torch.bool)
    pos[0, 1:] = True
    loss = -policy.token_logprobs(ids, torch.ones_like(ids), pos).logprobs.sum()
    loss.backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("lora", [None, LoRASettings(r=4, target_modules=["q_proj", "v_proj"])],
                         ids=["full", "lora"])
def test_an_optimizer_step_changes_nothing_the_copy_reads_until_the_push(lora: LoRASettings | None) -> None:
    policy = Policy("tiny-random", seed=0, lora=lora)
    if lora is not None:  # peft starts B at zero: move the adapter first, so the copy must carry a real adapter
        _optimizer_step(policy)
    engine = HFEngine(policy, weights="copy")
    before = _generate(engine)
    assert _worst(_logprobs(before), _trainer_logprobs(policy, before)) < 1e-5
    _optimizer_step(policy)
    assert _logprobs(_generate(engine)) == _logprobs(before)  # same seeds, same copy: bit for bit the same
    asyncio.run(engine.update_weights(policy))
    after = _generate(engine)
    fresh = _generate(HFEngine(policy, weights="copy"))  # a copy built from the stepped policy
    assert [o.token_ids for o in after] == [o.token_ids for o in fresh]
    assert _logprobs(after) == _logprobs(fresh)
    assert _worst(_logprobs(after), _trainer_logprobs(policy, after)) < 1e-5  # the trainer's code and weights
    assert _logprobs(after) != _logprobs(before)  # the step did move the policy


def test_a_shared_engine_sees_the_step_at_once() -> None:
    """The contrast: without a copy the engine reads the tensors the optimizer writes."""
    policy = Policy("tiny-random", seed=0)
    engine = HFEngine(policy, weights="shared")
    before = _generate(engine)
    _optimizer_step(policy)
    assert _logprobs(_generate(engine)) != _logprobs(before)
    assert engine.weights_bytes == 0


def test_a_bf16_copy_holds_half_the_bytes_and_decodes_in_bf16() -> None:
    policy = Policy("tiny-random", seed=0)
    fp32 = HFEngine(policy, weights="copy", decode_dtype="float32")
    bf16 = HFEngine(policy, weights="copy", decode_dtype="bfloat16")
    dtypes = {p.dtype for p in bf16.weights.model.parameters()}
    assert dtypes == {torch.bfloat16}
    assert {p.dtype for p in policy.model.parameters()} == {torch.float32}  # the policy is untouched
    params = sum(p.numel() for p in policy.model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in policy.model.buffers())
    assert fp32.weights_bytes == 4 * params + buffers and bf16.weights_bytes == 2 * params + buffers
    out = _generate(bf16)
    assert _worst(_logprobs(_generate(fp32)), _trainer_logprobs(policy, _generate(fp32))) < 1e-5
    worst = _worst(_logprobs(out), _trainer_logprobs(policy, out))  # the bf16 engine's own tokens, scored in fp32
    assert 1e-4 < worst < 0.1  # bf16 rounding: different numbers, the same model
    assert all(not p.requires_grad for p in bf16.weights.model.parameters()) and not bf16.weights.model.training


def test_auto_follows_the_cpu_rule_and_the_width_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    """``decode_dtype: auto`` is the policy's rule: tiny models stay fp32; a wide one is bf16 only with native
    bf16 (the probe replaced to simulate both CPUs)."""
    from agentrl.engines.weights import resolve_decode_dtype

    policy = Policy("tiny-random", seed=0)
    assert resolve_decode_dtype("auto", policy).dtype == torch.float32  # hidden size 64 < MIN_WIDTH
    monkeypatch.setattr(precision, "MIN_WIDTH", 16)
    monkeypatch.setattr(precision, "cpu_bf16_support", lambda: precision.Bf16Support(True, "CPU X has avx512_bf16"))
    assert resolve_decode_dtype("auto", policy).dtype == torch.bfloat16
    monkeypatch.setattr(precision, "cpu_bf16_support", lambda: precision.Bf16Support(False, "CPU Y has none"))
    assert resolve_decode_dtype("auto", policy).dtype == torch.float32
    assert resolve_decode_dtype("bfloat16", policy).dtype == torch.bfloat16  # explicit: preflight judges it


def test_weights_auto_copies_exactly_where_the_copy_decodes_cheaper(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default ``weights: auto``: a bf16 copy where ``decode_dtype`` resolves to bf16 (native bf16 and a wide
    enough model), the policy's own modules where it would be an fp32 copy (a tiny model, a CPU without native
    bf16, an explicit fp32) or where the engine decodes under the policy's autocast; and the trainer recomputes
    π_old exactly when the copy is made. Data-parallel overlap (``max_staleness >= 1``) resolves it to a copy."""
    from agentrl.training.rollout.async_collect import check_async

    policy = Policy("tiny-random", seed=0)
    assert HFEngineSpec().weights == "auto"
    assert HFEngineSpec().weights_for(policy) == "shared"  # hidden size 64 < MIN_WIDTH: fp32
    assert not HFEngineSpec().build(policy).weights.holds_copy  # type: ignore[attr-defined]
    monkeypatch.setattr(precision, "MIN_WIDTH", 16)
    monkeypatch.setattr(precision, "cpu_bf16_support", lambda: precision.Bf16Support(True, "CPU X has avx512_bf16"))
    spec = HFEngineSpec()
    assert spec.weights_for(policy) == "copy" and spec.decode_dtype_for(policy) == torch.bfloat16
    engine = spec.build(policy)
    assert engine.weights.holds_copy and engine.weights_bytes > 0  # type: ignore[attr-defined]
    assert recompute_on(PPOSettings(), spec, policy)  # a bf16 copy is not the trainer's code
    assert HFEngineSpec(decode_dtype="float32").weights_for(policy) == "shared"
    assert HFEngineSpec(compute_dtype="policy").weights_for(policy) == "shared"
    monkeypatch.setattr(precision, "cpu_bf16_support", lambda: precision.Bf16Support(False, "CPU Y has none"))
    assert HFEngineSpec().weights_for(policy) == "shared"
    assert not recompute_on(PPOSettings(), HFEngineSpec(), policy)  # shared fp32: the engine's log-probs are π_old
    overlapped = HFEngineSpec()
    check_async(1, overlapped, PPOSettings())
    assert overlapped.weights_for(policy) == "copy"


def test_recompute_follows_the_copy_dtype() -> None:
    fp32, bf16_compute = Policy("tiny-random"), Policy("tiny-random", compute_dtype="bfloat16")
    auto = PPOSettings()
    assert not recompute_on(auto, HFEngineSpec(weights="copy", decode_dtype="float32"), fp32)  # the trainer's code
    assert not recompute_on(auto, HFEngineSpec(weights="shared"), fp32)
    assert recompute_on(auto, HFEngineSpec(weights="copy", decode_dtype="bfloat16"), fp32)
    assert recompute_on(auto, HFEngineSpec(weights="copy", decode_dtype="float32"), bf16_compute)
    assert recompute_on(auto, HFEngineSpec(weights="shared", compute_dtype="policy"), bf16_compute)


def test_the_spec_builds_the_copy_and_names_wrong_settings() -> None:
    engine = HFEngineSpec(weights="copy").build(Policy("tiny-random"))
    assert isinstance(engine, HFEngine) and engine.weights.holds_copy
    assert not HFEngineSpec(weights="shared").build(Policy("tiny-random")).weights.holds_copy  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="engine.weights must be 'auto', 'shared' or 'copy'"):
        HFEngineSpec(weights="both")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="engine.decode_dtype must be"):
        HFEngineSpec(weights="copy", decode_dtype="float16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="engine.compute_dtype applies to weights: shared"):
        HFEngineSpec(weights="copy", compute_dtype="policy")
    with pytest.raises(ValueError, match="engine.decode_dtype applies to weights: copy"):
        HFEngineSpec(weights="shared", decode_dtype="bfloat16")


def test_a_push_during_a_prefill_waits_for_the_forward() -> None:
    """A refresh must never run under a forward: a push that comes while a request is being prefilled (handed to
    the worker thread, not yet in the decode batch) copies only once that model step is over."""
    policy = Policy("tiny-random", seed=0)
    engine = HFEngine(policy, weights="copy")
    busy, overlaps = threading.Event(), []
    timed, refresh = engine._worker._step, engine.weights.refresh

    def watched_step(*args: Any, **kwargs: Any) -> Any:
        busy.set()
        try:
            return timed(*args, **kwargs)
        finally:
            busy.clear()

    def watched_refresh(policy: Any) -> float:
        overlaps.append(busy.is_set())
        return refresh(policy)

    engine._worker._step = watched_step  # type: ignore[method-assign]
    engine.weights.refresh = watched_refresh  # type: ignore[method-assign]

    async def run() -> Completion:
        task = asyncio.create_task(engine.generate(PROMPTS[0], SamplingParams(max_tokens=4, stop_token_ids=())))
        while not engine._admitting:  # the scheduler has handed the request to the worker thread
            await asyncio.sleep(0)
        await engine.update_weights(policy)
        return await task

    out = asyncio.run(run())
    assert overlaps == [False] and engine.version == 1 and out.policy_version == 0


def test_preflight_refuses_an_explicit_bf16_copy_without_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentrl.training.command.preflight import PolicyPlan, check_bf16

    monkeypatch.delenv(precision.ALLOW_SLOW_BF16, raising=False)
    monkeypatch.setattr(precision, "cpu_bf16_support", lambda: precision.Bf16Support(False, "CPU Y has no native bf16"))
    plan = PolicyPlan("tiny-random", False, compute_dtype="float32")
    check_bf16(plan, "cpu", HFEngineSpec(weights="copy"))  # auto: never refused
    with pytest.raises(ValueError, match="model.engine.init_args.decode_dtype is bfloat16, but CPU Y"):
        check_bf16(plan, "cpu", HFEngineSpec(weights="copy", decode_dtype="bfloat16"))
    monkeypatch.setattr(precision, "cpu_bf16_support", lambda: precision.Bf16Support(True, "CPU X has amx_bf16"))
    check_bf16(plan, "cpu", HFEngineSpec(weights="copy", decode_dtype="bfloat16"))


def test_a_copy_is_refreshed_while_a_request_is_decoding_and_the_request_keeps_its_oldest_version(
        tiny_policy: Policy) -> None:
    """Bounded-staleness collection pushes while episodes are in flight: the copy engine refreshes between two
    model steps (not refused, not racing a step), the request goes on with the new weights and completes stamped
    with the version it started under; the next request gets the new version. Shared weights still refuse."""
    engine = HFEngine(tiny_policy, weights="copy", decode_dtype="float32")
    sp = SamplingParams(max_tokens=48, stop_token_ids=(), seed=1)
    reference = asyncio.run(HFEngine(tiny_policy, weights="copy", decode_dtype="float32").generate(PROMPTS[0], sp))

    async def run() -> tuple[Completion, int, int, Completion]:
        long = asyncio.ensure_future(engine.generate(PROMPTS[0], sp))
        while not engine._active or len(engine._active[0].out_ids) < 4:  # decoding, a few tokens in
            await asyncio.sleep(0.001)
        _optimizer_step(tiny_policy)
        at_push = len(engine._active[0].out_ids)
        await engine.update_weights(version=1)
        after_push = len(engine._active[0].out_ids) if engine._active else -1
        return await long, at_push, after_push, await engine.generate(PROMPTS[1], sp)

    out, at_push, after_push, fresh = asyncio.run(run())
    assert 4 <= at_push < 48 and at_push <= after_push < 48  # the push came in the middle of the decode
    assert len(out.token_ids) == 48 and out.finish_reason == "length"
    assert out.policy_version == 0 and fresh.policy_version == 1 and engine.version == 1
    # up to the push the request decoded exactly as it does without one; after it, with other weights
    assert out.token_ids[:at_push] == reference.token_ids[:at_push]
    assert out.logprobs[:at_push] == reference.logprobs[:at_push]
    assert max(abs(x - y) for x, y in zip(out.logprobs[after_push:], reference.logprobs[after_push:],
                                          strict=True)) > 1e-3

    shared = HFEngine(tiny_policy, weights="shared")

    async def push_while_decoding() -> None:
        long = asyncio.ensure_future(shared.generate(PROMPTS[0], sp))
        while not shared._active:
            await asyncio.sleep(0.001)
        try:
            await shared.update_weights(version=1)
        finally:
            await long

    with pytest.raises(RuntimeError, match="while requests are being decoded"):
        asyncio.run(push_while_decoding())


def test_a_copy_built_in_inference_mode_refreshes_outside_it() -> None:
    """`agentrl validate` builds the engine inside Lightning's inference mode; a push after it (outside) must
    refresh the copy in place (inference tensors cannot be updated in place outside inference mode)."""
    policy = Policy("tiny-random", seed=0)
    with torch.inference_mode():
        engine = HFEngine(policy, weights="copy", decode_dtype="float32")
    _optimizer_step(policy)
    asyncio.run(engine.update_weights(policy))
    assert all(torch.equal(a, b) for a, b in zip(policy.model.parameters(), engine.weights.model.parameters(),
                                                 strict=True))


def test_every_model_step_runs_on_the_engines_one_worker_thread() -> None:
    """Prefills and decode steps of concurrent requests all run on one dedicated thread (one allocator arena:
    `agentrl.engines.worker`), never on the event loop's thread, and the step counters still add up."""
    engine = HFEngine(Policy("tiny-random", seed=0))
    threads: list[str] = []
    prefill, decode = engine._prefill, engine._decode_step

    def on_prefill(requests: list[Request]) -> list[Request]:
        threads.append(threading.current_thread().name)
        return prefill(requests)

    def on_decode() -> None:
        threads.append(threading.current_thread().name)
        decode()

    engine._prefill, engine._decode_step = on_prefill, on_decode  # type: ignore[method-assign]

    async def run() -> list[Completion]:
        params = SamplingParams(max_tokens=6, stop_token_ids=())
        return await asyncio.gather(*(engine.generate(p, params) for p in PROMPTS))

    outs = asyncio.run(run())
    assert all(len(o.token_ids) == 6 for o in outs) and len(threads) >= 6
    assert len(set(threads)) == 1 and threads[0].startswith("agentrl-engine")
    stats = engine.stats
    assert stats.decode_seconds > 0 and stats.prefill_seconds > 0
    assert stats.busy_seconds == pytest.approx(stats.prefill_seconds + stats.decode_seconds)


def test_a_released_copy_refuses_to_decode_and_the_push_brings_back_a_fresh_copy() -> None:
    """The trainer frees the copy's storage for its update (`HFEngine.release_weights`): a request before the push
    fails with a clear error, and the push allocates a copy that decodes exactly as one built from the stepped
    policy, tied embeddings still one tensor. Shared weights and an engine with a request in flight free nothing."""
    policy = Policy("tiny-random", seed=0)
    engine = HFEngine(policy, weights="copy", decode_dtype="bfloat16")
    before = _generate(engine)
    params = sum(p.numel() for p in policy.model.parameters())  # tied embeddings counted once
    assert asyncio.run(engine.release_weights()) == 2 * params
    assert all(p.numel() == 0 for p in engine.weights.model.parameters())
    with pytest.raises(RuntimeError, match="released for the trainer's update"):
        _generate(engine)
    _optimizer_step(policy)
    asyncio.run(engine.update_weights(policy))
    after = _generate(engine)
    fresh = _generate(HFEngine(policy, weights="copy", decode_dtype="bfloat16"))
    assert [o.token_ids for o in after] == [o.token_ids for o in fresh] and _logprobs(after) == _logprobs(fresh)
    assert _logprobs(after) != _logprobs(before)
    model = engine.weights.model
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16} and engine.weights_bytes >= 2 * params

    shared = HFEngine(policy, weights="shared")
    assert asyncio.run(shared.release_weights()) == 0 and len(_generate(shared)) == len(PROMPTS)

    async def release_while_decoding() -> tuple[int, Completion]:
        sp = SamplingParams(max_tokens=24, stop_token_ids=(), seed=1)
        long = asyncio.ensure_future(engine.generate(PROMPTS[0], sp))
        while not engine._active:
            await asyncio.sleep(0.001)
        return await engine.release_weights(), await long

    freed, out = asyncio.run(release_while_decoding())
    assert freed == 0 and len(out.token_ids) == 24 and not engine.weights.released


def test_an_fp32_copy_released_and_pushed_is_its_own_storage_and_a_second_release_reports_the_same_bytes() -> None:
    """An fp32 copy allocated again at the push must not share the policy's tensors (``.to`` to the same dtype
    returns the very tensor without ``copy=True``); two releases without a push between them (Turn-PPO's value
    warm-up, then its update) both report the copy's bytes."""
    policy = Policy("tiny-random", seed=0)
    engine = HFEngine(policy, weights="copy", decode_dtype="float32")
    params = sum(p.numel() for p in policy.model.parameters())
    assert asyncio.run(engine.release_weights()) == 4 * params
    assert asyncio.run(engine.release_weights()) == 4 * params
    asyncio.run(engine.update_weights(policy))
    before = _generate(engine)
    _optimizer_step(policy)
    assert _logprobs(_generate(engine)) == _logprobs(before)  # the step changed nothing the copy reads
    assert not any(a.data_ptr() == b.data_ptr() for a, b in zip(policy.model.parameters(),
                                                                 engine.weights.model.parameters(), strict=True))
