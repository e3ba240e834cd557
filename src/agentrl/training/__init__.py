"""Layer `training`: the Lightning system that trains agents with live rollouts, in five subpackages, lowest first:
`update` and `rollout` (independent of each other), `schedules`, `system`, `command` (docs/architecture.md).

The names a config or a user types have one short form here, imported on first use so that ``agentrl --help``
stays light: ``class_path: agentrl.training.RTPO`` (or `GRPO`, `TurnPPO`, `TokenPPO`), `AgentRLModule`,
`RolloutDataModule`, `JsonlTasks`, `HFDatasetTasks` and the settings classes.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_HOMES = {
    "GRPO": "schedules.grpo", "TurnPPO": "schedules.turn_ppo", "TokenPPO": "schedules.token_ppo",
    "RTPO": "schedules.rtpo", "Schedule": "schedules.base",
    "AgentRLModule": "system.module", "RolloutDataModule": "rollout.datamodule", "JsonlTasks": "rollout.datamodule",
    "HFDatasetTasks": "rollout.hf_tasks",
    "PPOSettings": "update.settings", "OptimSettings": "update.settings", "CriticSettings": "update.settings",
}
__all__ = [
    "GRPO",
    "RTPO",
    "AgentRLModule",
    "CriticSettings",
    "HFDatasetTasks",
    "JsonlTasks",
    "OptimSettings",
    "PPOSettings",
    "RolloutDataModule",
    "Schedule",
    "TokenPPO",
    "TurnPPO",
]


def __getattr__(name: str) -> Any:
    """The short name ``agentrl.training.NAME`` of a class that lives in a subpackage (imported now)."""
    if name not in _HOMES:
        raise AttributeError(f"module 'agentrl.training' has no attribute {name!r}")
    return getattr(import_module(f"agentrl.training.{_HOMES[name]}"), name)
