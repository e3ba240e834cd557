"""A test-only callback for ``agentrl fit`` launched on several ranks (``--trainer.callbacks+=``): each rank writes
the tasks it was handed at every step, with its global and local rank, to ``tasks-rank<global>.json`` in its working
directory, so a test can see how the task stream was sharded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl


class RankTaskLog(pl.Callback):
    """Record ``{"global_rank", "local_rank", "node_rank", "steps": [[task ids of step 0], ...]}`` per rank."""

    def __init__(self) -> None:
        self.steps: list[list[str]] = []

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.steps.append([str(task.id) for task in batch])

    def on_train_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        record = {"global_rank": trainer.global_rank, "local_rank": trainer.local_rank,
                  "node_rank": trainer.node_rank, "world_size": trainer.world_size, "steps": self.steps}
        Path(f"tasks-rank{trainer.global_rank}.json").write_text(json.dumps(record))
