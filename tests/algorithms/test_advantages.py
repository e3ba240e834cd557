"""Advantage estimators: hand-worked cases, loop references over random inputs, and reductions."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from agentrl.algorithms import (
    grpo_advantages,
    masked_mean,
    masked_moments,
    masked_var,
    sibling_advantages,
    token_gae,
    turn_gae,
    whiten,
)
from tests.reference.loops import grpo_ref, sibling_ref, token_gae_ref, turn_gae_ref


def _prefix_mask(lengths: list[int], T: int) -> torch.Tensor:
    return torch.arange(T).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)


# ---------------------------------------------------------------- turn_gae: hand-worked


def test_turn_gae_hand_worked_three_turns() -> None:
    # γ = λ = 0.5; delta2 = 1 − 0.7 = 0.3; delta1 = 0.5·0.7 − 0.6 = −0.25; delta0 = 0.5·0.6 − 0.5 = −0.2
    # A2 = 0.3; A1 = −0.25 + 0.25·0.3 = −0.175; A0 = −0.2 + 0.25·(−0.175) = −0.24375
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    out = turn_gae(rewards, values, torch.ones(1, 3, dtype=torch.bool), gamma=0.5, lam=0.5)
    assert_close(out.advantages, torch.tensor([[-0.24375, -0.175, 0.3]]))
    assert_close(out.returns, torch.tensor([[0.25625, 0.425, 1.0]]))


def test_turn_gae_terminal_reward_zero_values_is_discounted_reward() -> None:
    # With V ≡ 0 and λ = 1 every delta but the last is 0, so A_n = γ^(N−1−n) · R.
    gamma, R = 0.9, 2.0
    out = turn_gae(torch.tensor([[0.0, 0.0, 0.0, R]]), torch.zeros(1, 4), torch.ones(1, 4, dtype=torch.bool),
                   gamma=gamma, lam=1.0)
    assert_close(out.advantages, torch.tensor([[R * gamma**3, R * gamma**2, R * gamma, R]]))
    # λ < 1 with V ≡ 0: A_n = (γλ)^(N−1−n) · R
    out = turn_gae(torch.tensor([[0.0, 0.0, R]]), torch.zeros(1, 3), torch.ones(1, 3, dtype=torch.bool),
                   gamma=gamma, lam=0.5)
    assert_close(out.advantages, torch.tensor([[R * (gamma * 0.5) ** 2, R * gamma * 0.5, R]]))


def test_turn_gae_bootstrap_only_for_truncated() -> None:
    values = torch.tensor([[0.2]])
    mask = torch.ones(1, 1, dtype=torch.bool)
    terminated = turn_gae(torch.zeros(1, 1), values, mask, gamma=0.9, lam=0.9)
    truncated = turn_gae(torch.zeros(1, 1), values, mask, gamma=0.9, lam=0.9, bootstrap=torch.tensor([1.0]))
    assert_close(terminated.advantages, torch.tensor([[-0.2]]))
    assert_close(truncated.advantages, torch.tensor([[0.9 * 1.0 - 0.2]]))


def test_turn_gae_padding_is_zero_and_ignored() -> None:
    rewards = torch.tensor([[0.0, 1.0, 5.0], [1.0, 9.0, 9.0]])
    values = torch.tensor([[0.1, 0.2, 7.0], [0.3, 7.0, 7.0]])
    out = turn_gae(rewards, values, _prefix_mask([2, 1], 3), gamma=1.0, lam=1.0)
    # row 0: A1 = 1 − 0.2 = 0.8, A0 = 0.2 − 0.1 + 0.8 = 0.9; row 1: A0 = 1 − 0.3 = 0.7
    assert_close(out.advantages, torch.tensor([[0.9, 0.8, 0.0], [0.7, 0.0, 0.0]]))
    assert_close(out.returns, torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))


def test_turn_gae_rejects_non_prefix_mask() -> None:
    mask = torch.tensor([[True, False, True]])
    with pytest.raises(ValueError, match="left-aligned"):
        turn_gae(torch.zeros(1, 3), torch.zeros(1, 3), mask, gamma=1.0, lam=1.0)


# ---------------------------------------------------------------- turn_gae / token_gae: loop references

# the loop references compute in Python floats (float64): float64 inputs must agree to rounding, not to 1e-5
_TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.9), (0.5, 0.0), (0.9, 0.95)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_turn_gae_matches_loop_reference(seed: int, gamma: float, lam: float, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(seed)
    B, T = 1 + seed, 1 + 2 * seed
    lengths = torch.randint(0, T + 1, (B,), generator=g).tolist()
    rewards = torch.randn(B, T, generator=g, dtype=dtype)
    values = torch.randn(B, T, generator=g, dtype=dtype)
    boot = torch.randn(B, generator=g, dtype=dtype) if seed % 2 else None
    out = turn_gae(rewards, values, _prefix_mask(lengths, T), gamma=gamma, lam=lam, bootstrap=boot)
    ref_a, ref_r = turn_gae_ref(rewards.tolist(), values.tolist(), lengths, gamma, lam,
                                None if boot is None else boot.tolist())
    assert out.advantages.dtype == out.returns.dtype == dtype  # float64 is computed in float64, not cast down
    tol = _TOLERANCE[dtype]
    assert_close(out.advantages, torch.tensor(ref_a, dtype=dtype), atol=tol, rtol=tol)
    assert_close(out.returns, torch.tensor(ref_r, dtype=dtype), atol=tol, rtol=tol)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.7, 0.3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_token_gae_matches_loop_reference(seed: int, gamma: float, lam: float, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(100 + seed)
    B, L = 2 + seed % 3, 3 + 3 * seed
    mask = torch.rand(B, L, generator=g) < 0.6
    rewards = torch.where(mask, torch.randn(B, L, generator=g, dtype=dtype), 0.0)
    values = torch.randn(B, L, generator=g, dtype=dtype)
    boot = torch.randn(B, generator=g, dtype=dtype) if seed % 2 else None
    out = token_gae(rewards, values, mask, gamma=gamma, lam=lam, bootstrap=boot)
    ref_a, ref_r = token_gae_ref(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam,
                                 None if boot is None else boot.tolist())
    assert out.advantages.dtype == out.returns.dtype == dtype
    tol = _TOLERANCE[dtype]
    assert_close(out.advantages, torch.tensor(ref_a, dtype=dtype), atol=tol, rtol=tol)
    assert_close(out.returns, torch.tensor(ref_r, dtype=dtype), atol=tol, rtol=tol)


def test_integer_and_half_inputs_compute_in_float32() -> None:
    mask = torch.ones(1, 2, dtype=torch.bool)
    turn = turn_gae(torch.tensor([[0, 1]]), torch.zeros(1, 2, dtype=torch.bfloat16), mask, gamma=1.0, lam=1.0)
    token = token_gae(torch.tensor([[0, 1]]), torch.zeros(1, 2, dtype=torch.int64), mask, gamma=1.0, lam=1.0)
    assert turn.advantages.dtype == token.returns.dtype == torch.float32
    assert turn.advantages.tolist() == token.returns.tolist() == [[1.0, 1.0]]


def test_token_gae_rejects_reward_outside_mask() -> None:
    mask = torch.tensor([[True, False]])
    with pytest.raises(ValueError, match="outside response_mask"):
        token_gae(torch.tensor([[0.0, 1.0]]), torch.zeros(1, 2), mask, gamma=1.0, lam=1.0)


@pytest.mark.parametrize("seed", range(5))
def test_turn_gae_with_one_token_turns_equals_token_gae(seed: int) -> None:
    """Reduction: a turn of one response token between observation tokens is a token of token-GAE."""
    g = torch.Generator().manual_seed(seed)
    B, T, obs = 3, 4, 3  # each turn: `obs` observation tokens then 1 response token
    lengths = torch.randint(1, T + 1, (B,), generator=g).tolist()
    turn_mask = _prefix_mask(lengths, T)
    rewards = torch.where(turn_mask, torch.randn(B, T, generator=g), 0.0)
    values = torch.randn(B, T, generator=g)
    turn = turn_gae(rewards, values, turn_mask, gamma=0.99, lam=0.9)

    L = T * (obs + 1)
    resp_pos = torch.arange(T) * (obs + 1) + obs
    tok_mask = torch.zeros(B, L, dtype=torch.bool)
    tok_rewards = torch.zeros(B, L)
    tok_values = torch.randn(B, L, generator=g)  # observation-token values must not matter
    for b in range(B):
        for n in range(lengths[b]):
            tok_mask[b, resp_pos[n]] = True
            tok_rewards[b, resp_pos[n]] = rewards[b, n]
            tok_values[b, resp_pos[n]] = values[b, n]
    tok = token_gae(tok_rewards, tok_values, tok_mask, gamma=0.99, lam=0.9)
    assert_close(tok.advantages[:, resp_pos], turn.advantages)
    assert_close(tok.returns[:, resp_pos], turn.returns)


# ---------------------------------------------------------------- GRPO and RTPO sibling advantages


def test_grpo_hand_worked() -> None:
    # group {1, 0, 1, 0}: mean 0.5, unbiased std sqrt(1/3); A = ±0.5·sqrt(3)
    out = grpo_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.zeros(4, dtype=torch.long), eps=0.0)
    half_sqrt3 = 0.5 * 3**0.5
    assert_close(out, torch.tensor([half_sqrt3, -half_sqrt3, half_sqrt3, -half_sqrt3]))


def test_grpo_equal_rewards_and_singletons_give_zero() -> None:
    out = grpo_advantages(torch.tensor([3.0, 3.0, 3.0, 7.0]), torch.tensor([0, 0, 0, 1]), eps=1e-6)
    assert_close(out, torch.zeros(4))


@pytest.mark.parametrize("seed", range(10))
def test_grpo_matches_loop_reference(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    n = 2 + 3 * seed
    rewards = torch.randn(n, generator=g, dtype=torch.float64)
    groups = torch.randint(0, 1 + seed, (n,), generator=g) * 7 - 3  # arbitrary, non-contiguous ids
    out = grpo_advantages(rewards, groups, eps=1e-6)
    assert_close(out, torch.tensor(grpo_ref(rewards.tolist(), groups.tolist(), 1e-6), dtype=torch.float64))


def test_sibling_hand_worked_no_std_normalisation() -> None:
    out = sibling_advantages(torch.tensor([1.0, 0.0, 0.0, 4.0, 2.0]), torch.tensor([5, 5, 5, 9, 9]))
    assert_close(out, torch.tensor([2 / 3, -1 / 3, -1 / 3, 1.0, -1.0]))


@pytest.mark.parametrize("seed", range(10))
def test_sibling_matches_loop_reference_and_pairs_sum_to_zero(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    n = 2 * (1 + seed)
    rewards = torch.randint(0, 2, (n,), generator=g).double()
    pairs = torch.arange(n) // 2  # G = 2: one pair per group
    out = sibling_advantages(rewards, pairs)
    assert_close(out, torch.tensor(sibling_ref(rewards.tolist(), pairs.tolist()), dtype=torch.float64))
    assert_close(out.view(-1, 2).sum(1), torch.zeros(n // 2, dtype=torch.float64))


# ---------------------------------------------------------------- whiten / masked statistics


def test_masked_mean_and_var() -> None:
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert_close(masked_mean(x, mask), torch.tensor(2.0))
    assert_close(masked_var(x, mask), torch.tensor(1.0))  # unbiased var of {1, 2, 3}
    assert_close(masked_mean(x, mask, dim=1), torch.tensor([1.5, 3.0]))
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0


def test_whiten_masked() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 7, generator=g) * 3 + 5
    mask = torch.rand(4, 7, generator=g) < 0.7
    w = whiten(x, mask)
    assert abs(masked_mean(w, mask).item()) < 1e-5
    assert abs(masked_var(w, mask).item() - 1.0) < 1e-4
    assert bool((w[~mask] == 0).all())
    kept = whiten(x, mask, shift_mean=False)
    assert abs(masked_mean(kept, mask).item() - masked_mean(x, mask).item()) < 1e-4


def test_whiten_with_summed_shard_moments_equals_whiten_over_all() -> None:
    """Ranks that sum their `masked_moments` whiten exactly as one process holding every value; a shard with a
    single value is whitened with the global statistics, not left raw."""
    torch.manual_seed(0)
    x = torch.randn(4, 5)
    mask = torch.rand(4, 5) > 0.3
    mask[0] = False
    mask[0, 2] = True  # shard 0 holds one value
    whole = whiten(x, mask)
    moments = masked_moments(x[:1], mask[:1]) + masked_moments(x[1:], mask[1:])
    shards = torch.cat([whiten(x[:1], mask[:1], moments=moments), whiten(x[1:], mask[1:], moments=moments)])
    assert_close(shards, whole)
    assert_close(whole[mask].mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    assert_close(whole[mask].std(), torch.tensor(1.0), atol=1e-5, rtol=0)
    assert not torch.allclose(shards[0, 2], x[0, 2])
