"""Episodes as MLflow traces in MLflow's chat format, with the episode's reward as assessments.

MLflow's GenAI views (the Traces tab's chat view, token counts, assessment filters) read a fixed shape:

* a span of type ``CHAT_MODEL`` whose inputs are an OpenAI chat request (``{"messages": [...]}``) and whose
  outputs are an OpenAI chat completion (``choices[0].message`` is the assistant message with its
  ``tool_calls``, ``usage`` the token counts);
* the tools offered to the model in the ``mlflow.chat.tools`` attribute (`mlflow.tracing.set_span_chat_tools`),
  the token usage in ``mlflow.chat.tokenUsage``, the format in ``mlflow.message.format``;
* scores as assessments (`mlflow.entities.Feedback`) on the trace, with a source naming who scored it.

A recorded `Turn` keeps only the messages new since the previous reply (``Turn.messages``), so the full input of
turn k is rebuilt here: the new messages of turns 0..k with each earlier turn's reply in between.

Trace and span ids: OpenTelemetry draws them from Python's global `random`, which ``seed_everything`` seeds, so two
seed-0 runs would overwrite each other's traces. `log_episode` draws them from a freshly seeded state
(`fresh_ids`) and restores the training's random state afterwards.

Credit (`agentrl.credit`): each turn span carries what the step's update did with the turn, as ``agentrl.credit.*``
attributes (`credit_attributes`: the schedule's advantage, the advantage the loss used after folding identical
turns, the critic's value and return, the importance weight, whether it was trained, which update). RTPO episodes
name their tree (``agentrl.rtpo.*`` trace tags and root attributes: tree, role, depth, sibling group, the trunk's
trace id); each turn span says its part (trunk, replayed prefix, branch turn, continuation), and `link_tree` tags
a trunk with its own id and its siblings' ids, so ``tags.`agentrl.rtpo.trunk_trace` = '<id>'`` lists a tree.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from agentrl.chat.tools import tool_call_id
from agentrl.credit import TurnCredit
from agentrl.types import Trajectory, Turn

Message = dict[str, Any]


def assistant_message(turn: Turn) -> Message:
    """The turn's reply as an OpenAI assistant message (the raw text as content, parsed calls as ``tool_calls``)."""
    message: Message = {"role": "assistant", "content": turn.text or ""}
    if turn.tool_calls:
        message["tool_calls"] = [
            {"id": tool_call_id(turn.index, i), "type": "function",
             "function": {"name": str(call.get("name")), "arguments": json.dumps(call.get("arguments", {}))}}
            for i, call in enumerate(turn.tool_calls)
        ]
    return message


def _same(a: Message, b: Message) -> bool:
    return a.get("role") == b.get("role") and a.get("content") == b.get("content")


def turn_inputs(traj: Trajectory) -> list[list[Message]]:
    """The full chat input of every turn: earlier new messages and replies, then the turn's new messages.

    A turn whose recorded messages start with the episode's first message was rendered from scratch (the agent
    rewrote its history), so its messages are the whole input.
    """
    out: list[list[Message]] = []
    history: list[Message] = []
    first = traj.turns[0].messages[0] if traj.turns and traj.turns[0].messages else None
    for turn in traj.turns:
        new = list(turn.messages or [])
        if history and new and first is not None and _same(new[0], first):
            history = []
        history = [*history, *new]
        out.append(list(history))
        history.append(assistant_message(turn))
    return out


def chat_completion(turn: Turn, model: str) -> dict[str, Any]:
    """The turn's reply as an OpenAI chat completion (what MLflow's chat view reads from a span's outputs)."""
    prompt, completion = len(turn.prompt_ids), len(turn.response_ids)
    return {
        "object": "chat.completion", "model": model,
        "choices": [{"index": 0, "message": assistant_message(turn), "finish_reason": turn.finish_reason}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def _tool_results(next_turn: Turn | None) -> list[Any]:
    return [m.get("content") for m in (next_turn.messages or []) if m.get("role") == "tool"] if next_turn else []


@contextmanager
def fresh_ids() -> Iterator[None]:
    """Python's global `random` seeded from the OS inside the block, and its previous state restored after it."""
    state = random.getstate()
    random.seed()  # os.urandom: unique trace and span ids whatever seed the run has
    try:
        yield
    finally:
        random.setstate(state)


def rtpo_role(traj: Trajectory, turn_index: int) -> str | None:
    """A turn's part in an RTPO tree: ``trunk``, ``prefix`` (replayed), ``branch`` (turn k, the trained one) or
    ``continuation``; None outside RTPO."""
    if traj.tree is None:
        return None
    if traj.branch_turn is None:
        return "trunk"
    if turn_index < traj.branch_turn:
        return "prefix"
    return "branch" if turn_index == traj.branch_turn else "continuation"


def credit_attributes(traj: Trajectory, turn_index: int, credit: TurnCredit | None) -> dict[str, Any]:
    """The turn span's ``agentrl.credit.*`` and ``agentrl.rtpo.*`` attributes (floats, ints, bools, strings)."""
    attrs: dict[str, Any] = {"agentrl.credit.trained": bool(credit is not None and credit.trained)}
    if credit is not None:
        attrs |= {"agentrl.credit.advantage": credit.advantage,
                  "agentrl.credit.advantage_used": credit.advantage_used}
        if credit.update:
            attrs["agentrl.credit.update"] = credit.update
        for name, value in (("value", credit.value), ("return", credit.returns), ("is_weight", credit.is_weight)):
            if value is not None:
                attrs[f"agentrl.credit.{name}"] = value
    role = rtpo_role(traj, turn_index)
    if role is not None:
        attrs["agentrl.rtpo.role"] = role
        if traj.branch_turn is not None:
            attrs["agentrl.rtpo.depth"] = traj.branch_turn
            attrs["agentrl.rtpo.group"] = traj.group
    return attrs


def rtpo_tags(traj: Trajectory, trunk_trace: str | None) -> dict[str, str]:
    """An RTPO episode's place in its tree as trace tags (searchable in the Traces tab); {} outside RTPO."""
    if traj.tree is None:
        return {}
    tags = {"agentrl.rtpo.tree": str(traj.tree),
            "agentrl.rtpo.role": "trunk" if traj.branch_turn is None else "sibling"}
    if traj.branch_turn is not None:
        tags |= {"agentrl.rtpo.depth": str(traj.branch_turn), "agentrl.rtpo.group": str(traj.group)}
    if trunk_trace is not None:
        tags["agentrl.rtpo.trunk_trace"] = trunk_trace
    return tags


def link_tree(client: Any, trunk_trace: str, sibling_traces: Sequence[str]) -> None:
    """Tag a logged trunk with its own trace id (as its siblings are) and its siblings' trace ids."""
    client.set_trace_tag(trunk_trace, "agentrl.rtpo.trunk_trace", trunk_trace)
    client.set_trace_tag(trunk_trace, "agentrl.rtpo.siblings", ",".join(sibling_traces)[:7000])


def log_episode(client: Any, traj: Trajectory, *, experiment_id: str, run_id: str, step: int, model: str,
                reward_source: str, credit: Sequence[TurnCredit | None] = (), trunk_trace: str | None = None) -> str:
    """Record one episode as a trace (root AGENT span, a CHAT_MODEL span per turn, a TOOL span per call) and its
    reward and success as feedback assessments. Returns the trace id.

    Args:
        client: The run's `mlflow.MlflowClient`.
        traj: The episode.
        experiment_id: Experiment of the run.
        run_id: Run the trace is linked to.
        step: RL step the episode was collected at.
        model: Model name shown on the chat spans.
        reward_source: Who scored the episode (the reward function's import path), the assessments' source.
        credit: Per turn, what the step's update did with it (`agentrl.credit.StepRecord.credit`); () or None
            entries: not trained.
        trunk_trace: RTPO sibling: the trace id of its trunk, when the trunk was logged.
    """
    # MLflow exports traces from a background queue by default; an assessment needs its trace stored, and flushing
    # that queue waits up to a second for its consumer thread to wake (`queue.get(timeout=1)`): once per episode,
    # 32 held-out episodes cost 30-40 s of idle waiting. Exported synchronously (set before the exporter is first
    # made, unless the user chose), the flush below returns at once and an episode costs its writes only.
    os.environ.setdefault("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")
    import mlflow
    from mlflow.entities import AssessmentSource, Feedback
    from mlflow.tracing.client import TracingClient

    with fresh_ids():
        trace_id = _log_spans(client, traj, experiment_id=experiment_id, run_id=run_id, step=step, model=model,
                              credit=credit, trunk_trace=trunk_trace)
        mlflow.flush_trace_async_logging()  # the trace must be stored before assessments can reference it
        source = AssessmentSource(source_type="CODE", source_id=reward_source)
        tracing = TracingClient(client.tracking_uri)
        tracing.log_assessment(trace_id, Feedback(name="reward", value=float(traj.total_reward), source=source))
        tracing.log_assessment(trace_id, Feedback(name="success", value=bool(traj.success), source=source))
    return trace_id


def _log_spans(client: Any, traj: Trajectory, *, experiment_id: str, run_id: str, step: int, model: str,
               credit: Sequence[TurnCredit | None], trunk_trace: str | None) -> str:
    """The episode's spans (root, turns, tool calls); returns the trace id."""
    from mlflow.tracing import set_span_chat_tools
    from mlflow.tracing.constant import SpanAttributeKey

    inputs = turn_inputs(traj)
    tree = rtpo_tags(traj, trunk_trace)
    # the spans keep the turns' real times (their engine calls), so the trace view's latencies are the episode's;
    # a tool span runs from its turn's reply to the next turn's call. None (an untimed turn) lets MLflow use now.
    starts = [turn.started_ns for turn in traj.turns]
    ends = [turn.ended_ns for turn in traj.turns]
    root = client.start_trace(
        f"episode {traj.task_id}", span_type="AGENT",
        inputs={"task": traj.task_id, "seed": traj.seed, "messages": inputs[0] if inputs else []},
        attributes={"step": step, "group": traj.group, "branch_turn": traj.branch_turn, **tree},
        tags={"agentrl.step": str(step), "agentrl.task": traj.task_id, **tree},
        experiment_id=experiment_id, run_id=run_id, start_time_ns=starts[0] if starts else None,
    )
    trace_id = root.trace_id
    for k, turn in enumerate(traj.turns):
        prompt, completion = len(turn.prompt_ids), len(turn.response_ids)
        span = client.start_span(
            f"turn {turn.index}", trace_id=trace_id, parent_id=root.span_id, span_type="CHAT_MODEL",
            inputs={"model": model, "messages": inputs[k]},
            attributes={
                SpanAttributeKey.MESSAGE_FORMAT: "openai",
                SpanAttributeKey.CHAT_USAGE: {"input_tokens": prompt, "output_tokens": completion,
                                              "total_tokens": prompt + completion},
                "mean_logprob": sum(turn.logprobs) / max(len(turn.logprobs), 1),
                "policy_version": turn.policy_version, "reward": turn.reward, "replayed": turn.forced,
                **credit_attributes(traj, turn.index, credit[k] if k < len(credit) else None),
            },
            start_time_ns=starts[k],
        )
        if turn.tools:
            set_span_chat_tools(span, turn.tools)  # type: ignore[arg-type]  # dicts are accepted and validated
        results = _tool_results(traj.turns[k + 1] if k + 1 < len(traj.turns) else None)
        for i, call in enumerate(turn.tool_calls or []):
            tool = client.start_span(str(call.get("name")), trace_id=trace_id, parent_id=span.span_id,
                                     span_type="TOOL", inputs=call.get("arguments"), start_time_ns=ends[k])
            client.end_span(trace_id=trace_id, span_id=tool.span_id,
                            outputs={"content": results[i]} if i < len(results) else None,
                            end_time_ns=starts[k + 1] if k + 1 < len(starts) else ends[k])
        client.end_span(trace_id=trace_id, span_id=span.span_id, outputs=chat_completion(turn, model),
                        end_time_ns=ends[k])
    client.end_trace(trace_id=trace_id, outputs={"reward": traj.total_reward, "success": traj.success,
                                                 "terminated": traj.terminated, "truncated": traj.truncated,
                                                 "error": traj.error},
                     status="ERROR" if traj.failed else "OK", end_time_ns=ends[-1] if ends else None)
    return str(trace_id)


def reward_source(agent: Any) -> str:
    """Import path of what scores an agent's episodes: its ``reward`` function, else its environment's class."""
    reward = getattr(agent, "reward", None)
    target = reward if callable(reward) and hasattr(reward, "__qualname__") else None
    if target is None:
        env = getattr(agent, "env", None)
        target = type(env) if env is not None else type(agent)
    return f"{target.__module__}.{target.__qualname__}"
