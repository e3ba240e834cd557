"""`agentrl fit` on the LangChain smoke config through a subprocess, as a user runs it: the YAML names the agent's
``build`` and ``reward`` by dotted path, the run trains, checkpoints and logs to MLflow."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.trained import ENTROPY_BONUS, assert_smoke_run_trained

ROOT = Path(__file__).resolve().parents[3]


def _fit(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "fit", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.mark.slow
def test_langchain_smoke_config_trains_end_to_end(tmp_path: Path) -> None:
    """The smoke config's random model earns equal rewards (zero advantages, no optimizer step), so an entropy
    bonus gives the update a signal: every policy tensor must then have moved."""
    proc = _fit(tmp_path, "--config", str(ROOT / "configs/smoke/langchain_rtpo.yaml"), *ENTROPY_BONUS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    params = assert_smoke_run_trained(tmp_path)
    assert params["data.agent.class_path"] == "agentrl_langchain.LangChainAgent"


def test_the_config_names_the_agent_by_dotted_path_and_a_bad_one_is_refused(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from agentrl.training.command.cli import fit_main

    monkeypatch.setattr("sys.argv", ["agentrl"])  # pytest's own arguments are not the CLI's

    config = str(ROOT / "configs/langchain_search_rtpo.yaml")
    with pytest.raises(SystemExit) as ok:
        fit_main(["--config", config, "--print_config"])
    assert ok.value.code in (0, None)
    printed = capsys.readouterr().out
    assert "build: agentrl_langchain_examples.search_agent.build" in printed
    assert "input_mapping: agentrl_langchain_examples.search_agent.with_demonstration" in printed
    with pytest.raises(SystemExit) as bad:
        fit_main(["--config", config, "--data.agent.init_args.reward", "my_project.rewards.missing", "--print_config"])
    assert bad.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[0] == (
        "agentrl fit: config error: data.agent.init_args.reward: cannot import my_project.rewards.missing (No module "
        "named 'my_project') (agentrl fit --help lists the keys)"), err
