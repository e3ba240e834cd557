"""The turn-level credit test's table: the difference-in-differences of the 2 × 2 (λ 0.5 vs λ 1, feedback on vs off).

Reads the finished cells ``<out>/<setting>/<arm>/seed<k>/summary.json`` of the two settings (``creditturn``,
``creditturn-fb``) and the two arms (``turn_ppo_lam05``, ``turn_ppo_lam1``), takes each cell's **final** held-out
evaluation, and for every seed with all four cells computes

    DiD = (λ 0.5 − λ 1 | feedback on) − (λ 0.5 − λ 1 | feedback off)

for the held-out decisions-right fraction (``reward``: held-out games pay no noise, so a game's return is its
fraction of decisions right, less 0.1 a format error), sampled and greedy, and for all-right (``success``). Each is
reported as the mean over seeds ± its SE with the exact two-sided sign-flip p (all 2^n sign patterns of the per-seed
values; the smallest p at n seeds is 2 / 2^n). The four arm means are given beside it.

Example::

    python benchmarks/credit_protocol.py --out benchmarks/results/learning --json table.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"on": "creditturn-fb", "off": "creditturn"}
ARMS = {"0.5": "turn_ppo_lam05", "1": "turn_ppo_lam1"}
METRICS = {"decisions_right": "reward", "decisions_right_greedy": "greedy_reward", "all_right": "success",
           "all_right_greedy": "greedy_success"}


def final(out: Path, setting: str, arm: str, seed: int) -> dict[str, Any] | None:
    """The final held-out evaluation of a finished cell, or None when the cell has not finished."""
    f = out / setting / arm / f"seed{seed}" / "summary.json"
    return json.loads(f.read_text())["evals"][-1] if f.exists() else None


def sign_flip_p(values: list[float]) -> float:
    """Exact two-sided sign-flip p of mean(values) = 0: the share of sign patterns with |mean| at least as large."""
    observed = abs(statistics.fmean(values))
    hits = sum(abs(statistics.fmean(s * v for s, v in zip(signs, values, strict=True))) >= observed - 1e-12
               for signs in itertools.product((1, -1), repeat=len(values)))
    return hits / 2 ** len(values)


def table(out: Path, seeds: range = range(64)) -> dict[str, Any]:
    """Per metric: the four arm means, the per-seed DiDs, their mean ± SE and sign-flip p (complete seeds only)."""
    cells = {(fb, lam, k): final(out, SETTINGS[fb], ARMS[lam], k) for fb in SETTINGS for lam in ARMS for k in seeds}
    complete = [k for k in seeds if all(cells[(fb, lam, k)] is not None for fb in SETTINGS for lam in ARMS)]
    finished = sorted(f"{SETTINGS[fb]}/{ARMS[lam]}/seed{k}" for (fb, lam, k), c in cells.items() if c is not None)
    result: dict[str, Any] = {"finished_cells": finished, "complete_seeds": complete, "metrics": {}}
    for name, key in METRICS.items():
        v = {(fb, lam, k): float(cells[(fb, lam, k)][key]) for fb in SETTINGS for lam in ARMS  # type: ignore[index]
             for k in complete}
        did = [(v[("on", "0.5", k)] - v[("on", "1", k)]) - (v[("off", "0.5", k)] - v[("off", "1", k)])
               for k in complete]
        row: dict[str, Any] = {f"fb {fb}, λ {lam}": statistics.fmean(v[(fb, lam, k)] for k in complete)
                               for fb in SETTINGS for lam in ARMS} if complete else {}
        row |= {"did_per_seed": did, "did": statistics.fmean(did) if did else None,
                "se": statistics.stdev(did) / len(did) ** 0.5 if len(did) > 1 else None,
                "sign_flip_p": sign_flip_p(did) if did else None}
        result["metrics"][name] = row
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "learning")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    res = table(args.out)
    print(f"finished cells: {len(res['finished_cells'])}; seeds with all four: {res['complete_seeds']}")
    for name, row in res["metrics"].items():
        if row.get("did") is None:
            print(f"{name}: no complete seed yet")
            continue
        se = "-" if row["se"] is None else f"{row['se']:.3f}"
        print(f"{name}: DiD {row['did']:+.3f} ± {se} (sign-flip p {row['sign_flip_p']:.3f}); "
              + ", ".join(f"{k} {v:.3f}" for k, v in row.items() if k.startswith("fb ")))
    if args.json is not None:
        args.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
