"""A LangChain search agent over the shipped SearchQA corpus, fine-tuned with RTPO by agentrl.

This is the whole user code of ``configs/langchain_search_rtpo.yaml``: two ``@tool`` functions (``search`` over
the BM25 index of ``agentrl.envs.SearchIndex``, and ``answer``, which ends the run), an agent built with
``langchain.agents.create_agent``, and a reward (token F1 of the answer against the gold one, success = exact
match; the scoring rule and the task source, the shipped questions, are `agentrl.agents.searchqa`'s). The agent
knows nothing about RL: ``build(model)`` receives the chat model agentrl gives it, exactly as it would receive
``ChatOpenAI(...)`` in production.

The corpus is about invented people, towns and companies, so the model cannot answer from memory: it has to
search. Both tools are deterministic, which RTPO's replay branching needs (a sibling replays the trunk's first
k turns and must see the same tool results).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolCall, ToolMessage
from langchain_core.tools import tool

from agentrl.agents.base import Task
from agentrl.agents.searchqa import SEARCH_BONUS, SearchQATasks, score_answer
from agentrl.envs.searchqa import format_hits, shared_index
from agentrl_langchain import Score

__all__ = ["SEARCH_BONUS", "SearchQATasks", "build", "reward"]

SYSTEM_PROMPT = (
    "You answer questions about invented people, towns and companies. You cannot know the answers: call the "
    "search tool first, then call the answer tool with the answer in a few words."
)
# The worked episode shown before every question; configs keep its question (q197) out of the task splits.
DEMO_QUESTION, DEMO_QUERY, DEMO_ANSWER = "On which river is the town of Burby?", "Burby river", "Daendbenis"
MAX_RESULT_CHARS = 600


@tool
def search(query: str) -> str:
    """Search the documents about invented people, towns and companies; returns the three best passages."""
    return format_hits(query, shared_index().search(query, k=3), MAX_RESULT_CHARS)


@tool(return_direct=True)
def answer(text: str) -> str:
    """Give the final answer to the question, in a few words. Call it once, as your last step."""
    return text


@lru_cache(maxsize=1)
def demonstration() -> tuple[BaseMessage, ...]:
    """The worked episode: question, a search call, its real result, and the answer call (which ends an episode:
    ``answer`` returns directly, so its result is never shown to the model)."""
    result = search.invoke({"query": DEMO_QUERY})
    return (
        HumanMessage(DEMO_QUESTION),
        AIMessage("", tool_calls=[ToolCall(name="search", args={"query": DEMO_QUERY}, id="demo_0")]),
        ToolMessage(result, tool_call_id="demo_0", name="search"),
        AIMessage("", tool_calls=[ToolCall(name="answer", args={"text": DEMO_ANSWER}, id="demo_1")]),
    )


def with_demonstration(task: Task) -> dict[str, Any]:
    """The agent's input: the worked episode, then the task's question (``LangChainAgent(input_mapping=...)``)."""
    return {"messages": [*demonstration(), HumanMessage(str(task.data["question"]))]}


def build(model: BaseChatModel) -> Any:
    """The agent, around whichever chat model it is given (agentrl's during training, any other in production)."""
    return create_agent(model, tools=[search, answer], system_prompt=SYSTEM_PROMPT)


def model_replies(result: dict[str, Any]) -> list[AIMessage]:
    """The model's replies: the AI messages after the last human message (the demonstration is not the model's)."""
    messages = result.get("messages", [])
    start = max((i for i, m in enumerate(messages) if isinstance(m, HumanMessage)), default=-1) + 1
    return [m for m in messages[start:] if isinstance(m, AIMessage)]


def final_answer(replies: list[AIMessage]) -> str | None:
    """The argument of the last ``answer`` call, else the text of the last reply, else None."""
    for message in reversed(replies):
        for call in message.tool_calls:
            if call["name"] == "answer" and isinstance(call["args"].get("text"), str):
                return str(call["args"]["text"])
    last = replies[-1] if replies else None
    if last is not None and not last.tool_calls and isinstance(last.content, str) and last.content.strip():
        return last.content
    return None


def reward(task: Task, result: dict[str, Any]) -> Score:
    """The shared SearchQA score (`agentrl.agents.searchqa.score_answer`): token F1 of the final answer plus a
    bonus for a well-formed search call; success is a normalised exact match."""
    replies = model_replies(result)
    searched = any(call["name"] == "search" and isinstance(call["args"].get("query"), str)
                   for message in replies for call in message.tool_calls)
    return score_answer(task, final_answer(replies), searched)
