"""Batched sampling (`agentrl.engines.sampling`): the same tokens, log-probs and generator states as the per-row
``torch.multinomial`` the engine used before, for every row of a batch with mixed settings."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.engines.sampling import RowSampling, sample_rows, truncate


def _reference(logits: torch.Tensor, row: RowSampling) -> tuple[int, float]:
    """The engine's former one-row-at-a-time sampler."""
    if row.temperature == 0:
        logp = torch.log_softmax(logits, -1)
        token = int(logp.argmax())
    else:
        logp = torch.log_softmax(logits / row.temperature, -1)
        token = int(torch.multinomial(truncate(logp.exp(), row.top_k, row.top_p), 1, generator=row.generator))
    return token, float(logp[token])


SETTINGS = [(1.0, 0, 1.0), (0.7, 0, 1.0), (0.0, 0, 1.0), (1.0, 5, 1.0), (1.3, 0, 0.9), (1.0, 50, 0.5)]


def test_batched_sampling_equals_per_row_multinomial() -> None:
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


@pytest.mark.parametrize("threads", [2, 3])
def test_threaded_draws_equal_the_serial_loop(threads: int) -> None:
    """The rows' exponentials split over threads are the serial loop's numbers, and every generator ends in the
    serial loop's state (each generator stays on one thread; no row is drawn twice or skipped)."""
    from agentrl.engines.sampling import draw_exponentials

    serial = [(torch.ones(5000), torch.Generator().manual_seed(i)) for i in range(11)]
    split = [(torch.ones(5000), torch.Generator().manual_seed(i)) for i in range(11)]
    for _ in range(3):
        draw_exponentials(serial, threads=1)
        draw_exponentials(split, threads=threads)
        for (a, ga), (b, gb) in zip(serial, split, strict=True):
            assert torch.equal(a, b)
            assert torch.equal(ga.get_state(), gb.get_state())


@pytest.mark.parametrize("inference", [False, True])
def test_a_wide_batch_samples_as_per_row_multinomial(inference: bool) -> None:
    """A 16-row batch (the threaded path of `draw_exponentials` at its default) gives the per-row tokens, also
    under inference mode, as the engine samples (the worker threads must take the caller's mode: inference
    tensors cannot be filled in place outside it)."""
    logits = torch.randn(16, 4000, generator=torch.Generator().manual_seed(3)) * 3
    rows = [RowSampling(1.0, 0, 1.0, torch.Generator().manual_seed(i)) for i in range(16)]
    refs = [RowSampling(1.0, 0, 1.0, torch.Generator().manual_seed(i)) for i in range(16)]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the draws follow torch's thread count
    try:
        with torch.inference_mode(inference):
            got = sample_rows(logits.clone(), rows)
    finally:
        torch.set_num_threads(threads)
    assert got.tokens == [_reference(logits[i], r)[0] for i, r in enumerate(refs)]
