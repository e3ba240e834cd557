"""PPO-family losses for turn-level agent RL, as pure torch functions.

All (N, L) tensors follow the alignment of `agentrl.types.TurnBatch`: ``mask`` marks the response tokens that
get gradient and ``turn_ids`` says which turn (sample) each of them belongs to (None: each row is one turn).

Variants are named functions passed in, not string switches (CONVENTIONS rule 4):

* ratio: `token_log_ratio` (RTPO Eq. 5, PPO's usual per-token ratio) or `turn_log_ratio` (the geometric mean of
  the token ratios of a turn, one ratio per action as in turn-level clipping / GSPO);
* aggregation: `turn_mean` (RTPO Eq. 6: token mean per turn, then mean over turns) or `token_mean` (one mean
  over every response token of the batch, as in DAPO).

References: PPO (Schulman et al. 2017), asymmetric clip ("clip-higher", DAPO), RTPO Eq. 5–6
(arXiv 2608.18682), Turn-PPO (arXiv 2512.17008), k3 KL estimator (Schulman, "Approximating KL divergence").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from agentrl.algorithms.advantages import masked_mean, masked_var

RatioFn = Callable[[Tensor, Tensor, Tensor, "Tensor | None"], Tensor]
Aggregator = Callable[[Tensor, Tensor, "Tensor | None"], Tensor]


class PolicyLoss(NamedTuple):
    """Clipped policy loss and its statistics (statistics are detached)."""

    loss: Tensor
    clipfrac: Tensor
    approx_kl: Tensor


class ValueLoss(NamedTuple):
    """Clipped value loss and the fraction of positions where the clipped branch was taken."""

    loss: Tensor
    clipfrac: Tensor


def _segments(mask: Tensor, turn_ids: Tensor | None) -> tuple[Tensor, int]:
    """Dense segment index (0..S−1) of every masked position, in ``mask``'s row-major order, and S."""
    if turn_ids is None:
        rows = torch.arange(mask.shape[0], device=mask.device).unsqueeze(1).expand_as(mask)
        ids = rows[mask]
    else:
        ids = turn_ids[mask]
        if bool((ids < 0).any()):
            raise ValueError("turn_ids must be >= 0 at every masked (response) position")
    if ids.numel() == 0:
        return ids, 0
    _, inverse = torch.unique(ids, return_inverse=True)
    return inverse, int(inverse.max().item()) + 1


def _segment_mean(values: Tensor, mask: Tensor, turn_ids: Tensor | None) -> tuple[Tensor, Tensor, int]:
    """Per-segment mean of ``values`` over masked positions; returns (means (S,), segment of each position, S)."""
    inverse, num = _segments(mask, turn_ids)
    flat = values[mask]
    sums = torch.zeros(num, dtype=flat.dtype, device=flat.device).index_add(0, inverse, flat)
    counts = torch.bincount(inverse, minlength=num).to(flat.dtype)
    return sums / counts.clamp(min=1.0), inverse, num


def token_mean(values: Tensor, mask: Tensor, turn_ids: Tensor | None = None) -> Tensor:
    """Mean over every masked token of the batch: ``Σ_t x_t / Σ_t 1``. ``turn_ids`` is ignored."""
    del turn_ids
    return masked_mean(values, mask)


def turn_mean(values: Tensor, mask: Tensor, turn_ids: Tensor | None = None) -> Tensor:
    """RTPO Eq. 6 aggregation: mean over a turn's tokens, then mean over turns.

    ``(1/S) Σ_s (1/|s|) Σ_{t∈s} x_t`` where s ranges over the turns present in the mask. Every turn weighs the
    same however long its response is. An empty mask gives 0 with the graph kept.
    """
    means, _, num = _segment_mean(values, mask, turn_ids)
    if num == 0:
        return (values * 0.0).sum()
    return means.mean()


def clamp_log_ratio(log_ratio: Tensor, clamp: float) -> Tensor:
    """Clamp a log-ratio to ``[−clamp, clamp]`` so that ``exp`` cannot overflow (RTPO: log-prob clip ±10)."""
    return log_ratio.clamp(min=-clamp, max=clamp)


def token_log_ratio(
    logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, turn_ids: Tensor | None = None
) -> Tensor:
    """RTPO Eq. 5: ``log ρ_t = log π_θ(a_t | c_k, a_<t) − log π_old(a_t | c_k, a_<t)`` per token."""
    del mask, turn_ids
    return logprobs - old_logprobs


def turn_log_ratio(
    logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, turn_ids: Tensor | None = None
) -> Tensor:
    """Turn-level ratio: the geometric mean of a turn's token ratios, broadcast to its tokens.

    ``log ρ_n = (1/|a_n|) Σ_{t∈a_n} (log π_θ(a_t) − log π_old(a_t))``. Clipping then acts on the whole action at
    once (one ratio per turn), as in turn-level clipping (Turn-PPO) and GSPO's sequence ratio. Positions outside
    the mask are 0.
    """
    diff = logprobs - old_logprobs
    means, inverse, num = _segment_mean(diff, mask, turn_ids)
    out = torch.zeros_like(diff)
    if num == 0:
        return out
    out = out.masked_scatter(mask, means[inverse])
    return out


def ppo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    turn_ids: Tensor | None = None,
    ratio: RatioFn = token_log_ratio,
    aggregate: Aggregator = turn_mean,
    log_ratio_clamp: float = 20.0,
    weights: Tensor | None = None,
) -> PolicyLoss:
    r"""PPO clipped surrogate with an asymmetric clip range.

    Per response token, with ρ from ``ratio`` and A the (turn-broadcast) advantage::

        ℓ_t = w_t · max(−A_t ρ_t, −A_t clip(ρ_t, 1 − clip_low, 1 + clip_high))

    then ``loss = aggregate(ℓ, mask, turn_ids)``. Minimising it maximises RTPO's J_k (Eq. 6) with ``turn_mean``.

    Args:
        logprobs: (N, L) log-probs under the current policy (with gradient).
        old_logprobs: (N, L) behaviour log-probs recorded at rollout.
        advantages: (N, L) advantage of each token.
        mask: (N, L) bool, tokens that get gradient.
        clip_low: ε_low; the ratio is clipped below at 1 − ε_low.
        clip_high: ε_high; the ratio is clipped above at 1 + ε_high.
        turn_ids: (N, L) turn of each masked token; None when each row is one turn.
        ratio: `token_log_ratio` or `turn_log_ratio`.
        aggregate: `turn_mean` or `token_mean`.
        log_ratio_clamp: The log-ratio is clamped to ±this before ``exp``.
        weights: (N, L) extra per-token weights (off-policy importance weights); None for ones.

    Returns:
        `PolicyLoss`: the loss, the fraction of masked tokens where the clipped branch is active, and the k3
        estimate of KL(π_old ‖ π_θ) from token log-ratios.
    """
    if not (0.0 <= clip_low < 1.0) or clip_high < 0.0:
        raise ValueError(f"clip_low must be in [0, 1) and clip_high >= 0; got {clip_low}, {clip_high}")
    log_r = clamp_log_ratio(ratio(logprobs, old_logprobs, mask, turn_ids), log_ratio_clamp)
    rho = torch.exp(log_r)
    unclipped = -advantages * rho
    clipped = -advantages * rho.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if weights is not None:
        per_token = per_token * weights
    loss = aggregate(per_token, mask, turn_ids)
    with torch.no_grad():
        clipfrac = masked_mean((clipped > unclipped).to(per_token.dtype), mask)
        token_lr = clamp_log_ratio(logprobs - old_logprobs, log_ratio_clamp)
        approx_kl = masked_mean(torch.expm1(token_lr) - token_lr, mask)
    return PolicyLoss(loss, clipfrac, approx_kl)


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None = 0.2,
) -> ValueLoss:
    r"""PPO value loss with value clipping, averaged over masked positions.

    ``ℓ = ½ max((V − R)², (clip(V, V_old − c, V_old + c) − R)²)``; with ``clip=None`` it is ``½ (V − R)²``.
    For the turn critic the mask holds one position per turn, so the mean is over turns.
    """
    err = (values - returns) ** 2
    if clip is None:
        return ValueLoss(0.5 * masked_mean(err, mask), torch.zeros((), device=values.device))
    v_clipped = old_values + (values - old_values).clamp(-clip, clip)
    err_clipped = (v_clipped - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(err, err_clipped), mask)
    with torch.no_grad():
        clipfrac = masked_mean((err_clipped > err).to(values.dtype), mask)
    return ValueLoss(loss, clipfrac)


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor, *, clamp: float = 20.0) -> Tensor:
    r"""Per-token k3 estimator of KL(π_θ ‖ π_ref): ``exp(r) − r − 1`` with ``r = log π_ref − log π_θ``.

    Unbiased, always ≥ 0, low variance (Schulman 2020). Sampled under π_θ. Aggregate it with a mask.
    """
    r = clamp_log_ratio(ref_logprobs - logprobs, clamp)
    return torch.expm1(r) - r


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """``1 − Var(R − V) / Var(R)`` over masked positions; NaN when the returns have no variance.

    "No variance" includes a spread no larger than the rounding of the returns' dtype at the size of the returns
    and values (64 ulps): the schedules compute R = A + V, so a batch whose true returns are all equal (every
    episode with the same reward, γ = λ = 1) carries rounding of about 1e-7 × |V|, and dividing by that variance logged
    −5.7e13 where the quantity is undefined.
    """
    var_r = masked_var(returns, mask)
    m = mask.bool()
    scale = float(torch.maximum(returns[m].abs().max(), values[m].abs().max())) if bool(m.any()) else 0.0
    if float(var_r) <= (64 * torch.finfo(returns.dtype).eps * scale) ** 2:
        return torch.tensor(float("nan"), device=values.device)
    return 1.0 - masked_var(returns - values, mask) / var_r
