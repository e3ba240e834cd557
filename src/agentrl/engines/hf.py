"""`HFEngine`: the embedded rollout engine, in process, on the policy's parameters or its own copy of them.

* **Weight sync is a version bump, or a copy.** With ``weights="shared"`` the engine runs the very modules the
  trainer updates, and `update_weights` only bumps the version; with ``weights="copy"`` it decodes with its own
  copy in ``decode_dtype`` (bf16 where the CPU has native bf16 matmuls), refreshed in place
  (`agentrl.engines.weights`). Either way the prefix cache is dropped: its KV was computed with the old weights.
* **Continuous batching.** Concurrent `generate` calls from many episodes join one decode batch; a request is
  admitted as soon as a slot is free (``max_batch_size``) and leaves as soon as it stops.
* **Prefix KV reuse.** A prompt that starts with the exact token ids of a stored prompt or finished turn reuses
  their KV and prefills only the new tokens (`agentrl.engines.kvcache.PrefixStore`), so a multi-turn episode's
  conversation is not re-read at every turn. Requests admitted together are prefilled in one forward.
* **Per-request seeded sampling, batched** (`agentrl.engines.sampling`): a request's tokens do not depend on which
  other requests share its batch.
* **A lean decode step** for Llama-architecture models (`agentrl.engines.lean`); other models, and the prefills of
  an unpacked model, go through transformers.
* **A request fails or leaves alone.** An error while prefilling or sampling one request fails that request only;
  only an error in the batched forward, which no request owns, fails every request in flight. A cancelled
  ``generate`` (the HTTP server cancels when the client disconnects) is dropped before the next step, freeing its
  KV rows (``stats.cancelled``).

Model steps run where `agentrl.engines.worker` puts them, never on the event loop's thread, so tool calls and env
steps go on meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from agentrl.engines.base import Completion, SamplingParams
from agentrl.engines.hf_requests import EngineStats, Lookup, Request
from agentrl.engines.hf_sync import WeightSync
from agentrl.engines.kvcache import BatchKV, PrefixStore, common_prefix_len, prefill_batch, prefill_chunks, retire_rows
from agentrl.engines.lean import LeanSlot
from agentrl.engines.sampling import RowSampling, sample_rows
from agentrl.engines.weights import DecodeDType, WeightsMode, engine_weights
from agentrl.engines.worker import ModelWorker
from agentrl.models.policy import Policy

log = logging.getLogger(__name__)
_WAIT_FOR_SHARED = 32  # a request sharing this many more tokens with an earlier admitted prompt than the store
                       # offers waits one wave to reuse that prompt's KV (a wave costs one more weight read)


class HFEngine(WeightSync):
    """In-process engine over a `Policy`.

    Args:
        policy: The policy whose weights generate (its modules, or a copy of them: ``weights``).
        max_batch_size: Most sequences decoded together.
        prefix_cache_tokens: Token budget of the prefix KV store (0 disables prefix reuse).
        max_context: Context window; defaults to the model's ``max_position_embeddings``.
        prefill_batch_tokens: Most padded tokens (rows × longest row) prefilled in one forward pass.
        seed: Seed of the generator used by requests without their own seed.
        step_context: Context manager factory entered around every model step, in the worker thread (``agentrl
            serve`` uses it to serialise two engines over one peft model and to switch the adapter off for
            base-model requests).
        autocast: Decode under the policy's compute dtype (its autocast). False (the default, as in
            `agentrl.engines.specs.HFEngineSpec`) decodes in the weights' dtype: bf16 autocast over fp32 weights decodes
            no faster than fp32 on a CPU (docs/benchmarks-log.md, "fp32 vs the default on the main job"), while bf16
            weights decode in bf16 either way.
        lean_decode: Decode steps (and a packed copy's prefills) through `agentrl.engines.lean.LeanDecoder` where it
            supports the model.
        pack_weights: With ``lean_decode`` and a bf16 weight copy: hold the copy's projections in oneDNN's blocked
            layout instead of the plain one (`agentrl.engines.lean.packs`; repacked at each push). See
            `agentrl.engines.specs.HFEngineSpec`.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        max_batch_size: int = 32,
        prefix_cache_tokens: int = 32768,
        max_context: int | None = None,
        prefill_batch_tokens: int = 4096,
        seed: int = 0,
        step_context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
        autocast: bool = False,
        weights: WeightsMode = "shared",
        decode_dtype: DecodeDType = "auto",
        lean_decode: bool = True,
        pack_weights: bool = False,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if prefill_batch_tokens < 1:
            raise ValueError(f"prefill_batch_tokens must be >= 1, got {prefill_batch_tokens}")
        if weights == "copy" and autocast:
            raise ValueError("autocast applies to shared weights only: a weight copy decodes in its own dtype")
        self._prefill_batch_tokens = prefill_batch_tokens
        self.policy = policy
        self.weights = engine_weights(policy, weights, decode_dtype)
        self.max_batch_size = max_batch_size
        self._max_context = int(max_context or policy.max_context)
        self._version = 0
        self._num_layers = int(policy.backbone.config.num_hidden_layers)
        self._prefix = PrefixStore(prefix_cache_tokens)
        self._rng = torch.Generator().manual_seed(seed)
        self._autocast = autocast
        self._lean = LeanSlot(lean_decode, pack=pack_weights)
        self._waiting: deque[Request] = deque()
        self._active: list[Request] = []
        self._admitting: list[Request] = []
        self._batch = BatchKV(self._num_layers)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None
        self._model_lock = asyncio.Lock()  # held around every model step and weight refresh (remade per loop)
        self._worker = ModelWorker(step_context)
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

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session: str | None = None,
        stop_when: Callable[[list[int]], bool] | None = None, top_logprobs: int = 0,
    ) -> Completion:
        """See `RolloutEngine.generate`. Beyond the protocol: ``stop_when`` is called with the generated ids
        after each sampled token, in the worker thread; True ends the completion with ``finish_reason="stop"``
        (the HTTP server's stop strings). ``top_logprobs`` > 0 also returns, per generated token, that many most
        likely tokens with their log-probs, read from the logits the token was sampled from."""
        self._ensure_scheduler()
        assert self._loop is not None and self._wakeup is not None
        # on the device the logits are on: a CPU generator cannot draw into a CUDA tensor (found on an H200: every
        # episode failed). A seed gives the same tokens run after run on one device, not across device types.
        generator = torch.Generator(device=self._device)
        if sampling.seed is None:
            generator.manual_seed(int(torch.randint(0, 2**62, (1,), generator=self._rng)))
        else:
            generator.manual_seed(int(sampling.seed))
        stop = frozenset(sampling.stop_token_ids if sampling.stop_token_ids is not None
                         else self.policy.stop_token_ids)
        req = Request(list(prompt_ids), sampling, session, self._loop.create_future(), generator, stop, stop_when,
                       max(int(top_logprobs), 0))
        self.stats.requests += 1
        if len(req.prompt_ids) == 0:
            raise ValueError("generate: prompt_ids is empty")
        if len(req.prompt_ids) >= self._max_context:
            return req.completion("length", self._version)
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
                req.future.set_result(req.completion("abort", self._version))
        self._waiting.clear()
        self._active.clear()
        self._admitting = []
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
            self._model_lock = asyncio.Lock()
            self._active, self._batch = [], BatchKV(self._num_layers)
            self._task = loop.create_task(self._run(), name="hf-engine-scheduler")

    async def _run(self) -> None:
        assert self._wakeup is not None
        while True:
            if not self._waiting and not self._active:
                self._wakeup.clear()
                await self._wakeup.wait()
            self._drop_cancelled_waiting()
            admitted: list[Request] = []
            while self._waiting and len(self._active) + len(admitted) < self.max_batch_size:
                admitted.append(self._waiting.popleft())
            self._admitting = admitted  # being prefilled: in flight, though not yet in the decode batch
            try:
                if admitted:
                    async with self._model_lock:  # a weight refresh waits for the step, and the step for it
                        for req in admitted:
                            req.version = self._version  # the weights its first token is sampled with
                        prefilled = await self._worker.run(self.weights.model, self.stats, True, self._prefill,
                                                           admitted)
                    self._active.extend(prefilled)
                    self._admitting = []
                    for req in admitted:
                        if req.error is not None:
                            self._fail(req)
                    await self._retire()
                if self._active:
                    async with self._model_lock:
                        await self._worker.run(self.weights.model, self.stats, False, self._decode_step)
                    await self._retire()
            except Exception as exc:  # a model error fails the requests in flight, not the scheduler
                log.exception("HFEngine step failed")
                for req in admitted + self._active:
                    if not req.future.done():
                        req.future.set_exception(exc)
                self._active, self._admitting, self._batch = [], [], BatchKV(self._num_layers)

    def _drop_cancelled_waiting(self) -> None:
        """Forget queued requests whose caller gave up (they hold no KV yet)."""
        if any(r.future.done() for r in self._waiting):
            self.stats.cancelled += sum(r.future.cancelled() for r in self._waiting)
            self._waiting = deque(r for r in self._waiting if not r.future.done())

    def _fail(self, req: Request) -> None:
        """Fail one request with its own error (on the event loop)."""
        assert req.error is not None
        self.stats.failed += 1
        log.warning("HFEngine request failed alone: %s: %s", type(req.error).__name__, req.error)
        if not req.future.done():
            req.future.set_exception(req.error)

    async def _retire(self) -> None:
        """Complete finished requests (storing their KV for prefix reuse), fail failed ones, drop cancelled ones,
        and shrink the batch to the rest (the KV work where model steps run, under the model lock: a push's
        clearing of the prefix store cannot come between)."""
        active, keep, done, store = self._active, [], [], []
        for row, req in enumerate(active):
            if not req.gone:
                keep.append(row)
            elif req.future.done():  # cancelled by its caller (or aborted by shutdown): no KV worth keeping
                self.stats.cancelled += req.future.cancelled()
            elif req.error is not None:
                self._fail(req)
            else:
                done.append(req)
                if req.session is not None:
                    store.append((row, req.session, (req.prompt_ids + req.out_ids)[:-1]))
        if store or len(keep) != len(active):
            async with self._model_lock:
                await self._worker.call(retire_rows, self._batch, self._prefix, store, keep)
            self._active = [active[i] for i in keep]
        for req in done:
            assert req.finish is not None
            req.future.set_result(req.completion(req.finish, self._version))

    # ------------------------------------------------------------------ model work (`agentrl.engines.worker`)

    @property
    def _device(self) -> torch.device:
        return next(self.weights.model.parameters()).device  # read each time: Lightning may move the model

    def _forward(self, input_ids: Tensor, mask: Tensor, position_ids: Tensor, cache: Any) -> Tensor:
        """Logits (B, V) of the last position (a decode step, one token a row, through the lean decoder where it
        supports the model; a prefill through it where the copy is held packed)."""
        weights = self.weights
        if weights.released:
            raise RuntimeError("the engine's weight copy was released for the trainer's update: push the weights "
                               "(update_weights) before generating")
        # the lean decoder: every decode step it supports, and the prefills of a copy held packed (it has no plain
        # projections left for transformers' modules; every other prefill goes through those)
        one = input_ids.shape[1] == 1
        lean = self._lean.get(weights.backbone, weights.lm_head, fuse=weights.holds_copy) \
            if one or weights.holds_copy else None
        with self.policy.autocast() if self._autocast else contextlib.nullcontext():
            if lean is not None and (one or lean.packed is not None):
                step = lean.step if one else lean.prefill
                return step(input_ids, position_ids, mask, cache).float()
            out = weights.backbone(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                                   cache=cache, use_cache=True)
            logits = weights.lm_head(out.last_hidden_state[:, -1])
        return logits.float()

    def _prefill(self, requests: list[Request]) -> list[Request]:
        """Prefill newly admitted requests, several per forward pass (up to ``prefill_batch_tokens`` padded
        tokens), reusing stored prefixes; sample their first tokens and add them to the decode batch.

        A request that shares a long prefix with an earlier one of the same admission (GRPO group members, RTPO
        siblings) waits for a second wave, in which it reuses that request's freshly stored prompt KV instead of
        recomputing it. Returns the requests added to the batch, in row order; one that fails is marked
        (``error``) and gets no row.
        """
        first, later = self._split_shared(requests)
        added: list[Request] = []
        sizes = [(item.cached, len(item.req.prompt_ids) - item.cached) for item in first]
        for rows in prefill_chunks(sizes, self._prefill_batch_tokens):
            added += self._prefill_chunk([first[i] for i in rows])
        return added + (self._prefill(later) if later else [])

    def _split_shared(self, requests: list[Request]) -> tuple[list[Lookup], list[Request]]:
        first: list[Lookup] = []
        later: list[Request] = []
        for req in requests:
            cached, kv = self._prefix.lookup(req.prompt_ids)
            shared = max((common_prefix_len(req.prompt_ids, o.req.prompt_ids) for o in first
                          if o.req.session is not None), default=0)
            if self._prefix.max_tokens > 0 and min(shared, len(req.prompt_ids) - 1) >= cached + _WAIT_FOR_SHARED:
                later.append(req)
            else:
                first.append(Lookup(req, cached, kv))
        return first, later

    def _prefill_chunk(self, chunk: list[Lookup]) -> list[Request]:
        """One batched prefill; if the forward fails, each request is retried alone so the one at fault fails
        alone."""
        try:
            return self._prefill_batch(chunk)
        except Exception as exc:
            if len(chunk) == 1:
                chunk[0].req.error = exc
                return []
        added: list[Request] = []
        for item in chunk:
            try:
                added += self._prefill_batch([item])
            except Exception as exc:
                item.req.error = exc
        return added

    def _prefill_batch(self, chunk: list[Lookup]) -> list[Request]:
        reqs = [item.req for item in chunk]
        batch = prefill_batch([r.prompt_ids for r in reqs], [(item.cached, item.kv) for item in chunk],
                              self._num_layers, self._device)
        logits = self._forward(batch.ids, batch.mask, batch.positions, batch.cache)
        self.stats.prefill_forwards += 1
        row_kvs = [batch.row_kv(i) for i in range(len(reqs))]  # fresh tensors: the store may keep them as is
        for req, kv, cached, new in zip(reqs, row_kvs, batch.cached, batch.new, strict=True):
            req.cached = cached
            self.stats.prefill_tokens += new
            self.stats.cached_tokens += cached
            if req.session is not None:
                self._prefix.put(f"{req.session}/prompt", req.prompt_ids, kv)
        self._sample(reqs, logits, skip_cancelled=False)
        added = [i for i, req in enumerate(reqs) if req.error is None]
        self._batch.add_many([row_kvs[i] for i in added])  # last: a request that failed above has no row
        return [reqs[i] for i in added]

    def _decode_step(self) -> None:
        assert self._batch.mask is not None
        tokens = torch.tensor([[r.out_ids[-1]] for r in self._active], device=self._device)
        positions = torch.tensor([[len(r.prompt_ids) + len(r.out_ids) - 1] for r in self._active],
                                 device=self._device)
        mask = self._batch.step_mask()
        logits = self._forward(tokens, mask, positions, self._batch.cache)
        self.stats.decode_steps += 1
        self._sample(self._active, logits, skip_cancelled=True)

    def _sample(self, reqs: list[Request], logits: Tensor, *, skip_cancelled: bool) -> None:
        """Sample one token per request (rows of ``logits``), all rows at once, each from its own generator; an
        error of one request's own (its distribution, its stop callback) fails it alone."""
        rows = [i for i, r in enumerate(reqs) if not (skip_cancelled and r.future.done())]  # cancelled: retired
        if not rows:
            return
        specs = [RowSampling(reqs[i].sampling.temperature, reqs[i].sampling.top_k, reqs[i].sampling.top_p,
                             reqs[i].generator, reqs[i].top_logprobs) for i in rows]
        out = sample_rows(logits if len(rows) == len(reqs) else logits[rows], specs)
        for j, i in enumerate(rows):
            req = reqs[i]
            error = out.errors[j]
            if error is None:
                try:
                    if req.top_logprobs:
                        req.out_top.append(out.top[j])
                    self._record(req, out.tokens[j], out.logprobs[j])
                except Exception as exc:  # e.g. the stop callback
                    error = exc
            req.error = error

    def _record(self, req: Request, token: int, logprob: float) -> None:
        """Append a sampled token and its log-prob; set the finish reason if it ends the completion."""
        sp = req.sampling
        req.out_ids.append(token)
        req.out_logprobs.append(logprob)
        self.stats.generated_tokens += 1
        if token in req.stop or (req.stop_when is not None and req.stop_when(req.out_ids)):
            req.finish = "stop"
        elif len(req.out_ids) >= sp.max_tokens or len(req.prompt_ids) + len(req.out_ids) >= self._max_context:
            req.finish = "length"
