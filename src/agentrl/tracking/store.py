"""The MLflow logger of ``agentrl fit``: a tracking store that fails never stops or stalls training, and one MLflow
run per training run across stops and resumes.

Lightning's `MLFlowLogger` lets every store error through: a read-only or missing sqlite file retries for ~100 s
(MLflow's engine retry) before crashing, an unreachable HTTP server ~250 s (120 s timeout, 7 retries with
backoff), and a store that fills mid-run crashes the run at the next metric. `MLflowLogger` instead

* checks the store first with a short timeout (a write lock on a sqlite file, one request to an HTTP server) and
  sets short HTTP limits (``MLFLOW_HTTP_REQUEST_TIMEOUT`` / ``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, unless they are
  set in the environment);
* on any store error, at the start or mid-run, logs one warning and moves to a local fallback store
  (``fallback_uri``, a sqlite file beside the run) where a new run gets the parameters again and the rest of the
  metrics; if the fallback fails too, tracking is off for the rest of the run, with one more warning;
* ends the run FINISHED when training completes, KILLED when it stopped early (a signal; resumable), FAILED on
  an error (`end_status`);
* reopens a run by id (``run_id``, which `reopen_run` takes from the checkpoint on ``--ckpt_path``) and marks it
  RUNNING again, so a resumed run continues the same metric history;
* logs the headline figures a second time under ``Summary/`` (`SUMMARY`: reward, success, held-out success,
  policy and value loss): MLflow's run page orders its metric sections by name, capitals first, and opens only the
  first, so the page leads with them instead of ``eval/`` details;
* gives the run's page as a link that opens it as a training run (`run_page_url`);
* starts a new sqlite store as a copy of a migrated empty one (`agentrl.tracking.store_template`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from agentrl.tracking import store_template

log = logging.getLogger(__name__)
T = TypeVar("T")
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
DEFAULT_FALLBACK_URI = "sqlite:///mlflow-fallback.db"
DEFAULT_UI = "http://127.0.0.1:5000"
# the run page's first metric section (see the module docstring): its name -> the metric it repeats
SUMMARY = {"Summary/reward": "rollout/reward", "Summary/success": "rollout/success",
           "Summary/heldout_success": "eval/success", "Summary/policy_loss": "train/policy_loss",
           "Summary/value_loss": "train/value_loss"}


def with_summary(metrics: Mapping[str, float]) -> dict[str, float]:
    """``metrics`` and, for each headline metric among them, its ``Summary/`` copy."""
    out = dict(metrics)
    out.update({name: metrics[key] for name, key in SUMMARY.items() if key in metrics})
    return out


def run_page_url(experiment_id: str, run_id: str, ui: str = DEFAULT_UI) -> str:
    """The run's page in ``mlflow ui`` laid out for model training. MLflow 3's UI opens in its GenAI layout unless
    the URL or the browser says otherwise (its "Model training" switch), and there every run is listed under
    "Evaluations"; ``workflowType=machine_learning`` opens the "Model training" layout: runs, metric charts."""
    return f"{ui.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"


def _sqlite_file(uri: str) -> str | None:
    path = uri.removeprefix("sqlite:///").split("?")[0] if uri.startswith("sqlite:///") else ""
    return None if path in ("", ":memory:") else path


@contextlib.contextmanager
def store_lock(uri: str, timeout_s: float) -> Iterator[bool]:
    """Hold ``<file>.lock`` beside a sqlite store while MLflow creates or migrates its tables and the experiment:
    two runs started together on a fresh ``mlflow.db`` both ran the migration, and one died in it (``duplicate
    column name``). Other stores, and a folder where no lock file can be made, go unlocked. Yields whether the
    lock is held (what `seed_new_store` needs)."""
    path = _sqlite_file(uri)
    if path is None:
        yield False
        return
    from filelock import FileLock, Timeout

    lock = FileLock(f"{path}.lock", timeout=max(60.0, timeout_s))
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except (Timeout, OSError):  # check_store says what is wrong with the folder; a stuck lock costs a minute
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


def seed_new_store(uri: str) -> bool:
    """A new sqlite store at ``uri`` as a copy of a migrated empty one (`agentrl.tracking.store_template`);
    False for other stores, a store that has content, or when no copy could be made. Only under `store_lock`."""
    path = _sqlite_file(uri)
    return path is not None and store_template.seed_new_store(path)


def check_store(uri: str, timeout_s: float) -> None:
    """Raise (quickly) if the store at ``uri`` cannot be written: sqlite files and HTTP servers are checked."""
    if uri.startswith("sqlite:///"):
        path = _sqlite_file(uri)
        if path is None:
            return
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(path, timeout=timeout_s)
        try:
            con.execute("BEGIN IMMEDIATE")  # takes the write lock: fails on a read-only or unopenable file
            con.execute("ROLLBACK")
        finally:
            con.close()
    elif uri.startswith(("http://", "https://")):
        import requests

        requests.get(uri.rstrip("/") + "/health", timeout=timeout_s)  # any answer: the server is there


def absolute_uri(uri: str) -> str:
    """``sqlite:///relative.db`` as an absolute sqlite URI (what ``mlflow ui`` needs from another directory)."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri.removeprefix("sqlite:///")).resolve())
    return uri


# errors about what was logged, not about the store: a warning, no fallback
DATA_ERRORS = {"INVALID_PARAMETER_VALUE", "RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST", "BAD_REQUEST",
               "INVALID_STATE"}


def _is_data_error(exc: BaseException) -> bool:
    return getattr(exc, "error_code", None) in DATA_ERRORS


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


class MLflowLogger(MLFlowLogger):
    """Lightning's MLflow logger, made safe for training (see the module docstring).

    Args:
        experiment_name: MLflow experiment.
        run_name: Name of a new run.
        tracking_uri: The store: ``sqlite:///file.db``, ``http://host:port``, a folder.
        tags: Tags of a new run.
        run_id: Continue this run instead of starting one (set from the checkpoint on resume).
        artifact_location: Artifact location of a new experiment.
        fallback_uri: Local store used when ``tracking_uri`` fails.
        timeout_s: Seconds for the store check and for each HTTP request.
        max_retries: Retries of a failed HTTP request.
    """

    def __init__(self, experiment_name: str = "agentrl", run_name: str | None = None,
                 tracking_uri: str = DEFAULT_TRACKING_URI, tags: dict[str, Any] | None = None,
                 run_id: str | None = None, artifact_location: str | None = None,
                 fallback_uri: str = DEFAULT_FALLBACK_URI, timeout_s: int = 10, max_retries: int = 1) -> None:
        self.check_settings(timeout_s, max_retries)
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(timeout_s))
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(max_retries))
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
        self.disabled = False
        # MLflow caches a sqlite store per URI string: a relative one would keep writing to the first working
        # directory's file after a chdir (a second run in one process), so the paths are fixed here
        tracking_uri, fallback_uri = absolute_uri(tracking_uri), absolute_uri(fallback_uri)
        with store_lock(tracking_uri, timeout_s) as held:  # MlflowClient creates (migrates) a sqlite store at once
            uri = self._usable(tracking_uri, fallback_uri, timeout_s)
            # a fallback chosen here is created under its own lock too: runs that found the same store dead at once
            # all open the same fallback file (before, two of three died in MLflow's migration of it)
            with contextlib.nullcontext(held) if uri == tracking_uri else store_lock(uri, timeout_s) as held_here:
                if held_here:
                    seed_new_store(uri)
                super().__init__(experiment_name=experiment_name, run_name=run_name, tracking_uri=uri, tags=tags,
                                 run_id=run_id if uri == tracking_uri else None, artifact_location=artifact_location)
        self.configured_uri = tracking_uri
        self.fallback_uri = fallback_uri
        self.timeout_s = timeout_s
        self.end_status: str | None = None  # set by TrajectoryLogger: KILLED on an early stop
        self.reopened = False  # the run is the checkpoint's, continued
        self._params: dict[str, Any] = {}

    @staticmethod
    def check_settings(timeout_s: int = 10, max_retries: int = 1) -> None:
        """The checks of the arguments, without creating anything (`agentrl.training.command.preflight` runs them)."""
        if not isinstance(timeout_s, int | float) or isinstance(timeout_s, bool) or timeout_s < 1:
            raise ValueError(f"trainer.logger.init_args.timeout_s must be >= 1 second, got {timeout_s!r}")
        if not isinstance(max_retries, int) or isinstance(max_retries, bool) or max_retries < 0:
            raise ValueError(f"trainer.logger.init_args.max_retries must be >= 0, got {max_retries!r}")

    # ------------------------------------------------------------------ opening the store

    def _usable(self, uri: str, fallback: str, timeout_s: float) -> str:
        """``uri`` when it can be written, else the fallback; a folder nobody reads when neither can."""
        for candidate in (uri, fallback):
            try:
                check_store(candidate, timeout_s)
            except Exception as exc:
                log.warning("MLflow store %s cannot be used (%s)%s", candidate, _short(exc),
                            f": logging to the local store {absolute_uri(fallback)}; training continues"
                            if candidate == uri else ": tracking is off for this run; training continues")
                continue
            return candidate
        self.disabled = True
        return "sqlite:///:memory:"  # a store in memory that nothing is written to

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        if not self._initialized and not self.disabled:
            self._open()
        return self._mlflow_client

    def _open(self) -> None:
        try:
            check_store(self._tracking_uri, self.timeout_s)
            with store_lock(self._tracking_uri, self.timeout_s):  # two runs creating one experiment: one does
                self._create_or_reopen()
        except Exception as exc:  # the store is unusable: fall back
            self._fall_back(exc, "opening the run")

    def _create_or_reopen(self) -> None:
        client = self._mlflow_client
        if self._run_id is not None:
            try:
                run = client.get_run(self._run_id)
            except Exception as exc:
                log.warning("MLflow run %s from the checkpoint is not in %s (%s): starting a new run", self._run_id,
                            self._tracking_uri, _short(exc))
                self._run_id = None
            else:
                client.update_run(self._run_id, status="RUNNING")
                self.reopened = True
                log.info("MLflow: continuing run %s (experiment %s)", self._run_id, run.info.experiment_id)
        MLFlowLogger.experiment.fget(self)  # type: ignore[attr-defined]

    def _fall_back(self, exc: BaseException, what: str) -> bool:
        """Move to the fallback store after ``exc``; False when tracking is now off."""
        from mlflow import MlflowClient

        if self._tracking_uri == self.fallback_uri or self.disabled:
            log.warning("MLflow fallback store %s failed while %s (%s): tracking is off for the rest of this run; "
                        "training continues", self.fallback_uri, what, _short(exc))
            self.disabled = True
            return False
        log.warning("MLflow store %s failed while %s (%s): logging to the local store %s from here on; training "
                    "continues", self._tracking_uri, what, _short(exc), absolute_uri(self.fallback_uri))
        self._tracking_uri = self.fallback_uri
        self._run_id = self._experiment_id = None
        self._initialized = False
        try:
            check_store(self.fallback_uri, self.timeout_s)
            with store_lock(self.fallback_uri, self.timeout_s) as held:
                if held:
                    seed_new_store(self.fallback_uri)
                self._mlflow_client = MlflowClient(self.fallback_uri)
                MLFlowLogger.experiment.fget(self)  # type: ignore[attr-defined]
            if self._params:
                super().log_hyperparams(self._params)
        except Exception as again:
            return self._fall_back(again, "opening the fallback run")
        return True

    # ------------------------------------------------------------------ logging that never raises

    def call(self, what: str, fn: Callable[[Any, str], T]) -> T | None:
        """``fn(client, run_id)``; on a store error: one warning, the fallback store, one more try there."""
        for _ in range(2):
            if self.disabled:
                return None
            try:
                client = self.experiment
                if self.disabled:
                    return None
                return fn(client, str(self._run_id))
            except Exception as exc:
                if _is_data_error(exc):
                    log.warning("MLflow: %s failed (%s); training continues", what, _short(exc))
                    return None
                if not self._fall_back(exc, what):
                    return None
        return None

    @property
    def tracking_uri(self) -> str:
        """The store in use now (the fallback after a failure), as an absolute URI."""
        return absolute_uri(self._tracking_uri)

    def ui_command(self) -> str:
        """The command that shows this run: ``mlflow ui --backend-store-uri <store>``."""
        return f"mlflow ui --backend-store-uri {self.tracking_uri}"

    def summary(self) -> str:
        """One line for the console: run id, experiment, store, and the command that shows the run."""
        if self.disabled:
            return "MLflow: tracking is off for this run (the store and the fallback failed)"
        return (f"MLflow run {self.run_id} in experiment '{self._experiment_name}' ({self.tracking_uri}); "
                f"view it with: {self.ui_command()}, then open {self.run_page_url()}")

    def run_page_url(self, ui: str = DEFAULT_UI) -> str:
        """This run's page in ``mlflow ui`` (at ``ui``) as a training run (`run_page_url`)."""
        return run_page_url(self.experiment_id or "0", self.run_id or "", ui)

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        new = dict(params) if isinstance(params, Mapping) else vars(params)
        self._params.update(new)
        self.call("logging parameters", lambda client, run_id: super(MLflowLogger, self).log_hyperparams(
            _unlogged(new, client.get_run(run_id).data.params)))

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        full = with_summary(metrics)
        self.call("logging metrics", lambda _c, _r: super(MLflowLogger, self).log_metrics(full, step))

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        if not self._initialized or self.disabled:
            return
        final = self.end_status or {"success": "FINISHED", "finished": "FINISHED"}.get(status, "FAILED")
        self.call("ending the run", lambda client, run_id: client.set_terminated(run_id, final))

    @rank_zero_only
    def supersede(self, step: int) -> None:
        """A resume from the checkpoint of RL step ``step`` logs the later steps again: remove from the continued
        run the points that the stopped run logged for them, so that a curve has one point a step.

        RL step k logs its metrics at step k − 1 and the evaluation after it at step k: the points removed are the
        metrics at steps >= ``step`` and the ``eval/*`` points at steps > ``step``. The run is tagged
        ``agentrl.resumed_at_step``. Only a sqlite store (the default and the fallback) can delete points; with
        another store the old points stay beside the new ones, and one warning says so."""
        if not self.reopened or self.disabled:
            return
        self.call("tagging the resume", lambda client, run_id: client.set_tag(run_id, "agentrl.resumed_at_step",
                                                                              str(step)))
        path = _sqlite_file(self._tracking_uri)
        if path is None:
            log.warning("MLflow: resumed at step %d; the store %s cannot delete the points the stopped run logged "
                        "after it: the curves show both (tag agentrl.resumed_at_step)", step, self.tracking_uri)
            return
        try:
            removed = remove_points_after(path, str(self._run_id), step)
        except sqlite3.Error as exc:
            log.warning("MLflow: could not remove the superseded points after step %d (%s)", step, _short(exc))
            return
        if removed:
            log.info("MLflow: resumed at step %d: removed %d points the stopped run logged after it", step, removed)

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        return None  # checkpoints stay files beside the run; the final model is logged by TrajectoryLogger


def remove_points_after(path: str, run_id: str, step: int) -> int:
    """Delete run ``run_id``'s metric points at steps >= ``step`` (``eval/*``: > ``step``) from the sqlite store
    ``path`` and recompute its latest values (MLflow's ``latest_metrics``: the highest step, then the newest point);
    the number of points deleted."""
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as con, con:
        removed = con.execute("DELETE FROM metrics WHERE run_uuid = ? AND ((key LIKE 'eval/%' AND step > ?) OR "
                              "(key NOT LIKE 'eval/%' AND step >= ?))", (run_id, step, step)).rowcount
        if removed:
            latest: dict[str, tuple[Any, ...]] = {}
            for row in con.execute("SELECT key, value, timestamp, step, is_nan FROM metrics WHERE run_uuid = ?",
                                   (run_id,)):
                if row[0] not in latest or (row[3], row[2], row[1]) > (latest[row[0]][3], latest[row[0]][2],
                                                                       latest[row[0]][1]):
                    latest[row[0]] = row
            con.execute("DELETE FROM latest_metrics WHERE run_uuid = ?", (run_id,))
            con.executemany("INSERT INTO latest_metrics (key, value, timestamp, step, is_nan, run_uuid) "
                            "VALUES (?, ?, ?, ?, ?, ?)", [(*row, run_id) for row in latest.values()])
    return int(removed)


def _unlogged(params: dict[str, Any], logged: dict[str, str]) -> dict[str, Any]:
    """The parameters a (reopened) run does not have yet; MLflow refuses to change a logged value, and a resume
    changes only bookkeeping ones (``ckpt_path``, the logger's ``run_id``)."""
    return {k: v for k, v in params.items() if k not in logged}


def reopen_run(fit_config: Any) -> None:
    """On ``--ckpt_path``, continue the MLflow run recorded in the checkpoint (``checkpoint["mlflow"]``).

    Args:
        fit_config: The parsed ``fit`` config (a jsonargparse namespace) before instantiation; its
            ``trainer.logger`` gets ``run_id`` when the checkpoint's run is in the same store.
    """
    ckpt = fit_config.get("ckpt_path")
    inits = [init for init in (getattr(entry, "init_args", None) for entry in logger_entries(fit_config))
             if init is not None and "run_id" in init and not init.get("run_id")]
    if not ckpt or not inits:
        return
    path = Path(fit_config.get("checkpoint.dirpath") or "checkpoints") / "last.ckpt" if ckpt == "last" else Path(ckpt)
    if not path.is_file():
        return
    import torch

    saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("mlflow") or {}
    if not saved.get("run_id"):
        return
    uris = [init.get("tracking_uri") or DEFAULT_TRACKING_URI for init in inits]
    saved_uri = absolute_uri(saved.get("tracking_uri", ""))
    same = [init for init, uri in zip(inits, uris, strict=True) if absolute_uri(uri) == saved_uri]
    for init in same:
        init.run_id = saved["run_id"]
    if not same:
        log.warning("the checkpoint's MLflow run %s is in %s, not in %s: starting a new run", saved["run_id"],
                    saved.get("tracking_uri"), " or ".join(uris))


def logger_entries(config: Any) -> list[Any]:
    """The ``trainer.logger`` entries of a parsed config: one, a list (e.g. CSV and MLflow), or none."""
    logger = config.get("trainer.logger")
    if isinstance(logger, list | tuple):
        return list(logger)
    return [logger] if logger is not None and not isinstance(logger, bool) else []
