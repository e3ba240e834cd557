"""What a run leaves in MLflow at its end: the reward curve drawn after the final held-out evaluation, and the
final model only for runs that are not short trials (real Trainer, tiny model, real sqlite store in tmp)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentrl.tracking import MLflowLogger, TrajectoryLogger, figures
from agentrl.training.schedules.grpo import GRPO
from tests.training.helpers import fit, guess_data, make_module


def _run(tmp_path: Path, steps: int, tracking: TrajectoryLogger, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, str]:
    logger = MLflowLogger(experiment_name="end", tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
                          fallback_uri=f"sqlite:///{tmp_path / 'fallback.db'}")
    fit(make_module(GRPO(group_size=2)), guess_data(batch_size=2, steps=steps, eval_episodes=2),
        callbacks=[tracking], logger=logger)
    return logger.experiment, str(logger.run_id)


def test_the_reward_curve_includes_the_final_evaluation_and_a_trial_keeps_no_final_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[int]] = []
    draw = figures.reward_curve

    def spy(client: Any, run_id: str) -> None:  # what the figure is drawn from, at the moment it is drawn
        seen.append([m.step for m in client.get_metric_history(run_id, "eval/reward")])
        draw(client, run_id)

    monkeypatch.setattr(figures, "reward_curve", spy)
    client, run_id = _run(tmp_path, 2, TrajectoryLogger(every_n_steps=0), monkeypatch)
    evals = sorted(m.step for m in client.get_metric_history(run_id, "eval/reward"))
    assert evals == [0, 2]  # the base evaluation and the final one (after step 2)
    assert seen == [evals]  # before the fix the figure was drawn from [0]: the final evaluation came after it
    names = {a.path for a in client.list_artifacts(run_id)}
    assert "reward_curve.png" in names
    assert "final_model" not in names  # 2 steps < final_model_min_steps (10): a trial run


def test_a_run_of_final_model_min_steps_logs_the_final_model(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    tracking = TrajectoryLogger(every_n_steps=0, final_model_min_steps=1)
    client, run_id = _run(tmp_path, 1, tracking, monkeypatch)
    assert tracking.log_final_model
    assert "final_model" in {a.path for a in client.list_artifacts(run_id)}
    with pytest.raises(ValueError, match="tracking.final_model_min_steps must be >= 0"):
        TrajectoryLogger(final_model_min_steps=-1)
