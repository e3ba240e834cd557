"""Shared-prefix rows: several sequences that start with the same tokens, forwarded as one row.

RTPO's siblings at a depth and the trunk's own turn there have the same context token for token (the replay is
exact), and a GRPO group's episodes start with the same prompt. Scored as separate rows, that context is read once
per sample. A *shared-prefix row* (`agentrl.training.update.batching.share_prefixes`) holds the context once followed by
each sample's own tokens, one *branch* after another::

    tokens   p0 p1 p2 p3 | a0 a1 | b0 b1 b2
    branch    0  0  0  0 |  1  1 |  2  2  2

and the forward pass makes each branch see only the prefix and itself:

* **attention**: token i sees token j iff j ≤ i, j is a real token and j is in the prefix (branch 0) or in i's own
  branch — a 4D mask handed to the model instead of the 2D padding mask;
* **positions**: a branch continues the prefix's positions (a0 is at position 4, and so is b0), so every token has
  the position it has in its own sequence;
* **predecessor**: token t is scored from the hidden state of the token before it *in its own sequence*: a
  branch's first token from the prefix's last token (b0 from p3, not from a1), every other token from t − 1.

Each token then has exactly the context it has in its own row, so log-probs, entropies and values equal the
separate rows' up to floating-point summation order (a test checks it). A batch without shared-prefix rows has
``branch`` None (`agentrl.training.update.batching.collate`) and takes the ordinary path: the model's own causal
mask and ``t − 1``. (Whether a batch has branches is decided by None, never by reading the tensor: no device sync.)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

SUPPORTED_ATTENTION = ("sdpa", "eager")
"""Attention implementations that take a custom 4D mask as it is (`transformers.masking_utils`)."""


def has_branches(branch: Tensor | None) -> bool:
    return branch is not None


def _mask_for(branch: Tensor | None, attention_mask: Tensor | None, like: Tensor) -> Tensor:
    """The padding mask scoring reads: required with shared-prefix rows, all ones otherwise (it is unused there)."""
    if attention_mask is not None:
        return attention_mask
    if has_branches(branch):
        raise ValueError("shared-prefix rows (branch) are scored with their attention_mask")
    return torch.ones(like.shape[:2], dtype=torch.long, device=like.device)


def visibility(attention_mask: Tensor, branch: Tensor) -> Tensor:
    """(N, L, L) bool: ``[n, i, j]`` is True iff token i of row n attends to token j (see the module docstring).
    A padding token sees the real prefix tokens before it, so no query row is empty."""
    length = attention_mask.shape[1]
    real = attention_mask.bool()
    causal = torch.ones(length, length, dtype=torch.bool, device=branch.device).tril()
    same = (branch[:, :, None] == branch[:, None, :]) | (branch[:, None, :] == 0)
    return causal[None] & same & real[:, None, :]


def position_ids(attention_mask: Tensor, branch: Tensor | None) -> Tensor:
    """(N, L) position of each token in its own sequence: the tokens it sees, minus one (padding-safe)."""
    if not has_branches(branch):
        return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    assert branch is not None
    return (visibility(attention_mask, branch).sum(-1) - 1).clamp(min=0)


def predecessors(attention_mask: Tensor, branch: Tensor) -> Tensor:
    """(N, L) long: the position whose hidden state scores token t — the last token before t that t sees
    (t − 1 outside branches; the prefix's last token for a branch's first token); −1 at position 0."""
    seen = visibility(attention_mask, branch)
    length = seen.shape[-1]
    idx = torch.arange(length, device=branch.device)
    before = seen & (idx[None, :] < idx[:, None])[None]
    return torch.where(before, idx, -1).amax(-1)


def model_mask(model: Any, attention_mask: Tensor, branch: Tensor | None) -> Tensor:
    """What the model takes as ``attention_mask``: the 2D padding mask, or for shared-prefix rows the 4D
    ``(N, 1, L, L)`` visibility mask in the form the model's attention implementation expects (bool for SDPA,
    additive float for eager)."""
    if not has_branches(branch):
        return attention_mask
    assert branch is not None
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None) or "eager"
    if impl not in SUPPORTED_ATTENTION:
        raise ValueError(f"shared-prefix rows need attention that takes a 4D mask ({', '.join(SUPPORTED_ATTENTION)});"
                         f" the model uses {impl!r}: set model.share_prefixes: false")
    seen = visibility(attention_mask, branch)[:, None]
    if impl == "sdpa":
        return seen
    return torch.zeros(seen.shape, dtype=torch.float32, device=seen.device).masked_fill(
        ~seen, torch.finfo(torch.float32).min)


def scoring_states(hidden: Tensor, positions: Tensor, attention_mask: Tensor | None,
                   branch: Tensor | None) -> Tensor:
    """(M, H): the hidden state that scores each True position of ``positions`` (N, L), in row-major order."""
    attention_mask = _mask_for(branch, attention_mask, positions)
    if not has_branches(branch):
        pred = torch.zeros_like(positions)
        pred[:, :-1] = positions[:, 1:]
        return hidden[pred]
    assert branch is not None
    rows, cols = positions.nonzero(as_tuple=True)
    return hidden[rows, predecessors(attention_mask, branch)[rows, cols]]


def shift_to_tokens(per_state: Tensor, attention_mask: Tensor | None, branch: Tensor | None) -> Tensor:
    """(N, L) values aligned to tokens: ``out[:, t]`` is ``per_state`` at t's predecessor (0 at position 0)."""
    attention_mask = _mask_for(branch, attention_mask, per_state)
    out = torch.zeros_like(per_state)
    if not has_branches(branch):
        out[:, 1:] = per_state[:, :-1]
        return out
    assert branch is not None
    prev = predecessors(attention_mask, branch)
    scored = prev >= 0
    out[scored] = per_state.gather(1, prev.clamp(min=0))[scored]
    return out
