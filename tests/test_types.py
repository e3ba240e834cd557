"""Validation of the core data types."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from agentrl.types import DataError, Trajectory, Turn, TurnBatch


def _turn(index: int = 0, **kw: Any) -> Turn:
    args: dict[str, Any] = {"prompt_ids": [1, 2, 3], "response_ids": [4, 5], "logprobs": [-0.1, -2.0],
                            "index": index}
    args.update(kw)
    return Turn(**args)


def test_turn_valid() -> None:
    t = _turn(reward=0.5, policy_version=3)
    assert t.num_tokens == 5


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"logprobs": [-0.1]}, "one behaviour log-prob per response token"),
        ({"prompt_ids": []}, "prompt_ids is empty"),
        ({"response_ids": [4, -1]}, "non-negative int"),
        ({"logprobs": [-0.1, 0.5]}, "<= 0"),
        ({"logprobs": [-0.1, float("nan")]}, "finite"),
        ({"finish_reason": "eos"}, "finish_reason"),
        ({"reward": float("inf")}, "reward"),
        ({"index": -1}, "index"),
    ],
)
def test_turn_rejects_inconsistent_input(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(DataError, match=match):
        _turn(**kw)


def test_trajectory_validation_and_rewards() -> None:
    traj = Trajectory(turns=[_turn(0, reward=0.1), _turn(1)], reward=1.0, terminated=True)
    assert traj.turn_rewards() == [0.1, 1.0]
    assert traj.total_reward == pytest.approx(1.1)
    with pytest.raises(DataError, match="terminated and Trajectory.truncated"):
        Trajectory(terminated=True, truncated=True)
    with pytest.raises(DataError, match=r"turns\[1\].index is 0"):
        Trajectory(turns=[_turn(0), _turn(0)])


def _batch(**override: torch.Tensor) -> TurnBatch:
    shape = (2, 4)
    fields = {
        "input_ids": torch.ones(shape, dtype=torch.long),
        "attention_mask": torch.ones(shape, dtype=torch.long),
        "response_mask": torch.zeros(shape, dtype=torch.bool),
        "turn_ids": torch.full(shape, -1),
        "old_logprobs": torch.zeros(shape),
        "advantages": torch.zeros(shape),
        "returns": torch.zeros(shape),
        "old_values": torch.zeros(shape),
        "value_mask": torch.zeros(shape, dtype=torch.bool),
        "weights": torch.ones(shape),
        "units": torch.ones(shape),
    }
    fields.update(override)
    return TurnBatch(**fields)


def test_turn_batch_shapes_are_checked_and_kept_on_a_move() -> None:
    b = _batch(turn_ids=torch.tensor([[-1, 0, 0, -1], [-1, -1, 1, 1]]), branch=torch.zeros(2, 4, dtype=torch.long))
    moved = b.to(torch.device("meta"))
    assert all(getattr(moved, f).device.type == "meta" and getattr(moved, f).shape == (2, 4)
               for f in b.__dataclass_fields__)
    assert _batch().to(torch.device("meta")).branch is None  # no shared-prefix rows: stays None
    with pytest.raises(DataError, match="branch has shape"):
        _batch(branch=torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(DataError, match="advantages has shape"):
        _batch(advantages=torch.zeros(2, 3))
