"""A run reviewed the way a user does it: the LangChain smoke config trains (in this process, so the recorded
episodes can be compared), then a real ``mlflow server`` on 127.0.0.1 serves the same store and everything is read
back through `MlflowClient` over HTTP: parameters, every metric, chat traces equal to the recorded turns (tools
offered included), reward assessments, the figures, the registered final model, which reloads with transformers
and scores tokens as the trained policy does."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.types import Trajectory
from tests.support.mlflow_server import start_mlflow_server

ROOT = Path(__file__).resolve().parents[2]


def _expected_inputs(traj: Trajectory, k: int) -> list[dict[str, Any]]:
    """Turn k's full chat input, rebuilt from the recorded turns: new messages, then each reply in between."""
    out: list[dict[str, Any]] = []
    for turn in traj.turns[:k]:
        out += list(turn.messages or [])
        out.append(_expected_reply(turn))
    return out + list(traj.turns[k].messages or [])


def _expected_reply(turn: Any) -> dict[str, Any]:
    reply: dict[str, Any] = {"role": "assistant", "content": turn.text}
    if turn.tool_calls:
        reply["tool_calls"] = [{"id": f"call_{turn.index}_{i}", "type": "function",
                                "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                               for i, c in enumerate(turn.tool_calls)]
    return reply


def _logprobs(model: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


@pytest.mark.slow
def test_a_smoke_run_reads_back_through_a_real_mlflow_server(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow
    from mlflow import MlflowClient

    from agentrl.tracking import review
    from agentrl.training.command.cli import fit_main

    logged: dict[str, Trajectory] = {}

    def spy(client: Any, traj: Trajectory, **kwargs: Any) -> str:
        trace_id = log_episode(client, traj, **kwargs)
        logged[trace_id] = traj
        return trace_id

    log_episode = review.log_episode
    monkeypatch.setattr(review, "log_episode", spy)
    monkeypatch.chdir(tmp_path)
    args = ["--config", str(ROOT / "configs/smoke/langchain_rtpo.yaml"), "--tracking.every_n_steps", "1",
            "--tracking.register_model", "smoke-policy"]
    monkeypatch.setattr("sys.argv", ["agentrl", "fit", *args])  # as `agentrl fit ...` from a shell
    try:
        fit_main(args)
    finally:
        mlflow.set_tracking_uri(None)  # type: ignore[arg-type]  # None unsets it; mlflow's hint omits None
    assert logged

    server = start_mlflow_server(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path)
    try:
        client = MlflowClient(server.url)
        _check_run(client, tmp_path, logged)
    finally:
        server.stop()


def _check_run(client: Any, cwd: Path, logged: dict[str, Trajectory]) -> None:
    (exp,) = [e for e in client.search_experiments() if e.name == "agentrl-smoke"]
    (run,) = client.search_runs([exp.experiment_id])
    run_id = run.info.run_id
    assert run.info.status == "FINISHED"
    assert run.data.params["data.batch_size"] == "2"
    assert run.data.tags["agentrl.schedule"] == "RTPO" and run.data.tags["agentrl.agent"] == "LangChainAgent"
    assert "--tracking.register_model smoke-policy" in run.data.tags["mlflow.note.content"]
    with sqlite3.connect(cwd / "mlflow.db") as con:
        stored = {k for (k,) in con.execute("SELECT DISTINCT key FROM metrics WHERE run_uuid = ?", (run_id,))}
    assert set(run.data.metrics) == stored
    # a random model's siblings all score 0: zero advantages, no update, so no train/* or clipfrac metrics
    assert {"rollout/reward", "rtpo/depth0/zero_advantage_frac", "rtpo/depth0/mean_abs_advantage"} <= stored

    traces = client.search_traces(locations=[exp.experiment_id], run_id=run_id)
    assert {t.info.trace_id for t in traces} == set(logged)
    for trace in traces:
        traj = logged[trace.info.trace_id]
        turns = [s for s in trace.data.spans if s.span_type == "CHAT_MODEL"]
        assert len(turns) == len(traj.turns) >= 1
        for k, (span, turn) in enumerate(zip(turns, traj.turns, strict=True)):
            assert span.inputs["messages"] == _expected_inputs(traj, k)
            assert span.outputs["choices"][0]["message"] == _expected_reply(turn)
            assert span.attributes["mlflow.chat.tools"] == turn.tools
            assert span.attributes["mlflow.chat.tokenUsage"]["input_tokens"] == len(turn.prompt_ids)
        assert turns[0].attributes["mlflow.chat.tools"], "the LangChain agent offers its tools"
        feedback = {a.name: a for a in trace.info.assessments}
        assert feedback["reward"].value == pytest.approx(traj.total_reward)
        assert feedback["success"].value == traj.success
        assert feedback["reward"].source.source_id == "agentrl_langchain_examples.search_agent.reward"

    names = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.yaml", "trajectories.json", "reward_curve.png", "rtpo_depths.png", "final_model"} <= names
    (version,) = client.search_model_versions("name='smoke-policy'")
    assert version.run_id == run_id
    _check_model(client, run_id, cwd, next(iter(logged.values())))


def _check_model(client: Any, run_id: str, cwd: Path, traj: Trajectory) -> None:
    from transformers import AutoModelForCausalLM

    from agentrl.models.policy import Policy

    folder = client.download_artifacts(run_id, "final_model", str(cwd / "download"))
    reloaded = AutoModelForCausalLM.from_pretrained(folder).eval()
    trained = Policy("tiny-random", seed=0)
    state = torch.load(cwd / "checkpoints/smoke/last.ckpt", weights_only=True, map_location="cpu")["state_dict"]
    trained.model.load_state_dict({k.removeprefix("policy.model."): v for k, v in state.items()
                                   if k.startswith("policy.model.")})
    ids = traj.turns[0].prompt_ids + traj.turns[0].response_ids
    want = _logprobs(trained.model.eval(), ids)
    assert (_logprobs(reloaded, ids) - want).abs().max() <= 1e-5
    # the comparison can tell models apart: a 1e-3 change of the output layer moves log-probs beyond 1e-5
    # (the smoke run itself may leave the weights as they were: a random model scores every sibling 0, and a
    # step with zero advantages takes no optimizer step)
    with torch.no_grad():
        reloaded.lm_head.weight.add_(1e-3 * torch.randn_like(reloaded.lm_head.weight))
    assert (_logprobs(reloaded, ids) - want).abs().max() > 1e-5
