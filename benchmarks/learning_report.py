"""Curves and the table of the learning benchmark, from the finished cells' ``summary.json`` files.

Writes ``<out>/<env>/curves.png`` (held-out success, sampled and greedy, against generated training tokens: the
mean over seeds with the min-max spread shaded; training rollout success below, one line per seed),
``<out>/<env>/table.json`` and ``<out>/<env>/table.md`` (the rows docs/benchmarks.md quotes) and prints the table.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

COLORS = {"rtpo": "tab:red", "turn_ppo": "tab:blue", "grpo": "tab:green", "token_ppo": "tab:purple"}
SEED_STYLES = ["-", "--", ":", "-."]


def load(out: Path, env: str, schedules: list[str], seeds: list[int]) -> dict[str, list[dict[str, Any]]]:
    cells: dict[str, list[dict[str, Any]]] = {}
    for s in schedules:
        for k in seeds:
            f = out / env / s / f"seed{k}" / "summary.json"
            if f.exists():
                cells.setdefault(s, []).append(json.loads(f.read_text()))
    return cells


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def tokens_to_target(cell: dict[str, Any], target: float) -> int | None:
    return next((e["tokens"] for e in cell["evals"] if e["success"] >= target), None)


def train_tokens_to_target(cell: dict[str, Any], target: float, window: int = 3) -> int | None:
    """Tokens at the first step whose training rollout success, averaged over it and the ``window - 1`` steps
    before, reaches ``target``: finer-grained than the held-out evaluations, which are far apart."""
    ys = [t["success"] or 0.0 for t in cell["train"]]
    for k in range(window - 1, len(ys)):
        if statistics.fmean(ys[k - window + 1 : k + 1]) >= target:
            return int(cell["train"][k]["tokens"])
    return None


def row(schedule: str, cells: list[dict[str, Any]], target: float) -> dict[str, Any]:
    base = [c["evals"][0]["success"] for c in cells]
    final = [c["evals"][-1]["success"] for c in cells]
    greedy = [c["evals"][-1]["greedy_success"] for c in cells]
    gain = [f - b for f, b in zip(final, base, strict=True)]
    minutes = [c["wall_seconds"] / 60 for c in cells]
    cpu_minutes = [c["cpu_seconds"] / 60 for c in cells]
    reached = [tokens_to_target(c, target) for c in cells]
    return {
        "schedule": schedule, "seeds": [c["seed"] for c in cells],
        "base_success": _mean_sd(base), "final_success": _mean_sd(final), "final_greedy_success": _mean_sd(greedy),
        "gain": _mean_sd(gain), "final_per_seed": final,
        "generated_tokens": statistics.fmean(c["generated_tokens"] for c in cells),
        "steps": statistics.fmean(c["steps"] for c in cells),
        "wall_minutes": _mean_sd(minutes),
        "cpu_minutes": _mean_sd(cpu_minutes),
        "gain_per_cpu_minute": statistics.fmean(g / m for g, m in zip(gain, cpu_minutes, strict=True)),
        "gain_per_1k_tokens": statistics.fmean(1000 * g / c["generated_tokens"] for g, c in zip(gain, cells,
                                                                                                 strict=True)),
        "tokens_to_target": reached, "target": target,
        "train_tokens_to_target": [train_tokens_to_target(c, target) for c in cells],
    }


def _band(ax: Any, cells: list[dict[str, Any]], key: str, color: str, label: str, style: str) -> None:
    # seeds stop at slightly different token counts: align the k-th evaluation of every seed
    n = min(len(c["evals"]) for c in cells)
    xs = [statistics.fmean(c["evals"][i]["tokens"] for c in cells) for i in range(n)]
    ys = [[c["evals"][i][key] for c in cells] for i in range(n)]
    ax.plot(xs, [statistics.fmean(y) for y in ys], style, color=color, label=label)
    ax.fill_between(xs, [min(y) for y in ys], [max(y) for y in ys], color=color, alpha=0.15)


def report(out: Path, env: str, schedules: list[str], seeds: list[int], target: float) -> list[dict[str, Any]]:
    cells = load(out, env, schedules, seeds)
    if not cells:
        print(f"[learning] {env}: no finished cells yet")
        return []
    rows = [row(s, cells[s], target) for s in schedules if s in cells]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 8), sharex=True)
    for s, cs in cells.items():
        _band(top, cs, "success", COLORS.get(s, "k"), f"{s} sampled ({len(cs)} seeds)", "o-")
        _band(top, cs, "greedy_success", COLORS.get(s, "k"), f"{s} greedy", "s--")
        for i, c in enumerate(cs):  # one line per seed (own dash), a running mean over 3 steps: raw steps are 8 games
            ys = [t["success"] or 0.0 for t in c["train"]]
            smooth = [statistics.fmean(ys[max(0, k - 2):k + 1]) for k in range(len(ys))]
            bottom.plot([t["tokens"] for t in c["train"]], smooth, SEED_STYLES[i % len(SEED_STYLES)],
                        color=COLORS.get(s, "k"), alpha=0.7, label=f"{s} seed {c['seed']}")
    top.set_ylabel("held-out success (32 games)")
    top.set_title(f"{env}: held-out success vs generated training tokens (mean, min-max over seeds)")
    top.legend(fontsize=7, ncol=2)
    bottom.set_ylabel("training rollout success (running mean of 3 steps)")
    bottom.set_xlabel("generated training tokens")
    bottom.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    (out / env).mkdir(parents=True, exist_ok=True)
    fig.savefig(out / env / "curves.png", dpi=110)
    plt.close(fig)
    (out / env / "table.json").write_text(json.dumps(rows, indent=1))
    lines = ["| schedule | seeds | held-out success: base → final (mean ± sd) | greedy final | gain | "
             f"tokens to {target:.0%} (per seed) | training tokens to {target:.0%} (per seed) | steps | wall min | "
             "CPU-min | gain / CPU-min | gain / 1k tokens |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        reach = ", ".join("—" if t is None else f"{t:,}" for t in r["tokens_to_target"])
        train_reach = ", ".join("—" if t is None else f"{t:,}" for t in r["train_tokens_to_target"])
        lines.append(
            f"| {r['schedule']} | {len(r['seeds'])} | {r['base_success'][0]:.3f} → {r['final_success'][0]:.3f} ± "
            f"{r['final_success'][1]:.3f} | {r['final_greedy_success'][0]:.3f} ± {r['final_greedy_success'][1]:.3f} | "
            f"{r['gain'][0]:+.3f} ± {r['gain'][1]:.3f} | {reach} | {train_reach} | {r['steps']:.1f} | "
            f"{r['wall_minutes'][0]:.1f} | {r['cpu_minutes'][0]:.1f} | "
            f"{r['gain_per_cpu_minute']:+.4f} | {r['gain_per_1k_tokens']:+.4f} |")
    (out / env / "table.md").write_text("\n".join(lines) + "\n")
    print(f"[learning] {env}:\n" + "\n".join(lines), flush=True)
    return rows
