"""What both examples share: the SearchQA task source, the two tools' behaviour, the worked example and the reward.

The corpus (shipped with agentrl, `agentrl.envs.searchqa`) is about invented people, towns and companies, so a
model cannot answer from memory: it has to search. Both tools are deterministic, which RTPO's replay branching
needs (a sibling replays the trunk's first k turns and must see the same tool results).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from agentrl.agents.base import Task
from agentrl.agents.scoring import Score
from agentrl.envs.searchqa import f1_score, format_hits, load_questions, normalize_answer, shared_index

SYSTEM_PROMPT = (
    "You answer questions about invented people, towns and companies. You cannot know the answers: call the "
    "search tool first, then call the answer tool with the answer in a few words."
)
SEARCH_DESCRIPTION = "Search the documents about invented people, towns and companies; returns the best passages."
ANSWER_DESCRIPTION = "Give the final answer to the question, in a few words. Call it once, as your last step."
# The worked episode shown before every question; configs keep its question (q197) out of the task splits.
DEMO_QUESTION, DEMO_QUERY, DEMO_ANSWER = "On which river is the town of Burby?", "Burby river", "Daendbenis"
MAX_RESULT_CHARS = 600
# A small bonus for a well-formed search call: a 135 M model that rarely answers right still gets a signal.
SEARCH_BONUS = 0.1


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


def score_answer(task: Task, prediction: str | None, searched: bool, llm_calls: int) -> Score:
    """Token F1 of ``prediction`` against ``task.data["answer"]`` (SQuAD) plus `SEARCH_BONUS` for a search
    call; success is a normalised exact match. ``llm_calls`` (as the agent counted them) goes to ``info``."""
    gold = str(task.data["answer"])
    f1 = f1_score(prediction, gold) if prediction is not None else 0.0
    em = prediction is not None and normalize_answer(prediction) == normalize_answer(gold)
    info = {"answer": None if prediction is None else prediction[:200], "gold": gold, "f1": f1,
            "searched": searched, "agent_llm_calls": llm_calls}
    return Score(f1 + SEARCH_BONUS * searched, success=em, info=info)


class SearchQATasks:
    """The shipped SearchQA questions as tasks (``Task.data`` = the question row: question, answer, hops, id).

    Args:
        hops: Only questions with this many hops (1 or 2); 0 keeps all.
        start: First question (after the hops filter) of this split.
        stop: End of the split (exclusive); None runs to the last question. Tasks cycle within the split.
    """

    def __init__(self, hops: int = 0, start: int = 0, stop: int | None = None) -> None:
        if hops not in (0, 1, 2):
            raise ValueError(f"tasks.hops must be 0 (all), 1 or 2, got {hops}")
        self.rows = load_questions(hops)[start:stop]
        if not self.rows:
            raise ValueError(f"no SearchQA questions with hops={hops} in [{start}, {stop})")

    def task(self, index: int) -> Task:
        """Task ``index`` (cycling); the question's position is its seed."""
        i = index % len(self.rows)
        return Task(id=str(self.rows[i]["id"]), seed=i, data=dict(self.rows[i]))
