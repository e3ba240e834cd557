"""Exact turn-level signal of RTPO's sibling pairs on the learning benchmark's FrozenLake (no model, no sampling).

FrozenLake 2x2 without holes, 6 moves, reward 1 on reaching the goal (configs/learning/frozenlake.yaml). For a
policy that plays each move with fixed probabilities at every state, it computes exactly, for RTPO's depths 0-2:
Q(s, a, moves left) = P(success | move a now, then the policy), and for a depth-k sibling pair (two continuations
branched from the same trunk state, advantages ±(R1 − R2)/2) the share of pairs that are *informative* (R1 ≠ R2),
and among those the share whose sign favours the better move ("sign right"), the better move's opposite ("wrong"),
or comes from two *identical* moves whose continuations differed (pure continuation noise; the update folds
identical replies, so these cancel). It is why a median RTPO update on this task rests on a few samples whose sign
is right about 2:1 at depth 0 (docs/benchmarks-log.md, "FrozenLake RTPO").

    python benchmarks/frozenlake_signal.py [--json OUT.json]      # exact, a second: no smoke mode needed
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
from collections.abc import Callable
from pathlib import Path

MOVES = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
MOVES_PER_EPISODE = 6
GOAL = (1, 1)
Policy = dict[str, float]
State = tuple[int, int]


def step(s: State, move: str) -> State:
    r, c = s[0] + MOVES[move][0], s[1] + MOVES[move][1]
    return (r, c) if 0 <= r < 2 and 0 <= c < 2 else s  # a move into the wall stays


def success_probability(pi: Policy) -> Callable[[State, int], float]:
    @functools.lru_cache(None)
    def value(s: State, left: int) -> float:
        if s == GOAL:
            return 1.0
        if left == 0:
            return 0.0
        return sum(p * value(step(s, a), left - 1) for a, p in pi.items())

    return value


def pair_shares(pi: Policy, dist: dict[State, float], left: int) -> tuple[float, float, float]:
    """(informative, sign right, same-move noise) of the depth's sibling pairs, over the trunk states ``dist``."""
    value = success_probability(pi)
    informative = right = noise = 0.0
    for s, ps in dist.items():
        for a1, a2 in itertools.product(pi, pi):
            q1, q2 = value(step(s, a1), left - 1), value(step(s, a2), left - 1)
            w = ps * pi[a1] * pi[a2]
            p_inf = q1 * (1 - q2) + q2 * (1 - q1)
            informative += w * p_inf
            if q1 != q2:  # sibling 1 is positive iff R1 = 1, R2 = 0: right iff that is the better move
                right += w * (q1 * (1 - q2) if q1 > q2 else q2 * (1 - q1))
            else:
                noise += w * p_inf
    return informative, right / max(informative, 1e-12), noise / max(informative, 1e-12)


def analyse(pi: Policy) -> tuple[float, list[tuple[int, float, float, float, float]]]:
    """Success of ``pi`` and, per depth 0-2: (depth, trunks alive, informative, sign right, same-move noise)."""
    dist: dict[State, float] = {(0, 0): 1.0}
    rows = []
    for k in range(3):
        rows.append((k, sum(dist.values()), *pair_shares(pi, dist, MOVES_PER_EPISODE - k)))
        moved: dict[State, float] = {}
        for s, ps in dist.items():
            for a, p in pi.items():
                moved[step(s, a)] = moved.get(step(s, a), 0.0) + ps * p
        dist = {s: p for s, p in moved.items() if s != GOAL}
    return success_probability(pi)((0, 0), MOVES_PER_EPISODE), rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = parser.parse_args(argv)
    out: dict[str, dict[str, object]] = {}
    for name, pi in [("uniform", dict.fromkeys(MOVES, 0.25)),
                     ("wall-leaning 0.4 up/left", {"up": .4, "left": .4, "right": .1, "down": .1}),
                     ("good-leaning 0.4 right/down", {"up": .1, "left": .1, "right": .4, "down": .4})]:
        success, rows = analyse(pi)
        out[name] = {"success": success, "depths": [dict(zip(("depth", "alive", "informative", "sign_right",
                                                              "same_move_noise"), r, strict=True)) for r in rows]}
        print(f"{name}: success {success:.3f}")
        for k, alive, inf, right, noise in rows:
            print(f"  depth {k}: alive {alive:.3f}  informative pairs {inf:.3f}  sign right {right:.3f}  "
                  f"wrong {1 - right - noise:.3f}  same-move noise {noise:.3f}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
