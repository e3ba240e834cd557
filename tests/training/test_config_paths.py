"""Input files a config names are found beside the config from any working directory; outputs stay in the working
directory (`agentrl.training.command.paths`, docs/operations.md "Paths in a config"). Real parts: ``agentrl fit``
in this process on the smoke config's tiny random model, a real MLflow sqlite store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.training.test_validate import SMOKE, _agentrl

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")


def _own_task(folder: Path, tasks: str) -> Path:
    """``folder/try/my_task.yaml`` (the smoke config with ``JsonlTasks`` at ``tasks``) and ``try/arith.jsonl``."""
    (folder / "try").mkdir()
    (folder / "try" / "arith.jsonl").write_text("".join(json.dumps({"q": f"{i}+1", "a": i + 1}) + "\n"
                                                        for i in range(4)))
    config = folder / "try" / "my_task.yaml"
    config.write_text("data:\n  tasks:\n    class_path: agentrl.training.JsonlTasks\n"
                      f"    init_args: {{path: {tasks}}}\n")
    return config


@pytest.mark.slow
def test_a_task_file_beside_the_config_is_found_from_another_working_directory(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    _own_task(tmp_path, "arith.jsonl")
    code, out, err = _agentrl(tmp_path, "fit", ["--config", SMOKE, "--config", "try/my_task.yaml", "--data.steps", "1",
                                                "--data.batch_size", "3", "--tracking.log_final_model", "false"], capfd)
    assert code == 0, err[-3000:]
    assert "done: 1 steps" in out
    # what the run wrote is in the working directory, not beside the config
    assert (tmp_path / "mlflow.db").is_file() and (tmp_path / "checkpoints/smoke/last.ckpt").is_file()
    assert not (tmp_path / "try" / "mlflow.db").exists()


def test_a_task_file_found_nowhere_is_one_line_naming_the_key(tmp_path: Path,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    _own_task(tmp_path, "nowhere.jsonl")
    code, _, err = _agentrl(tmp_path, "fit", ["--config", SMOKE, "--config", "try/my_task.yaml"], capfd)
    lines = [line for line in err.splitlines() if line.startswith("agentrl fit: config error:")]
    assert code == 2 and len(lines) == 1 and "tasks.path: file not found: nowhere.jsonl" in lines[0], err[-2000:]
    assert not (tmp_path / "mlflow.db").exists()
