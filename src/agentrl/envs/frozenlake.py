"""FrozenLake as a text environment.

Mirrors gymnasium's ``toy_text/frozen_lake.py`` (``FrozenLake-v1``) and its random-map generator: an N x N lake,
start top-left, goal bottom-right, ``holes`` holes placed by a NumPy generator seeded by the episode seed, kept
only if a BFS finds a path (as gymnasium's ``generate_random_map`` checks ``is_valid``). Departures: the hole
count is exact instead of a per-cell probability, and the map is redrawn every episode from the seed.

Action format: the **first direction word** anywhere in the reply, case-insensitive: ``left``, ``down``,
``right`` or ``up`` ("I move Right." is ``right``). Anything else is a format error. With ``slippery=True`` the
lake moves the agent in the intended direction with probability 1/3 and in each perpendicular direction with
probability 1/3 (gymnasium's ``is_slippery``), from a generator seeded by the episode seed.

Rewards (gymnasium's): 1.0 on reaching the goal (terminated, success), 0.0 on falling into a hole (terminated,
failure), 0.0 otherwise. Walking into the edge leaves the agent in place.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from agentrl.envs.base import EpisodeSnapshots, StepResult, format_error

ACTIONS: dict[str, tuple[int, int]] = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
_ORDER = ("left", "down", "right", "up")  # gymnasium's action numbering 0..3
_DIRECTION = re.compile(r"\b(left|down|right|up)\b", re.IGNORECASE)
_MAX_TRIES = 1000


def find_path(grid: list[str]) -> list[str] | None:
    """Shortest path from the top-left to the goal ``G`` avoiding holes ``H`` (BFS).

    Args:
        grid: Rows of ``S``/``F``/``H``/``G`` characters (gymnasium's map format).

    Returns:
        The actions (``"left"``, ``"down"``, ...) of a shortest path, or None when the goal is unreachable.
    """
    n_rows, n_cols = len(grid), len(grid[0])
    start = (0, 0)
    parents: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if grid[cell[0]][cell[1]] == "G":
            path: list[str] = []
            while (link := parents[cell]) is not None:
                cell, move = link
                path.append(move)
            return path[::-1]
        for name in _ORDER:
            dr, dc = ACTIONS[name]
            nxt = (cell[0] + dr, cell[1] + dc)
            inside = 0 <= nxt[0] < n_rows and 0 <= nxt[1] < n_cols
            if inside and nxt not in parents and grid[nxt[0]][nxt[1]] != "H":
                parents[nxt] = (cell, name)
                queue.append(nxt)
    return None


def generate_map(size: int, holes: int, rng: np.random.Generator) -> list[str]:
    """Draw a solvable ``size`` x ``size`` map with exactly ``holes`` holes.

    Rejection sampling as gymnasium does; if that keeps failing (many holes), the holes are placed off a random
    monotone start-to-goal path, which is always solvable.
    """
    inner = np.arange(1, size * size - 1)  # every cell except start (0) and goal (last)
    for _ in range(_MAX_TRIES):
        grid = _grid_with_holes(size, rng.choice(inner, size=holes, replace=False))
        if find_path(grid) is not None:
            return grid
    moves = np.array([0] * (size - 1) + [1] * (size - 1))
    rng.shuffle(moves)
    row = col = 0
    on_path = {0}
    for move in moves:
        row, col = row + int(move == 1), col + int(move == 0)
        on_path.add(row * size + col)
    free = np.array([c for c in inner if int(c) not in on_path])
    return _grid_with_holes(size, rng.choice(free, size=holes, replace=False))


def _grid_with_holes(size: int, cells: np.ndarray) -> list[str]:
    flat = ["F"] * (size * size)
    flat[0], flat[-1] = "S", "G"
    for c in cells:
        flat[int(c)] = "H"
    return ["".join(flat[r * size : (r + 1) * size]) for r in range(size)]


@dataclass
class _LakeState:
    grid: list[str] = field(default_factory=lambda: ["SG"])
    pos: tuple[int, int] = (0, 0)
    turn: int = 0
    done: bool = False
    started: bool = False
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))


class FrozenLakeEnv(EpisodeSnapshots):
    """Walk from the top-left corner to the goal without falling into a hole.

    Args:
        size: Side of the square lake, in [2, 12].
        holes: Number of holes, in [0, (size - 1) ** 2] (more could make every map unsolvable).
        slippery: Move in a random non-reverse direction (each with probability 1/3), as gymnasium.
        max_turns: Steps (format errors included) before the episode is truncated.
        format_penalty: Reward of a reply without a direction word (should be <= 0).
        prompt_example: Put one example reply in the system prompt (SmolLM2-135M's valid replies on 2 x 2: 36 % with
            it, 17 % without; docs/examples/base_success.md).
    """

    episode_type = _LakeState

    def __init__(
        self,
        size: int = 4,
        holes: int = 2,
        slippery: bool = False,
        max_turns: int = 8,
        format_penalty: float = -0.1,
        prompt_example: bool = True,
    ) -> None:
        if not 2 <= size <= 12:
            raise ValueError(f"size must be in [2, 12], got {size}")
        if not 0 <= holes <= (size - 1) ** 2:
            raise ValueError(f"holes must be in [0, (size - 1) ** 2 = {(size - 1) ** 2}], got {holes}")
        if not 1 <= max_turns <= 1000:
            raise ValueError(f"max_turns must be in [1, 1000], got {max_turns}")
        if not -10.0 <= format_penalty <= 0.0:
            raise ValueError(f"format_penalty must be in [-10, 0], got {format_penalty}")
        self.size, self.holes, self.slippery = size, holes, slippery
        self.max_turns = max_turns
        self.format_penalty = format_penalty
        self.system_prompt = (
            "You walk on a frozen lake grid. P is you, G is the goal, H is a hole, . is safe ice. "
            "Reach G without stepping on H. Reply with one move: left, down, right or up."
        )
        if slippery:
            self.system_prompt += " The ice is slippery: you may slide sideways."
        if prompt_example:
            self.system_prompt += "\nExample reply: right"
        self._episode = _LakeState()

    def reset(self, seed: int) -> str:
        """Draw a solvable map from ``seed`` and return its rendering."""
        rng = np.random.default_rng(seed)
        grid = generate_map(self.size, self.holes, rng)
        self._episode = _LakeState(grid=grid, started=True, rng=rng)
        return f"{self.render()}\nYour move:"

    def render(self) -> str:
        """The lake as text: ``P`` player, ``G`` goal, ``H`` hole, ``.`` frozen."""
        state = self._episode
        rows = []
        for r, line in enumerate(state.grid):
            cells = ["P" if (r, c) == state.pos else {"H": "H", "G": "G"}.get(ch, ".") for c, ch in enumerate(line)]
            rows.append(" ".join(cells))
        return "\n".join(rows)

    def step(self, action: str) -> StepResult:
        """Move by the first direction word in ``action``."""
        state = self._episode
        if not state.started or state.done:
            raise RuntimeError("FrozenLakeEnv.step called before reset() or after the episode ended")
        state.turn += 1
        truncated = state.turn >= self.max_turns
        match = _DIRECTION.search(action)
        if match is None:
            state.done = truncated
            obs = f"Invalid move. Reply with one word: left, down, right or up.\n{self.render()}"
            return format_error(obs, self.format_penalty, truncated)
        move = self._slip(match.group(1).lower())
        dr, dc = ACTIONS[move]
        row = min(max(state.pos[0] + dr, 0), self.size - 1)
        col = min(max(state.pos[1] + dc, 0), self.size - 1)
        state.pos = (row, col)
        cell = state.grid[row][col]
        info = {"format_error": False, "move": move}
        if cell in "GH":
            state.done = True
            info["success"] = cell == "G"
            obs = "You reached the goal!" if cell == "G" else "You fell into a hole."
            return StepResult(obs, float(cell == "G"), True, False, info)
        state.done = truncated
        if truncated:
            info["success"] = False
            return StepResult(f"Out of moves.\n{self.render()}", 0.0, False, True, info)
        return StepResult(f"{self.render()}\nYour move:", 0.0, False, False, info)

    def _slip(self, move: str) -> str:
        if not self.slippery:
            return move
        i = _ORDER.index(move)
        return _ORDER[(i + int(self._episode.rng.integers(-1, 2))) % 4]
