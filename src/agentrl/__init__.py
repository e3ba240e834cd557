"""agentrl: fine-tune multi-turn LLM agents with turn-level reinforcement learning (Turn-PPO, RTPO).

Heavy pieces (Lightning, transformers, HTTP) live in submodules and are imported where used, so that
``import agentrl`` and ``import agentrl.algorithms`` stay light.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
