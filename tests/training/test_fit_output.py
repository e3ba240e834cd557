"""What a user sees from ``agentrl fit``: the run's face (start line, steps, end summary), no other library's
chatter by default, and command-line values jsonargparse would misread (``null``, negative numbers)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.training.command.keys import normalize_argv
from tests.training.helpers import fit_in_process
from tests.training.test_fit_cli import check_smoke_run

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs/smoke/rtpo.yaml")
NOISE = ["Epoch 0/0", "it/s", "v_num", "Tip:", "litlogger", "Downloading artifacts", "Writing model shards",
         "Flushing the async trace", "GPU available", "Creating initial MLflow database", "Experiment with name",
         "Seed set to", "Trainer.fit` stopped"]


def _fit(cwd: Path, *args: str, verbose: bool = False, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    env.pop("AGENTRL_VERBOSE", None)
    if verbose:
        env["AGENTRL_VERBOSE"] = "1"
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "fit", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.slow
def test_smoke_run_shows_its_run_steps_and_summary_and_nothing_else(tmp_path: Path) -> None:
    proc = _fit(tmp_path, "--config", SMOKE, "--data.eval_episodes", "4",
                "--model.algorithm.init_args.ppo.minibatch_size", "null",
                "--data.agent.init_args.env.init_args.format_penalty", "-0.5",
                "--tracking.final_model_min_steps", "0")  # a 3-step run: no final model by default
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    start = re.search(r"\[agentrl\] run (\S+) \(id ([0-9a-f]{32})\) in MLflow experiment (\S+); open it with:\n"
                      r"\s+mlflow ui --backend-store-uri (\S+)\n", out)
    assert start, out
    name, run_id, experiment, uri = start.groups()
    assert (name, experiment) == ("rtpo-guessnumber-s0", "agentrl-smoke")
    assert uri == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    from mlflow import MlflowClient

    run = MlflowClient(uri).get_run(run_id)  # the command's store holds this run, under that name and experiment
    assert run.info.run_name == name
    assert MlflowClient(uri).get_experiment(run.info.experiment_id).name == experiment
    params = run.data.params
    assert params["model.algorithm.init_args.ppo.minibatch_size"] == "None"  # `null` on the command line
    assert params["data.agent.init_args.env.init_args.format_penalty"] == "-0.5"  # a negative number, no `=`

    line = r"^step (\d)/3  reward [-+]\d\.\d{3}  success \d\.\d\d  \d+\.\d s  (\d+) tokens  ETA \d+:\d\d:\d\d$"
    steps = re.findall(line, out, re.M)
    assert [s for s, _ in steps] == ["1", "2", "3"] and all(int(t) > 0 for _, t in steps), out
    summary = out[out.index("[agentrl] done: 3 steps in"):]
    assert re.search(r"held-out success: base \d\.\d{3} -> final \d\.\d{3} \(4 episodes\)", summary), summary
    model_dir = re.search(r"final model: (\S+) ", summary)
    assert model_dir and (Path(model_dir.group(1)) / "config.json").is_file(), summary
    assert f"(id {run_id})" in summary and summary.count(f"mlflow ui --backend-store-uri {uri}") == 1
    for noise in NOISE:
        assert noise not in out, noise
    check_smoke_run(tmp_path, "rtpo")  # and what test_fit_cli.py checks on the other schedules' smoke runs


@pytest.mark.slow
def test_agentrl_verbose_brings_the_libraries_output_back(tmp_path: Path) -> None:
    proc = _fit(tmp_path, "--config", SMOKE, "--data.steps", "1", verbose=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Seed set to 0" in out and "step 1:" in out  # Lightning's and agentrl's own INFO logs
    assert "step 1/1" in out


@pytest.mark.parametrize("args,shown", [
    (["--model.algorithm.init_args.ppo.minibatch_size", "null"], "minibatch_size: null"),
    (["--model.algorithm.init_args.ppo.minibatch_size=null"], "minibatch_size: null"),
    (["--data.agent.init_args.env.init_args.max_turns", "null"], "max_turns: null"),
    (["--model.optim.lr", "-1e-3"], "lr: -0.001"),
    (["--model.optim.lr", "-.5"], "lr: -0.5"),
    (["--data.agent.init_args.env.init_args.format_penalty", "-2"], "format_penalty: -2"),
], ids=["null-below-class_path", "null-with-equals", "null-two-levels-down", "negative-exponent",
        "negative-fraction", "negative-below-class_path"])
@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
def test_null_and_negative_numbers_on_the_command_line(tmp_path: Path, args: list[str], shown: str,
                                                       capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = fit_in_process(tmp_path, ["--config", SMOKE, *args, "--print_config"], capsys, monkeypatch)
    assert code == 0, err[-2000:]
    assert shown in out


def test_normalize_argv_keeps_meaning() -> None:
    assert normalize_argv(["--a.init_args.b.c", "null", "--x", "-1e-3", "--y=-2", "--z", "3"]) == [
        "--a.init_args", "{b: {c: null}}", "--x=-1e-3", "--y=-2", "--z", "3"]
    assert normalize_argv(["--a.init_args.b.init_args.c=~"]) == ["--a.init_args", "{b: {init_args: {c: null}}}"]
    assert normalize_argv(["--data.max_turns", "null", "--ckpt_path", "last"]) == [
        "--data.max_turns=null", "--ckpt_path", "last"]


def test_fit_help_shows_the_common_keys_first(tmp_path: Path) -> None:
    proc = _fit(tmp_path, "--help", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    common = proc.stdout.index("Common keys of `agentrl fit`")
    for key in ("--model.policy.init_args.model", "--data.steps", "--data.batch_size", "--model.optim.lr",
                "--model.algorithm", "--model.engine.init_args.base_urls"):
        assert common < proc.stdout.index(key) < proc.stdout.index("--trainer.accelerator"), key
    assert list(tmp_path.iterdir()) == []  # the help starts nothing: no MLflow store, no checkpoints


LEARNING = ROOT / "configs" / "learning"  # partial configs: one environment file + one schedule file make a run
CONFIGS = [[c] for c in sorted((ROOT / "configs").rglob("*.yaml")) if LEARNING not in c.parents] + [
    [env, schedule] for env in sorted(LEARNING.glob("*.yaml")) for schedule in sorted(LEARNING.glob("schedules/*"))]


@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
@pytest.mark.parametrize("configs", CONFIGS, ids=["+".join(str(c.relative_to(ROOT)) for c in cs) for cs in CONFIGS])
def test_every_shipped_config_passes_the_checks_before_work(configs: list[Path], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks build every cheap part of each shipped config (and resolve its model name) without error; the
    learning benchmark's environment files are checked with each of its schedule files."""
    from agentrl.training.command.cli import AgentRLCLI
    from agentrl.training.rollout.datamodule import RolloutDataModule
    from agentrl.training.system.module import AgentRLModule

    class ChecksOnly(AgentRLCLI):
        def instantiate_classes(self) -> None:  # stop after before_instantiate_classes (parse + checks)
            self.checked = True

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("agentrl.training.command.cli.quiet_libraries", lambda: None)  # keep logging as is
    args = [arg for c in configs for arg in ("--config", str(c))]
    if any(LEARNING in c.parents and "checkpoints/warmup/" in c.read_text() for c in configs):
        # its model folder is made by benchmarks/format_warmup.py on first use: check the rest with the base model
        args += ["--model.policy.init_args.model", "smollm2-135m-instruct"]
    cli = ChecksOnly(AgentRLModule, RolloutDataModule, args=args, run=False,
                     auto_configure_optimizers=False)
    assert cli.checked and cli.config.trainer.logger.init_args.run_name  # a run name was chosen
    assert list(tmp_path.iterdir()) == []
