"""An OpenAI Agents SDK agent with two function tools, fine-tuned with RTPO through agentrl's training gateway.

The agent is ordinary Agents SDK code: ``Agent`` with ``@function_tool`` tools ``search`` (the BM25 index of the
shipped SearchQA corpus) and ``answer`` (which ends the run: ``StopAtTools``), on an ``OpenAIChatCompletionsModel``
over ``AsyncOpenAI(base_url=...)``. agentrl hands ``run`` an episode-scoped ``base_url``; every model call the
SDK makes there is one recorded turn (token-exact, with behaviour log-probs), so RTPO gives each turn its own
credit and branches siblings by replaying the trunk's calls. In production, pass your usual endpoint instead.

Tracing is switched off (``set_tracing_disabled``): the SDK would otherwise try to export traces to OpenAI.
Config: ``configs/openai_agents_rtpo.yaml``; see docs/adapters.md.
"""

from __future__ import annotations

import json
from typing import Any

from openai import AsyncOpenAI

from agentrl.agents.base import EpisodeTruncated, Task
from agentrl.agents.scoring import Score
from agentrl_examples.searchqa import SYSTEM_PROMPT, demonstration, score_answer, search_text
from agents import (
    Agent,
    MaxTurnsExceeded,
    OpenAIChatCompletionsModel,
    Runner,
    RunResult,
    StopAtTools,
    ToolCallItem,
    function_tool,
    set_tracing_disabled,
)

set_tracing_disabled(True)
MAX_TURNS = 3  # the SDK's limit on model calls per run


@function_tool
def search(query: str) -> str:
    """Search the documents about invented people, towns and companies; returns the best passages.

    Args:
        query: What to look for.
    """
    return search_text(query)


@function_tool
def answer(text: str) -> str:
    """Give the final answer to the question, in a few words. Call it once, as your last step.

    Args:
        text: The answer.
    """
    return text


def build_agent(base_url: str, api_key: str) -> Agent[Any]:
    """The agent, on whichever OpenAI-compatible endpoint it is given."""
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    return Agent(name="searcher", instructions=SYSTEM_PROMPT, tools=[search, answer],
                 model=OpenAIChatCompletionsModel(model="agentrl", openai_client=client),
                 tool_use_behavior=StopAtTools(stop_at_tool_names=["answer"]))


def as_input(task: Task) -> list[Any]:
    """The run's input: the worked episode (as Responses items, the SDK's input format), then the question."""
    items: list[Any] = []
    for message in demonstration():
        if message["role"] == "user":
            items.append({"role": "user", "content": message["content"]})
        elif message["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": message["tool_call_id"],
                          "output": message["content"]})
        else:
            for call in message["tool_calls"]:
                items.append({"type": "function_call", "call_id": call["id"], "name": call["function"]["name"],
                              "arguments": call["function"]["arguments"]})
    return [*items, {"role": "user", "content": str(task.data["question"])}]


async def run(task: Task, base_url: str, api_key: str) -> RunResult:
    """One run of the agent; the SDK's turn limit ends the episode as truncated."""
    try:
        return await Runner.run(build_agent(base_url, api_key), as_input(task), max_turns=MAX_TURNS)
    except MaxTurnsExceeded as exc:
        raise EpisodeTruncated(f"the Agents SDK's max_turns={MAX_TURNS} was reached") from exc


def reward(task: Task, result: RunResult) -> Score:
    """F1 of the answer (the ``answer`` tool's argument, else the final text) plus a bonus for searching."""
    calls = [item.raw_item for item in result.new_items if isinstance(item, ToolCallItem)]
    names = [getattr(call, "name", None) for call in calls]
    prediction = None
    for call in calls:
        if getattr(call, "name", None) == "answer":
            text = json.loads(getattr(call, "arguments", "") or "{}").get("text")
            prediction = text if isinstance(text, str) else prediction
    if prediction is None and isinstance(result.final_output, str) and "answer" not in names:
        prediction = result.final_output or None
    return score_answer(task, prediction, "search" in names, agent_llm_calls=len(result.raw_responses))
