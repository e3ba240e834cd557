"""What both examples share: the two tools' behaviour and the worked example (the tasks and the reward are
`agentrl.agents.searchqa`'s, shared with the LangChain example).

The corpus (shipped with agentrl, `agentrl.envs.searchqa`) is about invented people, towns and companies, so a
model cannot answer from memory: it has to search. Both tools are deterministic, which RTPO's replay branching
needs (a sibling replays the trunk's first k turns and must see the same tool results).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from agentrl.agents.searchqa import SEARCH_BONUS, SearchQATasks, score_answer
from agentrl.envs.searchqa import format_hits, shared_index

__all__ = ["SEARCH_BONUS", "SearchQATasks", "demonstration", "score_answer", "search_text"]

SYSTEM_PROMPT = (
    "You answer questions about invented people, towns and companies. You cannot know the answers: call the "
    "search tool first, then call the answer tool with the answer in a few words."
)
SEARCH_DESCRIPTION = "Search the documents about invented people, towns and companies; returns the best passages."
ANSWER_DESCRIPTION = "Give the final answer to the question, in a few words. Call it once, as your last step."
# The worked episode shown before every question; configs keep its question (q197) out of the task splits.
DEMO_QUESTION, DEMO_QUERY, DEMO_ANSWER = "On which river is the town of Burby?", "Burby river", "Daendbenis"
MAX_RESULT_CHARS = 600


def search_text(query: str) -> str:
    """The search tool: the three best passages for ``query``."""
    return format_hits(query, shared_index().search(query, k=3), MAX_RESULT_CHARS)


@lru_cache(maxsize=1)
def demonstration() -> tuple[dict[str, Any], ...]:
    """The worked episode as chat-completions messages: question, a search call, its real result, the answer
    call (which ends an episode, so its result is never shown)."""
    call = {"id": "demo_0", "type": "function",
            "function": {"name": "search", "arguments": json.dumps({"query": DEMO_QUERY})}}
    answer = {"id": "demo_1", "type": "function",
              "function": {"name": "answer", "arguments": json.dumps({"text": DEMO_ANSWER})}}
    return (
        {"role": "user", "content": DEMO_QUESTION},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "demo_0", "content": search_text(DEMO_QUERY)},
        {"role": "assistant", "content": None, "tool_calls": [answer]},
    )
