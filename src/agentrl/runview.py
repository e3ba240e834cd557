"""`RunView`: what callbacks, the progress display and the tracking code read of a running fit, declared.

`agentrl.training.system.module.AgentRLModule` implements it. The readers (``agentrl.tracking``,
``agentrl.training.command.progress``, ``agentrl.training.system.callbacks``) sit in layers that must not import
the module, so the view lives here, in the lowest layer, and they get it with `run_view` — a typed check, not
attribute look-ups by name. A LightningModule that is not an agentrl run gives None,
and the readers skip what they cannot show.

It is a small abstract base class rather than a runtime-checkable ``Protocol``: on Python 3.11 ``isinstance``
against a protocol with properties evaluates each property, and several of these need an attached trainer.

`StepProgress` is the run's progress channel *inside* a step: the rollout session, the collector, the PPO update
and RTPO's sweep tell it what they are doing (a line each), and the progress display reads it (`StepPhase`).
"""

from __future__ import annotations

import abc
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, Protocol

from agentrl.credit import StepRecord
from agentrl.types import Trajectory


class SavesModel(Protocol):
    """A policy that can be written as a transformers/peft folder."""

    def save(self, path: str | Path, *, tokenizer: bool = False) -> None:
        ...


PhaseKind = Literal["collecting", "scoring", "updating", "evaluating"]


@dataclass(frozen=True)
class StepPhase:
    """What the run is doing now (a snapshot of `StepProgress`).

    Attributes:
        kind: The phase, or None between phases.
        since: ``time.monotonic()`` when the phase began.
        depth: RTPO's boundary ``(k, K)`` during its reverse sweep (k counts down from K − 1 to 0), else None.
        episodes: Episodes the phase's collections will play (collecting, evaluating).
        done: Episodes finished, those that failed included.
        failed: Finished episodes that failed (an error or a timeout; left out of the loss).
        running: Episodes in flight.
        tokens: Tokens sampled by the finished episodes.
        epoch: ``(i, n)``: PPO epoch i of n (1-based) once the update's first minibatch started.
        minibatch: ``(i, n)``: minibatch i of n within the epoch.
    """

    kind: PhaseKind | None = None
    since: float = 0.0
    depth: tuple[int, int] | None = None
    episodes: int = 0
    done: int = 0
    failed: int = 0
    running: int = 0
    tokens: int = 0
    epoch: tuple[int, int] | None = None
    minibatch: tuple[int, int] | None = None


class StepProgress:
    """The progress channel of a run: written by the training and rollout code (any thread), read as a
    `StepPhase`. Each change calls the listener, if one is set (the progress display), in the changing thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now = StepPhase()
        self._listener: Callable[[], None] | None = None
        self._boundary: Callable[[PhaseKind | None], None] | None = None

    def snapshot(self) -> StepPhase:
        with self._lock:
            return self._now

    def listen(self, listener: Callable[[], None] | None) -> None:
        """Call ``listener`` after every change (None: stop)."""
        self._listener = listener

    def on_boundary(self, hook: Callable[[PhaseKind | None], None] | None) -> None:
        """Call ``hook(kind)`` as each phase begins and ends, with the phase that is ending: the one running
        before the block (None between phases) at its start, the block's own at its end (None: stop)."""
        self._boundary = hook

    def _mark_boundary(self) -> None:
        hook = self._boundary
        if hook is not None:
            hook(self.snapshot().kind)

    def _set(self, change: Callable[[StepPhase], StepPhase]) -> None:
        with self._lock:
            self._now = change(self._now)
        listener = self._listener
        if listener is not None:
            listener()

    @contextlib.contextmanager
    def phase(self, kind: PhaseKind) -> Iterator[None]:
        """The block is phase ``kind``; the phase it interrupts (if any) resumes after it."""
        before = self.snapshot()
        self._mark_boundary()
        self._set(lambda p: StepPhase(kind, time.monotonic(), depth=p.depth))
        try:
            yield
        finally:
            self._mark_boundary()
            self._set(lambda p: replace(before, depth=p.depth))

    def rtpo_depth(self, k: int | None, of: int = 0) -> None:
        """RTPO's sweep is at boundary ``k`` of ``of`` (None: the sweep is over)."""
        self._set(lambda p: replace(p, depth=None if k is None else (k, of)))

    def episodes_expected(self, n: int) -> None:
        self._set(lambda p: replace(p, episodes=p.episodes + n))

    def episode_started(self) -> None:
        self._set(lambda p: replace(p, running=p.running + 1))

    def episode_finished(self, tokens: int, failed: bool = False) -> None:
        self._set(lambda p: replace(p, running=p.running - 1, done=p.done + 1, failed=p.failed + int(failed),
                                    tokens=p.tokens + tokens))

    def minibatch(self, epoch: int, epochs: int, i: int, n: int) -> None:
        """Minibatch ``i`` of ``n`` of epoch ``epoch`` of ``epochs`` begins (all 1-based)."""
        self._set(lambda p: replace(p, epoch=(epoch, epochs), minibatch=(i, n)))


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
        step_progress: What the run is doing inside a step (written by the session, update and schedules).
        generated_tokens: Tokens sampled for training so far, all ranks (restored on resume).
    """

    rl_step: int
    last_trajectories: Sequence[Trajectory]
    last_metrics: Mapping[str, float]
    base_eval: Mapping[str, float]
    last_eval: Mapping[str, float]
    step_record: StepRecord
    step_progress: StepProgress
    generated_tokens: int

    @property
    @abc.abstractmethod
    def total_steps(self) -> int:
        """Steps the run is configured for (``data.steps``)."""

    @property
    @abc.abstractmethod
    def max_generated_tokens(self) -> int | None:
        """The run's budget of generated training tokens (``data.max_generated_tokens``; None: no budget)."""

    def completed(self) -> bool:
        """Whether the run ended as configured: ``data.steps`` done, or its budget of generated tokens spent (a
        budget ends a run early by design). False after a requested stop (a signal), which is resumable."""
        budget = self.max_generated_tokens
        return self.rl_step >= self.total_steps or (budget is not None and self.generated_tokens >= budget)

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
