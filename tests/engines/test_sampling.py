"""Batched sampling (`agentrl.engines.sampling`): each row the token a one-row inverse-CDF draw from its own
generator gives (one float64 uniform a token), the right distribution, and no dependence on the rest of the batch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from agentrl.engines.sampling import RowSampling, sample_rows, truncate


def _reference(logits: torch.Tensor, row: RowSampling) -> tuple[int, float]:
    """One row alone, written out with numpy: the first token whose float64 cumulative probability exceeds u times
    the total."""
    if row.temperature == 0:
        logp = torch.log_softmax(logits, -1)
        token = int(logp.argmax())
    else:
        logp = torch.log_softmax(logits / row.temperature, -1)
        probs = truncate(logp.exp(), row.top_k, row.top_p).numpy().astype(np.float64)
        u = float(torch.rand((), generator=row.generator, dtype=torch.float64))
        cdf = np.cumsum(probs)
        token = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    return token, float(logp[token])


SETTINGS = [(1.0, 0, 1.0), (0.7, 0, 1.0), (0.0, 0, 1.0), (1.0, 5, 1.0), (1.3, 0, 0.9), (1.0, 50, 0.5)]


def test_batched_sampling_equals_the_one_row_reference() -> None:
    g = torch.Generator().manual_seed(0)
    ref_rows = [RowSampling(t, k, p, torch.Generator().manual_seed(10 + i)) for i, (t, k, p) in enumerate(SETTINGS)]
    new_rows = [RowSampling(t, k, p, torch.Generator().manual_seed(10 + i)) for i, (t, k, p) in enumerate(SETTINGS)]
    for _ in range(30):  # many steps: the generators must also advance identically
        logits = torch.randn(len(SETTINGS), 1000, generator=g) * 4
        expected = [_reference(logits[i], r) for i, r in enumerate(ref_rows)]
        got = sample_rows(logits, new_rows)
        assert got.errors == [None] * len(SETTINGS)
        assert got.tokens == [t for t, _ in expected]
        assert got.logprobs == [lp for _, lp in expected]  # bit for bit
    for a, b in zip(ref_rows, new_rows, strict=True):
        assert torch.equal(a.generator.get_state(), b.generator.get_state())


def test_one_draw_per_sampled_token_and_none_for_greedy() -> None:
    rows = [RowSampling(1.0, 0, 1.0, torch.Generator().manual_seed(1)), RowSampling(0.0, 0, 1.0,
                                                                                     torch.Generator().manual_seed(2))]
    sample_rows(torch.randn(2, 300), rows)
    once = torch.Generator().manual_seed(1)
    torch.rand((), generator=once, dtype=torch.float64)
    assert torch.equal(rows[0].generator.get_state(), once.get_state())
    assert torch.equal(rows[1].generator.get_state(), torch.Generator().manual_seed(2).get_state())


@pytest.mark.parametrize(("top_k", "top_p"), [(0, 1.0), (3, 1.0), (0, 0.75)])
def test_the_draws_follow_the_distribution(top_k: int, top_p: float) -> None:
    """20,000 draws of a 6-token distribution: each token's frequency within 5 standard errors of its (truncated,
    renormalised) probability, and a token cut by top-k / top-p never drawn."""
    logits = torch.log(torch.tensor([0.05, 0.3, 0.02, 0.4, 0.2, 0.03]))
    expected = truncate(torch.softmax(logits, -1), top_k, top_p).double()
    expected /= expected.sum()
    n = 20_000
    row = RowSampling(1.0, top_k, top_p, torch.Generator().manual_seed(7))
    got = sample_rows(logits.expand(n, -1).clone(), [row] * n).tokens
    counts = np.bincount(got, minlength=6) / n
    for token, p in enumerate(expected.tolist()):
        if p == 0:
            assert counts[token] == 0, f"token {token} has no mass but was drawn"
        else:
            assert abs(counts[token] - p) < 5 * math.sqrt(p * (1 - p) / n), (token, counts[token], p)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_row_fails_alone(bad: float) -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    logits[1, 7] = bad
    rows = [RowSampling(1.0, 0, 1.0, torch.Generator().manual_seed(i)) for i in range(3)]
    alone = [sample_rows(logits[i : i + 1], [RowSampling(1.0, 0, 1.0, torch.Generator().manual_seed(i))])
             for i in (0, 2)]
    out = sample_rows(logits, rows)
    assert isinstance(out.errors[1], ValueError) and out.errors[0] is None and out.errors[2] is None
    assert [out.tokens[0], out.tokens[2]] == [alone[0].tokens[0], alone[1].tokens[0]]
    assert all(math.isfinite(out.logprobs[i]) for i in (0, 2))


@pytest.mark.parametrize("inference", [False, True])
def test_a_row_samples_the_same_alone_as_in_a_wide_batch(inference: bool) -> None:
    """A request's tokens do not depend on which other requests share its batch (also under inference mode, as the
    engine samples)."""
    logits = torch.randn(16, 4000, generator=torch.Generator().manual_seed(3)) * 3
    rows = [RowSampling(1.0, 0, 1.0, torch.Generator().manual_seed(i)) for i in range(16)]
    with torch.inference_mode(inference):
        got = sample_rows(logits.clone(), rows)
        alone = [sample_rows(logits[i : i + 1].clone(), [RowSampling(1.0, 0, 1.0, torch.Generator().manual_seed(i))])
                 for i in range(16)]
    assert got.tokens == [a.tokens[0] for a in alone]
    assert len(set(got.tokens)) > 1
