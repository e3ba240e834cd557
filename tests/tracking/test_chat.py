"""Episodes in MLflow's chat format, written to a real sqlite store and read back: a two-turn episode with a tool
call (which the tiny random model of the smoke runs never writes), worked out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.tracking.chat import log_episode, reward_source, turn_inputs
from agentrl.types import Trajectory, Turn

TOOLS = [{"type": "function", "function": {"name": "search", "description": "Search the notes.",
                                           "parameters": {"type": "object",
                                                          "properties": {"query": {"type": "string"}},
                                                          "required": ["query"]}}}]
SYSTEM = {"role": "system", "content": "Answer with the tools."}
USER = {"role": "user", "content": "Where is Orlan?"}
TOOL_RESULT = {"role": "tool", "content": "Orlan is in Vell.", "tool_call_id": "call_0_0"}


def _episode() -> Trajectory:
    first = Turn([1, 2, 3], [4, 5], [-0.5, -0.25], index=0, messages=[SYSTEM, USER], tools=TOOLS,
                 text='<tool_call>{"name": "search", "arguments": {"query": "Orlan"}}</tool_call>',
                 tool_calls=[{"name": "search", "arguments": {"query": "Orlan"}}])
    second = Turn([1, 2, 3, 4, 5, 6, 7], [8], [-1.0], index=1, messages=[TOOL_RESULT], tools=TOOLS,
                  text="Vell.", reward=1.0)
    return Trajectory(turns=[first, second], reward=0.0, terminated=True, task_id="q1", seed=7,
                      info={"success": True})


def test_turn_inputs_rebuild_the_whole_conversation() -> None:
    call = {"id": "call_0_0", "type": "function",
            "function": {"name": "search", "arguments": '{"query": "Orlan"}'}}
    reply = {"role": "assistant", "content": _episode().turns[0].text, "tool_calls": [call]}
    assert turn_inputs(_episode()) == [[SYSTEM, USER], [SYSTEM, USER, reply, TOOL_RESULT]]


def test_an_agent_that_rewrites_its_history_sends_whole_inputs() -> None:
    traj = _episode()
    traj.turns[1].messages = [SYSTEM, {"role": "user", "content": "summary"}]
    assert turn_inputs(traj)[1] == [SYSTEM, {"role": "user", "content": "summary"}]


def test_an_episode_reads_back_as_chat_spans_with_tools_and_assessments(tmp_path: Path) -> None:
    import mlflow
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)  # where the tracer exports, as MLFlowLogger sets it in a run
    try:
        client = MlflowClient(uri)
        exp = client.create_experiment("chat")
        run = client.create_run(exp)
        trace_id = log_episode(client, _episode(), experiment_id=exp, run_id=run.info.run_id, step=3,
                               model="tiny", reward_source="my.rewards.exact_match")
        trace = client.get_trace(trace_id)
    finally:
        mlflow.set_tracking_uri(None)  # type: ignore[arg-type]  # None unsets it; mlflow's hint omits None
    spans = {s.name: s for s in trace.data.spans}
    turn0, turn1, tool = spans["turn 0"], spans["turn 1"], spans["search"]
    assert turn0.span_type == turn1.span_type == "CHAT_MODEL" and tool.span_type == "TOOL"
    assert turn0.attributes["mlflow.chat.tools"] == TOOLS
    message = turn0.outputs["choices"][0]["message"]
    assert message["tool_calls"][0]["function"] == {"name": "search", "arguments": '{"query": "Orlan"}'}
    assert turn1.inputs["messages"][-1] == TOOL_RESULT
    assert turn1.outputs["choices"][0]["message"] == {"role": "assistant", "content": "Vell."}
    assert turn1.outputs["usage"] == {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}
    assert turn1.attributes["mlflow.chat.tokenUsage"]["input_tokens"] == 7
    assert tool.inputs == {"query": "Orlan"} and tool.outputs == {"content": "Orlan is in Vell."}
    assert tool.parent_id == turn0.span_id
    feedback = {a.name: a for a in trace.info.assessments}
    assert feedback["reward"].value == pytest.approx(1.0)
    assert feedback["success"].value is True
    assert feedback["reward"].source.source_type == "CODE"
    assert feedback["reward"].source.source_id == "my.rewards.exact_match"


def test_reward_source_names_the_reward_function_or_the_environment() -> None:
    from agentrl.agents.env_agent import EnvAgent
    from agentrl.envs import GuessNumberEnv

    class Scored:
        def reward(self, task: object, result: object) -> float:
            return 0.0

    assert reward_source(EnvAgent(GuessNumberEnv())) == "agentrl.envs.guess.GuessNumberEnv"
    assert reward_source(Scored()).endswith("Scored.reward")


def test_spans_keep_the_turns_real_times(tmp_path: Path) -> None:
    """Traces are written after the episode, but their spans carry the turns' recorded times (issue 30, item 9:
    every turn showed ~0.6 ms): turn 0 took 1.5 s, its tool ran 0.25 s until turn 1, which took 0.5 s."""
    import mlflow
    from mlflow import MlflowClient

    t0 = 1_700_000_000_000_000_000
    traj = _episode()
    traj.turns[0].started_ns, traj.turns[0].ended_ns = t0, t0 + 1_500_000_000
    traj.turns[1].started_ns, traj.turns[1].ended_ns = t0 + 1_750_000_000, t0 + 2_250_000_000
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    try:
        client = MlflowClient(uri)
        exp = client.create_experiment("timing")
        run = client.create_run(exp)
        trace = client.get_trace(log_episode(client, traj, experiment_id=exp, run_id=run.info.run_id, step=1,
                                             model="tiny", reward_source="r"))
    finally:
        mlflow.set_tracking_uri(None)  # type: ignore[arg-type]  # None unsets it; mlflow's hint omits None
    spans = {s.name: s for s in trace.data.spans}
    times = {name: (s.start_time_ns - t0, s.end_time_ns - t0) for name, s in spans.items()}
    assert times == {"episode q1": (0, 2_250_000_000), "turn 0": (0, 1_500_000_000),
                     "search": (1_500_000_000, 1_750_000_000), "turn 1": (1_750_000_000, 2_250_000_000)}
    assert trace.info.execution_duration == 2250  # ms: the trace list's latency column


_TWO_EPISODES = """
import sys, threading
import mlflow
from mlflow import MlflowClient
from tests.tracking.test_chat import _episode
from agentrl.tracking.chat import log_episode
uri = f"sqlite:///{sys.argv[1]}/mlflow.db"
mlflow.set_tracking_uri(uri)
client = MlflowClient(uri)
exp = client.create_experiment("chat")
run = client.create_run(exp)
ids = [log_episode(client, _episode(), experiment_id=exp, run_id=run.info.run_id, step=1, model="tiny",
                   reward_source="r") for _ in range(2)]
assert all({a.name for a in client.get_trace(i).info.assessments} == {"reward", "success"} for i in ids)
print(sorted({t.name for t in threading.enumerate() if t.name.startswith("MLflowTraceLogging")}))
"""


def test_episodes_are_exported_without_mlflows_background_queue(tmp_path: Path) -> None:
    """Each episode's trace is stored before its assessments reference it: with MLflow's default asynchronous
    export that means flushing a queue whose consumer wakes once a second (30-40 s idle for 32 held-out episodes).
    `log_episode` has MLflow export synchronously: in a fresh process no background trace-logging thread is started,
    and both episodes read back with their assessments."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_ENABLE_ASYNC_TRACE_LOGGING"}
    out = subprocess.run([sys.executable, "-c", _TWO_EPISODES, str(tmp_path)], capture_output=True, text=True,
                         env=env, cwd=Path(__file__).resolve().parents[2], check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
