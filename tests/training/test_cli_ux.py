"""``agentrl fit`` as a new user meets it: one-line parser errors with "did you mean", short algorithm names,
the Python API, and the lines quiet mode must still show (a resume that found no checkpoint, ``log_episodes``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.training.helpers import fit_in_process

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs/smoke/grpo.yaml")
# a short name resolves to the class's one documented path, `agentrl.training.NAME`
NAMES = {name: f"agentrl.training.{name}" for name in ("RTPO", "TurnPPO", "GRPO", "TokenPPO")}
pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")


@pytest.mark.parametrize("args,message", [
    (["--data.batch_sizee", "4"], "unknown key data.batch_sizee (did you mean data.batch_size?)"),
    (["--data.steps", "many"], "data.steps: expected int, got 'many'"),
    (["--model.optim.lrr", "1e-3"], "unknown key model.optim.lrr (did you mean model.optim.lr?)"),
    (["--data.agent.init_args.env.init_args.max_turnss", "3"],
     "unknown key data.agent.init_args.env.init_args.max_turnss (did you mean "
     "data.agent.init_args.env.init_args.max_turns?)"),
    (["--model.algorithm", "RTPPO"], "model.algorithm: RTPPO is not a class that can be chosen here"),
], ids=["unknown-key", "wrong-type", "unknown-key-in-a-union", "unknown-key-two-classes-down", "unknown-class"])
def test_a_parser_error_is_one_short_line_naming_the_key(tmp_path: Path, args: list[str], message: str,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = fit_in_process(tmp_path, ["--config", SMOKE, *args], capsys, monkeypatch)
    assert code == 2
    lines = err.strip().splitlines()
    assert lines[0].startswith("agentrl fit: config error: ") and message in lines[0], err
    assert len(lines) == 1 and "usage:" not in err, err  # before: ~75 lines of usage first


def test_a_config_without_an_algorithm_says_how_to_name_one(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    partial = tmp_path / "agent_only.yaml"  # the shape of docs/adapters.md's config before it named the algorithm
    partial.write_text("data:\n  agent:\n    class_path: agentrl.agents.env_agent.EnvAgent\n    init_args:\n"
                       "      env: {class_path: agentrl.envs.GuessNumberEnv}\n")
    code, _, err = fit_in_process(tmp_path, ["--config", str(partial)], capsys, monkeypatch)
    assert code == 2
    assert err.splitlines()[0].startswith("agentrl fit: config error: model.algorithm is required: name it in the "
                                          "config (model: {algorithm: RTPO})"), err


def test_an_unknown_key_in_a_config_file_gets_did_you_mean(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    typo = tmp_path / "typo.yaml"
    typo.write_text(Path(SMOKE).read_text().replace("batch_size: 4", "batch_sizee: 4"))
    code, _, err = fit_in_process(tmp_path, ["--config", str(typo)], capsys, monkeypatch)
    assert code == 2
    assert err.splitlines()[0] == ("agentrl fit: config error: unknown key data.batch_sizee (did you mean "
                                   "data.batch_size?) (agentrl fit --help lists the keys)"), err


@pytest.mark.parametrize("name", sorted(NAMES))
def test_short_algorithm_names(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = fit_in_process(tmp_path, ["--config", SMOKE, "--model.algorithm", name, "--print_config"],
                                    capsys, monkeypatch)
    assert code == 0, err[-2000:]
    assert f"class_path: {NAMES[name]}" in out


def test_algorithm_help_by_short_name_and_all_four_in_help(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = fit_in_process(tmp_path, ["--model.algorithm.help", "RTPO"], capsys, monkeypatch)
    assert code == 0, err[-2000:]
    assert "--model.algorithm.group_size" in out and "--model.algorithm.max_depth" in out
    code, out, err = fit_in_process(tmp_path, ["--help"], capsys, monkeypatch)
    assert code == 0
    known = out[out.rindex("--model.algorithm ALGORITHM"):]  # its entry, after the usage
    known = known[:known.index("--model.engine")]
    for path in NAMES.values():
        assert path in known.replace("\n", "").replace(" ", ""), path  # RTPO was missing: rtpo.py not imported
    assert "RTPO (default), TurnPPO, GRPO or TokenPPO" in out  # the common keys name the short forms


def test_the_python_api_trains_and_raises_config_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import agentrl
    from agentrl.training.command.preflight import ConfigError

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("agentrl.training.command.cli.quiet_libraries", lambda: None)  # keep this process's logging
    with pytest.raises(ConfigError, match=r"unknown key data.batch_sizee \(did you mean data.batch_size\?\)"):
        agentrl.fit(SMOKE, data={"batch_sizee": 4})
    with pytest.raises(ConfigError, match="optim.lr must be a positive number"):
        agentrl.fit(SMOKE, model={"optim": {"lr": -1.0}})
    assert not (tmp_path / "mlflow.db").exists()  # both before any work
    cli = agentrl.fit(SMOKE, data={"steps": 1}, model={"algorithm": "TurnPPO"}, tracking={"every_n_steps": 0})
    assert cli.model.rl_step == 1 and type(cli.model.algorithm).__name__ == "TurnPPO"
    assert (tmp_path / "checkpoints/smoke/last.ckpt").is_file() and (tmp_path / "mlflow.db").is_file()


@pytest.mark.slow
def test_quiet_mode_still_shows_a_missing_resume_and_the_episodes_asked_for(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    env.pop("AGENTRL_VERBOSE", None)  # the default, quiet mode
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "fit", "--config", str(ROOT / "configs/smoke/langchain_rtpo.yaml"),
         "--data.steps", "1", "--ckpt_path", "last", "--data.agent.init_args.log_episodes", "true",
         "--tracking.every_n_steps", "0"], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    warning = ("agentrl fit: warning: --ckpt_path last: no checkpoint at checkpoints/smoke/last.ckpt; this run starts "
               "from step 0 (a new MLflow run)")
    assert warning in proc.stderr.splitlines(), proc.stderr[-3000:]
    assert "HINT: Set `ModelCheckpoint" not in out  # Lightning's misleading hint is replaced by the line above
    episodes = [line for line in proc.stderr.splitlines() if "agentrl_langchain.agent: episode " in line]
    assert len(episodes) >= 2, proc.stderr[-3000:]  # a trunk and its siblings, one INFO line each


@pytest.mark.parametrize("seeds,warned", [
    ({"seed_everything": 1, "data.seed": 0, "model.seed": 0}, "this run samples with data.seed=0 and model.seed=0"),
    ({"seed_everything": 1, "data.seed": 1, "model.seed": 0}, "this run samples with model.seed=0 (set"),
    ({"seed_everything": 2, "data.seed": 2, "model.seed": 2}, None),
    ({"seed_everything": True, "data.seed": 0, "model.seed": 0}, None),  # Lightning's "pick one": not a run seed
])
def test_a_seed_everything_that_does_not_seed_the_run_is_named(seeds: dict[str, object], warned: str | None,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from jsonargparse import Namespace

    from agentrl.training.command.cli import _warn_seed_mismatch

    config = Namespace()
    for key, value in seeds.items():
        config[key] = value
    _warn_seed_mismatch(config)
    err = capsys.readouterr().err
    if warned is None:
        assert err == ""
    else:
        assert err.startswith(f"agentrl fit: warning: seed_everything={seeds['seed_everything']} seeds torch only; ")
        assert warned in err, err


def test_full_weight_training_over_an_http_engine_is_refused_before_any_model_loads(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """An HTTP engine syncs weights only as a verified LoRA hot-load: a policy without LoRA is a config error, one
    line naming the reason, not a failure at the first push after the model has loaded."""
    config = str(ROOT / "configs/smoke/rtpo_serve.yaml")
    code, _, err = fit_in_process(tmp_path, ["--config", config, "--model.policy.init_args.lora", "null"], capsys,
                                  monkeypatch)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert lines[0].startswith("agentrl fit: config error: ") and "LoRA" in lines[0], err
