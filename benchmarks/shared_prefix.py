"""Shared-prefix rows (``model.share_prefixes``) against separate rows, on the main job's RTPO update shape.

RTPO's update of depth k trains the siblings' turn k; the two siblings of a trunk have the same context token for
token (the replayed trunk prefix). This benchmark builds that shape on SmolLM2-135M-Instruct — 8 trunks, 2 siblings
each, contexts of ``--contexts`` tokens at the depths (the main job's ~130-190), replies of ``--response`` tokens —
and times the trainer's own ``module.update`` per depth as `configs/rtpo.yaml` runs it (π_old recomputed, two
minibatches of 8 siblings, 1,024-token micro-batches), with and without shared prefixes, alternating in one
process so that both see the same machine. It prints the seconds and the tokens forwarded per step of three
depth updates and their ratio. What shared prefixes save depends on how often a sibling's partner falls into the
same minibatch (the minibatches are drawn at random: about 47 % of the time); the π_old recompute scores all
siblings of a depth at once and saves on every pair.

Usage::

    python benchmarks/shared_prefix.py [--rounds 3] [--out benchmarks/results/shared_prefix.json]
    python benchmarks/shared_prefix.py --smoke --out /tmp/shared_prefix.json   # tiny random model: does it run
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from train_throughput import _NoAgent  # the schedule hands the module fixed trajectories: nothing is collected

from agentrl.agents.base import Task
from agentrl.engines.base import SamplingParams
from agentrl.models.policy import Policy
from agentrl.models.precision import cpu_identity
from agentrl.training.rollout.datamodule import RolloutDataModule
from agentrl.training.schedules.base import Schedule
from agentrl.training.schedules.learner import Learner
from agentrl.training.system.module import AgentRLModule
from agentrl.training.update.batching import TurnTargets
from agentrl.training.update.settings import PPOSettings
from agentrl.types import Trajectory, Turn


def depth_batches(trunks: int, siblings: int, contexts: list[int], response: int, vocab: int,
                  seed: int = 0) -> list[list[Trajectory]]:
    """Per depth: ``trunks`` × ``siblings`` one-turn episodes; a trunk's siblings share one context."""
    rng = random.Random(seed)
    out = []
    for length in contexts:
        depth = []
        for g in range(trunks):
            context = [rng.randrange(3, vocab) for _ in range(length)]
            for _ in range(siblings):
                reply = [rng.randrange(3, vocab) for _ in range(response)]
                depth.append(Trajectory([Turn(list(context), reply, [-1.0] * response)], reward=1.0, group=g,
                                        terminated=True))
        out.append(depth)
    return out


class TimedDepths(Schedule):
    """Every repeat: one update per depth, as RTPO's step runs them; records each repeat's time and tokens."""

    def __init__(self, depths: list[list[Trajectory]], repeats: int, ppo: PPOSettings) -> None:
        super().__init__(ppo)
        self.depths, self.repeats = depths, repeats
        self.seconds: list[float] = []
        self.tokens: list[float] = []

    def step(self, learner: Learner, tasks: list[Task]) -> dict[str, float]:
        module = learner
        assert isinstance(module, AgentRLModule)  # this benchmark times the trainer's own module
        g = torch.Generator().manual_seed(0)
        targets = [{(b, 0): TurnTargets(float(torch.randn(1, generator=g))) for b in range(len(d))}
                   for d in self.depths]
        for _ in range(self.repeats + 1):  # the first repeat warms up allocators
            module.ppo_update.take_costs()
            start = time.perf_counter()
            for trajs, tgt in zip(self.depths, targets, strict=True):
                module.update(trajs, tgt, self.ppo)
            self.seconds.append(time.perf_counter() - start)
            self.tokens.append(module.ppo_update.take_costs().get("train_tokens", 0.0))
        return {}


def measure(policy: Policy, depths: list[list[Trajectory]], shared: bool, repeats: int) -> dict[str, float]:
    ppo = PPOSettings(epochs=1, minibatch_size=8, recompute_old_logprobs=True)
    schedule = TimedDepths(depths, repeats, ppo)
    module = AgentRLModule(policy, schedule, micro_batch_tokens=1024, share_prefixes=shared, peak_flops=1.0)
    module.evaluate = lambda label: {}  # type: ignore[method-assign]
    data = RolloutDataModule(_NoAgent(), batch_size=1, steps=1, sampling=SamplingParams(max_tokens=8))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=data)
    return {"seconds": sum(schedule.seconds[1:]) / repeats, "train_tokens": sum(schedule.tokens[1:]) / repeats}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--contexts", type=int, nargs="+", default=[130, 160, 190])
    p.add_argument("--response", type=int, default=10)
    p.add_argument("--trunks", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3, help="alternations of the two settings")
    p.add_argument("--repeats", type=int, default=2, help="timed repeats of a measurement (after one warm-up)")
    p.add_argument("--note", default="", help="the conditions in words, kept in the JSON")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/shared_prefix.json"))
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--smoke", action="store_true", help="tiny random model, 2 trunks, one round: checks it runs")
    args = p.parse_args()
    if args.smoke:
        args.model, args.contexts, args.response = "tiny-random", [8], 2
        args.trunks, args.rounds, args.repeats = 2, 1, 1
    policy = Policy(args.model)
    depths = depth_batches(args.trunks, 2, args.contexts, args.response, vocab=policy.model.config.vocab_size)
    runs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for shared in (False, True):
            m = measure(policy, depths, shared, args.repeats) | {"round": r, "shared": shared}
            runs.append(m)
            print(f"round {r} shared={shared!s:5}: {m['seconds']:6.2f} s, {m['train_tokens']:6.0f} tokens forwarded "
                  f"per step of {len(depths)} depth updates", flush=True)
    plain = [m["seconds"] for m in runs if not m["shared"]]
    shared_s = [m["seconds"] for m in runs if m["shared"]]
    ratios = [a / b for a, b in zip(plain, shared_s, strict=True)]
    tokens = (runs[0]["train_tokens"], runs[1]["train_tokens"])
    mean = sum(ratios) / len(ratios)
    print(f"separate / shared: time {min(ratios):.2f}-{max(ratios):.2f}x per round (mean {mean:.2f}x), "
          f"tokens forwarded {tokens[0] / tokens[1]:.2f}x fewer")
    result = {"machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
              "cpu": cpu_identity(), "note": args.note, "compute_dtype": str(policy.compute_dtype),
              "workload": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "runs": runs, "time_ratios": ratios, "token_ratio": tokens[0] / tokens[1]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
