"""Behaviour-correction weights (TIS, token MIS, turn MIS) against the loop reference, exactly at the boundary C,
and the mismatch KL against a hand computation."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algorithms.correction import masked_is, mismatch_kl, truncated_is, turn_masked_is
from tests.reference.loops import is_weights_ref, mismatch_kl_ref

MODES = {"tis": truncated_is, "mis": masked_is, "turn_mis": turn_masked_is}


def _padded(turns: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    L = max(len(t) for t in turns)
    x = torch.zeros(len(turns), L)
    mask = torch.zeros(len(turns), L, dtype=torch.bool)
    for i, t in enumerate(turns):
        x[i, : len(t)] = torch.tensor(t)
        mask[i, : len(t)] = True
    return x, mask


@pytest.mark.parametrize("mode", list(MODES))
def test_weights_at_exactly_the_boundary(mode: str) -> None:
    cap = 2.0
    log_c = float(torch.tensor(math.log(cap)))  # log C as float32 rounds it: the values below sit exactly on it
    nudge = 1e-3
    turns = [[log_c, -log_c, log_c + nudge, -log_c - nudge, 0.0], [log_c + nudge, log_c + nudge], [0.1, -0.1]]
    x, mask = _padded(turns)
    out = MODES[mode](x, mask, None, cap)
    ref_w, ref_c = is_weights_ref(turns, log_c, mode)
    for i, t in enumerate(turns):
        torch.testing.assert_close(out.weights[i, : len(t)], torch.tensor(ref_w[i]), rtol=1e-6, atol=0.0)
        assert out.corrected[i, : len(t)].tolist() == ref_c[i]
    assert not out.corrected[~mask].any()
    assert torch.all(out.weights[~mask] == 1.0)
    if mode == "tis":  # exactly C: weight C, not counted as truncated; above C: truncated to C
        assert out.corrected[0].tolist()[:4] == [False, False, True, False]
        assert out.weights[0, 0].item() == pytest.approx(cap, rel=1e-6)
        assert out.weights[0, 2].item() == pytest.approx(cap, rel=1e-6)
        assert out.weights[0, 3].item() == pytest.approx(math.exp(-log_c - nudge), rel=1e-6)
    elif mode == "mis":  # [1/C, C] inclusive
        assert out.weights[0].tolist()[:4] == [1.0, 1.0, 0.0, 0.0]
    else:  # turn 0's mean log-ratio is 0: kept whole; turn 1's exceeds log C: masked whole
        assert out.weights[0].tolist() == [1.0] * 5 and out.weights[1, :2].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("cap", [1.0, 1.5, 2.0, 5.0])
def test_weights_match_the_loop_reference_on_random_turns(mode: str, cap: float) -> None:
    gen = torch.Generator().manual_seed(int(cap * 10))
    turns = [(torch.randn(int(n), generator=gen) * 0.8).tolist()
             for n in torch.randint(1, 9, (12,), generator=gen)]
    x, mask = _padded(turns)
    out = MODES[mode](x, mask, None, cap)
    ref_w, ref_c = is_weights_ref(turns, float(torch.tensor(math.log(cap))), mode)
    for i, t in enumerate(turns):
        torch.testing.assert_close(out.weights[i, : len(t)], torch.tensor(ref_w[i]), rtol=1e-6, atol=1e-7)
        assert out.corrected[i, : len(t)].tolist() == ref_c[i]


def test_turn_ids_group_packed_turns() -> None:
    """Two turns packed in one row: the turn MIS decision is per turn, not per row."""
    x = torch.tensor([[0.0, 2.0, 2.0, 0.1, -0.1]])
    mask = torch.tensor([[False, True, True, True, True]])
    turn_ids = torch.tensor([[-1, 0, 0, 1, 1]])
    out = turn_masked_is(x, mask, turn_ids, 2.0)
    assert out.weights.tolist() == [[1.0, 0.0, 0.0, 1.0, 1.0]]


def test_bad_cap_names_the_rule() -> None:
    with pytest.raises(ValueError, match="cap C must be a finite number >= 1"):
        truncated_is(torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool), None, 0.5)


def test_mismatch_kl_by_hand() -> None:
    # two sampled tokens: π_b = 0.5, π_old = 0.25 (r = 1/2), and π_b = 0.2, π_old = 0.4 (r = 2)
    old = torch.log(torch.tensor([[0.25, 0.4, 0.9]]))
    beh = torch.log(torch.tensor([[0.5, 0.2, 0.1]]))
    mask = torch.tensor([[True, True, False]])
    by_hand = ((0.5 - 1 - math.log(0.5)) + (2 - 1 - math.log(2))) / 2  # (0.193147 + 0.306853) / 2 = 0.25
    assert by_hand == pytest.approx(0.25, abs=1e-12)
    assert mismatch_kl(old, beh, mask).item() == pytest.approx(by_hand, rel=1e-6)
    assert mismatch_kl_ref(old[0, :2].tolist(), beh[0, :2].tolist()) == pytest.approx(by_hand, rel=1e-6)
