"""Batched token sampling for the embedded engine, with one random generator per request.

Each sampled row draws **one** uniform number ``u`` from the request's own ``torch.Generator`` (float64) and takes
the first token whose cumulative probability exceeds ``u`` times the row's total (inverse-CDF sampling; the
cumulative sum in float64, so a token of probability p is drawn with probability p to about 1e-15, and a token of
probability 0 — cut by top-k or top-p — never). Everything else (temperature, log-softmax, validity checks, the
cumulative sums, the search, the log-prob gather) runs once over the whole batch. A request's tokens therefore do
not depend on which other requests share its batch, and its generator advances by exactly one draw per sampled
token.

Why not ``torch.multinomial`` (the engine's first sampler): on CPU it draws one ``Exp(1)`` number per
*vocabulary entry* (the exponential race, ``argmax(p / q)``), serially per generator, which made sampling a large
share of a decode step; one draw a token is about ten times cheaper (figures: docs/benchmarks-log.md, "AMD EPYC
(Zen 5), idle"). The price is that a seed gives other tokens than ``multinomial`` with that seed; the distribution
is the same (``tests/engines/test_sampling.py`` checks it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor


@dataclass(frozen=True)
class RowSampling:
    """How one row is sampled: temperature (0 is greedy), top-k (0 is off), top-p (1 is off), its generator, and
    how many of the most likely tokens to report with their log-probs (``top_logprobs``, 0 for none)."""

    temperature: float
    top_k: int
    top_p: float
    generator: torch.Generator
    top_logprobs: int = 0


class Sampled(NamedTuple):
    """Per row: the token, its log-probability under the tempered distribution, or the row's own error; and the
    row's ``top_logprobs`` most likely (token, log-prob) pairs from the same distribution."""

    tokens: list[int]
    logprobs: list[float]
    errors: list[Exception | None]
    top: list[list[tuple[int, float]]]


def sample_rows(logits: Tensor, rows: Sequence[RowSampling]) -> Sampled:
    """Sample one token per row of ``logits`` (B, V).

    A row whose distribution is not valid (non-finite logits) gets an error instead of a token; the others are
    unaffected.
    """
    if logits.shape[0] != len(rows):
        raise ValueError(f"sample_rows: {logits.shape[0]} logit rows for {len(rows)} sampling rows")
    logp = _log_softmax_by_temperature(logits, [r.temperature for r in rows])
    tokens = torch.zeros(len(rows), dtype=torch.long, device=logits.device)
    errors: list[Exception | None] = [None] * len(rows)
    greedy = [i for i, r in enumerate(rows) if r.temperature == 0]
    sampled = [i for i, r in enumerate(rows) if r.temperature != 0]
    if greedy:
        tokens[greedy] = logp[greedy].argmax(-1)
    if sampled:
        drawn, bad = _inverse_cdf(logp[sampled] if len(sampled) < len(rows) else logp, [rows[i] for i in sampled])
        tokens[sampled] = drawn
        for j in bad:
            errors[sampled[j]] = ValueError("invalid sampling distribution (inf, nan or no mass): the logits are "
                                            f"not finite (temperature {rows[sampled[j]].temperature})")
    chosen = logp.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
    token_list = tokens.tolist()
    for i, lp in enumerate(chosen):
        if errors[i] is None and not math.isfinite(lp):
            errors[i] = ValueError(f"non-finite log-probability for the sampled token (temperature "
                                   f"{rows[i].temperature}): the logits are not finite")
    return Sampled(token_list, chosen, errors, _top(logp, [r.top_logprobs for r in rows]))


def _top(logp: Tensor, counts: list[int]) -> list[list[tuple[int, float]]]:
    """The ``counts[i]`` most likely tokens of row i (one batched top-k over the rows that ask)."""
    out: list[list[tuple[int, float]]] = [[] for _ in counts]
    asking = [i for i, k in enumerate(counts) if k > 0]
    if not asking:
        return out
    values, indices = logp[asking].topk(min(max(counts), logp.shape[-1]), -1)
    for j, i in enumerate(asking):
        k = counts[i]
        out[i] = list(zip(indices[j, :k].tolist(), values[j, :k].tolist(), strict=True))
    return out


def _log_softmax_by_temperature(logits: Tensor, temperatures: list[float]) -> Tensor:
    """``log_softmax(logits / t)`` per row (no division for greedy rows, t = 0); one op per distinct t."""
    distinct = sorted(set(temperatures))
    if len(distinct) == 1:
        t = distinct[0]
        return torch.log_softmax(logits / t if t not in (0, 1) else logits, -1)
    logp = torch.empty_like(logits)
    for t in distinct:
        idx = [i for i, x in enumerate(temperatures) if x == t]
        part = logits[idx]
        logp[idx] = torch.log_softmax(part / t if t not in (0, 1) else part, -1)
    return logp


BLOCK = 512
"""Vocabulary entries a block of the two-level search (`_inverse_cdf`)."""


def _inverse_cdf(logp: Tensor, rows: Sequence[RowSampling]) -> tuple[Tensor, list[int]]:
    """One token per row, by inverse-CDF sampling with one float64 uniform from the row's own generator. Returns
    the tokens and the indices of rows whose distribution is invalid (they draw nothing, as ``multinomial`` raises
    before drawing).

    The search runs in two levels, all in float64: the row's mass in blocks of `BLOCK` tokens (one read of the
    probabilities), the block that ``u`` times the total falls in, then the cumulative sum inside that block only —
    the token a full float64 cumulative sum would give (``tests/engines/test_sampling.py`` compares them), without
    writing one."""
    probs = logp.exp()
    for i, r in enumerate(rows):
        if r.top_k > 0 or r.top_p < 1.0:
            probs[i] = truncate(probs[i], r.top_k, r.top_p)
    n, vocab = probs.shape
    full = vocab // BLOCK * BLOCK
    # each block summed in float32 (a copy of the whole row in float64 would cost more than the rest of the draw)
    sums = probs[:, :full].reshape(n, -1, BLOCK).sum(-1).double()
    if full < vocab:
        sums = torch.cat([sums, probs[:, full:].sum(-1, keepdim=True).double()], 1)
    through = sums.cumsum(-1)  # mass up to the end of each block
    total = through[:, -1]
    bad = [i for i, ok in enumerate((torch.isfinite(total) & (total > 0)).tolist()) if not ok]  # inf, NaN, no mass
    zero = torch.zeros((), dtype=torch.float64, device=probs.device)
    u = torch.stack([zero if i in bad else  # on the generator's device: a CUDA engine's generators live on the GPU
                     torch.rand((), generator=r.generator, dtype=torch.float64, device=r.generator.device)
                     for i, r in enumerate(rows)]).to(probs.device)
    x = (u * total).unsqueeze(1)
    # u * total can round up to the total: then the last block (and token) with mass, never one without
    block = torch.searchsorted(through, x, right=True)
    block = torch.where(block >= sums.shape[1], _last_positive(sums), block)
    before = torch.where(block > 0, through.gather(1, (block - 1).clamp(min=0)), 0.0)  # <= x
    index = block * BLOCK + torch.arange(BLOCK, device=probs.device)
    entries = probs.gather(1, index.clamp(max=vocab - 1)).double() * (index < vocab)
    inside = torch.searchsorted(before + entries.cumsum(-1), x, right=True)
    inside = torch.where(inside >= BLOCK, _last_positive(entries), inside)
    tokens = (block * BLOCK + inside).squeeze(1)
    tokens[bad] = 0  # drew nothing: a placeholder the caller replaces by the row's error
    return tokens, bad


def _last_positive(values: Tensor) -> Tensor:
    """(n, 1): the index of each row's last positive entry (0 if none)."""
    return values.shape[1] - 1 - (values > 0).flip(-1).to(torch.uint8).argmax(-1, keepdim=True)


def truncate(probs: Tensor, top_k: int, top_p: float) -> Tensor:
    """Zero the probabilities (V,) outside the top-k tokens and outside the top-p nucleus (unnormalised is fine:
    the inverse-CDF draw scales by the row's total)."""
    if top_k > 0 and top_k < probs.numel():
        kth = torch.topk(probs, top_k).values[-1]
        probs = torch.where(probs >= kth, probs, 0.0)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cumulative = sorted_p.cumsum(0)
        drop = cumulative - sorted_p > top_p * cumulative[-1]
        probs = probs.clone()
        probs[order[drop]] = 0.0
    return probs
