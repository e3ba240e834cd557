"""Training throughput and model-FLOPs utilisation of the real update path on SmolLM2-135M.

An `AgentRLModule` runs inside a real Lightning ``Trainer``; a benchmark schedule hands it fixed multi-turn
trajectories (no rollouts) and times ``module.update`` — the trainer's own code: packing, micro-batches, the
policy forward/backward with the LM head only on response tokens, the losses, gradient clipping, AdamW.

MFU = model FLOPs (6 per non-embedding parameter per token, plus the LM head on scored tokens, see
`agentrl.training.system.perf.train_flops`) / time / this CPU's peak matmul FLOP/s, measured in the same run.

Usage::

    python benchmarks/train_throughput.py [--episodes 8 --turns 4 --prompt 96 --response 32] [--out benchmarks/results]
    python benchmarks/train_throughput.py --smoke --out /tmp/tt   # tiny random model, seconds: does it run
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

from agentrl.agents.base import Outcome, Task
from agentrl.engines.base import SamplingParams
from agentrl.models.policy import LoRASettings, Policy
from agentrl.models.precision import cpu_identity
from agentrl.training.rollout.datamodule import RolloutDataModule
from agentrl.training.schedules.base import Schedule
from agentrl.training.schedules.learner import Learner
from agentrl.training.system.module import AgentRLModule
from agentrl.training.system.perf import measure_peak_flops, train_flops
from agentrl.training.update.batching import TurnTargets
from agentrl.training.update.settings import PPOSettings
from agentrl.types import Trajectory, Turn


def synthetic(episodes: int, turns: int, prompt: int, response: int, vocab: int, seed: int = 0) -> list[Trajectory]:
    """Full-history episodes: turn k's prompt = turn k−1's prompt + response + an observation."""
    rng = random.Random(seed)
    out = []
    for _ in range(episodes):
        ids = [rng.randrange(3, vocab) for _ in range(prompt)]
        traj_turns = []
        for k in range(turns):
            resp = [rng.randrange(3, vocab) for _ in range(response)]
            traj_turns.append(Turn(list(ids), resp, [-1.0] * response, index=k))
            ids = ids + resp + [rng.randrange(3, vocab) for _ in range(prompt // 4)]
        out.append(Trajectory(turns=traj_turns, reward=1.0, terminated=True))
    return out


class TimedUpdates(Schedule):
    """Runs ``repeats`` updates over fixed trajectories and records their wall time."""

    def __init__(self, trajectories: list[Trajectory], repeats: int, ppo: PPOSettings) -> None:
        super().__init__(ppo)
        self.trajectories = trajectories
        self.repeats = repeats
        self.seconds: list[float] = []
        self.tokens: list[float] = []
        self.scored: list[float] = []

    def step(self, learner: Learner, tasks: list[Task]) -> dict[str, float]:
        module = learner
        assert isinstance(module, AgentRLModule)  # this benchmark times the trainer's own module
        g = torch.Generator().manual_seed(0)
        targets = {(b, t.index): TurnTargets(float(torch.randn(1, generator=g)))
                   for b, tr in enumerate(self.trajectories) for t in tr.turns}
        for _ in range(self.repeats + 1):  # the first update warms up allocators
            module.ppo_update.take_costs()
            start = time.perf_counter()
            module.update(self.trajectories, targets, self.ppo)
            self.seconds.append(time.perf_counter() - start)
            costs = module.ppo_update.take_costs()
            self.tokens.append(costs["train_tokens"])
            self.scored.append(costs["scored_tokens"])
        return {}


class _NoAgent:
    async def run(self, task: Task, llm: Any) -> Outcome:
        raise RuntimeError("the benchmark collects nothing")


def measure(name: str, policy: Policy, trajs: list[Trajectory], *, pack: bool, repeats: int,
            micro_batch_tokens: int) -> dict[str, Any]:
    schedule = TimedUpdates(trajs, repeats, PPOSettings(epochs=1))
    module = AgentRLModule(policy, schedule, micro_batch_tokens=micro_batch_tokens, pack_turns=pack, peak_flops=1.0)
    module.evaluate = lambda label: {}  # type: ignore[method-assign]
    data = RolloutDataModule(_NoAgent(), batch_size=1, steps=1, sampling=SamplingParams(max_tokens=8))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=data)
    seconds = sum(schedule.seconds[1:]) / repeats
    tokens = sum(schedule.tokens[1:]) / repeats
    scored = sum(schedule.scored[1:]) / repeats
    flops = train_flops(policy, None, tokens, scored)
    return {"name": name, "seconds_per_update": seconds, "tokens_per_update": tokens, "tokens_per_s": tokens / seconds,
            "achieved_flops": flops / seconds}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=96)
    parser.add_argument("--response", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--smoke", action="store_true", help="tiny random model, 2 short episodes: checks it runs")
    args = parser.parse_args()
    peak_size: dict[str, int] = {}
    if args.smoke:
        args.model, args.episodes, args.turns, args.prompt, args.response, args.repeats = "tiny-random", 2, 2, 8, 4, 1
        peak_size = {"n": 256, "reps": 1}

    peak32 = measure_peak_flops(torch.device("cpu"), torch.float32, **peak_size)
    peak16 = measure_peak_flops(torch.device("cpu"), torch.bfloat16, **peak_size)
    print(f"peak matmul (2048^3, {torch.get_num_threads()} threads): fp32 {peak32 / 1e9:.0f} GFLOP/s, "
          f"bf16 {peak16 / 1e9:.0f} GFLOP/s")
    vocab = 49152 if args.model == "smollm2-135m-instruct" else Policy(args.model).model.config.vocab_size
    trajs = synthetic(args.episodes, args.turns, args.prompt, args.response, vocab=vocab)
    runs = []
    configs = [
        ("fp32, packed turns", "float32", True, None),
        ("fp32, one row per turn", "float32", False, None),
        ("bf16 autocast, packed", "bfloat16", True, None),
        ("fp32, LoRA r=16, packed", "float32", True, LoRASettings(r=16, alpha=32)),
    ]
    for name, compute, pack, lora in configs:
        torch.manual_seed(0)
        policy = Policy(args.model, compute_dtype=compute, lora=lora)  # type: ignore[arg-type]
        r = measure(name, policy, trajs, pack=pack, repeats=args.repeats, micro_batch_tokens=args.micro_batch_tokens)
        peak = peak16 if compute == "bfloat16" else peak32
        r["mfu"] = r["achieved_flops"] / peak
        runs.append(r)
        print(f"{name:28s}: {r['tokens_per_update']:6.0f} tokens/update in {r['seconds_per_update']:6.2f} s = "
              f"{r['tokens_per_s']:7.1f} tok/s, {r['achieved_flops'] / 1e9:6.1f} GFLOP/s, MFU {100 * r['mfu']:5.1f} %")
        del policy
    result = {"machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
              "cpu": cpu_identity(),
              "workload": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "peak_flops": {"float32": peak32, "bfloat16": peak16}, "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "train_throughput.json").write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out / 'train_throughput.json'}")


if __name__ == "__main__":
    main()
