"""Batched token sampling for the embedded engine, with one random generator per request.

On CPU, ``torch.multinomial(probs, 1, generator=g)`` draws ``q ~ Exp(1)`` once per vocabulary entry from ``g`` and
returns ``argmax(probs / q)`` (the exponential-race form of the Gumbel-max trick). `sample_rows` makes exactly
that draw for each row from the row's own generator, and runs everything else (temperature, log-softmax,
validity checks, the division and the argmax, the log-prob gather) once over the whole batch. So each request
gets the same tokens, and its generator ends in the same state, as a per-row ``multinomial`` would give (checked
bit for bit in ``tests/engines/test_sampling.py``), while the vocabulary-wide work and the host syncs are paid
once per step instead of once per sequence.

The per-row draws are the cost that remains: ``exponential_`` with a generator runs serially, about 0.8 ms per
row of SmolLM2's 49,152-token vocabulary on the 2-core Xeon of ``benchmarks/results/roofline.json`` — 13 ms of
a 16-row decode step, more than the step's attention. Rows draw from independent generators into disjoint rows of
``q``, so they are split over torch's threads (torch releases the GIL inside the op): the same numbers, the
same generator states, in less wall time. A temperature of 1 skips its division (``x / 1.0`` is ``x`` exactly).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

MAX_DRAW_THREADS = 4
"""Most threads that draw the rows' exponentials (one row's draw is serial inside torch); fewer when torch is set
to fewer (``torch.get_num_threads()``: a run told to use one thread gets one)."""
MIN_ROWS_PER_THREAD = 2
"""Below this many rows per thread the draws stay on the calling thread (a hand-off costs ~50 µs)."""
_pools: dict[tuple[int, int], ThreadPoolExecutor] = {}  # (process, threads): a forked child makes its own


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
        return torch.log_softmax(logits / t if t not in (0, 1) else logits, -1)
    logp = torch.empty_like(logits)
    for t in distinct:
        idx = [i for i, x in enumerate(temperatures) if x == t]
        part = logits[idx]
        logp[idx] = torch.log_softmax(part / t if t not in (0, 1) else part, -1)
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
    draw = [(q[i], r.generator) for i, r in enumerate(rows) if i not in bad]
    draw_exponentials(draw)
    return torch.div(probs, q, out=q).argmax(-1), bad


def draw_exponentials(draws: Sequence[tuple[Tensor, torch.Generator]], threads: int | None = None) -> None:
    """Fill each tensor with ``Exp(1)`` draws from its own generator (in place), the tensors split over up to
    ``threads`` threads (default: torch's thread count, at most `MAX_DRAW_THREADS`). Each generator is used by
    one thread only, and its draws do not depend on the split: the results and the generators' end states are
    those of a serial loop."""
    threads = min(torch.get_num_threads(), MAX_DRAW_THREADS) if threads is None else threads
    on_cpu = all(t.device.type == "cpu" for t, _ in draws)  # a GPU draw is an asynchronous kernel: no threads
    n = min(threads, len(draws) // MIN_ROWS_PER_THREAD) if on_cpu else 1
    if n <= 1:
        for t, g in draws:
            t.exponential_(1, generator=g)
        return
    key = (os.getpid(), n)  # a forked child has none of its parent's threads
    pool = _pools.get(key)
    if pool is None:
        pool = _pools[key] = ThreadPoolExecutor(max_workers=n, thread_name_prefix="agentrl-sample")

    inference = torch.is_inference_mode_enabled()  # thread-local: the engine samples under inference mode

    def run(part: Sequence[tuple[Tensor, torch.Generator]]) -> None:
        with torch.inference_mode(inference):
            for t, g in part:
                t.exponential_(1, generator=g)

    size = -(-len(draws) // n)
    for future in [pool.submit(run, draws[k : k + size]) for k in range(0, len(draws), size)]:
        future.result()


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
