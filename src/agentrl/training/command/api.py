"""The Python API of a training run: `fit`, the same run as ``agentrl fit`` with the same checks and defaults.

    import agentrl

    cli = agentrl.fit("configs/smoke/rtpo.yaml", data={"steps": 2}, model={"optim": {"lr": 1e-4}})
    cli.model.rl_step, float(cli.trainer.callback_metrics["rollout/reward"])

It is a thin layer over the LightningCLI objects of `agentrl.training.command.cli` (no second code path): configs are
``--config`` files in order, keyword arguments are command-line overrides (``data={"steps": 2}`` is
``--data.steps 2``), and the result is the finished `AgentRLCLI` with its ``trainer``, ``model`` and
``datamodule``. A wrong key or value raises `ConfigError` with the one-line message of the command.

``cli.trainer.callback_metrics`` holds, as 0-d tensors under the names MLflow shows, the last step's metrics
(``rollout/reward``, ``rollout/success``, ``train/*``, ``perf/*``, ...) and the last evaluation's ``eval/*``
(after the final evaluation: ``eval/success``); ``reward`` and ``step_s`` are the progress bar's copies. Config
paths are taken from the working directory, as on the command line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.training.command.cli import AgentRLCLI, run_fit
from agentrl.training.command.cli_errors import RaisingArgumentParser


def override_args(overrides: Mapping[str, Any], prefix: str = "") -> list[str]:
    """``{"data": {"steps": 2}}`` as ``["--data.steps=2"]``; a mapping with a ``class_path`` stays one value."""
    out: list[str] = []
    for key, value in overrides.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value and "class_path" not in value:
            out += override_args(value, f"{name}.")
        else:
            text = value if isinstance(value, str) else json.dumps(value)  # JSON is YAML: null, true, [1, 2]
            out.append(f"--{name}={text}")
    return out


def fit(*configs: str | os.PathLike[str], args: Sequence[str] = (), **overrides: Any) -> AgentRLCLI:
    """Train as ``agentrl fit --config CONFIG ... [args] [overrides]`` does, in this process.

    Args:
        configs: YAML config files, applied in order (later ones override earlier ones).
        args: Further command-line arguments, as on the command line (``["--ckpt_path", "last"]``).
        overrides: Config keys by their top-level section: ``data={"steps": 2}``, ``model={"algorithm": "GRPO"}``,
            ``trainer={"max_time": "00:00:10:00"}``, ``seed_everything=1``.

    Returns:
        The finished `AgentRLCLI`: ``.trainer`` (its ``callback_metrics`` hold the last step's and the last
        evaluation's metrics), ``.model`` (the trained `AgentRLModule`), ``.datamodule``.

    Raises:
        ConfigError: a wrong key or value, before any work (no model load, no MLflow run).
    """
    argv = [arg for config in configs for arg in ("--config", os.fspath(config))]
    return run_fit([*argv, *args, *override_args(overrides)], parser_class=RaisingArgumentParser)
