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
        self.add_many([kv])

    def add_many(self, kvs: list[KV]) -> None:
        """Append sequences (each batch dim 1, no padding) at the end of the batch, in order, with one copy of the
        batch cache (adding them one by one would copy it once per sequence)."""
        if not kvs:
            return
        lengths = [kv[0][0].shape[-2] for kv in kvs]
        device = kvs[0][0][0].device
        masks = [torch.ones(1, n, dtype=torch.long, device=device) for n in lengths]
        old: KV = []
        if self.cache is not None and self.mask is not None:
            old, masks = cache_kv(self.cache), [self.mask, *masks]
        width = max(m.shape[1] for m in masks)
        merged = []
        for layer in range(self.num_layers):
            parts = ([old[layer]] if old else []) + [kv[layer] for kv in kvs]
            merged.append((torch.cat([_left_pad(k, width) for k, _ in parts], 0),
                           torch.cat([_left_pad(v, width) for _, v in parts], 0)))
        self.mask = torch.cat([_left_pad(m, width) for m in masks], 0)
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
class PrefillBatch:
    """Inputs of one batched prefill of several prompts, each continuing its own cached prefix (or none).

    Row i holds its ``cached[i]`` reused tokens right-aligned in the first ``C = max(cached)`` cache columns and
    its ``new[i]`` tokens to prefill right-aligned in the last ``N = max(new)`` columns; the mask hides the gaps,
    and position ids run from ``cached[i]`` as if the row were alone.
    """

    ids: Tensor  # (B, N) new tokens, left-padded with id 0
    positions: Tensor  # (B, N)
    mask: Tensor  # (B, C + N) 1 for real tokens
    cache: DynamicCache  # holds (B, heads, C, head_dim) before the forward, C + N after
    cached: list[int]
    new: list[int]

    def row_kv(self, row: int) -> KV:
        """Row ``row``'s prompt KV after the forward, without padding (batch dim 1, fresh tensors)."""
        cols = self.mask[row].nonzero().squeeze(1)
        return [(k[row : row + 1].index_select(2, cols), v[row : row + 1].index_select(2, cols))
                for k, v in cache_kv(self.cache)]


def prefill_batch(prompts: list[list[int]], prefixes: list[tuple[int, KV | None]], num_layers: int,
                  device: torch.device) -> PrefillBatch:
    """Assemble a `PrefillBatch` from prompts and their `PrefixStore.lookup` results."""
    cached = [c for c, _ in prefixes]
    new = [len(p) - c for p, c in zip(prompts, cached, strict=True)]
    B, C, N = len(prompts), max(cached), max(new)
    ids = torch.zeros(B, N, dtype=torch.long)
    positions = torch.zeros(B, N, dtype=torch.long)
    mask = torch.zeros(B, C + N, dtype=torch.long)
    for i, (prompt, c, n) in enumerate(zip(prompts, cached, new, strict=True)):
        ids[i, N - n:] = torch.tensor(prompt[c:], dtype=torch.long)
        positions[i, N - n:] = torch.arange(c, c + n)
        mask[i, C - c : C] = 1
        mask[i, C + N - n:] = 1
    kv: KV | None = None
    if C > 0:
        like = next(kv for c, kv in prefixes if c == C and kv is not None)
        kv = []
        for layer in range(num_layers):
            ks, vs = [], []
            for c, row in prefixes:
                if row is None or c == 0:
                    empty = like[layer][0][:, :, :0]
                    ks.append(_left_pad(empty, C))
                    vs.append(_left_pad(empty, C))
                else:
                    ks.append(_left_pad(row[layer][0], C))
                    vs.append(_left_pad(row[layer][1], C))
            kv.append((torch.cat(ks, 0), torch.cat(vs, 0)))
    cache = make_cache(num_layers, kv)
    return PrefillBatch(ids.to(device), positions.to(device), mask.to(device), cache, cached, new)


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """Number of leading ids ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def prefill_chunks(sizes: list[tuple[int, int]], budget: int) -> list[list[int]]:
    """Split rows of (cached, new) tokens, in order, into prefill batches of at most ``budget`` padded tokens
    (rows × (most cached + most new)); a row larger than the budget goes alone. Returns row indices."""
    chunks: list[list[int]] = []
    chunk: list[int] = []
    width_c = width_n = 0
    for i, (cached, new) in enumerate(sizes):
        c, n = max(width_c, cached), max(width_n, new)
        if chunk and (len(chunk) + 1) * (c + n) > budget:
            chunks.append(chunk)
            chunk, c, n = [], cached, new
        chunk.append(i)
        width_c, width_n = c, n
    return chunks + ([chunk] if chunk else [])


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


def retire_rows(batch: BatchKV, prefix: PrefixStore, store: list[tuple[int, str, list[int]]], keep: list[int]) -> None:
    """The KV side of retiring finished requests: store rows' KV for prefix reuse (``(row, key, ids)``), then keep
    only the ``keep`` rows of the batch."""
    with torch.inference_mode():
        for row, key, ids in store:
            prefix.put(key, ids, batch.extract(row))
        if len(keep) != batch.size:
            batch.keep(keep)
