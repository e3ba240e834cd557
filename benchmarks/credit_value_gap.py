"""Does a critic read a decision's outcome? V(s_{n+1}) after a right and after a wrong CreditChain decision.

Turn-level bootstrapped credit (Turn-PPO at λ < 1) can only beat the Monte Carlo return if the critic's value of
the state after a decision, V(s_{n+1}), moves with whether the decision was right. On the credit test's setting a
right decision adds 1/M of the return, so a critic that knows the outcome puts V(s_{n+1} | right) − V(s_{n+1} |
wrong) at 1/M (0.333 at M = 3); one that cannot see it puts it near 0. With feedback on, the observation after a
decision says "Last answer: right." or "... wrong.", so the gap measures whether the critic has learned to read it.

The figures come from a run's MLflow traces: the trajectory logger writes every logged step's training episodes
with each turn's credit (``agentrl.credit.value`` = V(s_n), the critic's value before the update). Each decision
turn is judged right or wrong as the environment scores it (`CreditChainEnv.judge`: its cue → colour rule, the
config's ``rule_seed``; a reply naming no colour is not a decision and is left out); the value read is the next
turn's. Per run, the gap over the first and the second half of the logged steps, each with its
standard error (two independent means; turns of one episode are not independent, so read it as a guide).

Beside the gap, `credit_signal` reads what the update did with it: the correlation, over the traced decisions, of
the advantage the loss used (``agentrl.credit.advantage_used``) with the decision being right, and the decision
turns' share of the summed |advantage|. A critic can read outcomes and still leave the decisions little of the
update (λ^(4−t) of the terminal reward at λ < 1), or the update can follow outcomes with no such critic (λ = 1).

Example (the credit test's cells write their runs to the worktree's ``mlflow.db``)::

    python benchmarks/credit_value_gap.py --tracking-uri sqlite:///mlflow.db \\
        --runs creditturn-fb-turn_ppo_lam1-seed0 creditturn-fb-turn_ppo_lam05-seed0 --json gap.json
    python benchmarks/credit_value_gap.py --smoke --json gap.json     # a 2-step tiny-random run, then its gap
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "learning" / "creditturn.yaml"
CUE = re.compile(r"Cue: (\w+)")


@dataclass(frozen=True)
class Turn:
    """One traced turn: its index, the cue it showed (None for a distractor), the reply, V(s_n) and its advantage."""

    index: int
    cue: str | None
    reply: str
    value: float
    advantage: float | None = None  # the advantage the loss used on this turn (after whitening), when traced


Judge = Callable[[str, str], "bool | None"]


def env_judge(config: Path = CONFIG) -> Judge:
    """How the config's CreditChain environment scores a reply to a cue (`CreditChainEnv.judge`)."""
    from agentrl.envs import CreditChainEnv

    args = yaml.safe_load(config.read_text())["data"]["agent"]["init_args"]["env"]["init_args"]
    return CreditChainEnv(**args).judge


def value_gap(episodes: Sequence[tuple[int, Sequence[Turn]]], judge: Judge, split: int) -> dict[str, Any]:
    """Per half (steps < ``split`` and ≥ it): the mean V(s_{n+1}) after right and after wrong decisions, their
    counts, the gap and its standard error (None where either side has fewer than two turns). A reply that names no
    option is not a decision made (the environment asks again) and is left out."""
    sides: dict[str, tuple[list[float], list[float]]] = {"early": ([], []), "late": ([], [])}
    for step, turns in episodes:
        by_index = {t.index: t for t in turns}
        right, wrong = sides["early" if step < split else "late"]
        for t in turns:
            after = by_index.get(t.index + 1)
            if t.cue is None or after is None:
                continue
            verdict = judge(t.cue, t.reply)
            if verdict is not None:
                (right if verdict else wrong).append(after.value)
    out: dict[str, Any] = {}
    for half, (right, wrong) in sides.items():
        row: dict[str, Any] = {"n_right": len(right), "n_wrong": len(wrong), "v_right": None, "v_wrong": None,
                               "gap": None, "se": None}
        if len(right) > 1 and len(wrong) > 1:
            row["v_right"], row["v_wrong"] = statistics.fmean(right), statistics.fmean(wrong)
            row["gap"] = row["v_right"] - row["v_wrong"]
            row["se"] = (statistics.variance(right) / len(right) + statistics.variance(wrong) / len(wrong)) ** 0.5
        out[half] = row
    return out


def credit_signal(episodes: Sequence[tuple[int, Sequence[Turn]]], judge: Judge, split: int) -> dict[str, Any]:
    """Per half, what the update's credit said about the decisions: ``corr_within_cue``, the correlation of the
    advantage each decision was trained with and whether it was right (1) or wrong (0), both taken less their cue's
    mean in the half — does a right reply to a cue get more than a wrong reply to the same cue, whatever the scale
    after whitening (a baseline that moves every reply to a cue alike, V(s_n) of the cue's state, has no expected
    effect on the policy and is left out this way), with a large-sample SE (1 − r²)/√(n − 1); ``corr``, the same
    without the centring (the baseline's part left in); the mean advantage of right and of wrong decisions;
    and ``decision_share``, the decision turns' (a cue shown) share of the summed |advantage| over every traced turn
    (the distractors, and a format error's repeat, take the rest). A figure is None where its half has too few
    turns (fewer than two right or two wrong decisions, or no spread)."""
    halves: dict[str, dict[str, list[float]]] = {h: {"adv": [], "right": [], "cue": [], "all": []}
                                                 for h in ("early", "late")}
    cues: dict[str, list[str]] = {"early": [], "late": []}  # the cue of each decision in "adv"
    for step, turns in episodes:
        name = "early" if step < split else "late"
        half = halves[name]
        for t in turns:
            if t.advantage is None:
                continue
            half["all"].append(abs(t.advantage))
            if t.cue is None:
                continue
            half["cue"].append(abs(t.advantage))
            verdict = judge(t.cue, t.reply)
            if verdict is not None:
                half["adv"].append(t.advantage)
                half["right"].append(1.0 if verdict else 0.0)
                cues[name].append(t.cue)
    out: dict[str, Any] = {}
    for name, h in halves.items():
        n_right = int(sum(h["right"]))
        n_wrong = len(h["right"]) - n_right
        share = sum(h["cue"]) / sum(h["all"]) if sum(h["all"]) else None
        row: dict[str, Any] = {"n_right": n_right, "n_wrong": n_wrong, "a_right": None, "a_wrong": None,
                               "corr": None, "corr_within_cue": None, "corr_se": None,
                               "decision_share": share}
        if n_right > 1 and n_wrong > 1:
            row["a_right"] = statistics.fmean(a for a, r in zip(h["adv"], h["right"], strict=True) if r)
            row["a_wrong"] = statistics.fmean(a for a, r in zip(h["adv"], h["right"], strict=True) if not r)
            if statistics.pstdev(h["adv"]) > 0:
                row["corr"] = statistics.correlation(h["adv"], h["right"])
            adv, right = _within(h["adv"], cues[name]), _within(h["right"], cues[name])
            if statistics.pstdev(adv) > 0 and statistics.pstdev(right) > 0:
                row["corr_within_cue"] = r = statistics.correlation(adv, right)
                row["corr_se"] = (1 - r * r) / (len(adv) - 1) ** 0.5  # large-sample; a guide, as the gap's
        out[name] = row
    return out


def _within(values: Sequence[float], groups: Sequence[str]) -> list[float]:
    """Each value less the mean of its group's values."""
    by: dict[str, list[float]] = {}
    for v, g in zip(values, groups, strict=True):
        by.setdefault(g, []).append(v)
    means = {g: statistics.fmean(vs) for g, vs in by.items()}
    return [v - means[g] for v, g in zip(values, groups, strict=True)]


def _json_field(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def traced_episodes(client: Any, run: Any) -> list[tuple[int, list[Turn]]]:
    """The run's traced training episodes: (step, turns with a critic value), eval episodes left out."""
    traces = client.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id, max_results=10_000)
    episodes = []
    for trace in traces:
        if trace.info.tags.get("agentrl.phase") != "train":
            continue
        root = next(s for s in trace.data.spans if s.parent_id is None)
        turns = []
        for span in trace.data.spans:
            a = span.attributes
            if not span.name.startswith("turn ") or "agentrl.credit.value" not in a:
                continue
            cue = CUE.search(_json_field(span.inputs)["messages"][-1]["content"])
            reply = _json_field(span.outputs)["choices"][0]["message"]["content"]
            used = a.get("agentrl.credit.advantage_used")
            turns.append(Turn(int(span.name[5:]), cue.group(1) if cue else None, reply,
                              float(a["agentrl.credit.value"]), None if used is None else float(used)))
        if turns:
            episodes.append((int(root.attributes["step"]), turns))
    return episodes


def measure(tracking_uris: Sequence[str], names: Sequence[str], judge: Judge) -> dict[str, Any]:
    """Per run name (the latest run of that name that ended, over all the stores): its gap by half, split at the
    middle of its logged steps."""
    from mlflow import MlflowClient

    out: dict[str, Any] = {}
    for name in names:
        found = []
        for uri in tracking_uris:
            client = MlflowClient(uri)
            experiments = [e.experiment_id for e in client.search_experiments()]
            # a run killed with its machine stays RUNNING: only runs that ended
            found += [(run.info.start_time, uri, client, run) for run in client.search_runs(
                experiments, filter_string=f"attributes.run_name = '{name}' and attributes.status != 'RUNNING'",
                order_by=["attributes.start_time DESC"], max_results=1)]
        if not found:
            raise SystemExit(f"no ended run named {name!r} in {', '.join(tracking_uris)}")
        _, uri, client, run = max(found, key=lambda f: f[0])
        episodes = traced_episodes(client, run)
        steps = sorted({s for s, _ in episodes})
        split = steps[len(steps) // 2] if steps else 0
        out[name] = {"tracking_uri": uri, "run_id": run.info.run_id, "episodes": len(episodes),
                     "split_step": split, **value_gap(episodes, judge, split),
                     "credit": credit_signal(episodes, judge, split)}
    return out


def smoke(folder: Path) -> str:
    """A 2-step Turn-PPO run of the credit test's setting (feedback on, 2 tasks x 2 episodes a step) on the tiny
    random model, every step traced."""
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    overrides = {
        "trainer": {"logger": {"class_path": "agentrl.tracking.MLflowLogger",
                               "init_args": {"experiment_name": "smoke", "tracking_uri": uri, "run_name": "smoke"}}},
        "checkpoint": {"dirpath": str(folder / "checkpoints")},
        "tracking": {"every_n_steps": 1, "log_final_model": False},
        "model": {"policy": {"init_args": {"model": "tiny-random"}},
                  "algorithm": {"init_args": {"value_warmup_epochs": 1}}},
        "data": {"steps": 2, "batch_size": 4, "max_generated_tokens": None, "eval_episodes": 0, "eval_every_tokens": 0,
                 "eval_greedy": False, "agent": {"init_args": {"env": {"init_args": {"feedback": True}}}}},
    }
    (folder / "smoke.json").write_text(json.dumps(overrides))
    arm = ROOT / "configs" / "learning" / "schedules" / "turn_ppo_lam1.yaml"
    cmd = [sys.executable, "-m", "agentrl", "fit", "--config", str(CONFIG), "--config", str(arm), "--config",
           str(folder / "smoke.json")]
    subprocess.run(cmd, cwd=folder, check=True)
    return uri


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tracking-uri", nargs="+", default=[f"sqlite:///{ROOT / 'mlflow.db'}"],
                   help="one or more MLflow stores (two runners may write two)")
    p.add_argument("--runs", nargs="*", default=[], help="MLflow run names (e.g. creditturn-fb-turn_ppo_lam1-seed0)")
    p.add_argument("--config", type=Path, default=CONFIG, help="the environment config whose rule judges decisions")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--smoke", action="store_true", help="make a 2-step tiny-random run in a temporary folder first")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        uris, names = ([smoke(Path(tmp))], ["smoke"]) if args.smoke else (args.tracking_uri, args.runs)
        res = measure(uris, names, env_judge(args.config))
    for name, row in res.items():
        parts = [f"{half}: {r['gap']:+.3f} ± {r['se']:.3f} (V {r['v_right']:.3f} after {r['n_right']} right, "
                 f"{r['v_wrong']:.3f} after {r['n_wrong']} wrong)" if r["gap"] is not None else
                 f"{half}: too few turns ({r['n_right']} right, {r['n_wrong']} wrong)"
                 for half in ("early", "late") for r in [row[half]]]
        print(f"{name} ({row['episodes']} episodes, split at step {row['split_step']}): " + "; ".join(parts))
        credit = [f"{half}: within-cue corr {c['corr_within_cue']:+.3f} ± {c['corr_se']:.3f} (raw {c['corr']:+.3f}), "
                  f"decisions' share of |A| {c['decision_share']:.0%}"
                  if c["corr_within_cue"] is not None and c["corr"] is not None else f"{half}: too few decisions"
                  for half in ("early", "late") for c in [row["credit"][half]]]
        print("  credit on decisions (advantage used against right = 1 / wrong = 0): " + "; ".join(credit))
    if args.json is not None:
        args.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
