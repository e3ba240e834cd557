"""What ``agentrl fit`` shows on the terminal: the run in RL terms, and where it was recorded.

`RunProgress` replaces Lightning's progress bar (it *is* a Lightning `ProgressBar`, so Lightning adds no bar of its
own). It prints, on rank 0 only and one line each, so that the output reads the same in a terminal, a log file or
a CI job:

* at the start: the MLflow run name, id and experiment, and the exact ``mlflow ui`` command that opens the store
  this run writes;
* after every RL step: ``step k/N``, the step's reward and success, the step time, the generated tokens, the
  staleness (``stale N``, the most versions a trained turn lagged, when collection runs ahead), the ETA;
* inside a step and during evaluations, the phase the run is in (`StatusLine`, read from the run's
  `agentrl.runview.StepProgress`): collecting (episodes done of expected, in flight, tokens), RTPO's depth k of K,
  scoring, updating (epoch and minibatch i of n), evaluating. On a terminal it is one line redrawn in place; in a
  log (stdout not a TTY) it is a plain line, only for a phase that has lasted ``status_delay`` seconds and at most
  one every ``status_every`` seconds, so a fast run prints none;
* at the end: base → final held-out success, the wall time, where the final model is, and the ``mlflow ui``
  command again.

`quiet_libraries` silences what other libraries print by default (Lightning's device lines and tips, MLflow's
database and trace-queue messages and download bars, transformers' save bars); ``AGENTRL_VERBOSE=1`` keeps them.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import statistics
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from lightning.pytorch.loggers import MLFlowLogger

from agentrl.runview import StepPhase, run_view
from agentrl.tracking.review import TrajectoryLogger
from agentrl.training.system.health import DeadRun, step_health

VERBOSE_ENV = "AGENTRL_VERBOSE"
_NOISY_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning", "mlflow", "alembic",
                  "transformers", "httpx", "urllib3", "huggingface_hub", "datasets", "agentrl")


def verbose() -> bool:
    """Whether ``AGENTRL_VERBOSE`` asks for every library's own output."""
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def quiet_libraries() -> None:
    """Silence other libraries' chatter unless ``AGENTRL_VERBOSE=1`` (warnings and errors still show)."""
    if verbose():
        logging.getLogger("agentrl").setLevel(logging.INFO)
        return
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # read when `datasets` is first imported
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "warning")
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("lightning.pytorch.loggers.mlflow").setLevel(logging.ERROR)  # "Experiment ... Creating it."
    # transformers loads models in eval mode and the trainer keeps them so (SmolLM2 and LoRA here have no
    # dropout); Lightning warns about it at every start. AGENTRL_VERBOSE=1 shows the warning.
    warnings.filterwarnings("ignore", message=r".*module\(s\) in eval mode at the start of training")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - transformers is a core dependency
        pass


def mlflow_ui_command(tracking_uri: str) -> str:
    """The ``mlflow ui`` command that opens ``tracking_uri`` from any directory (relative paths made absolute)."""
    uri = tracking_uri
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        uri = prefix + str(Path(uri[len(prefix):]).resolve())
    elif "://" not in uri:
        uri = str(Path(uri).resolve())
    elif uri.startswith("file:") and not uri.startswith("file:///"):
        uri = Path(uri.removeprefix("file:").removeprefix("//")).resolve().as_uri()
    return f"mlflow ui --backend-store-uri {shlex.quote(uri)}"


def _clock(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


def eta_seconds(elapsed: float, steps_done: int, steps_left: int, tokens_done: float = 0.0,
                tokens_left: float | None = None, recent: Sequence[float] = ()) -> float:
    """Seconds left at this run's pace: by steps (``data.steps``), or by generated tokens when a token budget
    (``data.max_generated_tokens``) ends the run first — whichever comes sooner. The pace by steps is the median
    of ``recent`` step times when given (a slow first step or a passing load spike does not set it), else the
    mean since this process started. ``*_done`` are counted since this process started (a resumed run's earlier
    steps took no time here)."""
    pace = statistics.median(recent) if recent else elapsed / max(steps_done, 1)
    eta = pace * max(steps_left, 0)
    if tokens_left is not None and tokens_done > 0:
        eta = min(eta, elapsed / tokens_done * max(tokens_left, 0.0))
    return eta


def oversubscribed(load: float, threads: int, cores: int) -> str | None:
    """A one-line hint when the 1-minute ``load`` average is above what this run's ``threads`` torch threads on
    ``cores`` cores explain (the larger of the two, plus one for the run's own helper threads); None otherwise."""
    if load <= max(cores, threads) + 1:
        return None
    return (f"  machine busy: load {load:.1f} on {cores} cores ({threads} torch threads here), so steps take longer "
            "than documented; with other jobs running, start with OMP_NUM_THREADS=1 (torch threads on busy cores wait "
            "on each other: several times slower), and a smaller data.batch_size makes each step lighter "
            "(docs/operations.md)")


def _machine_hint() -> str | None:
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available on this platform
        return None
    import torch

    return oversubscribed(load, torch.get_num_threads(), len(os.sched_getaffinity(0)) if hasattr(
        os, "sched_getaffinity") else (os.cpu_count() or 1))


def _staleness(m: Mapping[str, float]) -> str:
    """``  stale N`` when the step trained on turns sampled N versions behind (data.max_staleness >= 1), else ''."""
    lag = m.get("rollout/staleness_max", 0.0)
    return f"  stale {lag:.0f}" if lag > 0 or m.get("rollout/trunk_lag_max", 0.0) > 0 else ""


def describe(phase: StepPhase, now: float) -> str:
    """One status line of ``phase`` at ``now`` (``time.monotonic()``); empty between phases."""
    if phase.kind is None:
        return ""
    parts: list[str] = [phase.kind]
    if phase.kind in ("collecting", "evaluating") and phase.episodes:
        ok = phase.done - phase.failed
        failed = f", {phase.failed} failed" if phase.failed else ""
        parts.append(f"{ok}/{phase.episodes} episodes done{failed}, {phase.running} in flight, {phase.tokens} tokens")
    elif phase.kind == "updating" and phase.epoch and phase.minibatch:
        parts.append(f"epoch {phase.epoch[0]}/{phase.epoch[1]}, minibatch {phase.minibatch[0]}/{phase.minibatch[1]}")
    text = ": ".join(parts) + f" ({_clock(now - phase.since)})"
    if phase.depth is not None and phase.kind != "evaluating":
        k, of = phase.depth
        text = f"RTPO depth k={k} ({of - k}/{of}) · {text}"
    return text


class StatusLine:
    """Shows the run's phase on ``stream``: redrawn in place on a terminal, plain throttled lines otherwise.

    Args:
        source: Reads the current phase.
        stream: Where to write.
        tty: Redraw one line in place (carriage return) instead of printing lines.
        delay: Not a TTY: a phase is shown once it has lasted this many seconds (shorter phases: never).
        every: Not a TTY: at most one line every this many seconds.
        prefix: Text before the phase (e.g. the step), read at each write.
        clock: ``time.monotonic`` (the phase's clock), replaceable in tests.
    """

    def __init__(self, source: Callable[[], StepPhase], stream: TextIO, *, tty: bool, delay: float = 5.0,
                 every: float = 10.0, prefix: Callable[[], str] = lambda: "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source, self.stream, self.tty = source, stream, tty
        self.delay, self.every, self.prefix, self.clock = delay, every, prefix, clock
        self._lock = threading.Lock()
        self._drawn = False  # a terminal line is on screen
        self._last = float("-inf")  # when the last plain line was written

    def refresh(self) -> None:
        """Show the current phase (any thread; the training code's changes and the ticker call it)."""
        with self._lock:
            phase, now = self.source(), self.clock()
            if phase.kind is None:
                self._clear()
            elif self.tty:  # cut to the terminal's width: a wrapped line cannot be redrawn in place
                width = shutil.get_terminal_size().columns - 1
                self.stream.write(f"\r{(self.prefix() + describe(phase, now))[:width]}\x1b[K")
                self._drawn = True
            elif now - phase.since >= self.delay and now - self._last >= self.every:
                self.stream.write(f"{self.prefix()}{describe(phase, now)}\n")
                self._last = now
            else:
                return
            self.stream.flush()

    def line(self, text: str) -> None:
        """Write ``text`` as a line of its own (the status line, if drawn, is cleared first)."""
        with self._lock:
            self._clear()
            self.stream.write(text + "\n")
            self.stream.flush()

    def clear(self) -> None:
        """Take the status line off the terminal (if drawn)."""
        with self._lock:
            self._clear()
            self.stream.flush()

    def _clear(self) -> None:
        if self._drawn:
            self.stream.write("\r\x1b[K")
            self._drawn = False


def _mlflow(trainer: pl.Trainer) -> MLFlowLogger | None:
    for logger in trainer.loggers:
        if isinstance(logger, MLFlowLogger):
            return logger
    return None


class RunProgress(ProgressBar):
    """One line per RL step, a start line, the phase inside a step, and an end summary (see the module docstring).

    Args:
        status_delay: Not a TTY: show a phase once it has lasted this many seconds.
        status_every: Not a TTY: at most one phase line every this many seconds.
        dead_steps: A run whose steps could not learn this many times in a row says so in its end summary
            (``progress.dead_steps`` in a config; 0: never).
        eta_window: The ETA's pace is the median of this many most recent step times.
    """

    def __init__(self, status_delay: float = 5.0, status_every: float = 10.0, dead_steps: int = 3,
                 eta_window: int = 5) -> None:
        super().__init__()
        if dead_steps < 0 or eta_window < 1:
            raise ValueError(f"progress.dead_steps must be >= 0 and eta_window >= 1, got {dead_steps}, {eta_window}")
        self.dead = DeadRun(dead_steps)
        self.step_times: deque[float] = deque(maxlen=eta_window)
        self._last_end = 0.0
        self._hinted = False
        self._enabled = True
        self._start = 0.0
        self._first_step = 0
        self._first_tokens = 0
        self.status_delay, self.status_every = status_delay, status_every
        self._status: StatusLine | None = None
        self._halt = threading.Event()
        self._ticker: threading.Thread | None = None
        self._step = ""  # "step k/N · " while a step runs

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    def _say(self, trainer: pl.Trainer, text: str) -> None:
        if self._enabled and trainer.is_global_zero:
            if self._status is not None:
                self._status.line(text)
            else:
                print(text, file=sys.stdout, flush=True)

    def _start_status(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Show the run's phase (rank 0): on every change of its progress channel, and every tick in between."""
        view = run_view(pl_module)
        if view is None or not self._enabled or not trainer.is_global_zero:
            return
        tty = sys.stdout.isatty()
        status = StatusLine(view.step_progress.snapshot, sys.stdout, tty=tty, delay=self.status_delay,
                            every=self.status_every, prefix=lambda: f"  {self._step}")
        view.step_progress.listen(status.refresh)
        self._status, tick = status, 0.25 if tty else 1.0
        self._halt.clear()

        def ticker() -> None:
            while not self._halt.wait(tick):
                status.refresh()

        self._ticker = threading.Thread(target=ticker, name="agentrl-status", daemon=True)
        self._ticker.start()

    def _stop_status(self, pl_module: pl.LightningModule) -> None:
        view = run_view(pl_module)
        if view is not None:
            view.step_progress.listen(None)
        self._halt.set()
        if self._ticker is not None:
            self._ticker.join()
        self._ticker = None
        if self._status is not None:
            self._status.clear()
        self._status = None

    def _where(self, trainer: pl.Trainer) -> str | None:
        from agentrl.tracking.store import run_page_url  # the page that opens the run as a training run

        logger = _mlflow(trainer)
        if logger is None:
            return None
        try:  # a failed tracking store costs a line here, never the run (docs/operations.md, "Tracking faults")
            client = logger.experiment
            name = client.get_run(logger.run_id).info.run_name
            experiment = client.get_experiment(logger.experiment_id).name
        except Exception as exc:
            return f"MLflow run unavailable ({type(exc).__name__}): see the warnings above"
        return (f"run {name} (id {logger.run_id}) in MLflow experiment {experiment}; open it with:\n"
                f"  {mlflow_ui_command(client.tracking_uri)}\n"
                f"  then {run_page_url(str(logger.experiment_id), str(logger.run_id))}")

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        where = self._where(trainer) if trainer.is_global_zero else None
        self._say(trainer, f"[agentrl] {where}" if where else "[agentrl] no MLflow logger: metrics are not recorded")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = 0.0  # set at the first step: the module's base evaluation follows this hook
        self._start_status(trainer, pl_module)
        view = run_view(pl_module)
        self._first_step = view.rl_step if view is not None else 0
        self._first_tokens = view.generated_tokens if view is not None else 0
        if self._first_step:
            self._say(trainer, f"[agentrl] resumed at step {self._first_step} from {trainer.ckpt_path}")

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._start = self._start or time.perf_counter()
        view = run_view(pl_module)
        if view is not None:
            self._step = f"step {view.rl_step + 1}/{view.total_steps} · "

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._step = ""
        view = run_view(pl_module)
        if view is None:
            return
        m, step, total = view.last_metrics, view.rl_step, view.total_steps
        budget, now = view.max_generated_tokens, time.perf_counter()
        self.step_times.append(now - (self._last_end or self._start))
        self._last_end = now
        eta = eta_seconds(now - self._start, step - self._first_step, total - step,
                          view.generated_tokens - self._first_tokens,
                          None if budget is None else budget - view.generated_tokens, recent=self.step_times)
        lines = [f"step {step:>{len(str(total))}}/{total}  reward {m.get('rollout/reward', float('nan')):+.3f}  "
                 f"success {m.get('rollout/success', float('nan')):.2f}  {m.get('perf/step_seconds', 0.0):.1f} s  "
                 f"{int(m.get('perf/generated_tokens', 0))} tokens{_staleness(m)}  ETA {_clock(eta)}"
                 + ("  (critic only: algorithm.value_warmup_steps)" if m.get("train/critic_only") else "")]
        findings = step_health(view.step_record.episodes or view.last_trajectories, m)
        self.dead.add(findings)
        lines += [f"  ! {f.line}" for f in findings]
        hint = None if self._hinted else _machine_hint()
        if hint:
            self._hinted = True
            lines.append(hint)
        self._say(trainer, "\n".join(lines))

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._stop_status(pl_module)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._stop_status(pl_module)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop_status(pl_module)
        view = run_view(pl_module)
        if not trainer.is_global_zero or view is None:
            return
        final, base = view.last_eval, view.base_eval
        elapsed = _clock(time.perf_counter() - self._start if self._start else 0.0)
        lines = [f"[agentrl] done: {view.rl_step} steps in {elapsed}"]
        dead = self.dead.summary()
        if dead:
            lines.append(dead)
        if "eval/success" in base and "eval/success" in final and final is not base:
            lines.append(f"  held-out success: base {base['eval/success']:.3f} -> final "
                         f"{final['eval/success']:.3f} ({int(final.get('eval/episodes', 0))} episodes)")
        for cb in trainer.checkpoint_callbacks:
            if isinstance(cb, ModelCheckpoint) and cb.last_model_path:
                lines.append(f"  checkpoint: {cb.last_model_path} (resume with --ckpt_path last)")
        logger = _mlflow(trainer)
        if logger is not None and any(isinstance(cb, TrajectoryLogger) and cb.log_final_model
                                      for cb in trainer.callbacks):  # type: ignore[attr-defined]
            try:
                uri = logger.experiment.get_run(logger.run_id).info.artifact_uri
                lines.append(f"  final model: {uri}/final_model (transformers/peft from_pretrained)")
            except Exception as exc:  # the store failed: the run is done all the same
                lines.append(f"  final model: not recorded (MLflow {type(exc).__name__})")
        where = self._where(trainer)
        if where:
            lines.append(f"  {where}".replace("\n", "\n  "))
        self._say(trainer, "\n".join(lines))
