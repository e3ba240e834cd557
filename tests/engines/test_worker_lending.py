"""Where the engine's model steps run (`agentrl.engines.worker`): on the thread that waits for the rollouts
(`lend_until`, as `RolloutRuntime.run` waits), else on the engine's own worker thread — the same tokens either way,
whatever autocast the waiting thread is in."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest
import torch

from agentrl.collect.runtime import RolloutRuntime
from agentrl.engines import worker
from agentrl.engines.base import Completion, SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.models.policy import Policy

PROMPTS = [list(range(3 + i, 20 + 2 * i)) for i in range(3)]


async def _generate(engine: HFEngine) -> list[Completion]:
    params = SamplingParams(max_tokens=6, stop_token_ids=())
    return list(await asyncio.gather(*(engine.generate(p, params.with_seed(i)) for i, p in enumerate(PROMPTS))))


def _threads(engine: HFEngine) -> list[str]:
    names: list[str] = []
    decode = engine._decode_step

    def on_decode() -> None:
        names.append(threading.current_thread().name)
        decode()

    engine._decode_step = on_decode  # type: ignore[method-assign]
    return names


def test_a_runtime_run_lends_its_thread_to_every_model_step() -> None:
    policy = Policy("tiny-random", seed=0)
    alone = HFEngine(policy)
    expected = asyncio.run(_generate(alone))  # no thread waits: the engine's worker thread
    assert alone._worker.worker_steps > 0 and alone._worker.lent_steps == 0
    engine = HFEngine(policy)
    names = _threads(engine)
    with RolloutRuntime() as runtime:
        for _ in range(2):  # the first step of each run too: the thread is lent before the work starts
            got = runtime.run(_generate(engine))
            assert [o.token_ids for o in got] == [o.token_ids for o in expected]
            assert [o.logprobs for o in got] == [o.logprobs for o in expected]
    assert engine._worker.worker_steps == 0 and engine._worker.lent_steps >= 2 * 6
    assert set(names) == {threading.current_thread().name}
    assert not worker._lenders


def test_the_lending_threads_autocast_does_not_reach_the_engine() -> None:
    """The trainer may wait for rollouts inside its bf16 autocast; an fp32 engine must still decode in fp32."""
    policy = Policy("tiny-random", seed=0)
    expected = asyncio.run(_generate(HFEngine(policy)))
    engine = HFEngine(policy)
    with RolloutRuntime() as runtime, torch.autocast("cpu", dtype=torch.bfloat16):
        got = runtime.run(_generate(engine))
    assert engine._worker.lent_steps > 0
    assert [o.logprobs for o in got] == [o.logprobs for o in expected]


def test_a_timed_out_wait_returns_its_thread_and_later_steps_run_on_the_worker() -> None:
    policy = Policy("tiny-random", seed=0)
    engine = HFEngine(policy)
    never: concurrent.futures.Future[int] = concurrent.futures.Future()
    with pytest.raises(TimeoutError):
        worker.lend_until(never, timeout=0.2)
    assert not worker._lenders
    with RolloutRuntime() as runtime:
        future = runtime.submit(_generate(engine))  # nobody waits: the worker thread generates
        assert len(future.result(timeout=60)) == len(PROMPTS)
    assert engine._worker.worker_steps > 0 and engine._worker.lent_steps == 0
