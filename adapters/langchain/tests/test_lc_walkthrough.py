"""docs/adapters.md's LangChain walk-through, run as written: its ``my_agent.py`` and ``my_config.yaml`` blocks are
written beside each other in an empty folder and trained with the ``agentrl`` console script from there (no
``PYTHONPATH``), on the tiny test model. A reward that raises shows where, in the log and in the MLflow run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs/adapters.md"
TINY = ["--model.policy.init_args.model", "tiny-random", "--data.steps", "1", "--data.batch_size", "2",
        "--data.max_turns", "2", "--data.sampling.max_tokens", "8", "--tracking.every_n_steps", "0",
        "--model.peak_flops", "1e11"]


def _blocks() -> tuple[str, str]:
    """The walk-through's agent module and config, exactly as the doc prints them."""
    text = DOC.read_text()
    agent = re.search(r"```python\n(# my_agent\.py.*?)```", text, re.S)
    config = re.search(r"```yaml\n(# my_config\.yaml.*?)```", text, re.S)
    assert agent and config, "docs/adapters.md lost its walk-through blocks"
    return agent.group(1), config.group(1)


def _questions() -> str:
    """The walk-through's ``questions.jsonl``, as the doc prints it."""
    block = re.search(r"```json\n(\{\"question\".*?)```", DOC.read_text(), re.S)
    assert block, "docs/adapters.md lost its questions.jsonl block"
    return block.group(1)


def _write(folder: Path, agent: str, config: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "my_agent.py").write_text(agent)
    (folder / "my_config.yaml").write_text(config)
    (folder / "questions.jsonl").write_text(_questions())


def test_the_questions_are_answered_by_the_shipped_corpus() -> None:
    """Every answer of the doc's questions is in a passage of the corpus the agent's ``search`` tool reads."""
    from agentrl.envs import SearchIndex

    rows = [json.loads(line) for line in _questions().splitlines() if line.strip()]
    texts = [doc["text"].lower() for doc in SearchIndex().docs]
    assert len(rows) == 8
    for row in rows:
        assert any(row["answer"].lower() in text for text in texts), row


def _agentrl(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The console script, as a user types it: it puts only its own folder on sys.path (``python -m`` adds cwd)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    env.pop("PYTHONPATH", None)
    env.pop("AGENTRL_VERBOSE", None)
    script = Path(sys.executable).parent / "agentrl"
    return subprocess.run([str(script), "fit", *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env=env)


@pytest.mark.slow
def test_the_walkthrough_trains_as_written(tmp_path: Path) -> None:
    agent, config = _blocks()
    _write(tmp_path, agent, config)
    proc = _agentrl(tmp_path, "--config", "my_config.yaml", *TINY)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]  # before: No module named 'my_agent', then required: model.algorithm
    assert "step 1/1" in proc.stdout, out[-3000:]
    assert (tmp_path / "checkpoints/last.ckpt").is_file()
    # the config names no seed_everything and no trainer settings: no Lightning seed warning, no summary table
    assert "No seed found" not in out and "Total params" not in out, out[-3000:]


@pytest.mark.slow
def test_a_reward_that_raises_shows_where_in_the_log_and_in_mlflow(tmp_path: Path) -> None:
    agent, config = _blocks()
    broken = agent.replace('task.data["answer"]', 'task.data["solution"]')
    assert broken != agent
    _write(tmp_path, broken, config)
    line = next(n for n, text in enumerate(broken.splitlines(), 1) if 'task.data["solution"]' in text)
    proc = _agentrl(tmp_path, "--config", "my_config.yaml", *TINY)
    assert proc.returncode != 0
    assert f"KeyError: 'solution' (raised at my_agent.py:{line} in reward)" in proc.stderr, proc.stderr[-3000:]
    assert f'my_agent.py", line {line}, in reward' in proc.stderr  # the episode's own traceback

    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FAILED"
    assert "KeyError: 'solution' (raised at my_agent.py" in run.data.tags["agentrl.error"]
    error = Path(client.download_artifacts(run.info.run_id, "error.txt", str(tmp_path)))
    assert f'my_agent.py", line {line}, in reward' in error.read_text()  # before: only config.yaml was there


def test_model_replies_leave_out_a_worked_example() -> None:
    from langchain_core.messages import AIMessage, HumanMessage

    from agentrl_langchain import RAW_TEXT_KEY, model_replies

    example = AIMessage("", tool_calls=[{"name": "answer", "args": {"text": "Vell"}, "id": "ex"}])
    own = AIMessage("", additional_kwargs={RAW_TEXT_KEY: "<tool_call>...</tool_call>"},
                    tool_calls=[{"name": "answer", "args": {"text": "Ama"}, "id": "call_0_0"}])
    state = {"messages": [HumanMessage("Where is Orlan?"), example, HumanMessage("Who built Kest?"), own]}
    assert model_replies(state) == [own] and model_replies(state["messages"]) == [own]
