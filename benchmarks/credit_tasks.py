"""Training-free credit ground truth on two real tasks, GuessNumber and Sokoban (`benchmarks/credit.py --env guess`,
``--env sokoban``): per-turn truths the environment's own state gives, and the estimators scored against them as in
`credit_truth` (Pearson correlation over all turns, cluster-bootstrap SE over tasks).

The scored policy is a seeded *ε-expert*: each turn it plays the expert's move with probability ``--expert-rate``
(bisection; the shipped BFS solver's first move), else a uniformly random move (a guess uniform in the interval
still possible; a uniform direction). Choices are independent draws.

* **GuessNumber** 1–20, 5 guesses (reward 1 for the right guess). Truth ``interval``: log2 of the interval
  bisection would leave minus log2 of the one the guess left (sizes + 1; the target known), so 0 for a bisection
  guess, > 0 for a luckier one, < 0 for a worse one. Truth ``A^π``: the exact advantage on the agent's information
  state (the target uniform over the interval still possible), from the dynamic programme V(n, t) over the interval
  size n and the guesses left t; the **oracle critic** is that V.
* **Sokoban** 6 × 6, one box, 10 moves (RAGEN's rewards). Truth ``progress``: the solver's distance to a solution
  before the move minus after it (+1 on a shortest path, 0 for a blocked move, −1 away; a position with no solution
  counts as ``max_turns`` away). Critic: the neutral one only (no oracle is computed here).
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from credit_truth import correlation, scored

from agentrl.algorithms.advantages import grpo_advantages, sibling_advantages, token_gae, turn_gae
from agentrl.envs import GuessNumberEnv, SokobanEnv
from agentrl.envs.sokoban import MOVES, SokobanState, solve


@dataclass(frozen=True)
class Ep:
    """One episode: the task, the actions, the rewards, per-turn truths (by name) and the oracle's V(s_n) if any."""

    task: int
    actions: list[str]
    rewards: list[float]
    truths: dict[str, list[float]]
    oracle: list[float] | None


class Guess:
    """GuessNumber 1–20, 5 guesses, the ε-bisection chooser, its exact values."""

    name, low, high, turns = "guess", 1, 20, 5

    def __init__(self, rate: float) -> None:
        self.rate = rate

    @functools.cache  # noqa: B019  (one instance per run)
    def value(self, n: int, t: int) -> float:
        """P(success) with an interval of n numbers and t guesses left."""
        if n <= 0 or t <= 0:
            return 0.0
        return self.rate * self.q(n, t, (n - 1) // 2) + (1 - self.rate) * sum(self.q(n, t, i) for i in range(n)) / n

    def q(self, n: int, t: int, i: int) -> float:
        """Guessing position i of the n (i below, n − 1 − i above), target uniform on the interval."""
        return 1 / n + i / n * self.value(i, t - 1) + (n - 1 - i) / n * self.value(n - 1 - i, t - 1)

    def play(self, seed: int, rng: np.random.Generator, prefix: Sequence[str] = ()) -> Ep:
        env = GuessNumberEnv(low=self.low, high=self.high, max_turns=self.turns)
        env.reset(seed)
        target = env._episode.target
        lo, hi, out = self.low, self.high, Ep(0, [], [], {"A^pi": [], "interval": []}, [])
        for t in range(self.turns, 0, -1):
            n, k = hi - lo + 1, self.turns - t
            i = int(prefix[k]) - lo if k < len(prefix) else (
                (n - 1) // 2 if rng.random() < self.rate else int(rng.integers(n)))
            guess, mid = lo + i, lo + (n - 1) // 2
            out.oracle.append(self.value(n, t))  # type: ignore[union-attr]
            out.truths["A^pi"].append(self.q(n, t, i) - self.value(n, t))
            out.truths["interval"].append(math.log2(1 + _left(lo, hi, mid, target)) - math.log2(
                1 + _left(lo, hi, guess, target)))
            result = env.step(str(guess))
            out.actions.append(str(guess))
            out.rewards.append(result.reward)
            if result.terminated or result.truncated:
                break
            lo, hi = (guess + 1, hi) if guess < target else (lo, guess - 1)
        return out


def _left(lo: int, hi: int, guess: int, target: int) -> int:
    """Numbers still possible after ``guess`` (0 when it is right)."""
    return 0 if guess == target else (hi - guess if guess < target else guess - lo)


class Soko:
    """Sokoban 6 × 6, one box, 10 moves, the ε-solver chooser, the solver's distance as truth."""

    name, turns = "sokoban", 10

    def __init__(self, rate: float) -> None:
        self.rate = rate

    @functools.cache  # noqa: B019
    def plan(self, state: SokobanState) -> tuple[str, ...] | None:
        path = solve(state, max_depth=self.turns * 3)
        return None if path is None else tuple(path)

    def distance(self, state: SokobanState) -> int:
        path = self.plan(state)
        return self.turns if path is None else len(path)

    def play(self, seed: int, rng: np.random.Generator, prefix: Sequence[str] = ()) -> Ep:
        env = SokobanEnv(max_turns=self.turns)
        env.reset(seed)
        out = Ep(0, [], [], {"progress": []}, None)
        for k in range(self.turns):
            state, path = env.state, self.plan(env.state)
            if k < len(prefix):
                action = prefix[k]
            elif path and rng.random() < self.rate:
                action = path[0]
            else:
                action = list(MOVES)[int(rng.integers(len(MOVES)))]
            result = env.step(action)
            out.truths["progress"].append(float(self.distance(state) - self.distance(env.state)))
            out.actions.append(action)
            out.rewards.append(result.reward)
            if result.terminated or result.truncated:
                break
        return out


def _padded(eps: Sequence[Ep], rows: Callable[[Ep], list[float]], width: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(e.rewards) for e in eps) * width
    x = torch.zeros(len(eps), T, dtype=torch.float64)
    mask = torch.zeros(len(eps), T, dtype=torch.bool)
    for b, e in enumerate(eps):
        row = rows(e)
        x[b, : len(row)] = torch.tensor(row, dtype=torch.float64)
        mask[b, : len(row)] = True
    return x, mask


def _flat(adv: torch.Tensor, eps: Sequence[Ep]) -> list[float]:
    return [float(adv[b, n]) for b, e in enumerate(eps) for n in range(len(e.rewards))]


def estimates(eps: list[Ep], lambdas: Sequence[float], oracle: bool) -> dict[tuple[str, str | None, float | None],
                                                                             list[float]]:
    """Every estimator's per-turn advantages on ``eps`` (turn order, episodes concatenated)."""
    r, mask = _padded(eps, lambda e: e.rewards)
    out: dict[tuple[str, str | None, float | None], list[float]] = {}
    critics = {"zero": torch.zeros_like(r)} | ({"oracle": _padded(eps, lambda e: e.oracle or [])[0]} if oracle else {})
    for name, v in critics.items():
        for lam in lambdas:
            out[("turn_ppo", name, lam)] = _flat(turn_gae(r, v, mask, gamma=1.0, lam=lam).advantages, eps)
    g = grpo_advantages(torch.tensor([sum(e.rewards) for e in eps], dtype=torch.float64),
                        torch.tensor([e.task for e in eps]))
    out[("grpo", None, None)] = [float(g[b]) for b, e in enumerate(eps) for _ in e.rewards]
    tr, tmask = _padded(eps, lambda e: [x for rew in e.rewards for x in (0.0, rew)], width=2)
    tok = token_gae(tr, torch.zeros_like(tr), tmask, gamma=1.0, lam=1.0).advantages
    out[("token_ppo", "zero", 1.0)] = _flat(tok.reshape(len(eps), -1, 2).mean(-1), eps)
    return out


def run_task(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """The rows of one task: each estimator × each truth."""
    task: Guess | Soko = Guess(args.expert_rate) if args.env == "guess" else Soko(args.expert_rate)
    eps = [_tagged(task.play(i, np.random.default_rng([args.seed, i, g])), i)
           for i in range(args.tasks) for g in range(args.group)]
    rng = np.random.default_rng([args.seed, 7])
    found = estimates(eps, args.lambdas, isinstance(task, Guess))
    trunks = eps[:: args.group]
    sibs, depths = [], []
    srng = np.random.default_rng([args.seed, 11])
    for k in range(task.turns):
        for t in trunks:
            if len(t.actions) > k:
                sibs += [(_tagged(task.play(t.task, srng, t.actions[:k]), t.task)) for _ in range(args.siblings)]
                depths += [k] * args.siblings
    ret = torch.tensor([sum(s.rewards) for s in sibs], dtype=torch.float64)
    rt = sibling_advantages(ret, torch.tensor([s.task * 1000 + k for s, k in zip(sibs, depths, strict=True)]))
    rows = []
    clusters = [e.task for e in eps for _ in e.rewards]
    for truth in eps[0].truths:
        flat = [x for e in eps for x in e.truths[truth]]
        for (est, critic, lam), adv in found.items():
            head: dict[str, Any] = {"env": task.name, "truth": truth, "estimator": est, "critic": critic,
                                    "lambda": lam}
            rows.append(head | scored(adv, flat, clusters, args.boot, rng))
        sib: dict[str, Any] = {"env": task.name, "truth": truth, "estimator": "rtpo", "critic": None, "lambda": None}
        rows.append(sib | scored(rt.tolist(), [s.truths[truth][k] for s, k in zip(sibs, depths, strict=True)],
                             [s.task for s in sibs], args.boot, rng))
    for row in rows:
        print(f"{row['env']:8s} {row['truth']:9s} {row['estimator']:9s} {row['critic'] or '-':6s} "
              f"{'-' if row['lambda'] is None else format(row['lambda'], 'g'):>4s} "
              f"{'   -  ' if row['corr'] is None else format(row['corr'], '+.3f')} ± "
              f"{'-' if row['se'] is None else format(row['se'], '.3f')} ({row['turns']} turns)", flush=True)
    setting = {"env": task.name, "episodes": len(eps), "turns": len(clusters), "expert_rate": args.expert_rate,
               "success": float(np.mean([sum(e.rewards) > 0 if task.name == "guess" else e.rewards[-1] > 5
                                         for e in eps])),
               "truth_corr_between": correlation(np.array([x for e in eps for x in e.truths[next(iter(e.truths))]]),
                                                 np.array([x for e in eps for x in e.truths[list(e.truths)[-1]]]))}
    what = {"truth": "guess: A^pi (exact, information state) and interval (log2 bits vs bisection); sokoban: "
                     "progress (solver distance before - after)",
            "policy": f"epsilon-expert: the expert's move with probability {args.expert_rate}, else uniform"}
    return rows, [setting], what


def _tagged(e: Ep, task: int) -> Ep:
    return Ep(task, e.actions, e.rewards, e.truths, e.oracle)
