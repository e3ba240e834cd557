"""`LangChainAgent`: an existing LangChain / LangGraph agent as an agentrl `Agent`.

Per episode: a fresh `AgentRLChatModel` bound to the episode's `LLMClient`, the user's ``build(chat_model)`` to
get their agent (a compiled graph from ``langchain.agents.create_agent`` or LangGraph, or any runnable), one
``ainvoke`` of it on the task's input, and the user's ``reward(task, result)`` on the result. Every model call
of the agent is one recorded turn, so the collector, RTPO's replay branching and every schedule work unchanged.
Nothing is global: concurrent episodes each have their own model, client and agent.

How episodes end (the collector turns this into the trajectory):

* the agent returns → ``terminated``, with the reward (a float, or a `Score` for success, per-turn rewards and
  review data);
* LangGraph's ``GraphRecursionError`` (``recursion_limit`` super-steps) or the client's turn limit
  (``data.max_turns``) → ``truncated``, reward 0: the agent ran out of steps, like an environment's step limit;
* anything else raised inside the agent (a tool's exception, a parsing error, ``timeout``) → the episode
  *fails* with a `LangChainAgentError` naming the tool or node and the number of LLM calls made; its turns are
  kept for review and it is left out of the loss. `ReplayMismatchError` passes through unchanged: the agent or its
  tools are not deterministic for a task, which RTPO's replay branching needs.

Blocking code: LangChain runs sync tools and sync graph nodes in worker threads, and a sync ``reward`` runs in
one here (`agentrl.agents.blocking.run_blocking`), so ``timeout`` and the collector's ``episode_timeout`` end an
episode whose tool or reward hangs; the thread cannot be killed and finishes in the background. An ``async``
tool that blocks (``time.sleep`` inside ``async def``) stalls the event loop of every episode: keep blocking calls
in sync tools or wrap them in ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig

from agentrl.agents.base import EpisodeTruncated, Outcome, ReplayMismatchError, Task
from agentrl.agents.llm import LLMClient
from agentrl.agents.scoring import apply_score, score
from agentrl_langchain.chat_model import AgentRLChatModel

log = logging.getLogger(__name__)


class LangChainAgentError(RuntimeError):
    """The wrapped agent raised; the message names the tool or exception and how far the episode got."""


def question_input(task: Task) -> dict[str, Any]:
    """The default input: ``{"messages": [HumanMessage(task.data["question"])]}``."""
    question = task.data.get("question")
    if not isinstance(question, str):
        raise ValueError(f"task {task.id!r} has no string 'question' in its data (keys: {sorted(task.data)}); "
                         "pass input_mapping to LangChainAgent to build the agent's input from a task")
    return {"messages": [HumanMessage(question)]}


class _EpisodeCallbacks(BaseCallbackHandler):
    """Counts tool runs and remembers the last tool error (for review and useful failure messages)."""

    run_inline = True  # plain counters: run in the caller, in order

    def __init__(self) -> None:
        self.tools: Counter[str] = Counter()
        self.tool_errors = 0
        self.last_error: tuple[str, BaseException] | None = None
        self._names: dict[Any, str] = {}

    def on_tool_start(self, serialized: dict[str, Any], input_str: str, *, run_id: Any, **kwargs: Any) -> None:
        name = str((serialized or {}).get("name") or kwargs.get("name") or "tool")
        self._names[run_id] = name
        self.tools[name] += 1

    def on_tool_error(self, error: BaseException, *, run_id: Any, **kwargs: Any) -> None:
        self.tool_errors += 1
        self.last_error = (self._names.get(run_id, "tool"), error)


class LangChainAgent:
    """Wrap a LangChain agent for RL fine-tuning: ``build(chat_model) -> agent`` and ``reward(task, result)``.

    Args:
        build: Builds the agent around the given chat model (called once per episode, so keep it cheap and free
            of shared mutable state); returns a runnable (``create_agent(...)``, a compiled LangGraph graph...).
        reward: ``reward(task, result) -> float | Score`` (may be async; a sync one runs in a worker thread);
            ``result`` is what the agent returned (for a LangGraph agent, the final state: ``result["messages"]``...).
        input_mapping: ``task -> agent input``; default `question_input` (``task.data["question"]`` as the user
            message).
        recursion_limit: LangGraph super-steps per episode (``create_agent`` takes two per tool round); hitting it
            truncates the episode.
        timeout: Seconds before the episode fails (None: only the collector's ``episode_timeout``).
        success_threshold: A float reward at or above this counts as a success.
        log_episodes: Log one INFO line per episode (LLM calls, tool calls, reward).
    """

    def __init__(
        self,
        build: Callable[[BaseChatModel], Any],
        reward: Callable[[Task, Any], Any],
        *,
        input_mapping: Callable[[Task], Any] | None = None,
        recursion_limit: int = 25,
        timeout: float | None = None,
        success_threshold: float = 1.0,
        log_episodes: bool = False,
    ) -> None:
        if recursion_limit < 1:
            raise ValueError(f"agent.recursion_limit must be >= 1, got {recursion_limit}")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"agent.timeout must be > 0 seconds or null, got {timeout}")
        self.build = build
        self.reward = reward
        self.input_mapping = input_mapping or question_input
        self.recursion_limit = recursion_limit
        self.timeout = timeout
        self.success_threshold = success_threshold
        self.log_episodes = log_episodes

    async def run(self, task: Task, llm: LLMClient) -> Outcome:
        """Play one episode: build the agent on a chat model over ``llm``, invoke it, score the result."""
        callbacks = _EpisodeCallbacks()
        try:
            result = await self._invoke(task, llm, callbacks)
        except (ReplayMismatchError, LangChainAgentError):
            raise
        except Exception as exc:
            reason = self._truncation(exc)
            if reason is None:
                raise LangChainAgentError(_describe(exc, callbacks, llm)) from exc
            info = _episode_info(llm, callbacks, None)
            info.update(success=False, truncation=reason)
            return self._finish(task, Outcome(0.0, terminated=False, truncated=True, info=info))
        result_score = await score(self.reward, task, result)
        info = _episode_info(llm, callbacks, result)
        apply_score(llm, result_score, info, self.success_threshold)
        return self._finish(task, Outcome(float(result_score.reward), terminated=True, info=info))

    async def _invoke(self, task: Task, llm: LLMClient, callbacks: _EpisodeCallbacks) -> Any:
        model = AgentRLChatModel(client=llm)
        agent = self.build(model)
        if not hasattr(agent, "ainvoke"):
            raise TypeError(f"build(chat_model) must return a LangChain runnable, got {type(agent).__name__}")
        config = RunnableConfig(recursion_limit=self.recursion_limit, callbacks=[callbacks],
                                configurable={"thread_id": llm.session}, metadata={"agentrl_task": task.id})
        inputs = self.input_mapping(task)
        if self.timeout is None:
            return await agent.ainvoke(inputs, config=config)
        try:
            async with asyncio.timeout(self.timeout) as deadline:
                return await agent.ainvoke(inputs, config=config)
        except TimeoutError as exc:
            if not deadline.expired():
                raise  # a tool's own timeout: reported as that tool's error
            raise LangChainAgentError(f"the agent did not finish within timeout={self.timeout} s "
                                      f"({len(llm.turns)} LLM calls made)") from exc

    def _truncation(self, exc: BaseException) -> str | None:
        """Why the episode was cut off, or None when ``exc`` is a failure."""
        if isinstance(exc, EpisodeTruncated):
            return str(exc)
        try:
            from langgraph.errors import GraphRecursionError
        except ImportError:  # LangGraph is optional; without it there is no graph recursion limit
            return None
        if isinstance(exc, GraphRecursionError):
            return f"recursion_limit={self.recursion_limit} reached"
        return None

    def _finish(self, task: Task, outcome: Outcome) -> Outcome:
        if self.log_episodes:
            info = outcome.info
            log.info("episode %s: %d LLM calls, %d tool calls requested, tools run %s, %d tool errors, reward %.3f%s",
                     task.id, info.get("llm_calls", 0), info.get("tool_calls_requested", 0),
                     dict(info.get("tools", {})), info.get("tool_errors", 0), outcome.reward,
                     " (truncated)" if outcome.truncated else "")
        return outcome


def _describe(exc: BaseException, callbacks: _EpisodeCallbacks, llm: LLMClient) -> str:
    where = f"after {len(llm.turns)} LLM calls and {sum(callbacks.tools.values())} tool calls"
    if callbacks.last_error is not None and callbacks.last_error[1] is exc:
        name, error = callbacks.last_error
        return f"tool {name!r} raised {type(error).__name__}: {error} ({where})"
    return f"the agent raised {type(exc).__name__}: {exc} ({where})"


def _episode_info(llm: LLMClient, callbacks: _EpisodeCallbacks, result: Any) -> dict[str, Any]:
    info: dict[str, Any] = {
        "llm_calls": len(llm.turns),
        "tool_calls_requested": sum(len(turn.tool_calls or []) for turn in llm.turns),
        "tool_calls": sum(callbacks.tools.values()),
        "tools": dict(callbacks.tools),
        "tool_errors": callbacks.tool_errors,
    }
    messages = result.get("messages") if isinstance(result, dict) else None
    if isinstance(messages, list):
        ai = [m for m in messages if isinstance(m, AIMessage)]
        info["invalid_tool_calls"] = sum(len(m.invalid_tool_calls) for m in ai)
        if ai:
            info["final_message"] = str(ai[-1].content)[:500]
    return info
