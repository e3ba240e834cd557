"""What one training step costs each algorithm in generated tokens, on the same tasks.

RTPO spends rollouts on siblings at every turn depth, GRPO on whole episodes per group member, Turn-PPO on one
episode per task plus a critic. ``perf/generated_tokens`` counts sampled tokens only (replayed turns are free), and
this script reports it, with the step time, for each schedule on the same tasks per step — the basis for comparing
learning curves at equal generation budgets.

Usage::

    python benchmarks/generation_cost.py [--tasks 4 --steps 1 --model smollm2-135m-instruct]
    python benchmarks/generation_cost.py --smoke --out /tmp/gc     # tiny random model, seconds: does it run
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from agentrl.agents.env_agent import EnvAgent
from agentrl.engines.base import SamplingParams
from agentrl.envs import GuessNumberEnv
from agentrl.models.policy import Policy
from agentrl.models.precision import cpu_identity
from agentrl.training.rollout.datamodule import RolloutDataModule
from agentrl.training.schedules.base import Schedule
from agentrl.training.schedules.grpo import GRPO
from agentrl.training.schedules.rtpo import RTPO
from agentrl.training.schedules.token_ppo import TokenPPO
from agentrl.training.schedules.turn_ppo import TurnPPO
from agentrl.training.system.module import AgentRLModule


class Probe(pl.Callback):
    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """The step's own metrics (`AgentRLModule.last_metrics`); the rollout seconds from its tokens and rate,
        the rest of the step (scoring and the update) as ``train_seconds``."""
        m = pl_module.last_metrics
        tokens, rate = m.get("perf/generated_tokens", 0.0), m.get("perf/rollout_tokens_per_s", 0.0)
        rollout = tokens / rate if rate > 0 else 0.0
        self.steps.append({"generated_tokens": tokens, "episodes": m.get("rollout/generated_episodes",
                                                                         m.get("rollout/episodes", 0.0)),
                           "sampled_turns": m.get("rollout/sampled_turns", 0.0), "rollout_seconds": rollout,
                           "train_seconds": m.get("perf/step_seconds", 0.0) - rollout,
                           "updates": float(pl_module.policy_version)})


def run(name: str, schedule: Schedule, args: argparse.Namespace) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    module = AgentRLModule(Policy(args.model), schedule, peak_flops=1.0)
    agent = EnvAgent(GuessNumberEnv(low=1, high=10, max_turns=4, prompt_example=False))
    data = RolloutDataModule(agent, batch_size=args.tasks * schedule.episodes_per_task, steps=args.steps,
                             sampling=SamplingParams(max_tokens=args.max_tokens))
    probe = Probe()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[probe])
    trainer.fit(module, datamodule=data)
    mean = {k: sum(s[k] for s in probe.steps) / len(probe.steps) for k in probe.steps[0]}
    mean["updates"] = probe.steps[-1]["updates"] / len(probe.steps)
    print(f"{name:9s}: {mean['generated_tokens']:7.0f} generated tokens/step, {mean['episodes']:5.1f} episodes, "
          f"{mean['sampled_turns']:5.1f} sampled turns, {mean['updates']:.0f} weight updates, rollout "
          f"{mean['rollout_seconds']:6.1f} s, update {mean['train_seconds']:6.1f} s")
    return {"name": name, **mean}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--smoke", action="store_true", help="tiny random model, 1 task, 4 tokens: checks it runs")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.tasks, args.steps, args.max_tokens = "tiny-random", 1, 1, 4
    schedules: list[tuple[str, Schedule]] = [
        ("RTPO", RTPO(group_size=3)), ("GRPO", GRPO(group_size=4)), ("Turn-PPO", TurnPPO()),
        ("Token-PPO", TokenPPO()),
    ]
    print(f"{args.tasks} tasks per step (GuessNumber 1-10, 4 turns), {args.model}, <= {args.max_tokens} tokens/turn")
    rows = [run(name, schedule, args) for name, schedule in schedules]
    out = {"machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
           "cpu": cpu_identity(),
           "workload": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "runs": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "generation_cost.json").write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out / 'generation_cost.json'}")


if __name__ == "__main__":
    main()
