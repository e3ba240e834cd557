"""`RunView`: what callbacks, the progress display and the tracking code read of a running fit, declared.

`agentrl.training.module.AgentRLModule` implements it. The readers (``agentrl.tracking``,
``agentrl.training.progress``, ``agentrl.training.callbacks``) sit in layers that must not import the module, so the
view lives here, in the lowest layer, and they get it with `run_view` — a typed check, not attribute look-ups by
name. A LightningModule that is not an agentrl run gives None, and the readers skip what they cannot show.

It is a small abstract base class rather than a runtime-checkable ``Protocol``: on Python 3.11 ``isinstance``
against a protocol with properties evaluates each property, and several of these need an attached trainer.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from agentrl.credit import StepRecord
from agentrl.types import Trajectory


class SavesModel(Protocol):
    """A policy that can be written as a transformers/peft folder."""

    def save(self, path: str | Path, *, tokenizer: bool = False) -> None:
        ...


class RunView(abc.ABC):
    """The read-only surface of a run, and the one action a failure handler needs (`stop_rollouts`).

    Attributes:
        rl_step: RL steps done so far (restored on resume).
        last_trajectories: The last training collection's episodes.
        last_metrics: The last step's logged metrics (only what that step measured).
        base_eval: The held-out evaluation of the starting weights (empty when none ran: resumed, or no
            evaluation episodes).
        last_eval: The latest held-out evaluation (empty when none ran).
        step_record: The last step's episodes (every collection: RTPO trunks and siblings) and the credit its
            updates gave each turn (`agentrl.credit`).
    """

    rl_step: int
    last_trajectories: Sequence[Trajectory]
    last_metrics: Mapping[str, float]
    base_eval: Mapping[str, float]
    last_eval: Mapping[str, float]
    step_record: StepRecord

    @property
    @abc.abstractmethod
    def total_steps(self) -> int:
        """Steps the run is configured for (``data.steps``)."""

    @property
    @abc.abstractmethod
    def schedule_name(self) -> str:
        """The algorithm schedule's class name (``RTPO``, ``TurnPPO``, ...)."""

    @property
    @abc.abstractmethod
    def model_name(self) -> str:
        """The policy's model name or path."""

    @property
    @abc.abstractmethod
    def engine_name(self) -> str:
        """The engine spec's class name (``HFEngineSpec``, ``VLLMEngineSpec``)."""

    @property
    @abc.abstractmethod
    def agent(self) -> Any:
        """The agent the episodes are played by (for its environment and reward source)."""

    @abc.abstractmethod
    def final_policy(self) -> SavesModel:
        """The policy with whole weights, as served at the last weight push (no collective): what rank 0 saves."""

    @abc.abstractmethod
    def stop_rollouts(self) -> None:
        """Shut the rollout engine and loop down (idempotent; for failure handlers)."""


def run_view(module: object) -> RunView | None:
    """``module`` as a `RunView`, or None if it is not an agentrl run."""
    return module if isinstance(module, RunView) else None
