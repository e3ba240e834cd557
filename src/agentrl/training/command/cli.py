"""``agentrl fit``: LightningCLI over `AgentRLModule` and `RolloutDataModule`.

Defaults a user expects: MLflow tracking to ``sqlite:///mlflow.db`` (the resolved config logged with the run, a
run name that says what ran), one epoch of ``data.steps`` RL steps, one line per step in RL terms with the
``mlflow ui`` command at the start and a summary at the end (`agentrl.training.command.progress`), other libraries quiet
unless ``AGENTRL_VERBOSE=1``, ``checkpoints/last.ckpt`` every ``checkpoint.every_n_steps`` steps and at the end, a
graceful stop on SIGINT/SIGTERM, and ``--ckpt_path last`` to resume. Unknown keys, wrong types and out-of-range
values stop the run before any work (no model load, no MLflow run), naming the key
(`agentrl.training.command.preflight`).

``agentrl validate`` is LightningCLI's ``validate`` over the same classes and config
(`agentrl.training.command.validate`).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from jsonargparse.typing import NonNegativeInt
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger

from agentrl.models.memory import bound_kernel_caches
from agentrl.models.policy import LoRATargetError
from agentrl.tracking import DEFAULT_TRACKING_URI, TrajectoryLogger, log_config, reopen_run
from agentrl.tracking.store import logger_entries
from agentrl.training.command import validate
from agentrl.training.command.cli_errors import AgentRLArgumentParser
from agentrl.training.command.keys import COMMON_KEYS, normalize_argv
from agentrl.training.command.paths import resolve_input_paths
from agentrl.training.command.preflight import ConfigError, preflight
from agentrl.training.command.progress import RunProgress, quiet_libraries, verbose
from agentrl.training.rollout.datamodule import RolloutDataModule
from agentrl.training.schedules import grpo, rtpo, token_ppo, turn_ppo  # noqa: F401  (`--model.algorithm TurnPPO`)
from agentrl.training.system.callbacks import GracefulStop, RLCheckpoint
from agentrl.training.system.checkpoint_io import CheckpointError, check_checkpoint
from agentrl.training.system.module import AgentRLModule


class MLflowConfig(SaveConfigCallback):
    """Log the resolved config (as ``config.yaml``) and its flattened values (as parameters) to MLflow."""

    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if not trainer.is_global_zero:
            return
        for logger in trainer.loggers:  # the MLflow one(s) among several loggers, not only the first
            if isinstance(logger, MLFlowLogger):
                flat = _flatten(self.config.as_dict())
                log_config(logger, self.parser.dump(self.config, skip_none=False),
                           {k: v for k, v in flat.items() if not k.startswith("trainer.callbacks")})


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
    elif isinstance(d, list):
        out[prefix[:-1]] = str(d)[:500]
    elif callable(d) and hasattr(d, "__qualname__"):  # a function chosen in the config: log its import path
        out[prefix[:-1]] = f"{d.__module__}.{d.__qualname__}"
    else:
        out[prefix[:-1]] = d
    return out


class AgentRLCLI(LightningCLI):
    def _parse_ckpt_path(self) -> None:
        # Lightning reads a --ckpt_path file here, right after parsing, with torch's traceback for a damaged one
        subcommand = self.config.get("subcommand")
        ckpt = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt and Path(ckpt).is_file():
            try:
                check_checkpoint(Path(ckpt))
            except CheckpointError as exc:
                raise ConfigError(f"ckpt_path: {exc}") from None
        super()._parse_ckpt_path()

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(RLCheckpoint, "checkpoint")
        parser.add_lightning_class_args(TrajectoryLogger, "tracking")
        parser.add_argument("--progress.dead_steps", type=NonNegativeInt, default=3,
                            help="say in the end summary when this many steps in a row could not learn (0: never)")
        parser.set_defaults({
            # a config without a model section trains SmolLM2 (docs/adapters.md). The algorithm has no default: a
            # default class's init_args would carry over to the configured one (jsonargparse keeps the arguments the
            # two share, e.g. RTPO's group_size into TurnPPO's)
            "model.policy": {"class_path": "agentrl.models.policy.Policy"},
            "trainer.max_epochs": 1,
            "trainer.log_every_n_steps": 1,
            "trainer.num_sanity_val_steps": 0,
            "trainer.enable_model_summary": False,  # agentrl prints its own start line; the table is noise here
            "trainer.logger": {
                "class_path": "agentrl.tracking.MLflowLogger",
                "init_args": {"experiment_name": "agentrl", "tracking_uri": DEFAULT_TRACKING_URI},
            },
        })

    def before_instantiate_classes(self) -> None:
        logging.basicConfig(level=logging.INFO if verbose() else logging.WARNING,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        quiet_libraries()
        config = self.config[self.subcommand] if self.subcommand else self.config
        _default_run_name(config)
        for callback in self.trainer_defaults.get("callbacks", []):
            if isinstance(callback, RunProgress) and config.get("progress.dead_steps") is not None:
                callback.dead.after = int(config["progress.dead_steps"])
        if config.get("trainer.enable_progress_bar") is False:  # Lightning refuses a progress bar callback then
            self.trainer_defaults["callbacks"] = [c for c in self.trainer_defaults.get("callbacks", [])
                                                  if not isinstance(c, RunProgress)]
        resolve_input_paths(config)  # a task file beside the config is found from any working directory
        preflight(self.parser, self.config, self.subcommand or "fit")
        if self.subcommand in (None, "fit"):
            _warn_missing_resume(config)
            _check_resume_steps(config)
            _warn_seed_mismatch(config)
            reopen_run(config)  # --ckpt_path continues the checkpoint's MLflow run
        elif self.subcommand == "validate":
            try:
                validate.check_validate(config)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            validate.tag_evaluation_run(config)  # a new run, named and tagged as an evaluation

    def before_fit(self) -> None:
        # resuming loads checkpoints with torch.load(weights_only=True) unless the user says otherwise
        config = self.config_init[self.subcommand]
        if "weights_only" in config and config["weights_only"] is None:
            config["weights_only"] = True
        _show_episode_logs(getattr(self.datamodule, "agent", None))

    def before_validate(self) -> None:
        self.before_fit()  # the same: checkpoints loaded with weights_only, episode logs shown

    def after_validate(self) -> None:
        line = validate.run_line(self.trainer) if self.trainer.is_global_zero else None
        if line:
            print(f"[agentrl] {line}", flush=True)

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        trainer.callbacks.append(GracefulStop())  # type: ignore[attr-defined]
        return trainer


def _warn_missing_resume(config: Namespace) -> None:
    """``--ckpt_path last`` with no checkpoint trains from scratch (Lightning's "set and forget" semantics, so a job
    script may always pass it); the user expected a resume, so say so in one line, whatever the quiet mode."""
    if config.get("ckpt_path") != "last":
        return
    path = Path(config.get("checkpoint.dirpath") or "checkpoints") / "last.ckpt"
    if not path.is_file():
        print(f"agentrl fit: warning: --ckpt_path last: no checkpoint at {path}; this run starts from step 0 "
              "(a new MLflow run)", file=sys.stderr, flush=True)


def _check_resume_steps(config: Namespace) -> None:
    """A resume trains the steps from the checkpoint's up to ``data.steps`` (a total, not a count of more steps).
    ``data.steps`` equal to the checkpoint's step: one line, nothing to train (exit 0: the run is complete, a job
    script that always resumes stays green). Below it: a `ConfigError` before any model load (exit 2), since the
    user most likely meant "N more steps"."""
    ckpt = config.get("ckpt_path")
    if not ckpt:
        return
    path = Path(config.get("checkpoint.dirpath") or "checkpoints") / "last.ckpt" if ckpt == "last" else Path(ckpt)
    if not path.is_file():  # absent (a warning above) or a sharded checkpoint folder
        return
    import torch

    try:
        saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("agentrl") or {}
    except Exception:  # a damaged file: Lightning's own check names it (`AgentRLCLI._parse_ckpt_path`)
        return
    done, steps = int(saved.get("rl_step", 0)), int(config.get("data.steps") or 0)
    if steps < done:
        raise ConfigError(f"data.steps {steps} is below the checkpoint's step {done} ({path}): data.steps is the "
                          f"run's total; pass --data.steps {done + steps} to train {steps} more")
    if steps == done:
        print(f"agentrl fit: the checkpoint {path} is at step {done} = data.steps: nothing to train (pass "
              f"--data.steps N > {done} to train more)", file=sys.stderr, flush=True)


def _warn_seed_mismatch(config: Namespace) -> None:
    """``seed_everything`` seeds torch's global generators only. The run's randomness is ``data.seed`` (every
    episode's sampling seed) and ``model.seed`` (minibatch order): a ``--seed_everything 1`` alone replays seed 0's
    run exactly (two "seeds" of the main job once gave the same 24,093 tokens). Say so in one line when they differ,
    whatever the quiet mode."""
    seed = config.get("seed_everything")
    if not isinstance(seed, int) or isinstance(seed, bool):
        return
    other = {key: config.get(key) for key in ("data.seed", "model.seed")}
    differ = [f"{key}={value}" for key, value in other.items() if isinstance(value, int) and value != seed]
    if differ:
        print(f"agentrl fit: warning: seed_everything={seed} seeds torch only; this run samples with "
              f"{' and '.join(differ)} (set --data.seed and --model.seed to change the run)", file=sys.stderr,
              flush=True)


def _show_episode_logs(agent: Any) -> None:
    """An agent's ``log_episodes: true`` asks for its INFO lines: they show in quiet mode too."""
    if getattr(agent, "log_episodes", False) is True:
        logging.getLogger(type(agent).__module__).setLevel(logging.INFO)


def _short(class_path: Any) -> str:
    return str(class_path).rsplit(".", 1)[-1].lower() if class_path else ""


def _default_run_name(config: Namespace) -> None:
    """Name the MLflow run after what runs (``rtpo-guessnumber-s0``) unless the config names it."""
    loggers = [entry for entry in logger_entries(config)
               if isinstance(entry, Namespace) and _short(entry.get("class_path")) == "mlflowlogger"
               and not entry.get("init_args.run_name")]
    if not loggers:
        return
    algorithm = _short(config.get("model.algorithm.class_path")) or "run"
    agent = config.get("data.agent")
    env = agent.get("init_args.env.class_path") if isinstance(agent, Namespace) else None
    task = _short(env).removesuffix("env") if env else _short(agent.get("class_path") if agent else "")
    task = task.removesuffix("agent") or "agent"
    seed = config.get("seed_everything")
    seed_part = f"-s{seed}" if isinstance(seed, int) and not isinstance(seed, bool) else ""
    for logger in loggers:
        logger["init_args.run_name"] = f"{algorithm}-{task}{seed_part}"


def add_import_paths(argv: Sequence[str]) -> None:
    """Let a config name modules in the working directory or beside the config file (``build: my_agent.build``
    with ``my_agent.py`` next to ``my_config.yaml``), as ``python -m`` would; the console script alone puts only
    its own folder on ``sys.path``. They are appended: an installed module of the same name still comes first."""
    folders = [Path.cwd()]
    for i, arg in enumerate(argv):
        path = arg.removeprefix("--config=") if arg.startswith("--config=") else \
            argv[i + 1] if arg == "--config" and i + 1 < len(argv) else None
        if path is not None:
            folders.append(Path(path).resolve().parent)
    for folder in folders:
        if str(folder) not in sys.path:
            sys.path.append(str(folder))


def run_fit(argv: Sequence[str], *, parser_class: type[AgentRLArgumentParser] = AgentRLArgumentParser,
            subcommand: str = "fit") -> AgentRLCLI:
    """``agentrl fit`` (or ``validate``) with these (already split) arguments, in this process; returns the
    finished CLI object.

    Raises:
        ConfigError: a wrong value found by the checks before any work (`agentrl.training.command.preflight`).
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    bound_kernel_caches()  # as `agentrl` does first (agentrl.fit comes here directly): too late once a kernel is built
    # tasks are plain data handed to training_step on purpose (rollouts happen inside it): not a mistake
    warnings.filterwarnings("ignore", message="You have overridden `transfer_batch_to_device`")
    warnings.filterwarnings("ignore", message=".*isinstance.treespec, LeafSpec.*")
    # the arguments are given explicitly because they are normalized (see normalize_argv), not by mistake
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
    # replaced by agentrl's own line, which names the checkpoint folder (`_warn_missing_resume`)
    warnings.filterwarnings("ignore", message=r'.*ckpt_path="last"\) is set, but there is no last checkpoint')
    quiet_libraries()
    add_import_paths(argv)
    return AgentRLCLI(
        AgentRLModule,
        RolloutDataModule,
        args=[subcommand, *normalize_argv(argv)],
        parser_class=parser_class,
        save_config_callback=MLflowConfig,
        save_config_kwargs={"overwrite": True, "save_to_log_dir": False},
        trainer_defaults={"callbacks": [RunProgress()]},
        auto_configure_optimizers=False,
        seed_everything_default=0,  # as data.seed and model.seed; not Lightning's random seed and its warning
    )


def fit_main(argv: Sequence[str], subcommand: str = "fit") -> int:
    """Entry point of ``agentrl fit``."""
    if any(a in ("-h", "--help") for a in argv):
        print(COMMON_KEYS)
    try:
        run_fit(argv, subcommand=subcommand)
    except ConfigError as exc:
        print(f"agentrl {subcommand}: config error: {exc}", file=sys.stderr, flush=True)
        return 2
    except (CheckpointError, LoRATargetError) as exc:  # found after the load began: still one line, no traceback
        print(f"agentrl {subcommand}: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


def validate_main(argv: Sequence[str]) -> int:
    """Entry point of ``agentrl validate`` (`agentrl.training.command.validate`): the same config as ``fit`` and
    ``--ckpt_path``; plays the held-out tasks once and logs an evaluation run."""
    return fit_main(argv, subcommand="validate")
