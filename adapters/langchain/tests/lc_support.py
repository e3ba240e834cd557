"""Test support: scripts for the teacher-forcing engine, real tools, and a tiny create_agent agent.

A tiny random model never writes a valid ``<tool_call>`` by itself, so `ScriptedEngine` (`tests.support.scripted`,
shared with the core's tests) makes the tool path real the honest way: it is the real `HFEngine`, except that when
``script(prompt_text, seed)`` returns a text, that text is tokenized and returned as the completion, with the
*model's own* log-probabilities of those tokens. Everything downstream — the client's recording, the Hermes parser,
LangChain's tool calling, the tool itself, the next turn's context, replay and training — is the real code path.
"""

from __future__ import annotations

import random
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.tools import tool
from tests.support.scripted import Script

from agentrl.agents.base import Task
from agentrl.chat.tools import HermesToolParser

CITIES = {"paris": "Paris: 18 degrees, light rain", "oslo": "Oslo: 4 degrees, snow",
          "lima": "Lima: 22 degrees, sunny"}


@tool
def weather(city: str) -> str:
    """Current weather of a city."""
    return CITIES.get(city.lower(), f"no weather data for {city}")


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    return HermesToolParser.render_call(name, arguments)


def weather_script(rounds: int = 1) -> Script:
    """Force a ``weather`` call (city chosen by the sampling seed) while fewer than ``rounds`` results are in the
    prompt; after that the model samples freely."""

    def script(prompt: str, seed: int | None) -> str | None:
        if prompt.count("<tool_response>") >= rounds:
            return None
        city = random.Random(seed).choice(sorted(CITIES))
        return tool_call_text("weather", {"city": city})

    return script


class CountModelCalls(BaseCallbackHandler):
    """Counts chat-model calls as LangChain reports them (independent of agentrl's recording)."""

    run_inline = True

    def __init__(self) -> None:
        self.calls = 0

    def on_chat_model_start(self, serialized: dict[str, Any], messages: Any, **kwargs: Any) -> None:
        self.calls += 1


def letter_reward(task: Task, result: Any) -> float:
    """Fraction of ASCII letters in the final message: a dense signal a random model can move."""
    text = str(result["messages"][-1].content)
    return sum(c.isascii() and c.isalpha() for c in text) / max(len(text), 1)


def tasks(n: int) -> list[Task]:
    return [Task(id=f"q{i}", seed=i, data={"question": f"What is the weather like? ({i})"}) for i in range(n)]


class QuestionTasks:
    """Task source of `tasks`: weather questions, cycled."""

    def task(self, index: int) -> Task:
        return Task(id=f"q{index % 8}", seed=index % 8, data={"question": f"What is the weather like? ({index % 8})"})
