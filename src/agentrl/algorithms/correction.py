"""Behaviour-policy correction: importance weights for tokens sampled by an engine that is not the trainer.

The engine that sampled a turn (vLLM's bf16 kernels, ``agentrl serve``, an autocast engine) computes a slightly
different distribution π_b than the trainer's π_old over the same weights. With π_old recomputed by the trainer,
PPO's ratio π_θ / π_old starts at exactly 1, and the remaining gap π_old / π_b is corrected per token by one of:

* `truncated_is` (TIS): ``w_t = min(π_old(a_t) / π_b(a_t), C)`` — the truncated importance weight of Yao et al.,
  "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training" (2025);
* `masked_is` (token MIS): ``w_t = 1`` if ``1/C ≤ π_old/π_b ≤ C`` else 0 — tokens the engine sampled from a
  clearly different distribution get no gradient;
* `turn_masked_is` (turn MIS): the same test on the turn's geometric-mean ratio
  ``exp(mean_t log(π_old/π_b))``; a turn outside ``[1/C, C]`` loses all its tokens.

The weights multiply the per-token PPO loss (``ℓ_t ← w_t ℓ_t``); they are constants (no gradient). Boundaries are
inclusive: a ratio of exactly C is kept (MIS) and not counted as truncated (TIS). Comparisons are made in log space
(``log r ≤ log C``). `mismatch_kl` is the k3 estimate of KL(π_b ‖ π_old) over the sampled tokens.

All (N, L) tensors follow `agentrl.types.TurnBatch`'s alignment; ``turn_ids`` None means each row is one turn.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from agentrl.algorithms.advantages import masked_mean
from agentrl.algorithms.losses import kl_k3, turn_log_ratio


class ISWeights(NamedTuple):
    """Per-token correction weights (ones outside the mask) and which masked tokens the correction changed
    (truncated or masked)."""

    weights: Tensor
    corrected: Tensor


CorrectionFn = Callable[[Tensor, Tensor, "Tensor | None", float], ISWeights]
"""``(log_ratio, mask, turn_ids, cap) -> ISWeights`` with ``log_ratio = log π_old − log π_b``."""


def _check_cap(cap: float) -> float:
    if not (cap >= 1.0 and math.isfinite(cap)):
        raise ValueError(f"the correction cap C must be a finite number >= 1, got {cap}")
    return math.log(cap)


def truncated_is(log_ratio: Tensor, mask: Tensor, turn_ids: Tensor | None = None, cap: float = 2.0) -> ISWeights:
    """TIS: ``w_t = min(exp(log_ratio_t), C)`` at masked tokens; ``corrected`` marks ``log_ratio_t > log C``."""
    del turn_ids
    log_c = torch.tensor(_check_cap(cap), dtype=log_ratio.dtype, device=log_ratio.device)
    over = (log_ratio > log_c) & mask
    w = torch.exp(torch.minimum(log_ratio, log_c))
    return ISWeights(torch.where(mask, w, torch.ones_like(w)), over)


def _keep(log_ratio: Tensor, cap: float) -> Tensor:
    log_c = torch.tensor(_check_cap(cap), dtype=log_ratio.dtype, device=log_ratio.device)
    return (log_ratio <= log_c) & (log_ratio >= -log_c)


def masked_is(log_ratio: Tensor, mask: Tensor, turn_ids: Tensor | None = None, cap: float = 2.0) -> ISWeights:
    """Token MIS: ``w_t = 1`` where ``|log_ratio_t| ≤ log C``, else 0 (masked tokens only)."""
    del turn_ids
    keep = _keep(log_ratio, cap)
    w = torch.where(mask & ~keep, torch.zeros_like(log_ratio), torch.ones_like(log_ratio))
    return ISWeights(w, mask & ~keep)


def turn_masked_is(log_ratio: Tensor, mask: Tensor, turn_ids: Tensor | None = None,
                   cap: float = 2.0) -> ISWeights:
    """Turn MIS: every token of a turn gets 0 when the turn's mean log-ratio leaves ``[−log C, log C]``."""
    zeros = torch.zeros_like(log_ratio)
    per_turn = turn_log_ratio(log_ratio, zeros, mask, turn_ids)  # the turn's mean log-ratio at each of its tokens
    return masked_is(per_turn, mask, None, cap)


def mismatch_kl(old_logprobs: Tensor, behaviour_logprobs: Tensor, mask: Tensor) -> Tensor:
    """k3 estimate of KL(π_b ‖ π_old) over the masked (sampled) tokens: mean of ``exp(d) − 1 − d``,
    ``d = log π_old − log π_b`` (the tokens were drawn from π_b)."""
    return masked_mean(kl_k3(behaviour_logprobs, old_logprobs), mask)
