"""A plain ``openai`` client loop with two tools: the smallest agent `HTTPAgent` trains (sync, in a worker thread).

Nothing here knows about agentrl except the signature: ``run(task, base_url, api_key)`` gets an OpenAI endpoint
(during training, the episode's route on the training gateway; in production, any OpenAI-compatible server).
"""

from __future__ import annotations

import json
from typing import Any

from openai import OpenAI

from agentrl.agents.base import Task
from agentrl.agents.scoring import Score
from agentrl_examples.searchqa import (
    ANSWER_DESCRIPTION,
    SEARCH_DESCRIPTION,
    SYSTEM_PROMPT,
    demonstration,
    score_answer,
    search_text,
)

TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "search", "description": SEARCH_DESCRIPTION, "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
    {"type": "function", "function": {"name": "answer", "description": ANSWER_DESCRIPTION, "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}},
]
MAX_CALLS = 4


def run(task: Task, base_url: str, api_key: str) -> dict[str, Any]:
    """Search until the model answers (or `MAX_CALLS` model calls); returns the answer and what happened."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages: list[Any] = [{"role": "system", "content": SYSTEM_PROMPT}, *demonstration(),
                           {"role": "user", "content": task.data["question"]}]
    searched, calls = False, 0
    while calls < MAX_CALLS:
        reply = client.chat.completions.create(model="agentrl", messages=messages, tools=TOOLS).choices[0].message
        calls += 1
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            return {"answer": reply.content, "searched": searched, "llm_calls": calls}
        for call in reply.tool_calls:
            name = call.function.name if call.type == "function" else "?"
            args = json.loads(call.function.arguments or "{}") if call.type == "function" else {}
            if name == "answer":
                return {"answer": str(args.get("text", "")), "searched": searched, "llm_calls": calls}
            searched = searched or name == "search"
            result = search_text(str(args.get("query"))) if name == "search" else f"unknown tool {name!r}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return {"answer": None, "searched": searched, "llm_calls": calls}


def reward(task: Task, result: dict[str, Any]) -> Score:
    """F1 of the answer plus a bonus for searching (see `agentrl_examples.searchqa.score_answer`)."""
    return score_answer(task, result["answer"], result["searched"], agent_llm_calls=result["llm_calls"])
