"""The learning-rate protocol of the learning benchmark: one small sweep per (environment, schedule), chosen on
training rollouts, never on the held-out games the benchmark reports.

Protocol (issue 26; docs/benchmarks.md "Learning-rate protocol"):

* For each environment and schedule, the policy learning rate is swept over ``--lrs`` (by default 5e-6, 1e-5,
  2e-5; RTPO 1e-5, 2e-5, 4e-5, see `SCHEDULE_LRS`) on the *sweep seeds* (by default seed 10, never one of the
  reported cells' seeds 0-2). The critic's learning rate stays at the environment config's value (5e-5): the
  sweep is over the policy's step only.
* A sweep cell is an ordinary cell of `benchmarks/learning.py` at that learning rate, to the same generated-token
  budget, with the held-out evaluation switched off (``data.eval_episodes 0``): the held-out games are not looked
  at while choosing.
* Score of a cell: the mean training-rollout success over the steps in the second half of the token budget
  (tokens sampled > budget / 2) — where a learning rate has had time to help or to hurt. A step's success is over
  **every episode it generated** (``rollout/generated_success``: for RTPO its trunks and all its siblings; for the
  other schedules, whose episodes are all rollouts, ``rollout/success``). Why: a GuessNumber RTPO sweep scored
  on trunks only saw 6 late trunk games a cell, none won at any rate (0.000 at 1e-5, 2e-5, 4e-5), while its
  sibling returns rose at 4e-5; a score that sees 6 games of a schedule and 30-60 of another is not one protocol.
  The FrozenLake and GuessNumber sweeps were made under the trunk score and are not re-made (their RTPO summaries
  hold no pooled figure, and the score falls back to trunks there). Score of a learning rate: the mean over the
  sweep seeds, with its standard error over those late steps (all seeds' pooled: the sample standard deviation over
  the square root of their number).
* The choice: the **smallest learning rate whose score is within one standard error of the best score** (the
  one-standard-error rule of model selection; a tie within 1e-9 counts as within). Why, from the sweep's own
  resolution: a FrozenLake score rests on 4-6 late steps of 4 episodes (standard error 0.08-0.13), so
  RTPO's 0.792 at 4e-5 against 0.750 at 2e-5 is not a difference the sweep can see, and "the best score" picked
  the larger, riskier step on noise. Where the scores are resolved (GRPO: 0.986 ± 0.014 against 0.970 and 0.941)
  the rule picks the best, as before.
* The standard error has a **binomial floor** (`score_error`): never below that of a success rate measured on the
  late steps' episodes, ``sqrt(p~(1-p~)/n)`` with Laplace's ``p~ = (successes + 1) / (n + 2)``. Without it a perfect
  score has a standard error of 0 and a zero-width window: FrozenLake token-PPO's 1.000 at 2e-5 (14 steps of 8
  games) beat 0.994 at 5e-6 (one game lost in 176). With it the window is 0.009 and 5e-6 is chosen. It applies to
  every sweep (when it was adopted, FrozenLake's choices were re-made: only token-PPO's changed, 2e-5 -> 5e-6).
* The reported cells (`learning.py --lr-from-sweep`) then run at the chosen learning rate, which each cell's
  ``summary.json`` records.

Sweep cells live in ``<out>/sweep/<env>/<schedule>/lr<lr>/seed<k>/``; ``<out>/sweep/<env>/chosen.json`` and
``sweep.md`` hold the scores and the choice.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

DEFAULT_LRS = (5.0e-6, 1.0e-5, 2.0e-5)
SCHEDULE_LRS = {"rtpo": (1.0e-5, 2.0e-5, 4.0e-5), "rtpo_fair": (5.0e-6, 1.0e-5, 2.0e-5, 4.0e-5),
                "token_ppo_credit": (5.0e-6, 1.0e-5, 2.0e-5, 4.0e-5), "turn_ppo_v0": (5.0e-6, 1.0e-5, 2.0e-5, 4.0e-5),
                "grpo_credit": (2.5e-6, 5.0e-6, 1.0e-5, 2.0e-5, 4.0e-5),
                "rtpo_credit": (5.0e-6, 1.0e-5, 2.0e-5, 4.0e-5)}
"""Grids other than the default, with the reason. RTPO: its config sizes each optimizer step by the informative
samples behind it (``ppo.lr_reference_samples: 16``), a factor taken per minibatch. The grid was doubled on the
assumption that this factor halves an RTPO step; it does not: a learning-config minibatch holds four siblings, so
the factor is at most 4/16 = 0.25, and folding identical replies keeps it lower (the grid's cells logged a
``train/lr_scale`` of about 0.12). The doubled grid's effective rates are therefore still below the default grid's:
a wider search, not the same steps in weight space, and its chosen rate sat at the grid's top edge. ``rtpo_fair``
(RTPO's fair run: no factor, K <= 3, two trunks a task) takes every step at the configured rate: the default grid,
on two sweep seeds (10, 11), widened to 4e-5 when its choice landed on the default grid's top edge
(docs/benchmarks-log.md, "RTPO's fair run"). The credit test's secondary arms (``token_ppo_credit``,
``turn_ppo_v0``, ``grpo_credit``, ``rtpo_credit``, swept on ``creditturn-fb``): the default grid and 4e-5 from the
start, since the primary arms run at 2e-5, the default grid's top, and the grid's choices landed on its edges;
a choice still on an edge widens that arm's grid here (its existing cells are kept): ``grpo_credit``'s landed on
the bottom edge, hence 2.5e-6 (docs/benchmarks-log.md, "The secondary sweep"). Each grid is written here, not
given with ``--lrs``, so that sweeping one arm again scores the others on their full grids."""

SWEEP_SEEDS = (10,)
NO_EVAL = {"eval_episodes": 0, "eval_every_tokens": 0, "eval_every": 0, "eval_greedy": False}


def sweep_lrs(schedule: str, given: Sequence[float] | None = None) -> tuple[float, ...]:
    """The learning rates swept for ``schedule``: ``given`` (``--lrs`` with values), else its grid."""
    return tuple(given) if given else SCHEDULE_LRS.get(schedule, DEFAULT_LRS)


def lr_name(lr: float) -> str:
    return f"lr{lr:g}"


def sweep_dir(out: Path, env: str, schedule: str, lr: float, seed: int) -> Path:
    return out / "sweep" / env / schedule / lr_name(lr) / f"seed{seed}"


def _late_steps(summary: dict[str, Any], budget: int) -> list[dict[str, Any]]:
    late = [s for s in summary["train"] if s["tokens"] > budget / 2 and s["success"] is not None]
    return late or [summary["train"][-1]]  # a run whose first step already passed half the budget: its last step


def _pooled(step: dict[str, Any]) -> bool:
    """Whether the step recorded the success of every episode it generated (RTPO's siblings with its trunks);
    where it did not (every other schedule's steps, whose episodes are all rollouts, and the RTPO cells made before
    the pooled score), its rollout success is that figure."""
    return step.get("generated_success") is not None and step.get("generated_episodes") is not None


def late_successes(summary: dict[str, Any], budget: int) -> list[float]:
    """Success over every episode generated by each step that ended past half the token budget."""
    return [(s["generated_success"] if _pooled(s) else s["success"]) or 0.0 for s in _late_steps(summary, budget)]


def late_episodes(summary: dict[str, Any], budget: int, cell: str = "cell") -> int:
    """Episodes played by those steps (each step's ``generated_episodes`` where recorded, else ``episodes``: its
    ``rollout/episodes``)."""
    steps = _late_steps(summary, budget)
    if any(s.get("episodes") is None for s in steps):
        raise ValueError(f"{cell}: a step has no 'episodes' (benchmarks/learning.py writes each step's "
                         "rollout/episodes since 2026-12-02; rerun the cell)")
    return int(sum(s["generated_episodes"] if _pooled(s) else s["episodes"] for s in steps))


def cell_score(summary: dict[str, Any], budget: int) -> float:
    """Mean training-rollout success (every generated episode's) over the steps that ended past half the budget."""
    return statistics.fmean(late_successes(summary, budget))


def standard_error(values: list[float]) -> float:
    """Sample standard deviation over sqrt(n); 0 for fewer than two values (nothing to say it is uncertain)."""
    return statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0


def binomial_floor(score: float, episodes: int) -> float:
    """Standard error of a success rate ``score`` over ``episodes`` games, with Laplace's estimate
    ``(successes + 1) / (episodes + 2)`` so that a perfect (or null) score still has a width."""
    if episodes <= 0:
        return 0.0
    p = (score * episodes + 1.0) / (episodes + 2.0)
    return math.sqrt(p * (1.0 - p) / episodes)


def score_error(late: list[float], episodes: int) -> float:
    """A score's standard error: over its late steps, never below the binomial floor of its episodes."""
    return max(standard_error(late), binomial_floor(statistics.fmean(late), episodes))


def choose(scores: dict[float, float], errors: dict[float, float] | None = None) -> float:
    """The smallest learning rate whose score is within one standard error (``errors``, of the best score's
    learning rate; none given: 0) of the best score; exact ties go to the smaller rate too."""
    best_lr = max(scores, key=lambda lr: (scores[lr], -lr))
    bar = scores[best_lr] - (errors or {}).get(best_lr, 0.0) - 1e-9
    return min(lr for lr, s in scores.items() if s >= bar)


def swept_seeds(out: Path, env: str, schedule: str) -> set[int]:
    """The seeds at which ``schedule`` has a finished sweep cell of any rate on disk."""
    names = (f.parent.name.removeprefix("seed")
             for f in (out / "sweep" / env / schedule).glob("lr*/seed*/summary.json"))
    return {int(k) for k in names if k.isdigit()}


def report_sweep(out: Path, env: str, schedules: list[str], grid: Mapping[str, Sequence[float]], seeds: list[int],
                 budget: int, asked: Collection[str] | None = None) -> dict[str, Any]:
    """Score the finished sweep cells, choose a learning rate per schedule, write chosen.json and sweep.md.
    ``grid``: each schedule's swept learning rates (its choice needs every cell of its own grid; the table's
    columns are all the grids' rates). ``seeds``: the seeds asked for the schedules in ``asked`` (None: all of
    them); each schedule is scored over those (if asked) and every seed it has a cell at on disk (`swept_seeds`),
    and recorded with them in chosen.json.

    Why the disk: one runner per sweep seed used to end each cell by rewriting chosen.json as chosen on its own
    seed, replacing the choice pooled over both that a run with ``--lr-from-sweep`` reads. Why per schedule: a
    schedule swept at an extra seed (a runner given ``--schedules token_ppo --seeds 12``) must not leave the
    others unchosen for lacking cells they were never meant to have. A schedule whose grid lacks a cell at any of
    its own seeds has no choice until its cells are all in."""
    lrs = sorted({lr for s in schedules for lr in grid[s]})
    own = {s: sorted((set(seeds) if asked is None or s in asked else set()) | swept_seeds(out, env, s))
           for s in schedules}
    shown = sorted({k for s in schedules for k in own[s]})
    chosen: dict[str, Any] = {}
    lines = [f"# Learning-rate sweep: {env} (policy lr; score = mean training-rollout success over the steps past "
             f"{budget // 2} of {budget} tokens ± its standard error over those steps, floored at the binomial one of "
             "their episodes; "
             f"seeds {', '.join(map(str, shown))}"
             + ("" if all(own[s] == shown for s in schedules) else " (each schedule over its own seeds on disk)")
             + "; "
             "chosen: the smallest lr within one standard error of the best; held-out games not played)", "",
             "| schedule | " + " | ".join(lr_name(lr) for lr in lrs) + " | chosen |",
             "|---|" + "---|" * (len(lrs) + 1)]
    for schedule in schedules:
        per_lr: dict[float, list[float]] = {}
        late: dict[float, list[float]] = {}
        episodes: dict[float, int] = {}
        for lr in grid[schedule]:
            for seed in own[schedule]:
                f = sweep_dir(out, env, schedule, lr, seed) / "summary.json"
                if f.exists():
                    summary = json.loads(f.read_text())
                    per_lr.setdefault(lr, []).append(cell_score(summary, budget))
                    late.setdefault(lr, []).extend(late_successes(summary, budget))
                    episodes[lr] = episodes.get(lr, 0) + late_episodes(summary, budget, str(f))
        complete = {lr: statistics.fmean(v) for lr, v in per_lr.items() if len(v) == len(own[schedule])}
        errors = {lr: score_error(late[lr], episodes[lr]) for lr in complete}
        cells = " | ".join(f"{complete[lr]:.3f} ± {errors[lr]:.3f}" if lr in complete else "—" for lr in lrs)
        if len(complete) == len(grid[schedule]):
            lr = choose(complete, errors)
            chosen[schedule] = {"lr": lr, "scores": {lr_name(k): v for k, v in complete.items()},
                                "standard_errors": {lr_name(k): v for k, v in errors.items()}, "seeds": own[schedule],
                                "rule": "smallest lr within one standard error (binomial floor) of the best score"}
            edge = " (top of its grid)" if lr == max(grid[schedule]) and len(grid[schedule]) > 1 else ""
            if edge:  # the protocol does not widen a grid; say so where a choice may lie beyond it
                chosen[schedule]["at_grid_edge"] = True
            lines.append(f"| {schedule} | {cells} | {lr:g}{edge} |")
        else:
            lines.append(f"| {schedule} | {cells} | (sweep unfinished) |")
    folder = out / "sweep" / env
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "chosen.json").write_text(json.dumps(chosen, indent=1))
    (folder / "sweep.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return chosen


def chosen_lr(out: Path, env: str, schedule: str) -> float:
    """The learning rate the sweep chose for (env, schedule); a clear error when the sweep has not chosen one."""
    f = out / "sweep" / env / "chosen.json"
    chosen = json.loads(f.read_text()) if f.exists() else {}
    if schedule not in chosen:
        raise SystemExit(f"--lr-from-sweep: no learning rate chosen for {env}/{schedule} in {f}; run the sweep "
                         f"first: python benchmarks/learning.py --env {env} --schedules {schedule} --lrs ...")
    return float(chosen[schedule]["lr"])
