"""Two ranks with asynchronous collection (run as a script by tests/training/test_multinode.py).

Lightning's DDP launcher (gloo, CPU) starts two ranks; each rank has its own ``agentrl serve`` process (as each
GPU of a node would have its own vLLM server beside it) and runs GRPO with ``data.max_staleness 1`` on its shard of
the tasks, the update slowed by ``--delay`` seconds so that the next step's batch is generated during it. Each rank
writes ``<out>.rank<r>.json``: per update, the trainer's version, the task ids and the version of every trained
turn; and the step metrics it logged (the same on every rank: reduced over ranks).

    python -m tests.training.async_ranks_run --urls http://127.0.0.1:8000 http://127.0.0.1:8001 \
        --adapter-root /tmp/adapters --out /tmp/async
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from agentrl.engines.vllm import VLLMEngineSpec
from agentrl.models.policy import LoRASettings, Policy
from agentrl.training.schedules.grpo import GRPO
from agentrl.training.system.module import AgentRLModule
from agentrl.training.update.batching import TurnKey, TurnTargets
from agentrl.training.update.settings import PPOSettings
from tests.training.helpers import letter_data

LORA = LoRASettings(r=8, alpha=16, target_modules=["q_proj", "v_proj"])


class RecordingModule(AgentRLModule):
    """Test-only: records what each update trains (versions, tasks) and sleeps ``delay`` seconds first."""

    delay = 1.0

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.trained: list[dict[str, Any]] = []
        self.steps: list[dict[str, float]] = []

    def update(self, trajectories: Any, targets: dict[TurnKey, TurnTargets], ppo: PPOSettings, *,
               tag: str = "") -> dict[str, float]:
        turns = [trajectories[b].turns[n] for b, n in targets]
        self.trained.append({"step": self.rl_step, "version": self.policy_version,
                             "tasks": sorted({trajectories[b].task_id for b, _ in targets}),
                             "turn_versions": [t.policy_version for t in turns if t.response_ids and not t.forced]})
        time.sleep(self.delay)
        return super().update(trajectories, targets, ppo, tag=tag)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_end(outputs, batch, batch_idx)
        self.steps.append({k: v for k, v in self.last_metrics.items() if k.startswith("rollout/")})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--urls", nargs=2, required=True, help="one agentrl serve per rank")
    ap.add_argument("--adapter-root", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--delay", type=float, default=1.0)
    args = ap.parse_args()
    rank = int(os.environ.get("LOCAL_RANK", "0"))  # set by Lightning's launcher in the process it starts
    pl.seed_everything(0, verbose=False)
    engine = VLLMEngineSpec([args.urls[rank]], adapter_dir=str(args.adapter_root / f"rank{rank}"),
                            logprobs_mode="processed_logprobs", timeout=60)
    RecordingModule.delay = args.delay
    module = RecordingModule(Policy("tiny-random", lora=LORA, seed=0), GRPO(group_size=2), engine=engine,
                             peak_flops=1e11)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=letter_data(batch_size=4, steps=args.steps, max_staleness=1))
    record = {"global_rank": trainer.global_rank, "trained": module.trained, "steps": module.steps}
    Path(f"{args.out}.rank{trainer.global_rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
