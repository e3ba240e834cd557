"""Asynchronous rollouts (issue 28): whole-loop throughput and held-out success with ``data.max_staleness`` s.

The trainer runs in this process and the rollouts in a separate ``agentrl serve`` process on 127.0.0.1, one thread
each (``torch.set_num_threads(1)`` here, ``OMP_NUM_THREADS=1`` for the server): with s = 0 each waits for the
other; with s ≥ 1 the server generates the next step's batch while the trainer updates (docs/async.md). For each
schedule (GRPO, RTPO) and s ∈ {0, 1, 2}, with the same seed, every run trains until the same generated-token
budget (``data.max_generated_tokens``) and is evaluated on the same held-out tasks at the start and at the end.

Per run it records the training loop's wall time (the sum of ``perf/step_seconds``: the evaluations are left out),
the tokens generated for training and the tokens trained (the response tokens of the turns each update trains,
counted once per update, not per epoch), the whole-loop throughput (generated + trained) / loop seconds, the
speed-up over s = 0 of the same schedule and seed, the staleness and wait metrics, and the held-out success
before and after. Between runs the server's adapters are unloaded, so each run starts from the base model.

The result file is written after every run and read back at start: a run already in it under the same workload
is not run again, so a long comparison can be stopped and resumed (``--fresh`` starts over).

Usage::

    python benchmarks/async.py                                   # SmolLM2-135M-Instruct, the real comparison
    python benchmarks/async.py --model tiny-random --budget 300 --eval-episodes 4 --out /tmp/async-small.json
    python benchmarks/async.py --smoke --out /tmp/async-smoke.json    # tiny random model, seconds: does it run
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import lightning.pytorch as pl
import torch
from serve_process import start_serve

from agentrl.agents.env_agent import EnvAgent
from agentrl.engines.base import SamplingParams
from agentrl.engines.vllm import VLLMEngineSpec
from agentrl.envs import GuessNumberEnv
from agentrl.models.policy import LoRASettings, Policy
from agentrl.models.precision import cpu_identity
from agentrl.training.rollout.datamodule import RolloutDataModule
from agentrl.training.schedules.base import Schedule
from agentrl.training.schedules.grpo import GRPO
from agentrl.training.schedules.rtpo import RTPO
from agentrl.training.system.module import AgentRLModule
from agentrl.training.update.batching import TurnKey, TurnTargets
from agentrl.training.update.settings import OptimSettings, PPOSettings

ROOT = Path(__file__).resolve().parents[1]
LORA = LoRASettings(r=8, alpha=16, target_modules=["q_proj", "v_proj"])


class CountingModule(AgentRLModule):
    """Counts the response tokens of the turns each update trains, and keeps every step's metrics."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.trained_tokens = 0
        self.steps: list[dict[str, float]] = []

    def update(self, trajectories: Any, targets: dict[TurnKey, TurnTargets], ppo: PPOSettings, *,
               tag: str = "") -> dict[str, float]:
        self.trained_tokens += sum(len(trajectories[b].turns[n].response_ids) for b, n in targets)
        return super().update(trajectories, targets, ppo, tag=tag)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.steps.append(dict(self.last_metrics))
        super().on_train_batch_end(outputs, batch, batch_idx)


def schedule(name: str, epochs: int) -> Schedule:
    ppo = PPOSettings(epochs=epochs)
    return GRPO(group_size=4, ppo=ppo) if name == "grpo" else RTPO(group_size=3, ppo=ppo)


def unload_adapters(url: str) -> None:
    """Leave the server serving the base model only (the previous run's last adapter is still loaded)."""
    models = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
    for m in models[1:]:
        httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": m["id"]}, timeout=30).raise_for_status()


def one_run(args: argparse.Namespace, url: str, root: Path, name: str, s: int, seed: int) -> dict[str, Any]:
    unload_adapters(url)
    pl.seed_everything(seed, verbose=False)
    engine = VLLMEngineSpec([url], adapter_dir=str(root / f"{name}-s{s}-seed{seed}"),
                            logprobs_mode="processed_logprobs", timeout=600)
    module = CountingModule(Policy(args.model, lora=LORA, seed=seed), schedule(name, args.epochs), engine=engine,
                            optim=OptimSettings(lr=args.lr), peak_flops=1e11)
    per_task = module.algorithm.episodes_per_task
    data = RolloutDataModule(EnvAgent(GuessNumberEnv(low=1, high=args.high, max_turns=4)),
                             batch_size=args.tasks * per_task, steps=args.max_steps,
                             sampling=SamplingParams(max_tokens=args.max_tokens), eval_episodes=args.eval_episodes,
                             max_generated_tokens=args.budget, seed=seed, max_staleness=s)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    start = time.perf_counter()
    trainer.fit(module, datamodule=data)
    steps = module.steps
    loop = sum(m["perf/step_seconds"] for m in steps)
    generated = int(sum(m.get("perf/generated_tokens", 0) for m in steps))
    return {
        "schedule": name, "max_staleness": s, "seed": seed, "cpu": cpu_identity(), "steps": len(steps),
        "loop_seconds": loop,
        "wall_seconds": time.perf_counter() - start, "generated_tokens": generated,
        "trained_tokens": module.trained_tokens, "tokens_per_s": (generated + module.trained_tokens) / loop,
        "staleness_max": max(m.get("rollout/staleness_max", 0.0) for m in steps),
        "trunk_lag_max": max(m.get("rollout/trunk_lag_max", 0.0) for m in steps),
        "stale_dropped_episodes": sum(m.get("rollout/stale_dropped_episodes", 0.0) for m in steps),
        "trainer_wait_frac": statistics.fmean(m.get("perf/trainer_wait_frac", 0.0) for m in steps),
        "engine_idle_frac": statistics.fmean(m.get("perf/engine_idle_frac", 0.0) for m in steps),
        "eval_base_success": module.base_eval.get("eval/success"),
        "eval_final_success": module.last_eval.get("eval/success"),
    }


def print_table(runs: list[dict[str, Any]]) -> None:
    print(f"{'schedule':8} {'s':>2} {'seed':>4} {'steps':>5} {'gen tok':>8} {'train tok':>9} {'loop s':>8} "
          f"{'tok/s':>8} {'speed-up':>8} {'stale':>5} {'dropped':>7} {'wait':>5} {'idle':>5} {'held-out':>13}")
    for r in runs:
        same = [b for b in runs if (b["schedule"], b["seed"], b["max_staleness"]) == (r["schedule"], r["seed"], 0)]
        base = same[0] if same else r  # no s = 0 run: speed-up against itself
        held = f"{r['eval_base_success']} -> {r['eval_final_success']}"
        print(f"{r['schedule']:8} {r['max_staleness']:>2} {r['seed']:>4} {r['steps']:>5} {r['generated_tokens']:>8} "
              f"{r['trained_tokens']:>9} {r['loop_seconds']:>8.1f} {r['tokens_per_s']:>8.1f} "
              f"{r['tokens_per_s'] / base['tokens_per_s']:>7.2f}x {r['staleness_max']:>5.0f} "
              f"{r['stale_dropped_episodes']:>7.0f} {r['trainer_wait_frac']:>5.2f} {r['engine_idle_frac']:>5.2f} "
              f"{held:>13}")


# what may differ between resumed invocations
RESUME_IGNORES = ("out", "seeds", "schedules", "staleness", "fresh", "smoke")


def same_workload(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return {k: v for k, v in a.items() if k not in RESUME_IGNORES} == {
        k: v for k, v in b.items() if k not in RESUME_IGNORES}


def earlier_runs(out: Path, workload: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs a previous invocation wrote to ``out`` under the same workload (none if it differs: a run made with
    another budget, model or learning rate is not comparable and is not mixed in). A run written before runs
    carried their own ``cpu`` gets the file's (the machine of the invocation that wrote it)."""
    if not out.exists():
        return []
    old = json.loads(out.read_text())
    if not same_workload(old.get("workload", {}), workload):
        print(f"{out} holds runs of another workload: starting over (they are overwritten at the first run)")
        return []
    return [{"cpu": old.get("cpu")} | run for run in old.get("runs", [])]


def run_key(r: dict[str, Any]) -> tuple[str, int, int]:
    return (r["schedule"], r["max_staleness"], r["seed"])


def pending(runs: list[dict[str, Any]], seeds: list[int], schedules: list[str],
            staleness: list[int]) -> list[tuple[int, str, int]]:
    """(seed, schedule, s) of the asked runs not in ``runs``, in the order they run: each seed's schedules with every
    s side by side."""
    done = {run_key(r) for r in runs}
    return [(seed, name, s) for seed in seeds for name in schedules for s in staleness if (name, s, seed) not in done]


def write_result(args: argparse.Namespace, workload: dict[str, Any], runs: list[dict[str, Any]]) -> None:
    result = {"machine": f"{platform.machine()}, 1 thread each (trainer, server), torch {torch.__version__}",
              "cpu": cpu_identity(), "workload": workload, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(args.out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--schedules", nargs="+", choices=["grpo", "rtpo"], default=["grpo", "rtpo"])
    ap.add_argument("--staleness", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--budget", type=int, default=20_000, help="generated training tokens per run")
    ap.add_argument("--max-steps", type=int, default=1000, help="a cap; the budget ends the run first")
    ap.add_argument("--tasks", type=int, default=4, help="tasks per step")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--high", type=int, default=10, help="GuessNumber: the secret is in 1..high")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--eval-episodes", type=int, default=32)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/async.json")
    ap.add_argument("--fresh", action="store_true", help="ignore the runs already in --out")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny random model, GRPO at s = 0 to a 48-token budget: checks the script runs")
    args = ap.parse_args(argv)
    if args.smoke:
        args.model, args.schedules, args.staleness, args.budget = "tiny-random", ["grpo"], [0], 48
        args.tasks, args.epochs, args.max_tokens, args.eval_episodes, args.fresh = 1, 1, 8, 2, True
    torch.set_num_threads(1)  # the trainer's one thread
    workload = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    runs = [] if args.fresh else earlier_runs(args.out, workload)
    todo = pending(runs, args.seeds, args.schedules, args.staleness)
    print(f"{len(runs)} runs already in {args.out}; {len(todo)} to run", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server: subprocess.Popen[bytes] | None = None
        if todo:
            server, url = start_serve(args.model, root, LORA, threads=1)
        try:
            for seed, name, s in todo:
                runs.append(one_run(args, url, root, name, s, seed))
                write_result(args, workload, runs)
                print(f"done: {name} s={s} seed={seed}: {runs[-1]['tokens_per_s']:.1f} tokens/s", flush=True)
        finally:
            if server is not None:
                server.terminate()
                server.wait(30)
    print_table(sorted(runs, key=lambda r: (r["seed"], r["schedule"], r["max_staleness"])))
    write_result(args, workload, runs)
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
