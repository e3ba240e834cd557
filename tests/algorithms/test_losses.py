"""PPO-family losses: hand-worked cases, loop references, and gradient properties."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from agentrl.algorithms import (
    clipped_value_loss,
    explained_variance,
    kl_k3,
    ppo_policy_loss,
    token_log_ratio,
    token_mean,
    turn_gae,
    turn_log_ratio,
    turn_mean,
)
from tests.reference.loops import ppo_loss_ref


def _one(x: float) -> torch.Tensor:
    return torch.tensor([[x]])


def test_policy_loss_hand_worked_clip_high_and_low() -> None:
    mask = torch.ones(1, 1, dtype=torch.bool)
    # A = 1, ρ = 1.5, ε_high = 0.2: max(−1.5, −1.2) = −1.2 (clipped)
    out = ppo_policy_loss(_one(math.log(1.5)), _one(0.0), _one(1.0), mask, clip_low=0.2, clip_high=0.2)
    assert_close(out.loss, torch.tensor(-1.2))
    assert out.clipfrac.item() == 1.0
    # A = −1, ρ = 0.5, ε_low = 0.2: max(0.5, 0.8) = 0.8 (clipped)
    out = ppo_policy_loss(_one(math.log(0.5)), _one(0.0), _one(-1.0), mask, clip_low=0.2, clip_high=0.2)
    assert_close(out.loss, torch.tensor(0.8))
    # asymmetric: ε_high = 0.28 lets ρ = 1.25 through unclipped
    out = ppo_policy_loss(_one(math.log(1.25)), _one(0.0), _one(1.0), mask, clip_low=0.2, clip_high=0.28)
    assert_close(out.loss, torch.tensor(-1.25))
    assert out.clipfrac.item() == 0.0


@pytest.mark.parametrize(
    "adv,rho,zero_grad",
    [
        (1.0, 1.5, True),    # A > 0 above 1 + ε: clipped, no gradient
        (-1.0, 0.5, True),   # A < 0 below 1 − ε: clipped, no gradient
        (1.0, 0.5, False),   # A > 0 below 1 − ε: unclipped (pessimistic side), gradient
        (-1.0, 1.5, False),  # A < 0 above 1 + ε: unclipped, gradient
        (1.0, 1.1, False),   # inside the trust region: gradient
    ],
)
def test_policy_loss_gradient_zero_outside_clip_region(adv: float, rho: float, zero_grad: bool) -> None:
    logp = _one(math.log(rho)).requires_grad_(True)
    out = ppo_policy_loss(logp, _one(0.0), _one(adv), torch.ones(1, 1, dtype=torch.bool))
    out.loss.backward()
    assert logp.grad is not None
    assert (logp.grad.abs().item() == 0.0) is zero_grad
    if not zero_grad:  # d(−A ρ)/d log ρ = −A ρ
        assert_close(logp.grad, _one(-adv * rho))


def test_turn_mean_vs_token_mean_hand_worked() -> None:
    # turn 0 has one token with loss 3, turn 1 has three tokens with loss 1:
    # turn mean = (3 + 1) / 2 = 2; token mean = (3 + 1 + 1 + 1) / 4 = 1.5
    values = torch.tensor([[3.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[True, False, False], [True, True, True]])
    assert_close(turn_mean(values, mask), torch.tensor(2.0))
    assert_close(token_mean(values, mask), torch.tensor(1.5))
    # the same two turns packed into one row, told apart by turn_ids
    packed = torch.tensor([[3.0, 9.0, 1.0, 1.0, 1.0]])
    pmask = torch.tensor([[True, False, True, True, True]])
    tids = torch.tensor([[0, -1, 1, 1, 1]])
    assert_close(turn_mean(packed, pmask, tids), torch.tensor(2.0))


def test_turn_log_ratio_is_geometric_mean_per_turn() -> None:
    logp = torch.tensor([[math.log(2.0), math.log(0.5), 0.0], [math.log(4.0), 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    lr = turn_log_ratio(logp, torch.zeros(2, 3), mask)
    # row 0: sqrt(2 · 0.5) = 1 → log 0; row 1: 4
    assert_close(lr, torch.tensor([[0.0, 0.0, 0.0], [math.log(4.0), 0.0, 0.0]]))


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("turn_ratio", [False, True])
@pytest.mark.parametrize("per_turn", [False, True])
def test_policy_loss_matches_loop_reference(seed: int, turn_ratio: bool, per_turn: bool) -> None:
    g = torch.Generator().manual_seed(seed)
    N, L = 2 + seed % 3, 4 + seed
    mask = torch.rand(N, L, generator=g) < 0.7
    mask[0, 0] = True
    # two turns packed per row for odd seeds, one per row otherwise
    turn_ids = torch.arange(N).unsqueeze(1).expand(N, L) * 2
    if seed % 2:
        turn_ids = turn_ids + (torch.arange(L) >= L // 2).long()
    turn_ids = torch.where(mask, turn_ids, -1)
    logp = torch.randn(N, L, generator=g) * 0.3 - 1.0
    old = logp + torch.randn(N, L, generator=g) * 0.3
    adv = torch.randn(N, L, generator=g)
    clip_low, clip_high = 0.2, 0.28
    out = ppo_policy_loss(
        logp, old, adv, mask, clip_low=clip_low, clip_high=clip_high, turn_ids=turn_ids,
        ratio=turn_log_ratio if turn_ratio else token_log_ratio, aggregate=turn_mean if per_turn else token_mean,
    )
    ref = ppo_loss_ref(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), turn_ids.tolist(),
                       clip_low, clip_high, turn_ratio, per_turn)
    assert_close(out.loss, torch.tensor(ref), atol=1e-5, rtol=1e-5)


def test_policy_loss_weights_and_empty_mask() -> None:
    logp = torch.zeros(1, 2, requires_grad=True)
    mask = torch.tensor([[True, True]])
    out = ppo_policy_loss(logp, torch.zeros(1, 2), torch.ones(1, 2), mask, weights=torch.tensor([[0.0, 2.0]]))
    assert_close(out.loss, torch.tensor(-1.0))  # mean(0·(−1), 2·(−1))
    empty = ppo_policy_loss(logp, torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1, 2, dtype=torch.bool))
    assert empty.loss.item() == 0.0
    empty.loss.backward()  # the graph is kept (backward works) and carries no gradient
    assert logp.grad is not None and torch.count_nonzero(logp.grad) == 0


def test_log_ratio_clamp_prevents_overflow() -> None:
    out = ppo_policy_loss(_one(0.0), _one(-500.0), _one(-1.0), torch.ones(1, 1, dtype=torch.bool),
                          log_ratio_clamp=10.0)
    assert math.isfinite(out.loss.item())
    assert_close(out.loss, torch.tensor(math.exp(10.0)))


def test_policy_loss_rejects_bad_clip() -> None:
    with pytest.raises(ValueError, match="clip_low"):
        ppo_policy_loss(_one(0.0), _one(0.0), _one(1.0), torch.ones(1, 1, dtype=torch.bool), clip_low=1.5)


def test_clipped_value_loss_hand_worked() -> None:
    mask = torch.ones(1, 1, dtype=torch.bool)
    # V = 1.0, V_old = 0, R = 1.0, clip 0.2: unclipped err 0, clipped (0.2 − 1)² = 0.64 → 0.5·0.64
    out = clipped_value_loss(_one(1.0), _one(0.0), _one(1.0), mask, clip=0.2)
    assert_close(out.loss, torch.tensor(0.32))
    assert out.clipfrac.item() == 1.0
    plain = clipped_value_loss(_one(1.0), _one(0.0), _one(3.0), mask, clip=None)
    assert_close(plain.loss, torch.tensor(2.0))


def test_kl_k3_properties() -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(50, generator=g)
    assert_close(kl_k3(a, a), torch.zeros(50))
    assert bool((kl_k3(a, torch.randn(50, generator=g)) >= 0).all())
    # Monte-Carlo: E_{x~p}[k3] ≈ KL(p‖q) for two categoricals
    p = torch.tensor([0.7, 0.2, 0.1])
    q = torch.tensor([0.4, 0.4, 0.2])
    x = torch.multinomial(p, 200_000, replacement=True, generator=g)
    est = kl_k3(p.log()[x], q.log()[x]).mean()
    exact = (p * (p / q).log()).sum()
    assert abs(est.item() - exact.item()) < 0.01


def test_explained_variance() -> None:
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    assert_close(explained_variance(returns, returns, mask), torch.tensor(1.0))
    assert explained_variance(torch.zeros(1, 4), returns, mask).item() == pytest.approx(0.0)
    assert math.isnan(explained_variance(returns, torch.ones(1, 4), mask).item())


def test_explained_variance_of_equal_returns_rebuilt_as_advantage_plus_value_is_undefined() -> None:
    """γ = λ = 1, every episode's reward 1: each return is exactly 1, but computed as A + V in float32 it carries
    rounding (~1e-7); the ratio is undefined (NaN), not the −5.7e13 that dividing by the rounding gives. A real
    spread of 1e-3 still gives the hand value: V = R + 0.25e-3·(±1) has Var(R − V) = Var(R)/4 → 0.75."""
    torch.manual_seed(0)
    rewards = torch.zeros(8, 9)
    rewards[:, -1] = 1.0
    values = torch.rand(8, 9) * 0.7 + 0.1
    mask = torch.ones(8, 9, dtype=torch.bool)
    _, returns = turn_gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert 0 < float(returns.var()) < 1e-12  # the rounding is there
    assert math.isnan(explained_variance(values, returns, mask).item())
    returns = torch.tensor([[1.0, 1.001, 1.0, 1.001]])
    values = returns + 0.00025 * torch.tensor([[1.0, -1.0, -1.0, 1.0]])
    ev = explained_variance(values, returns, torch.ones(1, 4, dtype=torch.bool)).item()
    assert ev == pytest.approx(0.75, abs=1e-3)
