"""The generated-token budget and the evaluation schedule (`agentrl.training.system.evaluation`), on real tiny runs."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from lightning.pytorch.loggers import Logger

from agentrl.training.schedules.grpo import GRPO
from tests.training.helpers import fit, fit_in_process, guess_data, make_module

ROOT = Path(__file__).resolve().parents[2]


class Recorder(Logger):
    """Keeps every logged metrics dict with its step (a real Lightning logger, in memory)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int | None, dict[str, float]]] = []
        self.params: dict[str, Any] = {}

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> str:
        return "0"

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(params, dict):
            self.params.update(params)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, dict(metrics)))


def test_the_run_stops_at_the_first_step_that_spends_the_budget_and_evaluates_on_the_token_schedule() -> None:
    module = make_module(GRPO(group_size=2))
    data = guess_data(batch_size=4, steps=50, eval_episodes=3, eval_every_tokens=30, eval_greedy=True,
                      max_generated_tokens=60)
    logger = Recorder()
    fit(module, data, logger=logger)

    totals = [int(m["perf/generated_tokens_total"]) for _, m in logger.rows if "perf/generated_tokens_total" in m]
    assert totals and totals[-1] >= 60 > (totals[-2] if len(totals) > 1 else 0)  # stopped at the first step over
    assert module.rl_step == len(totals) < 50
    assert module.generated_tokens == totals[-1]
    evals = [m for _, m in logger.rows if "eval/success" in m]
    points = [int(m["eval/generated_tokens"]) for m in evals]
    assert points[0] == 0 and points[-1] == totals[-1]  # the base model and the final weights
    crossed = [t for prev, t in zip([0, *totals], totals, strict=False) if t // 30 > prev // 30 and t < 60]
    assert points[1:-1] == crossed  # one evaluation each time a multiple of 30 tokens is crossed (before the end)
    for m in evals:  # greedy evaluation played the same held-out tasks
        assert m["eval/greedy_episodes"] == m["eval/episodes"] == 3
    assert logger.params["resolved/compute_dtype"] == "float32"  # what `auto` chose (the tiny model: fp32)


def test_greedy_evaluation_is_repeatable_and_sampled_evaluation_follows_the_seed() -> None:
    module = make_module(GRPO(group_size=2))
    data = guess_data(batch_size=2, steps=1, eval_episodes=4, eval_greedy=True)
    fit(module, data)  # base and final evaluations with different weights; now play the held-out tasks again

    def replies(seed: int) -> tuple[list[list[int]], list[list[int]]]:
        """Every response of the sampled and of the greedy evaluation with the run seed ``seed``."""
        data.seed = seed
        module.attach(data.make_collector)
        try:
            tasks = data.eval_task_list()
            sampled, greedy = module.session.play(tasks), module.session.play(tasks, temperature=0.0)
            assert module.evaluate("again")["eval/episodes"] == 4
        finally:
            module.detach()
        ids = [[t.response_ids for tr in trajs for t in tr.turns] for trajs in (sampled, greedy)]
        return ids[0], ids[1]

    sampled, greedy = replies(0)
    assert replies(0) == (sampled, greedy)  # the same seed plays the same episodes, sampled and greedy
    other_sampled, other_greedy = replies(1)
    assert other_sampled != sampled  # sampled evaluation follows the run seed (the control)
    assert other_greedy == greedy  # greedy evaluation does not depend on it


@pytest.mark.parametrize(("key", "value"), [("max_generated_tokens", 0), ("eval_every_tokens", -1),
                                            ("eval_every_tokens", None), ("steps", 2.5)])
def test_budget_settings_are_checked(key: str, value: int | float | None) -> None:
    """A bad value, a config's null included, is named with the field; not a TypeError from a comparison."""
    with pytest.raises(ValueError, match=f"data.{key} must be an integer >= .*, got {value!r}"):
        guess_data(**{key: value})  # type: ignore[arg-type]  # the wrong types are the point


def test_a_budget_that_is_never_reached_runs_all_steps() -> None:
    module = make_module(GRPO(group_size=2))
    fit(module, guess_data(batch_size=2, steps=2, max_generated_tokens=10**9))
    assert module.rl_step == 2 and isinstance(module, pl.LightningModule)


def test_the_spent_budget_is_saved_in_checkpoints() -> None:
    module = make_module(GRPO(group_size=2))
    module.generated_tokens, module.rl_step = 1234, 5
    checkpoint: dict[str, Any] = {}
    module.on_save_checkpoint(checkpoint)
    resumed = make_module(GRPO(group_size=2))
    resumed.on_load_checkpoint(checkpoint)
    assert (resumed.generated_tokens, resumed.rl_step) == (1234, 5)


def test_evaluations_the_resolved_dtype_and_the_config_reach_every_logger(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """With a CSV logger first and MLflow second (the learning benchmark's pair), `trainer.logger` is only the CSV
    one: held-out evaluations, the resolved dtype and the config must still reach the MLflow run."""
    overrides = {"trainer": {"logger": [
        {"class_path": "lightning.pytorch.loggers.CSVLogger",
         "init_args": {"save_dir": "csv", "name": "", "version": ""}},
        {"class_path": "agentrl.tracking.MLflowLogger",
         "init_args": {"experiment_name": "two-loggers", "tracking_uri": "sqlite:///mlflow.db", "run_name": "r"}},
    ]}, "data": {"steps": 1, "eval_episodes": 2}}
    (tmp_path / "overrides.json").write_text(json.dumps(overrides))
    code, _, err = fit_in_process(tmp_path, ["--config", str(ROOT / "configs/smoke/turn_ppo.yaml"),
                                             "--config", "overrides.json"], capsys, monkeypatch)
    assert code == 0, err[-3000:]
    with sqlite3.connect(tmp_path / "mlflow.db") as con:
        evals = con.execute("SELECT step, value FROM metrics WHERE key = 'eval/success'").fetchall()
        params = dict(con.execute("SELECT key, value FROM params").fetchall())
    assert len(evals) == 2  # the base model and the final weights
    assert params["resolved/compute_dtype"] == "float32"
    assert params["resolved/compute_dtype_reason"] == "hidden size 64 < 256: always float32"  # the rule's why
    assert (params["resolved/engine_weights"], params["resolved/engine_decode_dtype"]) == ("shared", "float32")
    assert params["data.batch_size"] == "4"  # the flattened config (MLflowConfig)
    with (tmp_path / "csv" / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("eval/success")]
    assert len(rows) == 2
