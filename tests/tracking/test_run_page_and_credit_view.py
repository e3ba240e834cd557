"""What the run page of a training run leads with: its link opens it as a training run, its first metric section is
``Summary/`` (reward, success, losses), and its credit is a table and a figure beside the traces.

Real parts: a Lightning Trainer with the tiny random model and the embedded engine, the `TrajectoryLogger` with
agentrl's `MLflowLogger` on a sqlite store in ``tmp_path``, read back with `MlflowClient` (metric histories, the
``credit.json`` table and ``credit.png`` artifacts, the traces' span attributes). What the browser shows with
them is in docs/review.md (screenshots of ``mlflow ui`` in headless Chromium).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentrl.credit import StepRecord, TurnCredit
from agentrl.tracking import MLflowLogger
from agentrl.tracking.credit_view import UNTRAINED, credit_rows, why
from agentrl.tracking.review import TrajectoryLogger
from agentrl.tracking.store import SUMMARY
from agentrl.training import GRPO, RTPO
from agentrl.training.schedules.base import Schedule
from agentrl.types import Trajectory, Turn
from tests.training.helpers import fit, letter_data, make_module

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _run(tmp_path: Path, schedule: Schedule, *, batch_size: int = 4, steps: int = 1) -> tuple[Any, Any, str]:
    """``steps`` RL steps of ``schedule`` logged to a sqlite store; the client, the run and the logger's summary."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logger = MLflowLogger(experiment_name="review", tracking_uri=uri, fallback_uri=f"sqlite:///{tmp_path}/fb.db")
    callback = TrajectoryLogger(every_n_steps=1, max_trajectories=4, log_final_model=False)
    fit(make_module(schedule), letter_data(batch_size=batch_size, steps=steps), callbacks=[callback], logger=logger)
    client = MlflowClient(uri)
    (exp,) = [e for e in client.search_experiments() if e.name == "review"]
    (run,) = client.search_runs([exp.experiment_id])
    return client, run, logger.summary()


def test_the_summary_section_repeats_the_headline_metrics_step_by_step(tmp_path: Path) -> None:
    client, run, summary = _run(tmp_path, GRPO(group_size=2), steps=2)
    rid, eid = run.info.run_id, run.info.experiment_id
    assert f"#/experiments/{eid}/runs/{rid}?workflowType=machine_learning" in summary  # the training layout
    repeated = [name for name, key in SUMMARY.items() if key in run.data.metrics]
    assert {"Summary/reward", "Summary/success", "Summary/policy_loss"} <= set(repeated)
    for name in repeated:
        history = sorted((m.step, m.value) for m in client.get_metric_history(rid, SUMMARY[name]))
        assert sorted((m.step, m.value) for m in client.get_metric_history(rid, name)) == history, name
    assert len(client.get_metric_history(rid, "Summary/reward")) == 2
    # the run page orders its sections by name, capitals first, and opens the first: Summary leads
    assert min({k.split("/")[0] for k in run.data.metrics if "/" in k}) == "Summary"


def test_a_training_run_logs_its_credit_beside_its_traces(tmp_path: Path) -> None:
    client, run, _ = _run(tmp_path, GRPO(group_size=2))
    files = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"credit.json", "credit.png"} <= files
    table = json.loads(Path(client.download_artifacts(run.info.run_id, "credit.json", str(tmp_path))).read_text())
    rows = [dict(zip(table["columns"], r, strict=True)) for r in table["data"]]
    traces = client.search_traces(locations=[run.info.experiment_id], max_results=100)
    from_spans: dict[tuple[str, int, int], list[tuple[float, float, bool]]] = {}
    for t in traces:  # the members of a group share their task: compare per (task, group, turn) as sorted lists
        root = t.data.spans[0]
        for s in t.data.spans:
            if s.name.startswith("turn "):
                a = s.attributes
                from_spans.setdefault((root.inputs["task"], root.attributes["group"], int(s.name[5:])), []).append(
                    (a["agentrl.credit.advantage"], a["agentrl.credit.advantage_used"], a["agentrl.credit.trained"]))
    from_rows: dict[tuple[str, int, int], list[tuple[float, float, bool]]] = {}
    for r in rows:
        assert r["step"] == 1 and r["value"] is None  # GRPO: no critic
        from_rows.setdefault((r["task"], int(r["role"].removeprefix("group ")), r["turn"]), []).append(
            (r["advantage"], r["advantage_used"], r["trained"]))
    assert len(rows) == sum(map(len, from_spans.values())) > 0
    def rounded(d: dict[Any, list[tuple[float, float, bool]]]) -> dict[Any, list[tuple[float, float, bool]]]:
        return {k: sorted((round(a, 9), round(u, 9), t) for a, u, t in v) for k, v in d.items()}

    assert rounded(from_rows) == rounded(from_spans)
    trained = sum(r["trained"] for r in rows)
    assert trained > 0  # the letter task's rewards differ within a group: something was compared


def test_rtpo_trunk_turns_say_they_were_not_trained_and_branch_turns_name_their_update(tmp_path: Path) -> None:
    client, run, _ = _run(tmp_path, RTPO(group_size=3), batch_size=2)
    table = json.loads(Path(client.download_artifacts(run.info.run_id, "credit.json", str(tmp_path))).read_text())
    rows = [dict(zip(table["columns"], r, strict=True)) for r in table["data"]]
    trunk = [r for r in rows if r["role"] == "trunk"]
    assert trunk and all(r["why"] == UNTRAINED and r["advantage"] is None for r in trunk)
    branches = [r for r in rows if r["role"].startswith("sibling k=") and r["turn"] == int(r["role"][10:])]
    assert branches and all(r["update"] == f"k{r['turn']}" for r in branches)


def _turn(k: int, prompt: list[int], reply: list[int]) -> Turn:
    return Turn(prompt, reply, [-0.5] * len(reply), index=k)


def test_why_names_a_fold_a_cancelled_pair_and_a_zero_advantage() -> None:
    """Two episodes whose turn 0 is the same context and reply: the update trained both at the mean of their
    advantages (0.5 and -1/6 -> 1/6); a third pair of identical turns cancelled (0.4 and -0.4 -> 0)."""
    a = Trajectory(turns=[_turn(0, [1, 2], [3]), _turn(1, [1, 2, 3, 4], [5])], reward=1.0, task_id="t", seed=0)
    b = Trajectory(turns=[_turn(0, [1, 2], [3]), _turn(1, [1, 2, 3, 4], [5])], reward=0.0, task_id="t", seed=0)
    c = Trajectory(turns=[_turn(0, [1, 2], [9])], reward=0.0, task_id="t", seed=0)
    record = StepRecord()
    record.add_episodes([a, b, c])
    record.record(a, 0, TurnCredit(0.5, 1 / 6, None, None, None, True))
    record.record(b, 0, TurnCredit(-1 / 6, 1 / 6, None, None, None, True))
    record.record(a, 1, TurnCredit(0.4, 0.0, None, None, None, False))
    record.record(b, 1, TurnCredit(-0.4, 0.0, None, None, None, False))
    record.record(c, 0, TurnCredit(0.0, 0.0, None, None, None, False))
    rows = credit_rows(record, [a, b, c], step=3)
    assert [r["why"].split(":")[0] for r in rows] == ["folded", "cancelled", "folded", "cancelled", "zero advantage"]
    assert rows[0]["why"].startswith("folded: 2 identical turns")
    assert why(None, 0) == UNTRAINED and why(TurnCredit(0.3, 0.3, None, None, None, True), 1) == ""
