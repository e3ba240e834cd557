"""A lean decode step for Llama-architecture models: the embedded engine's one-token-per-row forward, written out
(and, for a weight copy held packed, its prefill).

`LeanDecoder` runs a decode step's arithmetic on the model's own parameter tensors with a few torch calls a layer,
where transformers' modules add per-step work that a single new token does not need (a 4-D mask, the key/value
heads repeated for each query head, module and cache bookkeeping):

* the norms and rotary embedding computed as transformers computes them;
* new keys and values appended into the engine's `agentrl.engines.kvcache.GrowLayer` buffers, and one fused
  attention call a layer, the query heads that share a key/value head laid out as that head's positions (no
  ``repeat_kv`` copy);
* on the engine's own weight copy, q/k/v and gate/up each held as one matrix (`fuse_rows`, views that a push
  refreshes in place): two matrix products a layer instead of five;
* on a bf16 copy with ``pack``, every projection held in oneDNN's blocked layout and multiplied by
  ``torch.ops.mkldnn._linear_pointwise`` (bit-for-bit ``linear``'s result, without re-laying out the weight at
  every call). Packed layer by layer at each push, freeing the plain projections as it goes. Off unless the engine
  asks (``engine.pack_weights``): it did not pay in the main job.

`LeanDecoder.prefill` is the same arithmetic over T new tokens a row; the engine uses it only for a packed copy,
which has nothing left for transformers' modules to multiply. Equal to transformers' logits and cache to fp32
rounding (``tests/engines/test_lean.py``); the timings are in docs/benchmarks-log.md ("Roofline").
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from torch.nn.functional import linear, scaled_dot_product_attention, silu

from agentrl.engines.kvcache import GrowLayer

log = logging.getLogger(__name__)


def supports(backbone: Any, lm_head: Any) -> str | None:
    """None if `LeanDecoder` computes what ``backbone`` + ``lm_head`` compute; otherwise why not (then the engine
    decodes through transformers): a Llama-architecture model with default rotary embeddings, SiLU MLPs, no biases,
    plain ``nn.Linear`` projections (a peft adapter or a quantised layer is not), and no module hooks (FSDP2's
    all-gathers, a user's hooks) that a direct read of the weights would skip."""
    return next(_unsupported(backbone, lm_head), None)


def _unsupported(backbone: Any, lm_head: Any) -> Iterator[str]:
    config = getattr(backbone, "config", None)
    if getattr(config, "model_type", None) != "llama":
        yield f"model type {getattr(config, 'model_type', None)!r} (the lean step is written for 'llama')"
        return
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        yield f"rope_type {rope.get('rope_type')!r}"
    act, tp = getattr(config, "hidden_act", None), getattr(config, "pretraining_tp", 1)
    if act != "silu" or tp != 1:
        yield f"hidden_act {act!r}, pretraining_tp {tp}"
    if not hasattr(getattr(backbone, "rotary_emb", None), "inv_freq"):
        yield "no rotary_emb.inv_freq"
    linears = [lm_head]
    for layer in backbone.layers:
        att, mlp = layer.self_attn, layer.mlp
        linears += [att.q_proj, att.k_proj, att.v_proj, att.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    for module in linears:
        if type(module) is not torch.nn.Linear or module.bias is not None:
            kind = type(module)
            yield f"a {kind.__module__}.{kind.__qualname__} projection (plain nn.Linear without bias expected)"
    if type(backbone.embed_tokens) is not torch.nn.Embedding:
        yield f"embeddings are a {type(backbone.embed_tokens).__name__}"
    for name, module in [("backbone", backbone), ("lm_head", lm_head), *backbone.named_modules()]:
        if module._forward_hooks or module._forward_pre_hooks:
            yield f"module {name} has forward hooks"


class LeanDecoder:
    """Decode step over ``backbone`` (a transformers ``LlamaModel``) and ``lm_head`` — check `supports` first."""

    def __init__(self, backbone: Any, lm_head: Any, *, fuse: bool = False, pack: bool = False) -> None:
        config = backbone.config
        self.backbone = backbone
        self.lm_head = lm_head
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.eps = float(config.rms_norm_eps)
        self.scale = self.head_dim ** -0.5
        self.rope_scaling = float(getattr(backbone.rotary_emb, "attention_scaling", 1.0))
        self.fused: list[tuple[Tensor, Tensor]] = []  # per layer: (q|k|v, gate|up) weights, when fused
        # per layer (q|k|v, o, gate|up, down) and the LM head in oneDNN's layout, or None: plain `linear`
        self.packed: list[tuple[Tensor, ...]] | None = None
        self.packed_head: Tensor | None = None
        self.packed_bytes = 0  # what the blocked weights hold (their plain sizes)
        why = packs(lm_head.weight) if pack and fuse else "not a fused copy"
        if why is None:
            self._pack_and_drop(backbone, lm_head)
            return
        if pack:
            log.info("the lean decode step multiplies unpacked weights: %s", why)
        if fuse:
            for layer in backbone.layers:
                att, mlp = layer.self_attn, layer.mlp
                self.fused.append((fuse_rows([att.q_proj, att.k_proj, att.v_proj]),
                                   fuse_rows([mlp.gate_proj, mlp.up_proj])))

    def _pack_and_drop(self, backbone: Any, lm_head: Any) -> None:
        """Hold the copy's projections only in oneDNN's layout: layer by layer, pack (q|k|v, o, gate|up, down) and
        free the modules' plain weights (empty tensors until the next push refreshes them into new storage,
        `WeightCopy.refresh`), so the copy holds its projections once and building adds about two layers' worth. The LM
        head is packed too, unless it is also the embedding (tied, SmolLM2's case): the lookup needs the plain
        matrix, and a second, packed one would add its size (+54 MiB for SmolLM2, for 1.3 ms of a 16-row step),
        whereas as it is a packed copy holds exactly the bytes of an unpacked one. Transformers' modules cannot run
        on this copy any more: the engine prefills through `prefill`."""
        packed = []
        for layer in backbone.layers:
            att, mlp = layer.self_attn, layer.mlp
            projections = [att.q_proj, att.k_proj, att.v_proj, att.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
            if any(m.weight.numel() == 0 for m in projections):
                raise RuntimeError("the engine's weight copy has no plain projections to pack (freed by an earlier "
                                   "packing, or a push that failed part way): push the weights (update_weights)")
            with torch.no_grad():
                weights = (torch.cat([m.weight for m in projections[:3]]), att.o_proj.weight,
                           torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), mlp.down_proj.weight)
                packed.append(tuple(pack_weight(w) for w in weights))
            self.packed_bytes += sum(w.numel() * w.element_size() for w in weights)
            del weights
            _drop(projections)
        self.packed = packed
        if lm_head.weight is not backbone.embed_tokens.weight:
            self.packed_head = pack_weight(lm_head.weight)
            self.packed_bytes += lm_head.weight.numel() * lm_head.weight.element_size()
            _drop([lm_head])

    def _norm(self, x: Tensor, weight: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * xf.to(x.dtype)

    def _rope(self, position_ids: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin (N, 1, D) of the rotary embedding at ``position_ids`` (any shape, N positions)."""
        freqs = position_ids.reshape(-1, 1).float() * self.backbone.rotary_emb.inv_freq.float()[None]  # (N, D/2)
        emb = torch.cat((freqs, freqs), -1)
        cos = (emb.cos() * self.rope_scaling).to(dtype)[:, None, :]
        sin = (emb.sin() * self.rope_scaling).to(dtype)[:, None, :]
        return cos, sin

    def _rotate(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin

    # the four products of a layer on rows x (N, in): packed, fused or the modules' own weights

    def _qkv(self, i: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        nq, nk = self.heads * self.head_dim, self.kv_heads * self.head_dim
        if self.packed is not None:
            qkv = packed_linear(x, self.packed[i][0])
        elif self.fused:
            qkv = linear(x, self.fused[i][0])
        else:
            att = self.backbone.layers[i].self_attn
            return linear(x, att.q_proj.weight), linear(x, att.k_proj.weight), linear(x, att.v_proj.weight)
        return qkv[:, :nq], qkv[:, nq : nq + nk], qkv[:, nq + nk :]

    def _out(self, i: int, a: Tensor) -> Tensor:
        if self.packed is not None:
            return packed_linear(a, self.packed[i][1])
        return linear(a, self.backbone.layers[i].self_attn.o_proj.weight)

    def _mlp(self, i: int, x: Tensor) -> Tensor:
        if self.packed is not None:
            gate, up = packed_linear(x, self.packed[i][2]).chunk(2, -1)
        elif self.fused:
            gate, up = linear(x, self.fused[i][1]).chunk(2, -1)
        else:
            mlp = self.backbone.layers[i].mlp
            gate, up = linear(x, mlp.gate_proj.weight), linear(x, mlp.up_proj.weight)
        m = silu(gate) * up
        if self.packed is not None:
            return packed_linear(m, self.packed[i][3])
        return linear(m, self.backbone.layers[i].mlp.down_proj.weight)

    def _logits(self, h: Tensor) -> Tensor:
        x = self._norm(h, self.backbone.norm.weight)
        if self.packed_head is not None:
            return packed_linear(x, self.packed_head)
        return linear(x, self.lm_head.weight)

    @torch.no_grad()
    def step(self, input_ids: Tensor, position_ids: Tensor, mask: Tensor, cache: Any) -> Tensor:
        """Logits (B, V) of one new token per row.

        Args:
            input_ids: (B, 1) the tokens to feed.
            position_ids: (B, 1) their positions.
            mask: (B, S + 1) 1 for the real tokens of the cache and the new one, 0 for left padding.
            cache: The batch's DynamicCache of `GrowLayer`s holding S tokens; the new keys and values are appended.
        """
        bb = self.backbone
        B = input_ids.shape[0]
        h = bb.embed_tokens(input_ids[:, 0])  # (B, hidden)
        cos, sin = self._rope(position_ids, h.dtype)  # (B, 1, D)
        keep = (mask != 0)[:, None, None, :]  # (B, 1, 1, S + 1)
        g, nkv, D = self.heads // self.kv_heads, self.kv_heads, self.head_dim
        for i, (layer, kv) in enumerate(zip(bb.layers, cache.layers, strict=True)):
            q, k, v = self._qkv(i, self._norm(h, layer.input_layernorm.weight))
            q = self._rotate(q.view(B, self.heads, D), cos, sin)
            k = self._rotate(k.view(B, nkv, D), cos, sin)
            v = v.view(B, nkv, D)
            assert isinstance(kv, GrowLayer)
            keys, values = kv.update(k[:, :, None, :], v[:, :, None, :])  # (B, nkv, S + 1, D)
            # the g query heads sharing a key/value head attend as g query positions of that head (nothing causal
            # among them): one fused attention call, without repeating the keys and values g times
            a = scaled_dot_product_attention(q.view(B, nkv, g, D), keys, values, attn_mask=keep,
                                             scale=self.scale).reshape(B, self.heads * D)
            h = h + self._out(i, a)
            h = h + self._mlp(i, self._norm(h, layer.post_attention_layernorm.weight))
        return self._logits(h)

    @torch.no_grad()
    def prefill(self, input_ids: Tensor, position_ids: Tensor, mask: Tensor, cache: Any) -> Tensor:
        """Logits (B, V) of each row's last position after T new tokens a row (`kvcache.prefill_batch`'s layout:
        the cached columns and the new ones each left-padded, so that column order is token order).

        Args:
            input_ids: (B, T) the new tokens, left-padded.
            position_ids: (B, T) their positions.
            mask: (B, S + T) 1 for the real tokens of the cache and of the new ones, 0 for padding.
            cache: The batch's DynamicCache of `GrowLayer`s holding S tokens a row; the new keys and values are
                appended.
        """
        bb = self.backbone
        B, T = input_ids.shape
        S = mask.shape[1] - T
        h = bb.embed_tokens(input_ids).reshape(B * T, -1)  # (B·T, hidden)
        cos, sin = self._rope(position_ids, h.dtype)  # (B·T, 1, D)
        g, nkv, D = self.heads // self.kv_heads, self.kv_heads, self.head_dim
        keep = prefill_keep(mask, T)  # (B, T, S + T)
        for i, (layer, kv) in enumerate(zip(bb.layers, cache.layers, strict=True)):
            q, k, v = self._qkv(i, self._norm(h, layer.input_layernorm.weight))
            q = self._rotate(q.reshape(B * T, self.heads, D), cos, sin)
            q = q.view(B, T, nkv, g, D).permute(0, 2, 3, 1, 4)  # (B, nkv, g, T, D): head kv·g + gi
            k = self._rotate(k.reshape(B * T, nkv, D), cos, sin).view(B, T, nkv, D).transpose(1, 2)
            v = v.reshape(B, T, nkv, D).transpose(1, 2)
            assert isinstance(kv, GrowLayer)
            keys, values = kv.update(k, v)  # (B, nkv, S + T, D)
            a = q.new_empty(B, nkv, g, T, D)
            # the g query heads of a key/value head as g·n query rows (row gi·n + t), n new positions at a time:
            # the mask, repeated per gi, stays small for a long prompt (PREFILL_QUERIES positions a call)
            for t0 in range(0, T, PREFILL_QUERIES):
                t1 = min(T, t0 + PREFILL_QUERIES)
                n = t1 - t0
                a[:, :, :, t0:t1] = scaled_dot_product_attention(
                    q[:, :, :, t0:t1].reshape(B, nkv, g * n, D), keys[:, :, : S + t1], values[:, :, : S + t1],
                    attn_mask=keep[:, None, t0:t1, : S + t1].repeat(1, 1, g, 1), scale=self.scale,
                ).view(B, nkv, g, n, D)
            a = a.permute(0, 3, 1, 2, 4).reshape(B * T, self.heads * D)
            h = h + self._out(i, a)
            h = h + self._mlp(i, self._norm(h, layer.post_attention_layernorm.weight))
        return self._logits(h.view(B, T, -1)[:, -1])


PREFILL_QUERIES = 256
"""New positions a row per attention call in `LeanDecoder.prefill`: its mask (B, 1, g·n, S + n) is g times the
size a call with the heads apart would take, so a long prompt is attended in slices of this many positions."""


def prefill_keep(mask: Tensor, new: int) -> Tensor:
    """Which keys each of the ``new`` last positions attends to (B, new, S + new), from the (B, S + new) padding
    mask of `kvcache.prefill_batch` (column order is token order): the real tokens at or before it, and always
    itself — a padding position before any real token would otherwise have an empty row, which some attention
    kernels answer with NaN (torch's CPU kernel with zeros), and its keys and values stay in the cache."""
    S = mask.shape[1] - new
    cols, rows = torch.arange(S + new, device=mask.device), torch.arange(new, device=mask.device)
    keep = (mask != 0)[:, None, :] & (cols[None, :] <= S + rows[:, None])[None]
    keep[:, rows, S + rows] = True
    return keep


def packs(weight: Tensor) -> str | None:
    """None if weights like ``weight`` can be held in oneDNN's layout for the lean step (bf16 on a CPU whose
    oneDNN has bf16 kernels: the blocked product equals ``linear``'s bit for bit there); otherwise why not."""
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16:
        return f"{weight.dtype} on {weight.device.type} (packing is for bf16 on the CPU)"
    mkldnn = torch.ops.mkldnn
    if not (torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_linear_pointwise")
            and hasattr(mkldnn, "_reorder_linear_weight") and mkldnn._is_mkldnn_bf16_supported()):
        return "this torch's oneDNN has no bf16 linear kernels here"
    return None


def pack_weight(weight: Tensor) -> Tensor:
    """``weight`` (out, in) in oneDNN's blocked layout (an opaque tensor, a copy: later changes to ``weight`` do
    not reach it), for `packed_linear`."""
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 16)  # laid out for ~16-row products


def packed_linear(x: Tensor, packed: Tensor) -> Tensor:
    """``linear(x, weight)`` for ``packed = pack_weight(weight)``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def _drop(modules: list[Any]) -> None:
    """Free the modules' weights' storage (each becomes an empty tensor of its dtype; the Parameter objects stay)."""
    with torch.inference_mode(False), torch.no_grad():  # as `fuse_rows`: a later push refreshes these
        for module in modules:
            module.weight.data = module.weight.data.new_empty(0)


def fuse_rows(modules: list[Any]) -> Tensor:
    """One (Σ out, in) weight whose row blocks are the ``modules``' weights, in order, with each module's weight made
    a view of its block (same values, same Parameter objects; the separate tensors are freed): one matrix product
    instead of several, and a refresh of the modules' weights in place refreshes it. Returns the existing one when
    the weights already are such blocks (fused before, and refreshed in place since)."""
    weights = [m.weight for m in modules]
    first, cols = weights[0], weights[0].shape[1]
    rows = sum(w.shape[0] for w in weights)
    offsets = [first.storage_offset() + cols * sum(w.shape[0] for w in weights[:i]) for i in range(len(weights))]
    if all(w.is_contiguous() and w.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
           and w.storage_offset() == off for w, off in zip(weights, offsets, strict=True)):
        return first.as_strided((rows, cols), (cols, 1))
    # outside inference mode (the engine steps inside it): a push refreshes these views in place later
    with torch.inference_mode(False), torch.no_grad():
        fused = torch.empty(rows, cols, dtype=first.dtype, device=first.device)
        start = 0
        for module, weight in zip(modules, weights, strict=True):
            block = fused[start : start + weight.shape[0]]
            block.copy_(weight)
            module.weight.data = block
            start += weight.shape[0]
    return fused


class LeanSlot:
    """An engine's lean decoder for its current backbone: built (or found unsupported, once logged) on the first
    model step after construction or a weight push or release (`reset`: a strategy may wrap or shard the policy's
    modules after the engine is built; a released copy's fused or packed weights must not be held), or at a push
    for a copy. ``enabled`` False: always None (decode through transformers). ``pack``: hold a bf16 copy's
    projections in oneDNN's layout instead of the plain one (`LeanDecoder._pack_and_drop`)."""

    def __init__(self, enabled: bool = True, pack: bool = False) -> None:
        self.enabled = enabled
        self.pack = pack
        self._for: tuple[Any, LeanDecoder | None] | None = None

    def reset(self) -> None:
        self._for = None

    @property
    def nbytes(self) -> int:
        """Bytes of the current decoder's packed weights (0 when none)."""
        decoder = self._for[1] if self._for is not None else None
        return decoder.packed_bytes if decoder is not None else 0

    def get(self, backbone: Any, lm_head: Any, *, fuse: bool = False) -> LeanDecoder | None:
        """The decoder (None: decode through transformers). ``fuse``: the weights are the engine's own copy, whose
        projections may be laid out fused (`fuse_rows`); never the trainer's."""
        if not self.enabled:
            return None
        if self._for is None or self._for[0] is not backbone:
            why = supports(backbone, lm_head)
            if why is not None:
                log.info("the engine decodes through transformers: %s", why)
            self._for = (backbone, LeanDecoder(backbone, lm_head, fuse=fuse, pack=fuse and self.pack)
                         if why is None else None)
        return self._for[1]
