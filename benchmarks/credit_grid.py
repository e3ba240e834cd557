"""The CreditChain learning grid across its settings: held-out success against D, per schedule, with the bar a
policy that ignores the cue would reach.

`benchmarks/learning.py` runs and reports one setting at a time (``<out>/<setting>/table.md``); this reads the
finished cells of every setting named and writes ``<out>/creditchain-grid/``:

* ``table.md`` / ``table.json``: per (setting, schedule) the seeds, held-out success base → final (mean ± sd over
  seeds, min-max), the gain, the greedy final, CPU-minutes, and the **cue-blind bar**: the best held-out success a
  policy reaches that replies the same colour at each decision position whatever the cue (computed from the
  environment on the held-out seeds; on M = 1 it is the held-out share of the more frequent right colour). Above
  the bar a policy has learned something of the rule; at or below it, nothing a cue-blind reply would not give.
* ``--rules K`` reads only the cells run under version K of `learning_cells.CELL_RULES` (one code version) and
  writes ``<out>/creditchain-grid-vK/``; the full table names each row's versions (``v1×3, v2×2``).
* Each row pairs its final success with GRPO's in the same setting, seed by seed: the mean difference and its
  standard error over the seeds both have at one version (a seed gives both schedules the same tasks, so pairing
  removes the seed's own luck; across versions a seed's episodes differ and there is no pair), with the exact
  sign-flip p-value of those differences (`sign_flip_p`; five pairs cannot go below 0.0625), and its count of
  seeds above the bar against GRPO's with Fisher's exact p (`fisher_p`): the cells are near-bimodal (a seed learns
  the rule or stays at the bar), so the count is the natural outcome.
* ``--power PA PB`` prints how many seeds a cell the count comparison needs to tell a schedule whose seeds clear
  the bar with probability PA from one at PB (Fisher, α = 0.05, 80 % power: `seeds_for_power`), and stops.
* ``contrasts.json`` (and a second table in ``table.md``): for a setting and its control (the same M, D and σ, the
  decisions last), each schedule's lead over GRPO with the delay minus its lead without, seed by seed
  (`order_contrasts`): the measure of whether turn-level credit is what helps.
* A third table, **entropy collapse** (`collapse_update`): per cell, the update at which the policy's mean
  token entropy (``train/entropy`` in the cell's ``metrics.csv``) first fell below ``ENTROPY_FLOOR``, beside its
  final success, and per row how many collapsed seeds and how many others ended above the bar. A seed that
  collapses early has stopped exploring; whether it collapsed onto the rule or onto a cue-blind reply is what its
  final success against the bar says.
* ``--ablation DIR`` compares cells run with one change (the same layout under DIR, for example other GAE
  constants) with the grid's, seed by seed, against every schedule of the setting, and writes
  ``DIR/comparison.md`` (`ablation_rows`).
* ``success_vs_d.png``: final held-out success against D for the decisions-first M = 1 settings, mean and min-max
  over seeds, one line per schedule, the bar dashed; the other settings (M = 3, the control, noise) as points.

Example::

    python benchmarks/credit_grid.py --settings creditchain-d0 creditchain creditchain-d8 creditchain-m3-d4 \\
        creditchain-d8-last creditchain-d4-n0.5
    python benchmarks/credit_grid.py --smoke --out /tmp/grid     # the committed D = 0 cells only: does it run
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import shutil
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import matplotlib
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_cells import CONFIGS, SCHEDULES, env_setting
from learning_report import COLORS

from agentrl.envs import CreditChainEnv

ROOT = Path(__file__).resolve().parents[1]
EVAL_OFFSET = 1_000_000  # the datamodule's held-out seeds (`SeedTasks(offset=1_000_000)`)
ENTROPY_FLOOR = 0.1  # nats a token: the first update of each of the grid's 68 cells measured 0.26-0.36


def setting_env(setting: str, **over: Any) -> CreditChainEnv:
    """The cell's environment: configs/learning/creditchain.yaml's env with the setting's knobs over it (and
    ``over`` over those)."""
    base, knobs = env_setting(setting)
    config = yaml.safe_load((CONFIGS / f"{base}.yaml").read_text())
    init = dict(config["data"]["agent"]["init_args"]["env"]["init_args"])
    return CreditChainEnv(**{**init, **knobs, **over})


def setting_config(setting: str) -> dict[str, Any]:
    """The setting's base config (``configs/learning/<name>.yaml``) as a dict."""
    return dict(yaml.safe_load((CONFIGS / f"{env_setting(setting)[0]}.yaml").read_text()))


def held_out_episodes(setting: str) -> int:
    config = yaml.safe_load((CONFIGS / f"{env_setting(setting)[0]}.yaml").read_text())
    return int(config["data"]["eval_episodes"])


def cue_blind_bar(env: CreditChainEnv, seeds: list[int], fraction: bool = False) -> float:
    """The best success over ``seeds`` of a reply that fixes one colour per decision position, blind to the cue;
    with ``fraction``, the best mean fraction of decisions right instead (the held-out reward; with M = 1 the
    same number)."""
    right = [[env.right_reply(s, j) for j in range(env.decisions)] for s in seeds]
    best = 0.0
    for replies in itertools.product(env.words, repeat=env.decisions):
        if fraction:
            score = statistics.fmean(statistics.fmean(a == b for a, b in zip(replies, r, strict=True)) for r in right)
        else:
            score = statistics.fmean(list(replies) == r for r in right)
        best = max(best, score)
    return best


def collapse_update(metrics: Path, below: float = ENTROPY_FLOOR) -> int | None:
    """The first update (1-based: the logged ``step`` + 1) whose ``train/entropy`` is below ``below`` in a cell's
    ``metrics.csv``, or None if none is (or the file is missing). Rows without the column (evaluations) are
    skipped."""
    if not metrics.exists():
        return None
    with metrics.open(newline="") as f:
        for row in csv.DictReader(f):
            x = row.get("train/entropy")
            if x not in (None, "") and float(x) < below:
                return int(float(row["step"])) + 1
    return None


def _stats(xs: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(xs), "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0,
            "min": min(xs), "max": max(xs)}


def cell_version(cell: dict[str, Any]) -> int:
    """The `learning_cells.CELL_RULES` version a cell ran under (a summary without one is version 1)."""
    return int(cell.get("rules", 1))


def grid_rows(out: Path, settings: list[str], schedules: list[str], seeds: list[int],
              rules: int | None = None) -> list[dict[str, Any]]:
    """One row per (setting, schedule) with finished cells; ``rules`` keeps only the cells of that version, so a
    grid read as one is from one code version (`learning_cells.CELL_RULES`). Each row also pairs its seeds with GRPO's
    in the same setting (``vs_grpo``: final success minus GRPO's, seed by seed, over the seeds both have at the same
    version: a seed's episodes differ between versions, so a pair across them would not be a pair)."""
    rows = []
    for setting in settings:
        env = setting_env(setting)
        held_out = [EVAL_OFFSET + i for i in range(held_out_episodes(setting))]
        bar = cue_blind_bar(env, held_out)
        reward_bar = cue_blind_bar(env, held_out, fraction=True)
        finals: dict[str, dict[tuple[int, int], float]] = {}
        rewards: dict[str, dict[tuple[int, int], float]] = {}
        for schedule in schedules:
            cells = []
            for k in seeds:
                f = out / setting / schedule / f"seed{k}" / "summary.json"
                cell = json.loads(f.read_text()) if f.exists() else None
                if cell is not None and (rules is None or cell_version(cell) == rules):
                    cells.append(cell)
            if not cells:
                continue
            base = [c["evals"][0]["success"] for c in cells]
            final = [c["evals"][-1]["success"] for c in cells]
            finals[schedule] = {(int(c["seed"]), cell_version(c)): x for c, x in zip(cells, final, strict=True)}
            reward = [c["evals"][-1]["reward"] for c in cells]
            rewards[schedule] = {(int(c["seed"]), cell_version(c)): x for c, x in zip(cells, reward, strict=True)}
            versions = Counter(cell_version(c) for c in cells)
            rows.append({
                "setting": setting, "decisions": env.decisions, "distractors": env.distractors, "order": env.order,
                "noise": env.noise, "schedule": schedule, "seeds": [int(c["seed"]) for c in cells],
                "lr": cells[0].get("lr"), "cue_blind_bar": bar, "base": _stats(base), "final": _stats(final),
                "gain": _stats([f - b for f, b in zip(final, base, strict=True)]),
                "above_bar": sum(f > bar for f in final),
                "greedy_final": _stats([c["evals"][-1]["greedy_success"] for c in cells]),
                "cpu_minutes": _stats([float(c["cpu_seconds"]) / 60 for c in cells]),
                "versions": {str(v): versions[v] for v in sorted(versions)},
                "per_seed": [[int(c["seed"]), cell_version(c), x] for c, x in zip(cells, final, strict=True)],
                "collapse_update": [collapse_update(out / setting / schedule / f"seed{c['seed']}" / "metrics.csv")
                                    for c in cells],
                # the held-out reward: the fraction of decisions right (success asks for all M of them)
                "reward_bar": reward_bar, "reward_base": _stats([c["evals"][0]["reward"] for c in cells]),
                "reward_final": _stats(reward), "reward_above_bar": sum(x > reward_bar for x in reward),
            })
        for r in rows:
            if r["setting"] == setting:
                r["vs_grpo"] = paired(finals.get(r["schedule"], {}), finals.get("grpo", {}))
                r["reward_vs_grpo"] = paired(rewards.get(r["schedule"], {}), rewards.get("grpo", {}))
    return rows


def sign_flip_p(diffs: list[float]) -> float:
    """Two-sided exact p-value of paired differences under the null that each one's sign is a coin flip (the
    paired permutation test): the share of the 2^n sign assignments whose |sum| is at least the observed |sum|.
    Counted by convolving the sums (exact; fast for the few distinct values of success rates over 32 games). With
    n pairs it is never below 2 / 2^n: 5 seeds cannot reach 0.05."""
    sums: dict[float, int] = {0.0: 1}
    for d in diffs:
        nxt: dict[float, int] = {}
        for total, ways in sums.items():
            for signed in (abs(d), -abs(d)):
                key = round(total + signed, 9)
                nxt[key] = nxt.get(key, 0) + ways
        sums = nxt
    observed = abs(sum(diffs)) - 1e-9
    return sum(ways for total, ways in sums.items() if abs(total) >= observed) / 2 ** len(diffs)


def fisher_p(a: int, n_a: int, b: int, n_b: int) -> float:
    """Two-sided Fisher exact p-value for a of n_a against b of n_b (for example seeds above the bar): the
    probability, given the a + b successes in all, of every split no more likely than the observed one."""
    k, n = a + b, n_a + n_b

    def prob(x: int) -> float:
        return math.comb(k, x) * math.comb(n - k, n_a - x) / math.comb(n, n_a)

    observed = prob(a) * (1 + 1e-9)
    return min(1.0, sum(prob(x) for x in range(max(0, k - n_b), min(k, n_a) + 1) if prob(x) <= observed))


def fisher_power(p_a: float, p_b: float, n: int, alpha: float = 0.05) -> float:
    """The chance that n seeds a cell, each above the bar with probability p_a (one schedule) or p_b (the other),
    give a Fisher exact p ≤ alpha: the power of the seeds-above-the-bar comparison (exact, over every outcome)."""
    def binom(x: int, p: float) -> float:
        return math.comb(n, x) * p**x * (1 - p) ** (n - x)

    return sum(binom(a, p_a) * binom(b, p_b) for a in range(n + 1) for b in range(n + 1)
               if fisher_p(a, n, b, n) <= alpha)


def seeds_for_power(p_a: float, p_b: float, power: float = 0.8, alpha: float = 0.05, most: int = 200) -> int | None:
    """The fewest seeds a cell at which `fisher_power` reaches ``power`` (None if not within ``most``)."""
    return next((n for n in range(2, most + 1) if fisher_power(p_a, p_b, n, alpha) >= power), None)


def paired(a: dict[tuple[int, int], float], b: dict[tuple[int, int], float]) -> dict[str, Any] | None:
    """Differences a − b over the (seed, version) keys both have: mean, sd, standard error of the mean and the
    exact sign-flip p-value (`sign_flip_p`); None with fewer than two such pairs."""
    common = sorted(set(a) & set(b))
    if len(common) < 2:
        return None
    d = [a[k] - b[k] for k in common]
    sd = statistics.stdev(d)
    return {"seeds": [seed for seed, _ in common], "mean": statistics.fmean(d), "sd": sd, "se": sd / len(d) ** 0.5,
            "p": sign_flip_p(d)}


def _finals(row: dict[str, Any]) -> dict[tuple[int, int], float]:
    """A row's final success by (seed, version): the keys `paired` pairs on."""
    return {(k, v): x for k, v, x in row["per_seed"]}


def order_contrasts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The delay's effect on each schedule's lead over GRPO: for each pair of settings that differ only in order
    (the decisions first, the long delay; the decisions last, the control) and each schedule but GRPO, seed by seed
    (s − GRPO with the decisions first) − (s − GRPO with them last), over the (seed, version) pairs that all four
    cells have. Turn-level credit that helps with the delay shows as a positive mean; a lead that does not depend
    on it, as zero."""
    finals = {(r["setting"], r["schedule"]): _finals(r) for r in rows}
    settings = {(r["decisions"], r["distractors"], r["noise"], r["order"]): r["setting"] for r in rows}
    out = []
    for (m, d, noise, order), first in settings.items():
        last = settings.get((m, d, noise, "decisions_last"))
        if order != "decisions_first" or last is None:
            continue
        for schedule in dict.fromkeys(r["schedule"] for r in rows):
            cells = [finals.get((first, schedule)), finals.get((first, "grpo")), finals.get((last, schedule)),
                     finals.get((last, "grpo"))]
            if schedule == "grpo" or any(c is None for c in cells):
                continue
            a, ga, b, gb = (c for c in cells if c is not None)
            common = sorted(set(a) & set(ga) & set(b) & set(gb))
            if len(common) < 2:
                continue
            diffs = [(a[k] - ga[k]) - (b[k] - gb[k]) for k in common]
            sd = statistics.stdev(diffs)
            out.append({"first": first, "last": last, "schedule": schedule, "seeds": [k for k, _ in common],
                        "lead_first": statistics.fmean(a[k] - ga[k] for k in common),
                        "lead_last": statistics.fmean(b[k] - gb[k] for k in common),
                        "mean": statistics.fmean(diffs), "sd": sd, "se": sd / len(diffs) ** 0.5,
                        "p": sign_flip_p(diffs)})
    return out


def ablation_rows(out: Path, ablation: Path, settings: list[str], schedules: list[str], seeds: list[int],
                  rules: int | None = None) -> list[dict[str, Any]]:
    """An ablation against the grid: the cells under ``ablation`` (the same ``<setting>/<schedule>/seed<k>`` layout,
    run with one change, for example other GAE constants) beside the grid's cells under ``out``. One row per
    (setting, schedule) of the ablation, with its own stats (`grid_rows`) and, for every schedule the grid has in
    that setting, the paired difference ablation − grid cell, seed by seed within one version (``vs``: schedule →
    `paired`, None with fewer than two pairs): against its own schedule it is the change's effect, against GRPO
    and the others where it stands."""
    grid = grid_rows(out, settings, list(SCHEDULES), seeds, rules)
    rows = []
    for r in grid_rows(ablation, settings, schedules, seeds, rules):
        same = [g for g in grid if g["setting"] == r["setting"]]
        r["vs"] = {g["schedule"]: paired(_finals(r), _finals(g)) for g in same}
        r["grid_final"] = {g["schedule"]: g["final"] for g in same}
        rows.append(r)
    return rows


def write_ablation(ablation: Path, rows: list[dict[str, Any]]) -> Path:
    """``<ablation>/comparison.md`` and ``comparison.json`` from `ablation_rows`."""
    (ablation / "comparison.json").write_text(json.dumps(rows, indent=1))
    lines = [f"Ablation `{ablation.name}` against the grid, final held-out success paired by seed "
             "(ablation − grid cell; ± SE; seeds; sign-flip p):", "",
             "| setting | schedule | seeds | cue-blind bar | ablation base → final, mean ± sd (min-max) | "
             "seeds above the bar | against | grid cell's final | ablation − it |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f = r["final"]
        head = (f"| {r['setting']} | {r['schedule']} | {len(r['seeds'])} | {r['cue_blind_bar']:.3f} | "
                f"{r['base']['mean']:.3f} → {f['mean']:.3f} ± {f['sd']:.3f} ({f['min']:.3f}-{f['max']:.3f}) | "
                f"{r['above_bar']} of {len(r['seeds'])} |")
        others = sorted(r["vs"], key=lambda s: (s != r["schedule"], s))
        for i, s in enumerate(others):
            p, g = r["vs"][s], r["grid_final"][s]
            diff = "—" if p is None else f"{p['mean']:+.3f} ± {p['se']:.3f} ({len(p['seeds'])}; p = {p['p']:.2f})"
            lead = head if i == 0 else "| | | | | | |"
            lines.append(f"{lead} {s} | {g['mean']:.3f} ± {g['sd']:.3f} | {diff} |")
    (ablation / "comparison.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return ablation / "comparison.md"


def _versions(r: dict[str, Any]) -> str:
    return ", ".join(f"v{v}×{n}" for v, n in r.get("versions", {}).items())


def _vs_grpo(r: dict[str, Any], key: str = "vs_grpo") -> str:
    p = r.get(key)
    if r["schedule"] == "grpo" or p is None:
        return "—"
    return f"{p['mean']:+.3f} ± {p['se']:.3f} ({len(p['seeds'])}; p = {p['p']:.2f})"


def _above_vs_grpo(r: dict[str, Any], grpo: dict[str, Any] | None) -> str:
    if r["schedule"] == "grpo" or grpo is None:
        return "—"
    a, n_a, b, n_b = r["above_bar"], len(r["seeds"]), grpo["above_bar"], len(grpo["seeds"])
    return f"{a}/{n_a} vs {b}/{n_b} (p = {fisher_p(a, n_a, b, n_b):.2f})"


def collapse_line(r: dict[str, Any]) -> str:
    """One row of the entropy-collapse table (see `collapse_update`)."""
    cells = list(zip(r["per_seed"], r.get("collapse_update", [None] * len(r["per_seed"])), strict=True))
    per_seed = ", ".join(f"s{k}: {'—' if u is None else u} → {x:.3f}" for (k, _, x), u in cells)
    counts = []
    for collapsed in (True, False):
        finals = [x for (_, _, x), u in cells if (u is not None) == collapsed]
        counts.append(f"{sum(x > r['cue_blind_bar'] for x in finals)} of {len(finals)}")
    return f"| {r['setting']} | {r['schedule']} | {per_seed} | {counts[0]} | {counts[1]} |"


def write(out: Path, rows: list[dict[str, Any]], name: str = "creditchain-grid") -> Path:
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "table.json").write_text(json.dumps(rows, indent=1))
    lines = ["| setting | schedule | lr | seeds | cell versions | cue-blind bar | "
             "held-out base → final, mean ± sd (min-max) | gain | seeds above the bar | greedy final | "
             "final − GRPO's, paired by seed (± SE; seeds; sign-flip p) | seeds above the bar vs GRPO's (Fisher p) | "
             "CPU-min a cell |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    grpo = {r["setting"]: r for r in rows if r["schedule"] == "grpo"}
    for r in rows:
        f = r["final"]
        lines.append(
            f"| {r['setting']} | {r['schedule']} | {r['lr']} | {len(r['seeds'])} | {_versions(r)} | "
            f"{r['cue_blind_bar']:.3f} | "
            f"{r['base']['mean']:.3f} → {f['mean']:.3f} ± {f['sd']:.3f} ({f['min']:.3f}-{f['max']:.3f}) | "
            f"{r['gain']['mean']:+.3f} ± {r['gain']['sd']:.3f} | {r['above_bar']} of {len(r['seeds'])} | "
            f"{r['greedy_final']['mean']:.3f} | {_vs_grpo(r)} | {_above_vs_grpo(r, grpo.get(r['setting']))} | "
            f"{r['cpu_minutes']['mean']:.1f} |")
    contrasts = order_contrasts(rows)
    (folder / "contrasts.json").write_text(json.dumps(contrasts, indent=1))
    if contrasts:
        lines += ["", "The delay's effect on the lead over GRPO, paired by seed (`order_contrasts`):", "",
                  "| decisions first | decisions last | schedule | seeds | lead over GRPO, first | lead, last | "
                  "first − last (± SE) | sign-flip p |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {c['first']} | {c['last']} | {c['schedule']} | {len(c['seeds'])} | {c['lead_first']:+.3f} | "
                  f"{c['lead_last']:+.3f} | {c['mean']:+.3f} ± {c['se']:.3f} | {c['p']:.2f} |" for c in contrasts]
    lines += ["", f"Entropy collapse (`collapse_update`): the update at which train/entropy first fell below "
              f"{ENTROPY_FLOOR} nats a token, per seed (— never), with the seed's final success; then, of the seeds "
              "that collapsed and of the others, how many ended above the bar:", "",
              "| setting | schedule | per seed: collapsed at update → final | collapsed: above the bar | "
              "not collapsed: above the bar |", "|---|---|---|---|---|"]
    lines += [collapse_line(r) for r in rows]
    several = [r for r in rows if r["decisions"] > 1]
    if several:
        lines += ["", "Decisions right where M > 1 (success asks for all M; the held-out reward is the fraction "
                  "right, its cue-blind bar the best fraction a cue-blind reply gets):", "",
                  "| setting | schedule | seeds | cue-blind bar | held-out reward base → final, mean ± sd (min-max) | "
                  "seeds above the bar | final − GRPO's, paired by seed (± SE; seeds; sign-flip p) |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['setting']} | {r['schedule']} | {len(r['seeds'])} | {r['reward_bar']:.3f} | "
                  f"{r['reward_base']['mean']:.3f} → {r['reward_final']['mean']:.3f} ± {r['reward_final']['sd']:.3f} "
                  f"({r['reward_final']['min']:.3f}-{r['reward_final']['max']:.3f}) | "
                  f"{r['reward_above_bar']} of {len(r['seeds'])} | {_vs_grpo(r, 'reward_vs_grpo')} |"
                  for r in several]
    (folder / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    main = [r for r in rows if r["decisions"] == 1 and r["order"] == "decisions_first" and r["noise"] == 0.0]
    for s in dict.fromkeys(r["schedule"] for r in rows):
        line = sorted((r for r in main if r["schedule"] == s), key=lambda r: r["distractors"])
        if line:
            d = [r["distractors"] for r in line]
            ax.plot(d, [r["final"]["mean"] for r in line], "o-", color=COLORS.get(s, "k"), label=s)
            ax.fill_between(d, [r["final"]["min"] for r in line], [r["final"]["max"] for r in line],
                            color=COLORS.get(s, "k"), alpha=0.12)
        for r in rows:
            if r["schedule"] == s and r not in main:
                ax.plot([r["distractors"]], [r["final"]["mean"]], "x", color=COLORS.get(s, "k"), ms=8)
                ax.annotate(r["setting"].removeprefix("creditchain-"), (r["distractors"], r["final"]["mean"]),
                            fontsize=6, xytext=(3, 3), textcoords="offset points")
    bars = sorted({(r["distractors"], r["cue_blind_bar"]) for r in main})
    if bars:
        ax.plot([d for d, _ in bars], [b for _, b in bars], "k--", lw=1, label="cue-blind bar")
    ax.set_xlabel("D, distractor turns after the decision")
    ax.set_ylabel("final held-out success (32 games)")
    ax.set_title("CreditChain: final held-out success vs D (mean, min-max over seeds; x: other settings)")
    ax.title.set_fontsize(8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "success_vs_d.png", dpi=110)
    plt.close(fig)
    return folder


def smoke_cells(args: argparse.Namespace) -> None:
    """``--smoke``: the committed cells of one setting copied under ``--out``, the grid made of that setting only."""
    committed = ROOT / "benchmarks" / "results" / "learning"
    if args.out.resolve() == committed.resolve():
        raise SystemExit("credit_grid.py --smoke: give --out another folder (the committed results stay as they are)")
    source = committed / "creditchain-d0"
    for summary in source.glob("*/seed*/summary.json"):
        cell = args.out / "creditchain-d0" / summary.parent.relative_to(source)
        cell.mkdir(parents=True, exist_ok=True)
        for name in ("summary.json", "metrics.csv"):
            if (summary.parent / name).is_file():
                shutil.copyfile(summary.parent / name, cell / name)
    args.settings = ["creditchain-d0"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", nargs="+", default=["creditchain-d0", "creditchain", "creditchain-d8",
                                                     "creditchain-m3-d4", "creditchain-d8-last",
                                                     "creditchain-d4-n0.5"])
    p.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=SCHEDULES)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "learning")
    p.add_argument("--rules", type=int, default=None,
                   help="only the cells run under this version of learning_cells.CELL_RULES, written to "
                        "<out>/creditchain-grid-v<rules>/ (default: every cell, to <out>/creditchain-grid/)")
    p.add_argument("--power", nargs=2, type=float, metavar=("PA", "PB"),
                   help="print the seeds a cell needed to tell above-bar rates PA and PB apart, and stop")
    p.add_argument("--ablation", type=Path,
                   help="compare the cells under this folder (same layout, one change) with the grid's under --out, "
                        "seed by seed, and write <ablation>/comparison.md instead of the grid")
    p.add_argument("--smoke", action="store_true",
                   help="copy the committed creditchain-d0 cells into --out (give another folder) and tabulate them: "
                        "checks the script runs")
    args = p.parse_args(argv)
    if args.smoke:
        smoke_cells(args)
    if args.ablation:
        rows = ablation_rows(args.out, args.ablation, args.settings, args.schedules, args.seeds, args.rules)
        if not rows:
            print(f"[credit_grid] no finished cells under {args.ablation} for {args.settings}")
            return 1
        write_ablation(args.ablation, rows)
        return 0
    if args.power:
        pa, pb = args.power
        n = seeds_for_power(pa, pb)
        print(f"[credit_grid] above-bar rates {pa} vs {pb}: "
              + (f"{n} seeds a cell for 80 % power (Fisher exact, alpha 0.05); at 5 seeds the power is "
                 f"{fisher_power(pa, pb, 5):.2f}" if n else "more than 200 seeds a cell"))
        return 0
    rows = grid_rows(args.out, args.settings, args.schedules, args.seeds, args.rules)
    if not rows:
        print(f"[credit_grid] no finished cells under {args.out} for {args.settings}")
        return 1
    write(args.out, rows, "creditchain-grid" if args.rules is None else f"creditchain-grid-v{args.rules}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
