"""SearchQA for agents written outside agentrl: the shipped questions as tasks, and the answer's score.

`agentrl.envs.searchqa` is the environment (corpus, search index, the loop's reward); an agent written with
LangChain, the OpenAI Agents SDK or a plain OpenAI client runs its own loop and only needs the tasks and the
scoring rule. Both live here so every such example trains on the same questions with the same reward.
"""

from __future__ import annotations

from typing import Any

from agentrl.agents.base import Task
from agentrl.agents.scoring import Score
from agentrl.envs.searchqa import f1_score, load_questions, normalize_answer

# A small bonus for a well-formed search call: a 135 M model that rarely answers right still gets a signal.
SEARCH_BONUS = 0.1


def score_answer(task: Task, prediction: str | None, searched: bool, **info: Any) -> Score:
    """Token F1 of ``prediction`` against ``task.data["answer"]`` (SQuAD) plus `SEARCH_BONUS` for a search
    call; success is a normalised exact match. Extra keyword arguments go to the score's ``info``."""
    gold = str(task.data["answer"])
    f1 = f1_score(prediction, gold) if prediction is not None else 0.0
    em = prediction is not None and normalize_answer(prediction) == normalize_answer(gold)
    details = {"answer": None if prediction is None else prediction[:200], "gold": gold, "f1": f1,
               "searched": searched, **info}
    return Score(f1 + SEARCH_BONUS * searched, success=em, info=details)


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
