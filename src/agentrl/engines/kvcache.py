"""KV-cache pieces of the embedded engine: a growable cache layer, the padded batch cache, and a prefix store.

* `GrowLayer` — a transformers cache layer that writes new keys/values into a buffer with spare capacity
  instead of concatenating (``torch.cat`` copies the whole cache at every decoded token).
* `BatchKV` — the running decode batch: one left-padded KV cache for all active sequences, with ``add`` (merge a
  freshly prefilled sequence), ``keep`` (drop finished ones, trim shared padding) and ``extract`` (one
  sequence's KV, unpadded).
* `PrefixStore` — KV of finished prompts/turns keyed by their exact token ids (LRU, bounded in tokens). A new
  prompt that starts with stored ids reuses their KV and prefills only the rest: turn k+1 of an episode starts
  with turn k's prompt + response, GRPO group members share the task prompt, RTPO siblings share c_k.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

KV = list[tuple[Tensor, Tensor]]  # per layer: keys, values shaped (B, heads, S, head_dim)


class GrowLayer(DynamicLayer):
    """Dynamic cache layer that appends in place into a buffer grown geometrically."""

    def __init__(self) -> None:
        super().__init__()
        self._kbuf: Tensor | None = None
        self._vbuf: Tensor | None = None

    def set(self, keys: Tensor, values: Tensor) -> None:
        """Replace the contents (the next update copies them into a fresh buffer)."""
        self.lazy_initialization(keys, values)
        self.keys, self.values = keys, values
        self._kbuf = self._vbuf = None

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.set(key_states[:, :, :0], value_states[:, :, :0])
        keys, values = self.keys, self.values
        assert keys is not None and values is not None
        n_old = keys.shape[-2]
        n_new = n_old + key_states.shape[-2]
        buf = self._kbuf
        if buf is None or buf.shape[-2] < n_new or buf.shape[0] != key_states.shape[0]:
            cap = n_new + max(64, n_new // 2)
            shape = (*key_states.shape[:2], cap, key_states.shape[-1])
            kbuf = key_states.new_empty(shape)
            vbuf = value_states.new_empty(shape)
            kbuf[:, :, :n_old] = keys
            vbuf[:, :, :n_old] = values
            self._kbuf, self._vbuf = kbuf, vbuf
        assert self._kbuf is not None and self._vbuf is not None
        self._kbuf[:, :, n_old:n_new] = key_states
        self._vbuf[:, :, n_old:n_new] = value_states
        self.keys = self._kbuf[:, :, :n_new]
        self.values = self._vbuf[:, :, :n_new]
        return self.keys, self.values


def make_cache(num_layers: int, kv: KV | None = None) -> DynamicCache:
    """A DynamicCache made of `GrowLayer`s, optionally filled with ``kv``."""
    cache = DynamicCache()
    layers = [GrowLayer() for _ in range(num_layers)]
    if kv is not None:
        for layer, (k, v) in zip(layers, kv, strict=True):
            layer.set(k, v)
    cache.layers = layers  # type: ignore[assignment]
    cache.layer_class_to_replicate = None
    return cache


def cache_kv(cache: DynamicCache) -> KV:
    out: KV = []
    for layer in cache.layers:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        assert keys is not None and values is not None, "cache layer is empty"
        out.append((keys, values))
    return out


class BatchKV:
    """Left-padded KV cache of the active decode batch, with its attention mask."""

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self.cache: DynamicCache | None = None
        self.mask: Tensor | None = None  # (B, S) 1 for real tokens

    @property
    def size(self) -> int:
        return 0 if self.mask is None else int(self.mask.shape[0])

    def add(self, kv: KV) -> None:
        """Append one sequence (batch dim 1, no padding) at the end of the batch."""
        n = kv[0][0].shape[-2]
        new_mask = torch.ones(1, n, dtype=torch.long, device=kv[0][0].device)
        if self.cache is None or self.mask is None:
            self.cache = make_cache(self.num_layers, [(k.contiguous(), v.contiguous()) for k, v in kv])
            self.mask = new_mask
            return
        S = self.mask.shape[1]
        width = max(S, n)
        merged = []
        for (bk, bv), (k, v) in zip(cache_kv(self.cache), kv, strict=True):
            merged.append((torch.cat([_left_pad(bk, width), _left_pad(k, width)], 0),
                           torch.cat([_left_pad(bv, width), _left_pad(v, width)], 0)))
        self.mask = torch.cat([_left_pad(self.mask, width), _left_pad(new_mask, width)], 0)
        self.cache = make_cache(self.num_layers, merged)

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in that order) and trim padding columns no remaining row uses."""
        if self.cache is None or self.mask is None:
            return
        if not rows:
            self.cache, self.mask = None, None
            return
        index = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        start = int((mask.sum(0) == 0).long().cumprod(0).sum())  # leading all-padding columns
        kv = [(k.index_select(0, index)[:, :, start:], v.index_select(0, index)[:, :, start:])
              for k, v in cache_kv(self.cache)]
        self.mask = mask[:, start:]
        self.cache = make_cache(self.num_layers, kv)

    def extract(self, row: int) -> KV:
        """The unpadded KV of one row (cloned, batch dim 1)."""
        assert self.cache is not None and self.mask is not None
        pad = int((self.mask[row] == 0).sum())
        return [(k[row : row + 1, :, pad:].clone(), v[row : row + 1, :, pad:].clone()) for k, v in cache_kv(self.cache)]

    def step_mask(self) -> Tensor:
        """Attention mask for one more decoded token per row (and records it)."""
        assert self.mask is not None
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], 1)
        return self.mask


def _left_pad(x: Tensor, width: int) -> Tensor:
    """Left-pad the sequence dimension (−2 for KV, −1 for masks) with zeros up to ``width``."""
    dim = -1 if x.dim() == 2 else -2
    missing = width - x.shape[dim]
    if missing <= 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x.new_zeros(shape), x], dim)


@dataclass
class _Entry:
    ids: Tensor  # (S,) long
    kv: KV


class PrefixStore:
    """LRU store of KV caches keyed by exact token ids, bounded by the total number of cached tokens."""

    def __init__(self, max_tokens: int, min_match: int = 8) -> None:
        self.max_tokens = max_tokens
        self.min_match = min_match
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        return self._tokens

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0

    def put(self, key: str, ids: list[int], kv: KV) -> None:
        if self.max_tokens <= 0 or not ids:
            return
        self._drop(key)
        self._entries[key] = _Entry(torch.tensor(ids, dtype=torch.long), kv)
        self._tokens += len(ids)
        while self._tokens > self.max_tokens and self._entries:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._tokens -= int(entry.ids.numel())

    def lookup(self, prompt_ids: list[int]) -> tuple[int, KV | None]:
        """Longest stored exact prefix of ``prompt_ids`` (at most len − 1 tokens: the last one is always fed).

        Returns the number of reusable tokens and their KV (views; never mutated by the caller).
        """
        limit = len(prompt_ids) - 1
        if limit < self.min_match or not self._entries:
            return 0, None
        prompt = torch.tensor(prompt_ids, dtype=torch.long)
        best_key, best_len = None, 0
        for key, entry in self._entries.items():
            m = min(limit, int(entry.ids.numel()))
            if m <= best_len:
                continue
            diff = (entry.ids[:m] != prompt[:m]).nonzero()
            common = m if diff.numel() == 0 else int(diff[0])
            if common > best_len:
                best_key, best_len = key, common
        if best_key is None or best_len < self.min_match:
            return 0, None
        self._entries.move_to_end(best_key)
        kv = self._entries[best_key].kv
        return best_len, [(k[:, :, :best_len], v[:, :, :best_len]) for k, v in kv]
