"""`WeightSync`: how `agentrl.engines.hf.HFEngine` takes new weights and gives memory back — pushes (a version bump
for shared weights, an in-place refresh of a copy, the lean decoder rebuilt with it), the copy's release for the
trainer's update, and the prefix KV that any change of weights makes stale. Kept apart from the scheduler in
``hf.py``: these run between collections (or, for a copy, between two model steps), never inside one."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

from agentrl.engines.hf_requests import EngineStats, Request
from agentrl.engines.kvcache import PrefixStore
from agentrl.engines.lean import LeanSlot
from agentrl.engines.weights import EngineWeights, WeightCopy
from agentrl.engines.worker import ModelWorker


class WeightSync:
    """Mixin of `HFEngine`: its weight versions and what they invalidate (the attributes are the engine's)."""

    policy: Any
    weights: EngineWeights
    stats: EngineStats
    _version: int
    _prefix: PrefixStore
    _lean: LeanSlot
    _packed_released = 0  # the packed bytes the last release freed
    _model_lock: asyncio.Lock
    _worker: ModelWorker
    _waiting: deque[Request]
    _active: list[Request]
    _admitting: list[Request]

    async def update_weights(self, policy: Any = None, *, version: int | None = None) -> None:
        """Serve the policy's current weights as a new version: shared weights need nothing more, a copy is
        refreshed in place (``stats.push_seconds``); cached KV of the old weights is dropped.

        Shared weights: only with no request in flight (the trainer changes them itself, between collections). A
        copy may be refreshed while requests are in flight (bounded-staleness collection): the refresh waits for the
        model step that is running (prefill or decode), no step starts while it copies, and the requests go on
        with the new weights (partial rollouts: their KV so far came from the old ones). A completion carries the
        *oldest* version that sampled any of its tokens (`Request.version`), the one a staleness bound must use;
        its log-probs are the probabilities its tokens were actually sampled with, the behaviour policy that the
        trainer's importance weights correct."""
        if policy is not None and policy is not self.policy:
            raise ValueError("HFEngine serves the policy it was built on; update_weights got a different policy")
        if not self.weights.holds_copy and (self._active or self._admitting):
            raise RuntimeError("update_weights while requests are being decoded: collect, then update")
        async with self._model_lock:
            self.stats.push_seconds += await self._worker.call(self._push)
            self.stats.pushes += 1
            self._version = self._version + 1 if version is None else int(version)
            self._prefix.clear()

    def _push(self) -> float:
        """Refresh the weights from the policy (on the model's thread); a copy's lean decoder — its fused and packed
        weights — is rebuilt now, so that its cost is the push's. Returns the seconds spent."""
        start = time.perf_counter()
        self._lean.reset()  # first: its packed weights are freed before the refresh allocates new ones
        self.weights.refresh(self.policy)
        if self.weights.holds_copy:
            self._lean.get(self.weights.backbone, self.weights.lm_head, fuse=True)
        return time.perf_counter() - start

    async def release_weights(self) -> int:
        """Free the weight copy's storage until the next `update_weights` (the trainer's update, the run's memory
        peak, needs none of it): returns the bytes freed, 0 when the engine shares the policy's weights or has a
        request waiting or in flight. A request admitted before the next push fails with a clear error."""
        if not isinstance(self.weights, WeightCopy):
            return 0
        async with self._model_lock:  # checked under the lock: nothing is admitted while it is held
            if self._waiting or self._active or self._admitting:
                return 0
            self._prefix.clear()
            if not self.weights.released:  # a second release (no push between) reports the first one's figure
                self._packed_released = self._lean.nbytes
            self._lean.reset()  # its fused weights would keep the copy's storage, its packed ones are their own
            return self.weights.release() + self._packed_released

    @property
    def weights_bytes(self) -> int:
        """Bytes of weights the engine holds itself (a copy and its packed projections; 0 when it shares the
        policy's)."""
        return self.weights.nbytes + self._lean.nbytes

    def drop_prefix_cache(self) -> None:
        """Forget the stored prefixes and their KV. The trainer calls it before it changes the shared weights
        (which makes them stale; `update_weights` drops them too), so that the update does not hold them."""
        self._prefix.clear()

