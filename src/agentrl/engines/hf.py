"""`HFEngine`: the embedded rollout engine, in process, sharing the policy's parameters.

* **Weight sync is a version bump.** The engine runs the very modules the trainer updates; `update_weights`
  only bumps the version and drops the prefix cache (its KV was computed with the old weights).
* **Continuous batching.** Concurrent `generate` calls from many episodes join one decode batch; a request is
  admitted as soon as a slot is free (``max_batch_size``) and leaves as soon as it stops, without waiting for the
  rest of the batch (static batching, as ``model.generate`` does, waits for the longest).
* **Prefix KV reuse.** A prompt that starts with the exact token ids of a stored prompt or finished turn reuses
  their KV and prefills only the new tokens (see `agentrl.engines.kvcache.PrefixStore`). In a multi-turn episode
  turn k+1's prompt is turn k's prompt + response + the new observation, so the conversation is not re-read.
* **Per-request seeded sampling.** Each request samples from its own ``torch.Generator``, so its tokens do not
  depend on which other requests share the batch.
* **A request fails or leaves alone.** An error while prefilling or sampling one request (its stop callback, a
  non-finite distribution) fails that request only; the rest of the batch goes on. Only an error in the batched
  forward pass, which no single request owns, fails every request in flight. A caller that cancels its
  ``generate`` (the HTTP server does when the client disconnects) has its request dropped from the queue or the
  decode batch before the next step, which frees its KV rows (``stats.cancelled`` counts them).

The forward passes run in a worker thread (``asyncio.to_thread``) so that agents' tool calls and environment
steps proceed on the event loop meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from agentrl.engines.base import Completion, SamplingParams
from agentrl.engines.kvcache import KV, BatchKV, PrefixStore, cache_kv, make_cache
from agentrl.models.policy import Policy
from agentrl.types import FinishReason

log = logging.getLogger(__name__)


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    session: str | None
    future: asyncio.Future[Completion]
    generator: torch.Generator
    stop: frozenset[int]
    stop_when: Callable[[list[int]], bool] | None = None
    out_ids: list[int] = field(default_factory=list)
    out_logprobs: list[float] = field(default_factory=list)
    cached: int = 0
    finish: FinishReason | None = None
    error: Exception | None = None  # set in the worker thread when this request alone failed

    @property
    def gone(self) -> bool:
        """Finished, failed, or cancelled by its caller: it leaves the batch at the next retire."""
        return self.finish is not None or self.error is not None or self.future.done()


@dataclass
class EngineStats:
    """Counters since construction (or the last `HFEngine.reset_stats`)."""

    requests: int = 0
    generated_tokens: int = 0
    prefill_tokens: int = 0
    cached_tokens: int = 0
    decode_steps: int = 0
    cancelled: int = 0
    failed: int = 0
    busy_seconds: float = 0.0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0


class HFEngine:
    """In-process engine over a `Policy`.

    Args:
        policy: The policy whose modules generate (shared, never copied).
        max_batch_size: Most sequences decoded together.
        prefix_cache_tokens: Token budget of the prefix KV store (0 disables prefix reuse).
        max_context: Context window; defaults to the model's ``max_position_embeddings``.
        seed: Seed of the generator used by requests without their own seed.
        step_context: Context manager factory entered around every model step, in the worker thread (``agentrl
            serve`` uses it to serialise two engines over one peft model and to switch the adapter off for
            base-model requests).
    """

    def __init__(
        self,
        policy: Policy,
        *,
        max_batch_size: int = 32,
        prefix_cache_tokens: int = 32768,
        max_context: int | None = None,
        seed: int = 0,
        step_context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.policy = policy
        self.max_batch_size = max_batch_size
        self._max_context = int(max_context or policy.max_context)
        self._version = 0
        self._num_layers = int(policy.backbone.config.num_hidden_layers)
        self._prefix = PrefixStore(prefix_cache_tokens)
        self._rng = torch.Generator().manual_seed(seed)
        self._step_context = step_context
        self._waiting: deque[_Request] = deque()
        self._active: list[_Request] = []
        self._batch = BatchKV(self._num_layers)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None
        self.stats = EngineStats()

    # ------------------------------------------------------------------ protocol

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def tokenizer(self) -> Any:
        return self.policy.tokenizer

    async def update_weights(self, policy: Any = None, *, version: int | None = None) -> None:
        """The parameters are shared, so only the version moves; cached KV of the old weights is dropped."""
        if policy is not None and policy is not self.policy:
            raise ValueError("HFEngine shares its policy's parameters; update_weights got a different policy")
        if self._active:
            raise RuntimeError("update_weights while requests are being decoded: collect, then update")
        self._version = self._version + 1 if version is None else int(version)
        self._prefix.clear()

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session: str | None = None,
        stop_when: Callable[[list[int]], bool] | None = None,
    ) -> Completion:
        """See `RolloutEngine.generate`. ``stop_when`` (not part of the protocol) is called with the generated ids
        after each sampled token, in the worker thread; True ends the completion with ``finish_reason="stop"``
        (the HTTP server's stop strings)."""
        self._ensure_scheduler()
        assert self._loop is not None and self._wakeup is not None
        generator = torch.Generator()
        if sampling.seed is None:
            generator.manual_seed(int(torch.randint(0, 2**62, (1,), generator=self._rng)))
        else:
            generator.manual_seed(int(sampling.seed))
        stop = frozenset(sampling.stop_token_ids if sampling.stop_token_ids is not None
                         else self.policy.stop_token_ids)
        req = _Request(list(prompt_ids), sampling, session, self._loop.create_future(), generator, stop, stop_when)
        self.stats.requests += 1
        if len(req.prompt_ids) == 0:
            raise ValueError("generate: prompt_ids is empty")
        if len(req.prompt_ids) >= self._max_context:
            return self._completion(req, "length")
        self._waiting.append(req)
        self._wakeup.set()
        return await req.future

    @property
    def running(self) -> int:
        """Requests in the decode batch."""
        return len(self._active)

    @property
    def waiting(self) -> int:
        """Requests queued for a batch slot."""
        return len(self._waiting)

    def reset_stats(self) -> None:
        self.stats = EngineStats()

    async def shutdown(self) -> None:
        """Abort every pending request (their futures get ``finish_reason="abort"``) and stop the scheduler."""
        for req in list(self._waiting) + self._active:
            if not req.future.done():
                req.future.set_result(self._completion(req, "abort"))
        self._waiting.clear()
        self._active.clear()
        self._batch = BatchKV(self._num_layers)
        if self._task is not None:
            self._task.cancel()
            self._task = None

    # ------------------------------------------------------------------ scheduler

    def _ensure_scheduler(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._task is None or self._task.done():
            if self._loop is not None and self._loop is not loop and (self._active or self._waiting):
                raise RuntimeError("HFEngine is busy on another event loop; use one loop (RolloutRuntime)")
            self._loop = loop
            self._wakeup = asyncio.Event()
            self._active, self._batch = [], BatchKV(self._num_layers)
            self._task = loop.create_task(self._run(), name="hf-engine-scheduler")

    async def _run(self) -> None:
        assert self._wakeup is not None
        while True:
            if not self._waiting and not self._active:
                self._wakeup.clear()
                await self._wakeup.wait()
            self._drop_cancelled_waiting()
            admitted: list[_Request] = []
            while self._waiting and len(self._active) + len(admitted) < self.max_batch_size:
                admitted.append(self._waiting.popleft())
            try:
                if admitted:
                    await asyncio.to_thread(self._timed, self._prefill, admitted)
                    self._active.extend(r for r in admitted if r.error is None)
                    for req in admitted:
                        if req.error is not None:
                            self._fail(req)
                    self._retire()
                if self._active:
                    await asyncio.to_thread(self._timed, self._decode_step)
                    self._retire()
            except Exception as exc:  # a model error fails the requests in flight, not the scheduler
                log.exception("HFEngine step failed")
                for req in admitted + self._active:
                    if not req.future.done():
                        req.future.set_exception(exc)
                self._active, self._batch = [], BatchKV(self._num_layers)

    def _drop_cancelled_waiting(self) -> None:
        """Forget queued requests whose caller gave up (they hold no KV yet)."""
        if any(r.future.done() for r in self._waiting):
            self.stats.cancelled += sum(r.future.cancelled() for r in self._waiting)
            self._waiting = deque(r for r in self._waiting if not r.future.done())

    def _fail(self, req: _Request) -> None:
        """Fail one request with its own error (on the event loop)."""
        assert req.error is not None
        self.stats.failed += 1
        log.warning("HFEngine request failed alone: %s: %s", type(req.error).__name__, req.error)
        if not req.future.done():
            req.future.set_exception(req.error)

    def _timed(self, fn: Any, *args: Any) -> None:
        with self._step_context() if self._step_context is not None else contextlib.nullcontext():
            self._timed_step(fn, *args)

    def _timed_step(self, fn: Any, *args: Any) -> None:
        start = time.perf_counter()
        prefill = fn == self._prefill
        model = self.policy.model
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                fn(*args)
        finally:
            model.train(was_training)
            spent = time.perf_counter() - start
            self.stats.busy_seconds += spent
            if prefill:
                self.stats.prefill_seconds += spent
            else:
                self.stats.decode_seconds += spent

    def _retire(self) -> None:
        """Complete finished requests (storing their KV for prefix reuse), fail failed ones, drop cancelled ones,
        and shrink the batch to the rest."""
        keep = []
        for row, req in enumerate(self._active):
            if not req.gone:
                keep.append(row)
                continue
            if req.future.done():  # cancelled by its caller (or aborted by shutdown): no KV worth keeping
                self.stats.cancelled += req.future.cancelled()
                continue
            if req.error is not None:
                self._fail(req)
                continue
            assert req.finish is not None
            if req.session is not None:
                ids = (req.prompt_ids + req.out_ids)[: len(req.prompt_ids) + len(req.out_ids) - 1]
                self._prefix.put(req.session, ids, self._batch.extract(row))
            req.future.set_result(self._completion(req, req.finish))
        if len(keep) != len(self._active):
            self._active = [self._active[i] for i in keep]
            self._batch.keep(keep)

    def _completion(self, req: _Request, finish: FinishReason) -> Completion:
        return Completion(token_ids=list(req.out_ids), logprobs=list(req.out_logprobs), finish_reason=finish,
                          policy_version=self._version, prompt_len=len(req.prompt_ids), cached_tokens=req.cached)

    # ------------------------------------------------------------------ model work (worker thread)

    @property
    def _device(self) -> torch.device:
        return next(self.policy.model.parameters()).device  # read each time: Lightning may move the model

    def _forward(self, input_ids: Tensor, mask: Tensor, position_ids: Tensor, cache: Any) -> Tensor:
        """Logits (B, V) of the last position."""
        with self.policy.autocast():
            out = self.policy.backbone(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                                       cache=cache, use_cache=True)
            logits = self.policy.lm_head(out.last_hidden_state[:, -1])
        return logits.float()

    def _prefill_one(self, req: _Request) -> None:
        """Prefill a new request (reusing a stored prefix when one matches), sample its first token, and add it to
        the decode batch."""
        cached, kv = self._prefix.lookup(req.prompt_ids)
        cache = make_cache(self._num_layers, kv)
        n = len(req.prompt_ids)
        ids = torch.tensor([req.prompt_ids[cached:]], device=self._device)
        positions = torch.arange(cached, n, device=self._device).unsqueeze(0)
        mask = torch.ones(1, n, dtype=torch.long, device=self._device)
        logits = self._forward(ids, mask, positions, cache)
        req.cached = cached
        self.stats.prefill_tokens += n - cached
        self.stats.cached_tokens += cached
        prompt_kv: KV = cache_kv(cache)
        if req.session is not None:
            stored = [(k.clone(), v.clone()) for k, v in prompt_kv]
            self._prefix.put(f"{req.session}/prompt", req.prompt_ids, stored)
        self._sample(req, logits[0])
        self._batch.add(prompt_kv)  # last: a request that failed above has no row

    def _prefill(self, requests: list[_Request]) -> None:
        """Prefill each request on its own; one that fails is marked (``error``) and gets no batch row."""
        for req in requests:
            try:
                self._prefill_one(req)
            except Exception as exc:
                req.error = exc

    def _decode_step(self) -> None:
        assert self._batch.mask is not None
        tokens = torch.tensor([[r.out_ids[-1]] for r in self._active], device=self._device)
        positions = torch.tensor([[len(r.prompt_ids) + len(r.out_ids) - 1] for r in self._active],
                                 device=self._device)
        mask = self._batch.step_mask()
        logits = self._forward(tokens, mask, positions, self._batch.cache)
        self.stats.decode_steps += 1
        for row, req in enumerate(self._active):
            if req.future.done():
                continue  # cancelled meanwhile: retired after this step
            try:
                self._sample(req, logits[row])
            except Exception as exc:  # this request's own fault (stop callback, distribution): it alone fails
                req.error = exc

    def _sample(self, req: _Request, logits: Tensor) -> None:
        """Sample one token for ``req`` from its own generator; record token, log-prob and finish reason."""
        sp = req.sampling
        if sp.temperature == 0:
            logp = torch.log_softmax(logits, -1)
            token = int(logp.argmax())
        else:
            logp = torch.log_softmax(logits / sp.temperature, -1)
            probs = _truncate(logp.exp(), sp.top_k, sp.top_p)
            token = int(torch.multinomial(probs, 1, generator=req.generator))
        if not math.isfinite(float(logp[token])):
            raise ValueError(f"non-finite log-probability for the sampled token (temperature {sp.temperature}): "
                             "the logits are not finite")
        req.out_ids.append(token)
        req.out_logprobs.append(float(logp[token]))
        self.stats.generated_tokens += 1
        if token in req.stop or (req.stop_when is not None and req.stop_when(req.out_ids)):
            req.finish = "stop"
        elif len(req.out_ids) >= sp.max_tokens or len(req.prompt_ids) + len(req.out_ids) >= self._max_context:
            req.finish = "length"


def _truncate(probs: Tensor, top_k: int, top_p: float) -> Tensor:
    """Zero the probabilities outside the top-k tokens and outside the top-p nucleus (unnormalised is fine for
    ``torch.multinomial``)."""
    if top_k > 0 and top_k < probs.numel():
        kth = torch.topk(probs, top_k).values[-1]
        probs = torch.where(probs >= kth, probs, 0.0)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cumulative = sorted_p.cumsum(0)
        drop = cumulative - sorted_p > top_p * cumulative[-1]
        probs = probs.clone()
        probs[order[drop]] = 0.0
    return probs
