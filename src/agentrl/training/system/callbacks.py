"""Callbacks of a training run: checkpoints every N RL steps and a graceful stop on SIGINT/SIGTERM.

Steps here are RL iterations (one training batch each). Lightning's ``global_step`` counts optimizer steps, which
in manual optimization is several per RL iteration (PPO epochs × minibatches × 2 optimizers), so these callbacks
count batches instead.
"""

from __future__ import annotations

import logging
import shutil
import signal
from pathlib import Path
from types import FrameType
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities.exceptions import SIGTERMException

from agentrl.runview import run_view
from agentrl.training.system.checkpoint_io import AtomicCheckpointIO, remove_stale_partials

log = logging.getLogger(__name__)


def _rl_step(pl_module: pl.LightningModule, default: int) -> int:
    """The run's RL step (`agentrl.runview.RunView`), or ``default`` for a module that is not an agentrl run."""
    view = run_view(pl_module)
    return view.rl_step if view is not None else default


def _aside(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def swap_folder(new: Path, target: Path) -> None:
    """Put the finished folder ``new`` in the place of ``target`` (a sharded checkpoint): the old one is renamed
    aside, the new one renamed in, the old one removed. A kill at any point leaves a whole checkpoint: ``target``,
    or ``target.old`` between the two renames (`restore_swapped_folder` puts it back)."""
    old = _aside(target, ".old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    new.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def restore_swapped_folder(target: Path) -> None:
    """At start-up: a ``target.old`` without ``target`` is a swap killed between its renames — put it back; a
    ``target.partial`` is a sharded write that was killed — remove it (``target`` is whole)."""
    old, partial = _aside(target, ".old"), _aside(target, ".partial")
    if old.is_dir() and not target.exists():
        old.rename(target)
        log.warning("restored %s from %s, left by a checkpoint swap that was killed", target, old.name)
    for stale in (old, partial):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)


class RLCheckpoint(ModelCheckpoint):
    """Save ``step-NNNNNN.ckpt`` every ``every_n_steps`` RL steps and keep ``last.ckpt`` current, so that
    ``agentrl fit --config ... --ckpt_path last`` resumes (weights, both optimizers, step, task stream).
    Files are written atomically (`AtomicCheckpointIO`): a failed write leaves the previous file whole.

    Args:
        dirpath: Checkpoint folder.
        every_n_steps: RL steps between checkpoints (0: only ``last.ckpt`` at the end and on a stop).
        keep_steps: Also keep the numbered checkpoints (otherwise only ``last.ckpt``).
    """

    def __init__(self, dirpath: str = "checkpoints", every_n_steps: int = 10, keep_steps: bool = False) -> None:
        if every_n_steps < 0:
            raise ValueError(f"checkpoint.every_n_steps must be >= 0, got {every_n_steps}")
        if Path(dirpath).exists() and not Path(dirpath).is_dir():
            raise ValueError(f"checkpoint.dirpath must be a folder, got {dirpath!r}, which is a file")
        super().__init__(dirpath=dirpath, save_last=True, save_top_k=0, every_n_train_steps=0,
                         save_on_train_epoch_end=False)
        self.every_n_steps = every_n_steps
        self.keep_steps = keep_steps

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # a user's own CheckpointIO is left alone
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        if trainer.is_global_zero and self.dirpath is not None:
            restore_swapped_folder(Path(self.dirpath) / f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}")
            removed = remove_stale_partials(Path(self.dirpath))
            if removed:
                log.warning("removed %d stale partial checkpoint file(s) in %s, left by a write that was killed: %s",
                            len(removed), self.dirpath, ", ".join(p.name for p in removed))

    def save_now(self, trainer: pl.Trainer, step: int) -> Path:
        assert self.dirpath is not None
        folder = Path(self.dirpath)
        if self.keep_steps:
            trainer.save_checkpoint(str(folder / f"step-{step:06d}.ckpt"), weights_only=False)
        last = folder / f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}"
        if isinstance(trainer.strategy, ModelParallelStrategy):  # a folder of shards, written in place: write a
            partial = _aside(last, ".partial")                      # new folder, then swap it in (`swap_folder`)
            if trainer.is_global_zero:
                shutil.rmtree(partial, ignore_errors=True)
            trainer.strategy.barrier("agentrl-checkpoint-write")
            trainer.save_checkpoint(str(partial), weights_only=False)
            trainer.strategy.barrier("agentrl-checkpoint-written")
            if trainer.is_global_zero:
                swap_folder(partial, last)
            trainer.strategy.barrier("agentrl-checkpoint-swapped")
        else:
            trainer.save_checkpoint(str(last), weights_only=False)
        self.last_model_path = str(last)
        return last

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = _rl_step(pl_module, batch_idx + 1)
        if self.every_n_steps and step % self.every_n_steps == 0:
            self.save_now(trainer, step)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.save_now(trainer, _rl_step(pl_module, 0))

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        return None


class GracefulStop(Callback):
    """On SIGINT or SIGTERM, finish the current RL step, save ``last.ckpt`` and stop; a second SIGINT aborts at
    once. The run can then be resumed with ``--ckpt_path last`` and continues exactly where it stopped."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self._stopping = False
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = name
        log.warning("%s received: stopping after the current step (checkpoint first); press Ctrl-C again to abort",
                    name)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # here, after Lightning registered its own SIGTERM handler (between on_fit_start and the training loop),
        # which this one replaces for the loop: Lightning's forwards the signal to the other ranks and broadcasts
        # from inside the handler, a collective the other ranks are not in at that moment; on two ranks the stopped
        # run hung. The stop is decided below by a collective every rank makes at the same point of every step.
        self.requested, self._stopping = None, False
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handler)
        except ValueError:  # not the main thread: leave signals alone
            self._previous.clear()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        # the signal may reach one rank only (the launcher's): every rank stops at the same step, or none does
        if not trainer.strategy.reduce_boolean_decision(self.requested is not None, all=False):
            return
        step = _rl_step(pl_module, batch_idx + 1)
        for cb in trainer.callbacks:  # type: ignore[attr-defined]
            if isinstance(cb, RLCheckpoint):
                path = cb.save_now(trainer, step)
                log.warning("stopped after step %d; checkpoint %s; resume with --ckpt_path last", step, path)
        self._stopping = True  # the step's metrics are logged after this hook: leave at the next step's start

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self._stopping:
            # Lightning's own way out for a signal, on every rank at once: the exception hooks run (the MLflow run
            # ends KILLED, the engine stops) and the process exits 0. `trainer.should_stop` would end the epoch
            # instead, and its end-of-epoch checkpoint would mark the run finished: a resume had nothing to do.
            raise SIGTERMException

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


class DetachOnException(Callback):
    """Shut the rollout engine and loop down when fit fails (Lightning tells callbacks, not the module)."""

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        view = run_view(pl_module)
        if view is not None:
            view.stop_rollouts()
