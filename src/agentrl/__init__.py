"""agentrl: fine-tune multi-turn LLM agents with turn-level reinforcement learning (Turn-PPO, RTPO).

Heavy pieces (Lightning, transformers, HTTP) live in submodules and are imported where used, so that
``import agentrl`` and ``import agentrl.algorithms`` stay light; ``agentrl.fit`` (`agentrl.training.command.api.fit`, a
training run from Python) imports them when it is first used.
"""

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "fit"]


def __getattr__(name: str) -> Any:
    if name == "fit":
        from agentrl.training.command.api import fit

        return fit
    raise AttributeError(f"module 'agentrl' has no attribute {name!r}")
