"""Plain-Python loop references for the estimators and losses in `agentrl.algorithms`.

Written element by element from the equations, with no vectorisation, so that a vectorised bug cannot hide in
both places. Used only by tests.
"""

from __future__ import annotations

import math


def turn_gae_ref(
    rewards: list[list[float]],
    values: list[list[float]],
    lengths: list[int],
    gamma: float,
    lam: float,
    bootstrap: list[float] | None = None,
) -> tuple[list[list[float]], list[list[float]]]:
    """Turn GAE row by row: delta_n = r_n + γ V_{n+1} − V_n, last turn uses the bootstrap (or 0)."""
    advs, rets = [], []
    for b, row_r in enumerate(rewards):
        T = len(row_r)
        n_turns = lengths[b]
        adv = [0.0] * T
        ret = [0.0] * T
        boot = 0.0 if bootstrap is None else bootstrap[b]
        for n in range(n_turns):
            total = 0.0
            for l in range(n, n_turns):
                next_v = values[b][l + 1] if l + 1 < n_turns else boot
                delta = row_r[l] + gamma * next_v - values[b][l]
                total += (gamma * lam) ** (l - n) * delta
            adv[n] = total
            ret[n] = total + values[b][n]
        advs.append(adv)
        rets.append(ret)
    return advs, rets


def token_gae_ref(
    rewards: list[list[float]],
    values: list[list[float]],
    mask: list[list[bool]],
    gamma: float,
    lam: float,
    bootstrap: list[float] | None = None,
) -> tuple[list[list[float]], list[list[float]]]:
    """Token GAE over response tokens only: gather the masked positions, run plain GAE, scatter back."""
    advs, rets = [], []
    for b, row_mask in enumerate(mask):
        L = len(row_mask)
        pos = [t for t in range(L) if row_mask[t]]
        boot = 0.0 if bootstrap is None else bootstrap[b]
        adv = [0.0] * L
        ret = [0.0] * L
        for i, t in enumerate(pos):
            total = 0.0
            for j in range(i, len(pos)):
                tj = pos[j]
                next_v = values[b][pos[j + 1]] if j + 1 < len(pos) else boot
                delta = rewards[b][tj] + gamma * next_v - values[b][tj]
                total += (gamma * lam) ** (j - i) * delta
            adv[t] = total
            ret[t] = total + values[b][t]
        advs.append(adv)
        rets.append(ret)
    return advs, rets


def _groups(groups: list[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        out.setdefault(g, []).append(i)
    return out


def grpo_ref(rewards: list[float], groups: list[int], eps: float) -> list[float]:
    out = [0.0] * len(rewards)
    for members in _groups(groups).values():
        if len(members) < 2:
            continue
        vals = [rewards[i] for i in members]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        for i in members:
            out[i] = (rewards[i] - mean) / (std + eps)
    return out


def sibling_ref(rewards: list[float], groups: list[int]) -> list[float]:
    out = [0.0] * len(rewards)
    for members in _groups(groups).values():
        mean = sum(rewards[i] for i in members) / len(members)
        for i in members:
            out[i] = rewards[i] - mean
    return out


def ppo_loss_ref(
    logprobs: list[list[float]],
    old_logprobs: list[list[float]],
    advantages: list[list[float]],
    mask: list[list[bool]],
    turn_ids: list[list[int]],
    clip_low: float,
    clip_high: float,
    turn_ratio: bool,
    per_turn_mean: bool,
    clamp: float = 20.0,
) -> float:
    """PPO clipped loss by explicit loops over turns and tokens."""
    turns: dict[int, list[tuple[int, int]]] = {}
    for n, row in enumerate(mask):
        for t, m in enumerate(row):
            if m:
                turns.setdefault(turn_ids[n][t], []).append((n, t))
    token_losses: dict[int, list[float]] = {}
    for tid, positions in turns.items():
        diffs = [logprobs[n][t] - old_logprobs[n][t] for n, t in positions]
        turn_lr = sum(diffs) / len(diffs)
        for (n, t), d in zip(positions, diffs, strict=True):
            lr = turn_lr if turn_ratio else d
            lr = max(-clamp, min(clamp, lr))
            rho = math.exp(lr)
            a = advantages[n][t]
            loss = max(-a * rho, -a * min(max(rho, 1 - clip_low), 1 + clip_high))
            token_losses.setdefault(tid, []).append(loss)
    if not token_losses:
        return 0.0
    if per_turn_mean:
        return sum(sum(v) / len(v) for v in token_losses.values()) / len(token_losses)
    flat = [x for v in token_losses.values() for x in v]
    return sum(flat) / len(flat)


def is_weights_ref(log_ratios: list[list[float]], cap_log: float,
                   mode: str) -> tuple[list[list[float]], list[list[bool]]]:
    """Behaviour-correction weights turn by turn (each inner list is one turn's tokens, ``log π_old − log π_b``).

    ``tis``: min(r, C), corrected where log r > log C; ``mis``: 1 inside [1/C, C] (inclusive) else 0; ``turn_mis``:
    the turn's mean log-ratio decides for all its tokens. ``cap_log`` is log C as the caller's dtype rounds it.
    """
    weights, corrected = [], []
    for turn in log_ratios:
        if mode == "tis":
            weights.append([min(math.exp(x), math.exp(cap_log)) for x in turn])
            corrected.append([x > cap_log for x in turn])
            continue
        tests = [sum(turn) / len(turn)] * len(turn) if mode == "turn_mis" else turn
        keep = [-cap_log <= x <= cap_log for x in tests]
        weights.append([1.0 if k else 0.0 for k in keep])
        corrected.append([not k for k in keep])
    return weights, corrected


def mismatch_kl_ref(old: list[float], behaviour: list[float]) -> float:
    """k3 estimate of KL(behaviour ‖ old) from tokens sampled under behaviour: mean of r − 1 − log r, r = old/beh."""
    terms = []
    for o, b in zip(old, behaviour, strict=True):
        r = math.exp(o - b)
        terms.append(r - 1.0 - math.log(r))
    return sum(terms) / len(terms)
