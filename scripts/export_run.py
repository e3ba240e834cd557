"""Export an MLflow run's metrics and reward curve into a folder (to commit a training result).

Usage::

    python scripts/export_run.py --experiment agentrl-rtpo --out benchmarks/results/rtpo_main_job
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from mlflow import MlflowClient

KEYS = ("rollout/reward", "rollout/success", "eval/reward", "eval/success", "perf/step_seconds",
        "perf/generated_tokens", "train/approx_kl", "train/clipfrac", "train/entropy", "rollout/length_finish")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--command", default="", help="the command that produced the run, stored with it")
    args = parser.parse_args()
    client = MlflowClient(args.tracking_uri)
    exp = client.get_experiment_by_name(args.experiment)
    if exp is None:
        raise SystemExit(f"no experiment named {args.experiment!r} in {args.tracking_uri}")
    run = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"], max_results=1)[0]
    rid = run.info.run_id
    history = {k: sorted((m.step, m.value) for m in client.get_metric_history(rid, k)) for k in KEYS}
    args.out.mkdir(parents=True, exist_ok=True)
    steps = sorted({s for h in history.values() for s, _ in h})
    with open(args.out / "metrics.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", *KEYS])
        for step in steps:
            writer.writerow([step, *(dict(history[k]).get(step, "") for k in KEYS)])
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for key, style in (("rollout/reward", "-"), ("rollout/success", ":"), ("eval/success", "o--")):
        h = history[key]
        if h:
            ax.plot([s for s, _ in h], [v for _, v in h], style, label=key)
    ax.set_xlabel("step")
    ax.set_title(args.experiment)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "reward_curve.png", dpi=120)
    duration = (run.info.end_time or run.info.start_time) - run.info.start_time
    summary = {"run_id": rid, "experiment": args.experiment, "command": args.command,
               "wall_seconds": duration / 1000, "final": {k: h[-1][1] for k, h in history.items() if h},
               "first": {k: h[0][1] for k, h in history.items() if h}}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
