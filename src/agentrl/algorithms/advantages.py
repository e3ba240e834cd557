"""Advantage estimators for turn-level and token-level agent RL, as pure torch functions.

Each estimator states its recurrence and shapes. None of them whitens its output: whitening is a separate step
(`whiten`) so that the schedule decides, and the tests can check each piece alone. Nothing here imports
Lightning, an HTTP client or LangChain (a test enforces it).

References:
    * Turn-PPO (Li et al., arXiv 2512.17008): GAE over turns with a learned turn critic V(s_n).
    * RTPO (Li, Qiao, Cao, Hu, arXiv 2608.18682), Algorithm 1 step 2(c): sibling advantage R_j − mean(R).
    * GRPO (Shao et al., DeepSeekMath): group-normalised episode returns.
    * Token-level PPO as in verl's ``compute_gae_advantage_return``: observation tokens are skipped by the
      recurrence (they carry the next value and advantage through unchanged).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class Advantages(NamedTuple):
    """Advantages and the value targets (returns) that go with them, both shaped like the input."""

    advantages: Tensor
    returns: Tensor


def _float_dtype(*tensors: Tensor) -> torch.dtype:
    """float32, or the inputs' wider float type: float64 inputs are computed and returned in float64."""
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _check_prefix_mask(turn_mask: Tensor) -> None:
    if turn_mask.dtype != torch.bool:
        raise TypeError(f"turn_mask must be a bool tensor, got {turn_mask.dtype}")
    if turn_mask.shape[1] > 1 and bool((turn_mask[:, 1:] & ~turn_mask[:, :-1]).any()):
        raise ValueError("turn_mask rows must be left-aligned prefixes (no existing turn after a missing one)")


def turn_gae(
    rewards: Tensor,
    values: Tensor,
    turn_mask: Tensor,
    *,
    gamma: float,
    lam: float,
    bootstrap: Tensor | None = None,
) -> Advantages:
    r"""Generalised advantage estimation over turns (Turn-PPO).

    For a row with N existing turns (indices 0..N−1)::

        delta_n = r_n + γ V(s_{n+1}) − V(s_n)        for n < N−1
        delta_{N−1} = r_{N−1} + γ b − V(s_{N−1})     b = bootstrap (0 when None: the episode terminated)
        A_n = Σ_{l≥0} (γλ)^l delta_{n+l}  =  delta_n + γλ A_{n+1}
        returns_n = A_n + V(s_n)

    ========== ======== ==========================================================
    argument   shape    meaning
    ========== ======== ==========================================================
    rewards    (B, T)   r_n, reward of turn n (terminal reward on the last turn)
    values     (B, T)   V(s_n), the critic's pre-action value of turn n
    turn_mask  (B, T)   bool, True for turns that exist; each row a left-aligned prefix
    bootstrap  (B,)     V of the state after the last turn, for truncated episodes
    ========== ======== ==========================================================

    Returns:
        `Advantages` of shape (B, T), zero where ``turn_mask`` is False, in float32 or the inputs' wider float
        type (float64 in, float64 out).
    """
    _check_prefix_mask(turn_mask)
    B, T = rewards.shape
    if values.shape != (B, T) or turn_mask.shape != (B, T):
        raise ValueError(f"rewards, values and turn_mask must share shape (B, T); got {rewards.shape}, "
                         f"{values.shape}, {turn_mask.shape}")
    dtype = _float_dtype(rewards, values)
    rewards, values = rewards.to(dtype), values.to(dtype)
    boot = torch.zeros(B, dtype=rewards.dtype, device=rewards.device)
    if bootstrap is not None:
        boot = bootstrap.to(rewards.dtype).reshape(B)
    advantages = torch.zeros_like(rewards)
    next_value = boot
    next_advantage = torch.zeros_like(boot)
    for n in reversed(range(T)):
        if n + 1 < T:
            has_next = turn_mask[:, n + 1]
            next_value = torch.where(has_next, values[:, n + 1], boot)
            next_advantage = torch.where(has_next, advantages[:, n + 1], torch.zeros_like(boot))
        delta = rewards[:, n] + gamma * next_value - values[:, n]
        advantages[:, n] = torch.where(turn_mask[:, n], delta + gamma * lam * next_advantage, 0.0)
    returns = torch.where(turn_mask, advantages + values, 0.0)
    return Advantages(advantages, returns)


def token_gae(
    rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    *,
    gamma: float,
    lam: float,
    bootstrap: Tensor | None = None,
) -> Advantages:
    r"""Token-level GAE for the token-PPO baseline, observation tokens masked (as verl does).

    The recurrence runs over response tokens only; a masked (observation or prompt) token passes the next value
    and the running advantage through unchanged, so a turn's last token is discounted once against the first
    token of the next turn. With τ ranging over response positions in order and τ' the next one::

        delta_τ = r_τ + γ V_{τ'} − V_τ        (V after the last response token = bootstrap, or 0)
        A_τ = delta_τ + γλ A_{τ'}
        returns_τ = A_τ + V_τ

    ============== ======== =================================================
    argument       shape    meaning
    ============== ======== =================================================
    rewards        (B, L)   reward at each response token (zero elsewhere)
    values         (B, L)   V at each token (read before the token is emitted)
    response_mask  (B, L)   bool, True for response tokens
    bootstrap      (B,)     value after the last response token (truncation)
    ============== ======== =================================================

    Returns:
        `Advantages` of shape (B, L), zero outside ``response_mask``, in float32 or the inputs' wider float type.

    Raises:
        ValueError: if a reward sits outside the response mask (it would be silently lost).
    """
    if response_mask.dtype != torch.bool:
        raise TypeError(f"response_mask must be a bool tensor, got {response_mask.dtype}")
    if bool((rewards[~response_mask] != 0).any()):
        raise ValueError("token_gae: rewards must be zero outside response_mask; put each reward on a response token")
    B, L = rewards.shape
    dtype = _float_dtype(rewards, values)
    rewards, values = rewards.to(dtype), values.to(dtype)
    next_value = torch.zeros(B, dtype=rewards.dtype, device=rewards.device)
    if bootstrap is not None:
        next_value = bootstrap.to(rewards.dtype).reshape(B).clone()
    running = torch.zeros_like(next_value)
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(L)):
        live = response_mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        gae = delta + gamma * lam * running
        advantages[:, t] = torch.where(live, gae, 0.0)
        running = torch.where(live, gae, running)
        next_value = torch.where(live, values[:, t], next_value)
    returns = torch.where(response_mask, advantages + values, 0.0)
    return Advantages(advantages, returns)


def _group_stats(rewards: Tensor, groups: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-element group mean, group size and unbiased group variance for 1-D ``rewards``."""
    if rewards.dim() != 1 or groups.shape != rewards.shape:
        raise ValueError(f"rewards and groups must both be 1-D of the same length; got {rewards.shape}, {groups.shape}")
    _, inverse = torch.unique(groups, return_inverse=True)
    num = int(inverse.max().item()) + 1 if inverse.numel() else 0
    x = rewards.double()
    count = torch.bincount(inverse, minlength=num).double()
    total = torch.zeros(num, dtype=x.dtype, device=x.device).scatter_add_(0, inverse, x)
    mean = total / count
    sq = torch.zeros_like(total).scatter_add_(0, inverse, (x - mean[inverse]) ** 2)
    var = sq / (count - 1).clamp(min=1)
    return mean[inverse], count[inverse], var[inverse]


def grpo_advantages(rewards: Tensor, groups: Tensor, *, eps: float = 1e-6) -> Tensor:
    r"""Group-normalised episode returns (GRPO), one advantage per trajectory.

    ``A_i = (R_i − mean_{g(i)} R) / (std_{g(i)} R + eps)`` with the unbiased standard deviation. A group of one
    trajectory has no baseline and gets advantage 0. Broadcast to every turn of the trajectory by the caller.

    Args:
        rewards: (B,) episode returns.
        groups: (B,) integer group id of each trajectory (trajectories of one task share an id).
        eps: Added to the standard deviation; a group with equal rewards therefore gets zeros.

    Returns:
        (B,) advantages, in the dtype of ``rewards``.
    """
    mean, count, var = _group_stats(rewards, groups)
    adv = (rewards.double() - mean) / (var.sqrt() + eps)
    return torch.where(count > 1, adv, 0.0).to(rewards.dtype)


def sibling_advantages(rewards: Tensor, groups: Tensor) -> Tensor:
    r"""RTPO sibling advantage (Algorithm 1, step 2c): ``A_j = R_j − mean(R over its sibling group)``.

    No standard-deviation normalisation (the paper's choice: it keeps the estimator unbiased up to the
    (G−2)/(G−1) factor of its Theorem 1). With G = 2 the two advantages of a pair sum to zero.

    Args:
        rewards: (B,) returns of the siblings.
        groups: (B,) integer id of each sibling's group (the trunk and boundary it branched from).

    Returns:
        (B,) advantages.
    """
    mean, _, _ = _group_stats(rewards, groups)
    return (rewards.double() - mean).to(rewards.dtype)


def masked_mean(x: Tensor, mask: Tensor | None = None, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over the positions where ``mask`` is True (all positions when None).

    An empty mask gives 0 (not NaN), keeping the autograd graph.
    """
    if mask is None:
        return x.mean() if dim is None else x.mean(dim)
    m = mask.to(x.dtype)
    if dim is None:
        return (x * m).sum() / m.sum().clamp(min=1.0)
    return (x * m).sum(dim) / m.sum(dim).clamp(min=1.0)


def masked_var(x: Tensor, mask: Tensor | None = None, *, unbiased: bool = True) -> Tensor:
    """Variance of ``x`` over the masked positions (scalar)."""
    mean = masked_mean(x, mask)
    n = x.numel() if mask is None else mask.sum()
    sq = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n_t = torch.as_tensor(n, dtype=x.dtype, device=x.device)
        sq = sq * n_t / (n_t - 1).clamp(min=1.0)
    return sq


def masked_moments(x: Tensor, mask: Tensor | None = None) -> Tensor:
    """``[Σ x, Σ x², n]`` over the masked positions (float64): the sufficient statistics of `whiten`, which add
    up across shards (ranks) — sum them over the ranks and every rank whitens with the global mean and variance."""
    m = torch.ones_like(x, dtype=torch.bool) if mask is None else mask
    v = x[m].double()
    return torch.stack([v.sum(), (v * v).sum(), torch.tensor(float(v.numel()), dtype=torch.float64)])


def whiten(x: Tensor, mask: Tensor | None = None, *, shift_mean: bool = True, eps: float = 1e-8,
           moments: Tensor | None = None) -> Tensor:
    """Normalise ``x`` to unit variance over the masked positions (and zero mean when ``shift_mean``).

    ``mean = Σx / n``, ``var = (Σx² − n·mean²) / (n − 1)`` (unbiased), from ``moments`` (`masked_moments`, e.g.
    summed over ranks) or from ``x`` itself. Positions outside the mask are returned as 0.
    """
    total, total_sq, n = (moments if moments is not None else masked_moments(x, mask)).tolist()
    mean = total / max(n, 1.0)
    var = max(total_sq - n * mean * mean, 0.0) / max(n - 1.0, 1.0)
    out = (x - mean) * (var + eps) ** -0.5
    if not shift_mean:
        out = out + mean
    return out if mask is None else torch.where(mask, out, 0.0)
