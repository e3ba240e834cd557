"""Credit in the trace: each turn span says what the step's update did with the turn.

Real parts: a Lightning Trainer with the tiny random model and the embedded engine, the `TrajectoryLogger` with
agentrl's `MLflowLogger` on a sqlite store in ``tmp_path``, read back with `MlflowClient.search_traces`. The agent
is `LetterAgent` (a per-turn reward that a random byte-level model moves), so group returns differ and GRPO's
advantages are not all zero.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from agentrl.credit import StepRecord
from agentrl.tracking import MLflowLogger
from agentrl.tracking.review import TrajectoryLogger, sample_episodes
from agentrl.training.schedules.base import Schedule
from agentrl.training.schedules.grpo import GRPO
from agentrl.training.schedules.rtpo import RTPO
from agentrl.training.update.batching import Row, TurnTargets
from agentrl.training.update.credit import record_update
from agentrl.types import Trajectory, Turn
from tests.training.helpers import fit, letter_data, make_module

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _traces(tmp_path: Path, schedule: Schedule, batch_size: int, max_trajectories: int) -> list[Any]:
    """One RL step of ``schedule`` logged to a sqlite store; its traces, read back."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logger = MLflowLogger(experiment_name="credit", tracking_uri=uri, fallback_uri=f"sqlite:///{tmp_path}/fb.db")
    callback = TrajectoryLogger(every_n_steps=1, max_trajectories=max_trajectories, log_final_model=False)
    fit(make_module(schedule), letter_data(batch_size=batch_size, steps=1), callbacks=[callback], logger=logger)
    client = MlflowClient(uri)
    (exp,) = [e for e in client.search_experiments() if e.name == "credit"]
    return list(client.search_traces(locations=[exp.experiment_id], max_results=100))


def _root(trace: Any) -> Any:
    return next(s for s in trace.data.spans if s.parent_id is None)


def _turns(trace: Any) -> list[Any]:
    return sorted((s for s in trace.data.spans if s.name.startswith("turn ")), key=lambda s: int(s.name[5:]))


def test_grpo_turns_carry_the_group_advantage_worked_out_from_the_rewards(tmp_path: Path) -> None:
    traces = _traces(tmp_path, GRPO(group_size=2), batch_size=4, max_trajectories=4)
    assert len(traces) == 4
    groups: dict[int, list[tuple[float, Any]]] = {}
    for trace in traces:
        root = _root(trace)
        groups.setdefault(root.attributes["group"], []).append((root.outputs["reward"], trace))
    assert sorted(len(g) for g in groups.values()) == [2, 2]
    nonzero = 0
    for members in groups.values():
        rewards = [r for r, _ in members]
        mean, std = statistics.mean(rewards), statistics.stdev(rewards)  # GRPO: unbiased std, eps 1e-6
        for reward, trace in members:
            expected = (reward - mean) / (std + 1e-6)
            nonzero += abs(expected) > 1e-6
            for span in _turns(trace):
                a = span.attributes
                assert a["agentrl.credit.advantage"] == pytest.approx(expected, abs=1e-6), span.name
                assert a["agentrl.credit.trained"] is (a["agentrl.credit.advantage_used"] != 0.0)
                assert "agentrl.credit.value" not in a and "agentrl.rtpo.role" not in a  # no critic, no tree
    assert nonzero >= 2  # the check had advantages to compare, not only zeros


def test_rtpo_siblings_name_their_trunk_depth_and_group_and_untrained_turns_say_so(tmp_path: Path) -> None:
    traces = _traces(tmp_path, RTPO(group_size=3), batch_size=2, max_trajectories=4)
    trunks = [t for t in traces if t.info.tags.get("agentrl.rtpo.role") == "trunk"]
    assert len(trunks) == 1  # one whole tree fits in (or exceeds) 4 episodes: trunk + 2 siblings per depth
    trunk = trunks[0]
    trunk_id = trunk.info.trace_id
    siblings = [t for t in traces if t.info.tags.get("agentrl.rtpo.role") == "sibling"]
    depths = len(_turns(trunk))
    assert len(siblings) == 2 * depths and len(traces) == 1 + 2 * depths
    assert trunk.info.tags["agentrl.rtpo.trunk_trace"] == trunk_id
    assert sorted(trunk.info.tags["agentrl.rtpo.siblings"].split(",")) == sorted(s.info.trace_id for s in siblings)
    for span in _turns(trunk):  # trunks only provide the boundary states: never trained
        assert span.attributes["agentrl.rtpo.role"] == "trunk"
        assert span.attributes["agentrl.credit.trained"] is False
        assert "agentrl.credit.advantage" not in span.attributes
    per_depth: dict[int, list[float]] = {}
    for sib in siblings:
        tags, root = sib.info.tags, _root(sib)
        k = int(tags["agentrl.rtpo.depth"])
        assert tags["agentrl.rtpo.trunk_trace"] == trunk_id and root.attributes["agentrl.rtpo.trunk_trace"] == trunk_id
        assert tags["agentrl.rtpo.tree"] == trunk.info.tags["agentrl.rtpo.tree"]
        assert root.attributes["branch_turn"] == k
        for span in _turns(sib):
            a, n = span.attributes, int(span.name[5:])
            assert a["agentrl.rtpo.role"] == ("prefix" if n < k else "branch" if n == k else "continuation")
            if n != k:  # replayed prefix and on-policy continuation: context only
                assert a["agentrl.credit.trained"] is False and "agentrl.credit.advantage" not in a
                continue
            assert a["agentrl.rtpo.depth"] == k and a["agentrl.credit.update"] == f"k{k}"
            assert a["agentrl.credit.trained"] is (a["agentrl.credit.advantage_used"] != 0.0)
            per_depth.setdefault(k, []).append(a["agentrl.credit.advantage"])
            assert a["agentrl.credit.advantage"] == pytest.approx(
                root.outputs["reward"] - statistics.mean(
                    _root(o).outputs["reward"] for o in siblings if o.info.tags["agentrl.rtpo.depth"] == str(k)),
                abs=1e-6)
    assert sorted(per_depth) == list(range(depths))


def _turn(index: int, reply: list[int]) -> Turn:
    return Turn([1, 2], reply, [-0.5] * len(reply), index=index)


def test_a_cancelled_pair_and_a_zero_advantage_are_not_trained() -> None:
    # two identical replies (same context, same reply) with advantages +½ and −½ fold to 0: the update skips them
    a, b, c = (Trajectory(turns=[_turn(0, reply)]) for reply in ([7, 8], [7, 8], [9]))
    targets = [TurnTargets(0.5), TurnTargets(-0.5), TurnTargets(0.0)]
    planned = [Row([1, 2, *t.turns[0].response_ids], [((i, 0), t.turns[0], targets[i])])
               for i, t in enumerate((a, b, c))]
    from agentrl.training.update.objective import fold_identical

    record = StepRecord()
    record_update(record, [a, b, c], planned, fold_identical(planned), "")
    (ca,), (cb,), (cc,) = record.credit(a), record.credit(b), record.credit(c)
    assert ca is not None and cb is not None and cc is not None
    assert (ca.advantage, ca.advantage_used, ca.trained) == (0.5, 0.0, False)
    assert (cb.advantage, cb.advantage_used, cb.trained) == (-0.5, 0.0, False)
    assert cc.trained is False and ca.value is None and ca.is_weight is None
    assert record.credit(Trajectory(turns=[_turn(0, [1])])) == [None]  # an episode no update saw


def test_rtpo_trees_are_sampled_whole() -> None:
    trunk0, trunk1 = Trajectory(tree=0), Trajectory(tree=1)
    sibs0 = [Trajectory(tree=0, branch_turn=k) for k in (1, 1, 0, 0)]
    sibs1 = [Trajectory(tree=1, branch_turn=0) for _ in range(2)]
    episodes = [trunk0, trunk1, *sibs0[:2], *sibs1, *sibs0[2:]]
    assert sample_episodes(episodes, 4) == [trunk0, *sibs0]  # at least one tree, whole
    assert sample_episodes(episodes, 8) == [trunk0, *sibs0, trunk1, *sibs1]
    flat = [Trajectory() for _ in range(5)]
    assert sample_episodes(flat, 3) == flat[:3]


def test_the_importance_weight_value_and_return_of_a_turn() -> None:
    from agentrl.training.update.credit import turn_credit

    planned = TurnTargets([0.2, 0.4], [1.0, 0.9], [0.25, 0.3], per_token_values=True, weight=0.5)
    used = TurnTargets([0.2, 0.4], [1.0, 0.9], [0.25, 0.3], per_token_values=True, weight=0.5,
                       token_weights=[0.8, 1.0])  # TIS weights from the π_old recompute
    credit = turn_credit(planned, used, 2, "")
    assert credit.advantage == pytest.approx(0.3) and credit.trained
    assert (credit.value, credit.returns) == (0.25, 1.0)  # at the turn's first response token: V(s_n), its target
    assert credit.is_weight == pytest.approx(0.5 * 0.9)
    assert turn_credit(TurnTargets(1.0), TurnTargets(1.0), 3, "").is_weight is None  # no correction: weight 1
