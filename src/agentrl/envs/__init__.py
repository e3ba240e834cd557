"""Text environments: gymnasium-like, deterministic for a seed, text in and text out (see `base`)."""

from agentrl.envs.base import SnapshotEnv, StepResult, TextEnv
from agentrl.envs.creditchain import CreditChainEnv
from agentrl.envs.frozenlake import FrozenLakeEnv
from agentrl.envs.guess import GuessNumberEnv
from agentrl.envs.searchqa import SearchIndex, SearchQAEnv
from agentrl.envs.shop import ShopEnv
from agentrl.envs.sokoban import SokobanEnv, SokobanState, solve

__all__ = [
    "CreditChainEnv",
    "FrozenLakeEnv",
    "GuessNumberEnv",
    "SearchIndex",
    "SearchQAEnv",
    "ShopEnv",
    "SnapshotEnv",
    "SokobanEnv",
    "SokobanState",
    "StepResult",
    "TextEnv",
    "solve",
]
