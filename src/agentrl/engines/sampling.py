"""Batched token sampling for the embedded engine, with one random generator per request.

On CPU, ``torch.multinomial(probs, 1, generator=g)`` draws ``q ~ Exp(1)`` once per vocabulary entry from ``g`` and
returns ``argmax(probs / q)`` (the exponential-race form of the Gumbel-max trick). `sample_rows` makes exactly
that draw for each row from the row's own generator, and runs everything else (temperature, log-softmax,
validity checks, the division and the argmax, the log-prob gather) once over the whole batch. So each request
gets the same tokens, and its generator ends in the same state, as a per-row ``multinomial`` would give (checked
bit for bit in ``tests/engines/test_sampling.py``), while the vocabulary-wide work and the host syncs are paid
once per step instead of once per sequence.
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
        drawn, bad = _race(logp[sampled] if len(sampled) < len(rows) else logp, [rows[i] for i in sampled])
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
        return torch.log_softmax(logits / t if t != 0 else logits, -1)
    logp = torch.empty_like(logits)
    for t in distinct:
        idx = [i for i, x in enumerate(temperatures) if x == t]
        part = logits[idx]
        logp[idx] = torch.log_softmax(part / t if t != 0 else part, -1)
    return logp


def _race(logp: Tensor, rows: Sequence[RowSampling]) -> tuple[Tensor, list[int]]:
    """``multinomial(probs, 1)`` for each row, each from its own generator. Returns the tokens and the indices
    of rows whose distribution is invalid (they draw nothing, as ``multinomial`` raises before drawing)."""
    probs = logp.exp()
    for i, r in enumerate(rows):
        if r.top_k > 0 or r.top_p < 1.0:
            probs[i] = truncate(probs[i], r.top_k, r.top_p)
    valid = ((probs >= 0) & (probs < math.inf)).all(-1) & (probs.sum(-1) > 0)  # NaN fails `>= 0`
    bad = [i for i, ok in enumerate(valid.tolist()) if not ok]
    q = torch.ones_like(probs)
    for i, r in enumerate(rows):
        if i not in bad:
            q[i].exponential_(1, generator=r.generator)
    return (probs / q).argmax(-1), bad


def truncate(probs: Tensor, top_k: int, top_p: float) -> Tensor:
    """Zero the probabilities (V,) outside the top-k tokens and outside the top-p nucleus (unnormalised is fine:
    the exponential race, like ``torch.multinomial``, needs no normalisation)."""
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
