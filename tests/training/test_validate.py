"""Evaluating a model: ``agentrl validate`` on a checkpoint, held-out episodes of ``fit`` as traces, and a finished
run resumed with more ``data.steps`` (issue 30, item 4). Real parts: the smoke config's tiny random model, real
Lightning trainers, a real MLflow sqlite store in a temporary folder."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from agentrl.training.system.callbacks import RLCheckpoint
from tests.support.fit_runs import logged_steps
from tests.training.helpers import guess_data, make_module

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs/smoke/rtpo.yaml")
FIT = ["--config", SMOKE, "--data.steps", "1", "--data.eval_episodes", "2", "--tracking.every_n_steps", "1",
       "--tracking.max_trajectories", "2", "--tracking.log_final_model", "false"]
LINE = (r"^\[agentrl\] {label} evaluation on 2 held-out episodes: success \d\.\d{{3}} ± \d\.\d{{3}}, "
        r"reward -?\d\.\d{{3}} ± \d\.\d{{3}} \(± standard error; seed 0\)$")
pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")


def _agentrl(cwd: Path, subcommand: str, args: list[str], capfd: Any = None) -> tuple[int, str, str]:
    """``agentrl fit`` / ``agentrl validate`` in this process (their entry point): exit code, stdout, stderr."""
    from agentrl.training.command.cli import fit_main

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        patch.setattr("agentrl.training.command.cli.quiet_libraries", lambda: None)
        code = fit_main(args, subcommand=subcommand)
    out = capfd.readouterr() if capfd is not None else None
    return code, out.out if out else "", out.err if out else ""


def _client(folder: Path) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")


def _runs(folder: Path) -> dict[str, Any]:
    client = _client(folder)
    experiment = client.get_experiment_by_name("agentrl-smoke")
    return {run.info.run_name: run for run in client.search_runs([experiment.experiment_id])}


def _trace_tags(folder: Path, run: Any) -> Counter[tuple[str | None, str | None]]:
    traces = _client(folder).search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id,
                                           max_results=100)
    return Counter((t.info.tags.get("agentrl.phase"), t.info.tags.get("agentrl.eval")) for t in traces)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder holding a 1-step smoke run: ``checkpoints/smoke/last.ckpt`` and ``mlflow.db``."""
    folder = tmp_path_factory.mktemp("trained")
    code, _, _ = _agentrl(folder, "fit", FIT)
    assert code == 0
    yield folder


@pytest.mark.slow
def test_fit_traces_its_heldout_episodes_apart_from_training_ones(trained: Path) -> None:
    run = _runs(trained)["rtpo-guessnumber-s0"]
    traces = _client(trained).search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id,
                                            max_results=100)
    # step 1's training episodes are one whole RTPO tree (the trajectory logger keeps trees whole): its trunk
    # and the siblings the trunk lists; the 2 held-out episodes of each evaluation (base, final) are apart
    (trunk,) = [t for t in traces if t.info.tags.get("agentrl.rtpo.trunk_trace") == t.info.trace_id]
    tree = 1 + len(trunk.info.tags["agentrl.rtpo.siblings"].split(","))
    assert _trace_tags(trained, run) == Counter({("train", None): tree, ("eval", "base"): 2, ("eval", "final"): 2})
    assert "eval_trajectories.json" in {a.path for a in _client(trained).list_artifacts(run.info.run_id)}


@pytest.mark.slow
def test_validate_plays_the_heldout_tasks_of_a_checkpoint_and_logs_an_evaluation_run(
        trained: Path, capfd: pytest.CaptureFixture[str]) -> None:
    capfd.readouterr()
    code, out, err = _agentrl(trained, "validate", ["--config", SMOKE, "--data.eval_episodes", "2",
                                                    "--ckpt_path", "last"], capfd)
    assert code == 0, err[-3000:]
    assert re.search(LINE.format(label=r"step 1 checkpoint"), out, re.M), out
    runs = _runs(trained)
    training, evaluation = runs["rtpo-guessnumber-s0"], runs["rtpo-guessnumber-s0-eval"]
    assert f"(id {evaluation.info.run_id}) in MLflow experiment agentrl-smoke" in out
    assert evaluation.info.status == "FINISHED"
    tags = evaluation.data.tags
    assert tags["agentrl.phase"] == "evaluation" and tags["agentrl.evaluated_run"] == training.info.run_id
    assert tags["agentrl.evaluation_of"] == str((trained / "checkpoints/smoke/last.ckpt").resolve())
    metrics = evaluation.data.metrics
    assert metrics["eval/episodes"] == 2 and 0.0 <= metrics["eval/success"] <= 1.0 and "eval/reward" in metrics
    # the checkpoint holds the weights fit's final evaluation played with, and held-out seeds do not depend on the
    # step: the same evaluation gives the same result
    final = {key: training.data.metrics[key] for key in ("eval/success", "eval/reward", "eval/turns")}
    assert {key: metrics[key] for key in final} == final
    assert _trace_tags(trained, evaluation) == Counter({("eval", "step 1 checkpoint"): 2})
    assert not any(k.startswith("rollout/") for k in metrics)  # nothing was trained
    assert torch.load(trained / "checkpoints/smoke/last.ckpt", weights_only=True)["agentrl"]["rl_step"] == 1


def _eval_transcripts(folder: Path, run_id: str, label: str) -> dict[str, str]:
    """Task id -> transcript of the episodes of the evaluation ``label`` in a run's ``eval_trajectories.json``."""
    target = folder / "artifacts" / run_id
    target.mkdir(parents=True, exist_ok=True)
    table = json.loads(Path(_client(folder).download_artifacts(run_id, "eval_trajectories.json", str(target)))
                       .read_text())
    rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    return {row["task"]: row["transcript"] for row in rows if row["eval"] == label}


@pytest.mark.slow
def test_validate_at_the_runs_seed_replays_its_final_evaluation_episode_for_episode(
        trained: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Two ``agentrl validate`` runs on the last checkpoint at the run's seed (``--data.seed 0``) print the same
    line and play the same episodes, word for word, as the run's final evaluation did."""
    trained = Path(shutil.copytree(trained, tmp_path / "run"))  # its evaluation runs stay out of the shared store
    lines, played = [], []
    for _ in range(2):
        capfd.readouterr()
        code, out, err = _agentrl(trained, "validate", ["--config", SMOKE, "--data.eval_episodes", "2",
                                                        "--ckpt_path", "last", "--data.seed", "0"], capfd)
        assert code == 0, err[-3000:]
        line = re.search(LINE.format(label=r"step 1 checkpoint"), out, re.M)
        run_id = re.search(r"^\[agentrl\] evaluation run \S+ \(id (\w+)\)", out, re.M)
        assert line and run_id, out
        lines.append(line.group(0))
        played.append(_eval_transcripts(trained, run_id.group(1), "step 1 checkpoint"))
    final = _eval_transcripts(trained, _runs(trained)["rtpo-guessnumber-s0"].info.run_id, "final")
    assert len(final) == 2 and lines[0] == lines[1]
    assert played[0] == played[1] == final


@pytest.mark.parametrize(("args", "expected"), [
    (["--data.eval_episodes", "0", "--ckpt_path", "last"], "data.eval_episodes must be >= 1 for agentrl validate"),
    (["--data.eval_episodes", "2", "--ckpt_path", "last"], "ckpt_path last: no checkpoint file checkpoints/smoke/"),
    (["--data.eval_episodes", "2", "--ckpt_path", "nowhere.ckpt"], "ckpt_path: no checkpoint file nowhere.ckpt"),
])
def test_validate_refuses_what_it_cannot_evaluate_in_one_line_naming_the_key(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], args: list[str], expected: str) -> None:
    code, _, err = _agentrl(tmp_path, "validate", ["--config", SMOKE, *args], capfd)
    assert code == 2
    lines = [line for line in err.splitlines() if line.startswith("agentrl validate: config error:")]
    assert len(lines) == 1 and expected in lines[0], err[-2000:]
    assert not (tmp_path / "mlflow.db").exists()  # stopped before any work


@pytest.mark.slow
def test_resuming_a_finished_run_with_more_steps_trains_them(trained: Path, tmp_path: Path,
                                                             capfd: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(trained / "checkpoints", tmp_path / "checkpoints")
    shutil.copy(trained / "mlflow.db", tmp_path / "mlflow.db")
    capfd.readouterr()
    more = [*FIT[:2], "--data.steps", "2", *FIT[4:], "--ckpt_path", "last"]
    code, out, err = _agentrl(tmp_path, "fit", more, capfd)
    assert code == 0, err[-3000:]
    assert "resumed at step 1" in out and re.search(r"^step 2/2 ", out, re.M), out
    assert re.search(LINE.format(label="final"), out, re.M) and "done: 2 steps" in out, out
    assert torch.load(tmp_path / "checkpoints/smoke/last.ckpt", weights_only=True)["agentrl"]["rl_step"] == 2


@pytest.mark.slow
def test_a_resume_from_an_older_checkpoint_leaves_one_point_a_step_and_says_when_there_is_nothing_to_train(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A run of 1 step, resumed to 2, then resumed again from its step-1 checkpoint (as after a kill past the
    last checkpoint): step 2 is logged twice, and MLflow keeps only the second (docs/operations.md). Then
    ``--data.steps`` at the checkpoint's step says there is nothing to train (exit 0), below it is a config error
    (exit 2) before any model load. Its own folder: a checkpoint continues its run only in the store it names."""
    assert _agentrl(tmp_path, "fit", FIT)[0] == 0
    shutil.copy(tmp_path / "checkpoints/smoke/last.ckpt", tmp_path / "step1.ckpt")
    to_two = [*FIT[:2], "--data.steps", "2", *FIT[4:]]
    for ckpt in ("last", "step1.ckpt"):
        code, out, err = _agentrl(tmp_path, "fit", [*to_two, "--ckpt_path", ckpt], capfd)
        assert code == 0 and "done: 2 steps" in out, err[-3000:]
    db, run = tmp_path / "mlflow.db", _runs(tmp_path)["rtpo-guessnumber-s0"]
    assert len(_client(tmp_path).search_runs([run.info.experiment_id])) == 1  # one run, continued twice
    steps = lambda key: logged_steps(db, key, run.info.run_id)  # noqa: E731
    assert steps("rollout/reward") == [0, 1]  # RL step k at k - 1: steps 1 and 2, once each
    assert steps("eval/success") == [0, 1, 2]  # base, the 1-step run's final, the final at step 2
    history = _client(tmp_path).get_metric_history(run.info.run_id, "rollout/reward")
    assert run.data.metrics["rollout/reward"] == history[-1].value and run.data.tags["agentrl.resumed_at_step"] == "1"

    code, out, err = _agentrl(tmp_path, "fit", [*to_two, "--ckpt_path", "last"], capfd)
    assert code == 0 and "is at step 2 = data.steps: nothing to train" in err, err[-3000:]
    assert steps("eval/success") == [0, 1, 2]
    code, out, err = _agentrl(tmp_path, "fit", [*FIT, "--ckpt_path", "last"], capfd)
    lines = [line for line in err.splitlines() if line.startswith("agentrl fit: config error:")]
    assert code == 2 and len(lines) == 1, err[-3000:]
    assert "data.steps 1 is below the checkpoint's step 2" in lines[0] and "--data.steps 3 to train 1 more" in lines[0]


def test_a_finished_run_resumed_with_more_steps_continues_as_the_longer_run_would(tmp_path: Path) -> None:
    """In process with the helpers' trainer: 1 step, then resumed to 2, equals 2 steps at once."""
    from agentrl.training.schedules.rtpo import RTPO

    def run(steps: int, folder: str, resume: bool = False) -> Any:
        module = make_module(RTPO(group_size=2))
        checkpoint = RLCheckpoint(dirpath=str(tmp_path / folder), every_n_steps=0)
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
                             enable_model_summary=False, callbacks=[checkpoint])
        trainer.fit(module, datamodule=guess_data(steps=steps),
                    ckpt_path=str(tmp_path / folder / "last.ckpt") if resume else None)
        return module

    run(1, "split")
    resumed = run(2, "split", resume=True)
    whole = run(2, "whole")
    assert resumed.rl_step == whole.rl_step == 2
    assert resumed.last_metrics["rollout/reward"] == whole.last_metrics["rollout/reward"]
    for a, b in zip(resumed.policy.trainable_parameters(), whole.policy.trainable_parameters(), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.slow
def test_validate_evaluates_a_saved_model_folder_without_a_checkpoint(tmp_path: Path,
                                                                     capfd: pytest.CaptureFixture[str]) -> None:
    from agentrl.models.policy import Policy

    Policy("tiny-random", seed=0).save(tmp_path / "final_model", tokenizer=True)  # what a run logs as final_model/
    capfd.readouterr()
    code, out, err = _agentrl(tmp_path, "validate", ["--config", SMOKE, "--data.eval_episodes", "2",
                                                     "--model.policy.init_args.model", "final_model"], capfd)
    assert code == 0, err[-3000:]
    assert re.search(LINE.format(label="model"), out, re.M), out
    evaluation = _runs(tmp_path)["rtpo-guessnumber-s0-eval"]
    assert evaluation.data.tags["agentrl.evaluation_of"] == "final_model"
    assert evaluation.data.metrics["eval/episodes"] == 2
    assert _trace_tags(tmp_path, evaluation) == Counter({("eval", "model"): 2})
