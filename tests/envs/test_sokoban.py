"""Sokoban: generated rooms are solvable, the BFS solution wins, rewards follow RAGEN."""

from __future__ import annotations

import pytest

from agentrl.envs import SokobanEnv, SokobanState, solve
from agentrl.envs.sokoban import move


def room(lines: list[str]) -> SokobanState:
    """Parse a room drawn with the environment's legend."""
    cells = {(r, c): ch for r, line in enumerate(lines) for c, ch in enumerate(line)}
    return SokobanState(
        height=len(lines),
        width=len(lines[0]),
        walls=frozenset(k for k, v in cells.items() if v == "#"),
        targets=frozenset(k for k, v in cells.items() if v in "O√S"),
        boxes=frozenset(k for k, v in cells.items() if v in "X√"),
        player=next(k for k, v in cells.items() if v in "PS"),
    )


@pytest.mark.parametrize(("width", "height", "boxes"), [(6, 6, 1), (5, 5, 1), (7, 7, 2)])
def test_fifty_rooms_are_solved_by_their_bfs_solution(width: int, height: int, boxes: int) -> None:
    env = SokobanEnv(width=width, height=height, boxes=boxes)
    for seed in range(50):
        env.reset(seed)
        start = env.state
        plan = solve(start)
        assert plan is not None and 1 <= len(plan) <= env.max_turns
        assert len(plan) == len(env.solution)
        total = 0.0
        for i, action in enumerate(plan):
            result = env.step(f"I will move {action.lower()}.")
            total += result.reward
            assert result.terminated == (i == len(plan) - 1)
        assert result.info["success"] is True
        assert result.reward >= 10.0 - 0.1
        # box on/off rewards telescope to (boxes on target at the end) - (at the start)
        on_start = len(start.boxes & start.targets)
        assert total == pytest.approx(10.0 + boxes - on_start - 0.1 * len(plan))


def test_render_uses_ragen_legend() -> None:
    lines = ["#####", "#P_O#", "#_X_#", "#_√_#", "#####"]
    assert room(lines).render() == "\n".join(lines)
    assert room(["#####", "#S__#", "#_X_#", "#_O_#", "#####"]).render().splitlines()[1] == "#S__#"


def test_rewards_push_on_and_off_target() -> None:
    state = room(["######", "#P_XO#", "#____#", "######"])
    assert solve(state) == ["Right", "Right"]
    pushed = move(move(state, "Right"), "Right")
    assert pushed.solved
    blocked = room(["#####", "#PX√#", "#___#", "#####"])
    assert move(blocked, "Right") is blocked  # box against a box does not move
    assert move(blocked, "Up") is blocked  # wall


def test_step_rewards_match_ragen() -> None:
    env = SokobanEnv()
    env.reset(3)
    env.restore(type(env.snapshot())(room(["######", "#P_XO#", "#_O_X#", "#____#", "#____#", "######"])))
    first = env.step("Right")
    assert first.reward == pytest.approx(-0.1) and not first.terminated
    second = env.step("Right")  # box onto a target, one box still off
    assert second.reward == pytest.approx(0.9) and not second.terminated
    bump = env.step("Up")  # into the wall: still costs a step
    assert bump.reward == pytest.approx(-0.1) and bump.info["moved"] is False


def test_unsolvable_room_returns_none() -> None:
    corner = room(["#####", "#X_P#", "#__O#", "#####"])
    assert solve(corner) is None
    assert solve(room(["#####", "#P_√#", "#####"])) == []
