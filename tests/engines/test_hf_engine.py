"""HFEngine: log-prob consistency with the trainer, stop/length handling, seeded sampling, continuous batching
and prefix KV reuse, all on a tiny random model."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentrl.engines.base import Completion, SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.models.policy import Policy


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 259, (n,), generator=g).tolist()


def _trainer_logprobs(policy: Policy, prompt: list[int], completion: Completion) -> torch.Tensor:
    ids = torch.tensor([prompt + completion.token_ids])
    pos = torch.zeros_like(ids, dtype=torch.bool)
    pos[0, len(prompt):] = True
    with torch.no_grad():
        return policy.token_logprobs(ids, torch.ones_like(ids), pos).logprobs[pos]


def test_engine_logprobs_match_trainer(tiny_policy: Policy) -> None:
    engine = HFEngine(tiny_policy, max_batch_size=4)
    prompts = [_prompt(5 + 7 * i, i) for i in range(7)]  # different lengths: left padding in the batch

    async def run() -> list[Completion]:
        sp = SamplingParams(max_tokens=24, stop_token_ids=())
        return await asyncio.gather(*[engine.generate(p, sp.with_seed(i), session=f"e{i}")
                                      for i, p in enumerate(prompts)])

    outs = asyncio.run(run())
    worst = 0.0
    for prompt, out in zip(prompts, outs, strict=True):
        assert len(out.token_ids) == 24 and out.finish_reason == "length"
        diff = (_trainer_logprobs(tiny_policy, prompt, out) - torch.tensor(out.logprobs)).abs().max().item()
        worst = max(worst, diff)
    assert worst <= 1e-4, worst


def test_stop_token_and_max_tokens(tiny_policy: Policy) -> None:
    engine = HFEngine(tiny_policy)
    prompt = _prompt(12, 0)
    greedy = asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=6, temperature=0.0, stop_token_ids=())))
    assert greedy.finish_reason == "length" and len(greedy.token_ids) == 6
    first = greedy.token_ids[0]
    stopped = asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=6, temperature=0.0,
                                                                 stop_token_ids=(first,))))
    assert stopped.finish_reason == "stop" and stopped.token_ids == [first]  # the stop token is kept
    topk1 = asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=6, top_k=1, seed=5, stop_token_ids=())))
    assert topk1.token_ids == greedy.token_ids


def test_prompt_longer_than_context_is_a_length_finish(tiny_policy: Policy) -> None:
    engine = HFEngine(tiny_policy, max_context=32)
    out = asyncio.run(engine.generate(_prompt(40, 1), SamplingParams(max_tokens=4)))
    assert out.finish_reason == "length" and out.token_ids == []
    near = asyncio.run(engine.generate(_prompt(30, 1), SamplingParams(max_tokens=10, stop_token_ids=())))
    assert near.finish_reason == "length" and len(near.token_ids) == 2  # 30 + 2 = the 32-token window
    with pytest.raises(ValueError, match="empty"):
        asyncio.run(engine.generate([], SamplingParams()))


def test_seeded_sampling_does_not_depend_on_batch_company(tiny_policy: Policy) -> None:
    engine = HFEngine(tiny_policy, prefix_cache_tokens=0)
    prompt = _prompt(15, 3)
    sp = SamplingParams(max_tokens=16, seed=42, stop_token_ids=())
    alone = asyncio.run(engine.generate(prompt, sp))

    async def crowd() -> list[Completion]:
        others = [engine.generate(_prompt(5 + i, 10 + i), sp.with_seed(i), session=None) for i in range(5)]
        return await asyncio.gather(engine.generate(prompt, sp), *others)

    together = asyncio.run(crowd())[0]
    assert together.token_ids == alone.token_ids
    torch.testing.assert_close(torch.tensor(together.logprobs), torch.tensor(alone.logprobs), atol=1e-5, rtol=0)


def test_continuous_batching_admits_as_slots_free(tiny_policy: Policy) -> None:
    engine = HFEngine(tiny_policy, max_batch_size=2)
    done_order: list[int] = []

    async def one(i: int, n: int) -> Completion:
        out = await engine.generate(_prompt(8, i), SamplingParams(max_tokens=n, stop_token_ids=(), seed=i))
        done_order.append(i)
        return out

    async def run() -> list[Completion]:
        return list(await asyncio.gather(one(0, 30), one(1, 3), one(2, 3), one(3, 3)))

    outs = asyncio.run(run())
    assert [len(o.token_ids) for o in outs] == [30, 3, 3, 3]
    # the long request 0 holds one slot; 1, 2, 3 pass through the other slot and finish first
    assert done_order[-1] == 0
    assert engine.stats.decode_steps < 30 + 3 + 3 + 3  # batched, not one request at a time


def test_prefix_reuse_gives_same_tokens_and_logprobs(tiny_policy: Policy) -> None:
    reuse = HFEngine(tiny_policy)
    fresh = HFEngine(tiny_policy, prefix_cache_tokens=0)
    system = _prompt(30, 7)

    async def episode(engine: HFEngine) -> list[Completion]:
        outs = []
        prompt = list(system)
        for turn in range(3):
            out = await engine.generate(prompt, SamplingParams(max_tokens=10, seed=turn, stop_token_ids=()),
                                        session="ep")
            outs.append(out)
            prompt = prompt + out.token_ids + _prompt(6, 100 + turn)  # the next observation
        return outs

    a = asyncio.run(episode(reuse))
    b = asyncio.run(episode(fresh))
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)
    assert a[0].cached_tokens == 0 and a[1].cached_tokens > 30 and a[2].cached_tokens > a[1].cached_tokens
    assert all(o.cached_tokens == 0 for o in b)
    # a prompt that diverges inside the stored prefix reuses the common part only
    branched = [*system[:20], 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    out = asyncio.run(reuse.generate(branched, SamplingParams(max_tokens=2), session="other"))
    assert out.cached_tokens == 20


def test_weight_update_bumps_version_and_drops_stale_kv(tiny_policy: Policy) -> None:
    engine = HFEngine(tiny_policy)
    prompt = _prompt(20, 9)
    first = asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=4), session="s"))
    assert first.policy_version == 0
    asyncio.run(engine.update_weights(tiny_policy))
    again = asyncio.run(engine.generate(prompt + first.token_ids + [5, 6], SamplingParams(max_tokens=4),
                                        session="s"))
    assert again.policy_version == 1 and again.cached_tokens == 0
    with pytest.raises(ValueError, match="different policy"):
        asyncio.run(engine.update_weights(Policy("tiny-random", seed=1)))


def test_engine_serves_updated_weights(tiny_policy: Policy) -> None:
    engine = HFEngine(tiny_policy)
    prompt = _prompt(10, 1)
    sp = SamplingParams(max_tokens=5, seed=3, stop_token_ids=())
    before = asyncio.run(engine.generate(prompt, sp))
    with torch.no_grad():
        tiny_policy.lm_head.weight.mul_(3.0)
    asyncio.run(engine.update_weights())
    after = asyncio.run(engine.generate(prompt, sp))
    assert after.logprobs != before.logprobs
    diff = (_trainer_logprobs(tiny_policy, prompt, after) - torch.tensor(after.logprobs)).abs().max().item()
    assert diff <= 1e-4


def test_cancelled_requests_leave_the_batch_and_the_rest_is_unchanged(tiny_policy: Policy) -> None:
    engine = HFEngine(tiny_policy, max_batch_size=2)
    sp = SamplingParams(max_tokens=40, stop_token_ids=())
    prompts = [_prompt(6, i) for i in range(4)]

    async def run(cancel: bool) -> list[Completion]:
        tasks = [asyncio.create_task(engine.generate(p, sp.with_seed(i))) for i, p in enumerate(prompts)]
        if cancel:
            while engine.stats.decode_steps < 3:  # row 0 is decoding, row 3 still waits for a slot
                await asyncio.sleep(0)
            tasks[0].cancel()
            tasks[3].cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        return [d for d in done if isinstance(d, Completion)]

    kept = asyncio.run(run(cancel=True))
    assert engine.stats.cancelled == 2 and engine.running == 0 and engine.waiting == 0
    assert engine._batch.size == 0  # no KV rows left behind
    assert engine.stats.generated_tokens < 4 * 40
    clean = asyncio.run(run(cancel=False))
    assert [c.token_ids for c in kept] == [c.token_ids for c in clean[1:3]]  # seeded: company does not matter


def test_batched_prefill_equals_one_at_a_time(tiny_policy: Policy) -> None:
    """Admitted together, prompts of different lengths, some continuing a stored prefix and some not, are
    prefilled in one forward and give the tokens (and log-probs) they get when prefilled one by one."""
    sp = SamplingParams(max_tokens=6, stop_token_ids=())

    async def run(engine: HFEngine) -> list[Completion]:
        first = await asyncio.gather(*[engine.generate(_prompt(10 + 5 * i, i), sp.with_seed(i), session=f"s{i}")
                                       for i in range(3)])
        follow = [_prompt(10 + 5 * i, i) + c.token_ids + _prompt(3 + i, 50 + i) for i, c in enumerate(first)]
        fresh = [_prompt(7 + 9 * i, 60 + i) for i in range(2)]
        return await asyncio.gather(*[engine.generate(p, sp.with_seed(10 + i), session=f"s{i}")
                                      for i, p in enumerate(follow + fresh)])

    batched = HFEngine(tiny_policy)
    single = HFEngine(tiny_policy, prefill_batch_tokens=1)  # every prompt alone
    a, b = asyncio.run(run(batched)), asyncio.run(run(single))
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)
    assert [o.cached_tokens > 0 for o in a] == [True, True, True, False, False]
    assert batched.stats.prefill_forwards == 2 and single.stats.prefill_forwards == 8


def test_prompts_sharing_a_prefix_reuse_it_within_one_admission(tiny_policy: Policy) -> None:
    """Siblings admitted together with the same long context: the first computes it, the others wait one wave
    and reuse its KV instead of recomputing it."""
    engine = HFEngine(tiny_policy)
    context = _prompt(60, 3)
    sp = SamplingParams(max_tokens=4, stop_token_ids=())

    async def run() -> list[Completion]:
        return await asyncio.gather(*[engine.generate(context, sp.with_seed(i), session=f"sib{i}")
                                      for i in range(3)])

    outs = asyncio.run(run())
    assert [o.cached_tokens for o in outs] == [0, 59, 59]
    assert engine.stats.prefill_tokens == 60 + 1 + 1 and engine.stats.prefill_forwards == 2
