"""The turn-level credit test's table: the difference-in-differences of the 2 × 2 (λ 0.5 vs λ 1, feedback on vs off).

Reads the finished cells ``<out>/<setting>/<arm>/seed<k>/summary.json`` of the two settings (``creditturn``,
``creditturn-fb``) and the two arms (``turn_ppo_lam05``, ``turn_ppo_lam1``), takes each cell's **final** held-out
evaluation, and for every seed with all four cells computes

    DiD = (λ 0.5 − λ 1 | feedback on) − (λ 0.5 − λ 1 | feedback off)

for the held-out decisions-right fraction (``reward``: held-out games pay no noise, so a game's return is its
fraction of decisions right, less 0.1 a format error), sampled and greedy, and for all-right (``success``). Each is
reported as the mean over seeds ± its SE with the exact two-sided sign-flip p (all 2^n sign patterns of the per-seed
values; the smallest p at n seeds is 2 / 2^n) and a 95 % t-interval (the test is the sign-flip one; the interval
says how large a difference the seeds still admit). The four arm means are given beside it.

The **secondary arms** (feedback on only: token-PPO, Turn-PPO with a zero critic, GRPO, RTPO; `SECONDARY`) are
each set against the feedback-on Turn-PPO arms, λ 0.5 (the reference the protocol names) and λ 1 (the same λ as
the zero critic and the Monte Carlo schedules), paired by seed over the seeds where both cells have finished:
the mean of the per-seed differences (arm − Turn-PPO) ± its SE, its sign-flip p and 95 % t-interval, with both
means beside it.

``--markdown`` prints the 2 × 2 seed by seed, as docs/benchmarks.md shows it: each finished cell's final held-out
decisions-right, sampled (greedy), marked † where the policy's entropy collapsed (mean `train/entropy` over the
last quarter of its steps below `COLLAPSED_ENTROPY`: the policy samples one reply a prompt, so nothing more is
learned), and the seed's DiD where all four cells have finished; then the feedback-on arms the same way, the two
Turn-PPO references beside the secondary arms, with each arm's mean over its finished seeds; then each secondary
arm against Turn-PPO λ 1 (difference, p, interval, greedy difference).

Example::

    python benchmarks/credit_protocol.py --out benchmarks/results/learning --json table.json
    python benchmarks/credit_protocol.py --markdown
    python benchmarks/credit_protocol.py --half-arm turn_ppo_lam05_dec   # the follow-up arm against the same λ 1

The follow-up arm ``turn_ppo_lam05_dec`` (λ 0.5 with decoupled GAE, ``critic_lam: 1``) takes the λ 0.5 arm's
place with ``--half-arm``: its DiD is against the same λ 1 cells.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import statistics
from pathlib import Path
from typing import Any

from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"on": "creditturn-fb", "off": "creditturn"}
ARMS = {"0.5": "turn_ppo_lam05", "1": "turn_ppo_lam1"}
# the secondary arms (configs/learning/schedules/<file>.yaml), run on the feedback-on setting only, and the
# primary arms they are set against
SECONDARY = {"token-PPO": "token_ppo_credit", "Turn-PPO V = 0": "turn_ppo_v0", "GRPO": "grpo_credit",
             "RTPO": "rtpo_credit"}
REFERENCES = {"Turn-PPO λ 0.5": "turn_ppo_lam05", "Turn-PPO λ 1": "turn_ppo_lam1"}
# below this mean per-token entropy (nats) over the last quarter of its steps a cell's policy has collapsed
COLLAPSED_ENTROPY = 0.02
METRICS = {"decisions_right": "reward", "decisions_right_greedy": "greedy_reward", "all_right": "success",
           "all_right_greedy": "greedy_success"}


def final(out: Path, setting: str, arm: str, seed: int) -> dict[str, Any] | None:
    """The final held-out evaluation of a finished cell, or None when the cell has not finished."""
    f = out / setting / arm / f"seed{seed}" / "summary.json"
    return json.loads(f.read_text())["evals"][-1] if f.exists() else None


def late_entropy(out: Path, setting: str, arm: str, seed: int) -> float | None:
    """Mean `train/entropy` over the last quarter of a finished cell's logged steps (None without any)."""
    f = out / setting / arm / f"seed{seed}" / "metrics.csv"
    if not f.exists():
        return None
    with f.open(newline="") as fh:
        values = [float(r["train/entropy"]) for r in csv.DictReader(fh) if r.get("train/entropy")]
    return statistics.fmean(values[-max(1, len(values) // 4):]) if values else None


def markdown(out: Path, seeds: range = range(64), half: str = ARMS["0.5"]) -> str:
    """The 2 × 2 seed by seed (see the module docstring), with a count of collapsed cells per arm; ``half`` is the
    λ 0.5 arm's schedule file (the follow-up's ``turn_ppo_lam05_dec``)."""
    arms = ARMS | {"0.5": half}
    order = [(fb, lam) for fb in ("off", "on") for lam in ARMS]
    label = {"0.5": "λ 0.5" if half == ARMS["0.5"] else f"λ 0.5 ({half})", "1": "λ 1"}
    lines = ["| seed | " + " | ".join(f"feedback {fb}, {label[lam]}" for fb, lam in order) + " | DiD |",
             "|---" * (len(order) + 2) + "|"]
    collapsed = dict.fromkeys(order, 0)
    for k in seeds:
        finals = {c: final(out, SETTINGS[c[0]], arms[c[1]], k) for c in order}
        if all(f is None for f in finals.values()):
            continue
        texts = []
        for c, f in finals.items():
            text, dead = cell_text(out, SETTINGS[c[0]], arms[c[1]], k, f)
            collapsed[c] += dead
            texts.append(text)
        r = {c: float(f["reward"]) for c, f in finals.items() if f is not None}
        did = f"{(r[('on', '0.5')] - r[('on', '1')]) - (r[('off', '0.5')] - r[('off', '1')]):+.3f}" \
            if len(r) == len(order) else "—"
        lines.append(f"| {k} | " + " | ".join(texts) + f" | {did} |")
    lines.append("| collapsed † | " + " | ".join(str(collapsed[c]) for c in order) + " | |")
    return "\n".join(lines)


def cell_text(out: Path, setting: str, arm: str, seed: int, f: dict[str, Any] | None) -> tuple[str, bool]:
    """A cell as the seed-by-seed tables show it: its final held-out decisions-right, sampled (greedy), † where its
    policy collapsed; "—" for a cell not finished. Also whether it collapsed."""
    if f is None:
        return "—", False
    entropy = late_entropy(out, setting, arm, seed)
    dead = entropy is not None and entropy < COLLAPSED_ENTROPY
    return f"{f['reward']:.3f} ({f['greedy_reward']:.3f}){' †' if dead else ''}", dead


def secondary_markdown(out: Path, seeds: range = range(64)) -> str:
    """The feedback-on arms seed by seed: the two Turn-PPO references, then each secondary arm (`cell_text`), the
    mean over each arm's finished seeds and its count of collapsed cells."""
    columns = {**REFERENCES, **SECONDARY}
    on = SETTINGS["on"]
    lines = [f"| seed ({on}) | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    collapsed = dict.fromkeys(columns, 0)
    rewards: dict[str, list[float]] = {c: [] for c in columns}
    for k in seeds:
        finals = {c: final(out, on, arm, k) for c, arm in columns.items()}
        if all(f is None for f in finals.values()):
            continue
        texts = []
        for c, f in finals.items():
            text, dead = cell_text(out, on, columns[c], k, f)
            collapsed[c] += dead
            texts.append(text)
            if f is not None:
                rewards[c].append(float(f["reward"]))
        lines.append(f"| {k} | " + " | ".join(texts) + " |")
    lines.append("| mean (seeds) | " + " | ".join(
        f"{statistics.fmean(v):.3f} ({len(v)})" if v else "—" for v in rewards.values()) + " |")
    lines.append("| collapsed † | " + " | ".join(str(collapsed[c]) for c in columns) + " |")
    return "\n".join(lines)


def sign_flip_p(values: list[float]) -> float:
    """Exact two-sided sign-flip p of mean(values) = 0: the share of sign patterns with |mean| at least as large."""
    observed = abs(statistics.fmean(values))
    hits = sum(abs(statistics.fmean(s * v for s, v in zip(signs, values, strict=True))) >= observed - 1e-12
               for signs in itertools.product((1, -1), repeat=len(values)))
    return hits / 2 ** len(values)


def t_interval(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """The ``level`` t-interval of mean(values) (n − 1 degrees of freedom); None below two values."""
    if len(values) < 2:
        return None
    mean, se = statistics.fmean(values), statistics.stdev(values) / len(values) ** 0.5
    half = float(stats.t.ppf(0.5 + level / 2, len(values) - 1)) * se
    return mean - half, mean + half


def table(out: Path, seeds: range = range(64), half: str = ARMS["0.5"]) -> dict[str, Any]:
    """Per metric: the four arm means, the per-seed DiDs, their mean ± SE and sign-flip p (complete seeds only);
    ``half`` as in `markdown`."""
    arms = ARMS | {"0.5": half}
    cells = {(fb, lam, k): final(out, SETTINGS[fb], arms[lam], k) for fb in SETTINGS for lam in arms for k in seeds}
    complete = [k for k in seeds if all(cells[(fb, lam, k)] is not None for fb in SETTINGS for lam in ARMS)]
    finished = sorted(f"{SETTINGS[fb]}/{arms[lam]}/seed{k}" for (fb, lam, k), c in cells.items() if c is not None)
    result: dict[str, Any] = {"half_arm": half, "finished_cells": finished, "complete_seeds": complete,
                              "metrics": {}}
    for name, key in METRICS.items():
        v = {(fb, lam, k): float(cells[(fb, lam, k)][key]) for fb in SETTINGS for lam in ARMS  # type: ignore[index]
             for k in complete}
        did = [(v[("on", "0.5", k)] - v[("on", "1", k)]) - (v[("off", "0.5", k)] - v[("off", "1", k)])
               for k in complete]
        row: dict[str, Any] = {f"fb {fb}, λ {lam}": statistics.fmean(v[(fb, lam, k)] for k in complete)
                               for fb in SETTINGS for lam in ARMS} if complete else {}
        row |= {"did_per_seed": did, "did": statistics.fmean(did) if did else None,
                "se": statistics.stdev(did) / len(did) ** 0.5 if len(did) > 1 else None,
                "sign_flip_p": sign_flip_p(did) if did else None, "ci95": t_interval(did)}
        result["metrics"][name] = row
    return result


def paired(arm: dict[int, dict[str, Any]], ref: dict[int, dict[str, Any]], key: str) -> dict[str, Any]:
    """``arm`` − ``ref`` on ``key`` over the seeds both have: the two means, the per-seed differences, their mean
    ± SE, sign-flip p and 95 % t-interval (None where no seed is shared, or too few for it)."""
    seeds = sorted(set(arm) & set(ref))
    diff = [float(arm[k][key]) - float(ref[k][key]) for k in seeds]
    return {"seeds": seeds, "arm": statistics.fmean(float(arm[k][key]) for k in seeds) if seeds else None,
            "reference": statistics.fmean(float(ref[k][key]) for k in seeds) if seeds else None,
            "diff_per_seed": diff, "diff": statistics.fmean(diff) if diff else None,
            "se": statistics.stdev(diff) / len(diff) ** 0.5 if len(diff) > 1 else None,
            "sign_flip_p": sign_flip_p(diff) if diff else None, "ci95": t_interval(diff)}


def secondary(out: Path, seeds: range = range(64)) -> dict[str, Any]:
    """Per secondary arm, per reference (`REFERENCES`), per metric: `paired` on the feedback-on setting."""
    on = SETTINGS["on"]
    finals = {name: {k: c for k in seeds if (c := final(out, on, name, k)) is not None}
              for name in [*SECONDARY.values(), *REFERENCES.values()]}
    return {label: {"schedule": arm, "finished_seeds": sorted(finals[arm]),
                    "vs": {ref_label: {m: paired(finals[arm], finals[ref], key) for m, key in METRICS.items()}
                           for ref_label, ref in REFERENCES.items()}}
            for label, arm in SECONDARY.items()}


def print_secondary(res: dict[str, Any]) -> None:
    """One line per (arm, reference): held-out decisions-right, sampled and greedy, arm − Turn-PPO paired by seed."""
    print(f"secondary arms ({SETTINGS['on']}; arm − reference, paired by seed; sign-flip p):")
    for label, arm in res.items():
        for ref_label, metrics in arm["vs"].items():
            parts = []
            for m in ("decisions_right", "decisions_right_greedy"):
                r = metrics[m]
                if r["diff"] is None:
                    parts.append(f"{m}: no shared seed")
                    continue
                se = "-" if r["se"] is None else f"{r['se']:.3f}"
                parts.append(f"{m} {r['arm']:.3f} vs {r['reference']:.3f}: {r['diff']:+.3f} ± {se} "
                             f"(p {r['sign_flip_p']:.3f}, {len(r['seeds'])} seeds{interval_text(r['ci95'])})")
            print(f"  {label} vs {ref_label}: " + "; ".join(parts))


def interval_text(ci: tuple[float, float] | None) -> str:
    """", 95 % CI a to b" for the printed lines; nothing without an interval."""
    return "" if ci is None else f", 95 % CI {ci[0]:+.3f} to {ci[1]:+.3f}"


def paired_markdown(res: dict[str, Any], reference: str = "Turn-PPO λ 1") -> str:
    """Each secondary arm against ``reference`` (`secondary`'s result): decisions-right difference ± SE, its
    sign-flip p, its 95 % t-interval, the greedy difference ± SE, and the seeds paired; "—" where there is none."""
    def pm(r: dict[str, Any]) -> str:
        return "—" if r["diff"] is None else f"{r['diff']:+.3f}" + ("" if r["se"] is None else f" ± {r['se']:.3f}")
    lines = [f"| arm − {reference} | decisions-right | p | interval | greedy | seeds |", "|---" * 6 + "|"]
    for label, arm in res.items():
        r, g = arm["vs"][reference]["decisions_right"], arm["vs"][reference]["decisions_right_greedy"]
        p = "—" if r["sign_flip_p"] is None else f"{r['sign_flip_p']:.3f}"
        ci = "—" if r["ci95"] is None else f"{r['ci95'][0]:+.2f} to {r['ci95'][1]:+.2f}"
        lines.append(f"| {label} | {pm(r)} | {p} | {ci} | {pm(g)} | {len(r['seeds'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "learning")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--markdown", action="store_true",
                   help="print the 2 × 2, then the feedback-on arms, seed by seed as markdown tables")
    p.add_argument("--half-arm", default=ARMS["0.5"], help="the λ 0.5 arm's schedule file (default %(default)s; the "
                   "follow-up: turn_ppo_lam05_dec, decoupled GAE)")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown(args.out, half=args.half_arm))
        print()
        print(secondary_markdown(args.out))
        print()
        print(paired_markdown(secondary(args.out)))
        return
    res = table(args.out, half=args.half_arm)
    print(f"finished cells: {len(res['finished_cells'])}; seeds with all four: {res['complete_seeds']}")
    for name, row in res["metrics"].items():
        if row.get("did") is None:
            print(f"{name}: no complete seed yet")
            continue
        se = "-" if row["se"] is None else f"{row['se']:.3f}"
        print(f"{name}: DiD {row['did']:+.3f} ± {se} (sign-flip p {row['sign_flip_p']:.3f}"
              f"{interval_text(row['ci95'])}); "
              + ", ".join(f"{k} {v:.3f}" for k, v in row.items() if k.startswith("fb ")))
    res["secondary"] = secondary(args.out)
    print_secondary(res["secondary"])
    if args.json is not None:
        args.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
