"""`ModuleRunView`: how `AgentRLModule` answers the `RunView` (`agentrl.runview`) that callbacks, the progress
display and the tracking code read: the names and sizes of the run, taken from the parts the module holds."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any

from agentrl.runview import RunView, SavesModel

if TYPE_CHECKING:
    from agentrl.engines.specs import EngineSpec
    from agentrl.models.policy import Policy
    from agentrl.training.rollout.datamodule import RolloutDataModule
    from agentrl.training.schedules.base import Schedule


class ModuleRunView(RunView):
    """The `RunView` members that `AgentRLModule` derives from its policy, schedule, engine spec and data module."""

    policy: Policy
    algorithm: Schedule
    engine_spec: EngineSpec
    _full_policy: list[Policy]  # sharded training: the engine's unsharded copy

    @property
    @abc.abstractmethod
    def data(self) -> RolloutDataModule:
        """The trainer's data module."""

    @abc.abstractmethod
    def detach(self, *, ended: bool = False) -> None:
        """Stop the engine and the rollout loop (idempotent)."""

    @property
    def total_steps(self) -> int:
        return int(self.data.steps)

    @property
    def max_generated_tokens(self) -> int | None:
        return self.data.max_generated_tokens

    @property
    def schedule_name(self) -> str:
        return type(self.algorithm).__name__

    @property
    def model_name(self) -> str:
        return str(self.policy.name)

    @property
    def engine_name(self) -> str:
        return type(self.engine_spec).__name__

    @property
    def agent(self) -> Any:
        return self.data.agent

    def final_policy(self) -> SavesModel:
        # sharded training: the whole weights, as gathered at the last push (no collective on rank 0 alone)
        return self._full_policy[0] if self._full_policy else self.policy

    def stop_rollouts(self) -> None:
        self.detach()
