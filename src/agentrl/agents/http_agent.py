"""`HTTPAgent`: any agent that talks to an OpenAI-compatible endpoint, trained through an episode-scoped URL.

Most agents people run speak only the OpenAI chat-completions API: the OpenAI Agents SDK, CrewAI, LlamaIndex,
smolagents, a plain ``openai`` client loop, a program in another language. The user gives two functions:

* ``run(task, base_url, api_key) -> result`` (sync or async): play the task with an OpenAI client pointed at
  ``base_url``; a sync ``run`` executes in a worker thread, so it never blocks the rollout loop and the episode
  timeout still holds;
* ``reward(task, result) -> float | Score`` (sync or async), as for ``agentrl_langchain.LangChainAgent``.

Per episode the agent asks its `EpisodeRoutes` (the training gateway, `agentrl.serve.gateway.TrainingGateway`,
which ``RolloutDataModule`` attaches) for a route bound to the episode's `LLMClient`: every chat completion
sent to ``route.base_url`` is one recorded turn, so turn-level credit and RTPO's replay branching apply to agents
that know nothing of agentrl. The route is closed when ``run`` ends: later requests (a timed-out thread still
running) get 404.

How episodes end: ``run`` returns → ``terminated`` with the reward; the client's turn limit or a full context
window (whatever ``run`` did with the resulting 400) → ``truncated``, reward 0; a replayed prompt that differs from
the trunk's → `ReplayMismatchError` (the sibling fails, as for every agent); any other exception in ``run`` or
``timeout`` → the episode fails with an `HTTPAgentError` naming the exception and the LLM calls made.

The protocol `EpisodeRoutes` lives here, in the agents layer, and is implemented by the serve layer, so this
module never imports a web server.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from agentrl.agents.base import EpisodeTruncated, Outcome, ReplayMismatchError, Task
from agentrl.agents.llm import LLMClient
from agentrl.agents.scoring import apply_score, score

log = logging.getLogger(__name__)


@dataclass
class EpisodeRoute:
    """Where one episode's agent sends its requests.

    Attributes:
        episode_id: The episode's id in the gateway (part of the URL).
        base_url: OpenAI ``base_url`` of the episode, e.g. ``http://127.0.0.1:PORT/episodes/<id>/v1``.
        api_key: Bearer token the gateway expects.
        stopped: Set by the gateway when the episode's LLM client stopped it (`EpisodeTruncated`,
            `ReplayMismatchError`); the agent reports it whatever ``run`` did with the error response.
    """

    episode_id: str
    base_url: str
    api_key: str
    stopped: BaseException | None = None


@runtime_checkable
class EpisodeRoutes(Protocol):
    """Hands out episode-scoped OpenAI endpoints over episodes' LLM clients (implemented by the serve layer)."""

    async def open(self, llm: LLMClient) -> EpisodeRoute:
        """Register ``llm`` and return its route (starting the server on first use)."""
        ...

    async def close(self, route: EpisodeRoute) -> None:
        """Finish the episode: later requests get 404 and requests still in flight are cancelled."""
        ...


class HTTPAgentError(RuntimeError):
    """The user's ``run`` raised or ran out of time; the message says what and after how many LLM calls."""


def _is_async(fn: Callable[..., Any]) -> bool:
    target = fn.func if isinstance(fn, functools.partial) else fn
    return inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(getattr(target, "__call__", None))  # noqa: B004


class HTTPAgent:
    """Train an agent that only speaks the OpenAI API: ``run(task, base_url, api_key)`` and ``reward``.

    Args:
        run: Plays one task against ``base_url`` with ``api_key``; returns whatever ``reward`` needs. Sync
            functions run in a worker thread, async ones on the rollout loop (never block in them).
        reward: ``reward(task, result) -> float | Score`` (may be async).
        timeout: Seconds before the episode fails (None: only the collector's ``episode_timeout``).
        success_threshold: A float reward at or above this counts as a success.
        api_key: Bearer token the training gateway requires (None: a random one per run).
        threads: Worker threads for sync ``run`` functions (episodes beyond this wait for a thread).
        log_episodes: Log one INFO line per episode (LLM calls, tool calls requested, reward).
    """

    def __init__(
        self,
        run: Callable[[Task, str, str], Any],
        reward: Callable[[Task, Any], Any],
        *,
        timeout: float | None = None,
        success_threshold: float = 1.0,
        api_key: str | None = None,
        threads: int = 32,
        log_episodes: bool = False,
    ) -> None:
        if not callable(run) or not callable(reward):
            raise TypeError("agent.run and agent.reward must be callables (dotted paths in YAML)")
        if timeout is not None and timeout <= 0:
            raise ValueError(f"agent.timeout must be > 0 seconds or null, got {timeout}")
        if threads < 1:
            raise ValueError(f"agent.threads must be >= 1, got {threads}")
        if api_key is not None and not api_key.strip():
            raise ValueError("agent.api_key must be a non-empty string or null")
        self.run_fn = run
        self.reward = reward
        self.timeout = timeout
        self.success_threshold = success_threshold
        self.api_key = api_key
        self.threads = threads
        self.log_episodes = log_episodes
        self.routes: EpisodeRoutes | None = None
        self._executor: ThreadPoolExecutor | None = None

    def attach(self, routes: EpisodeRoutes) -> None:
        """Use ``routes`` (the training gateway) for every episode."""
        self.routes = routes

    async def run(self, task: Task, llm: LLMClient) -> Outcome:
        """Play one episode through an episode-scoped route, then score the result."""
        if self.routes is None:
            raise RuntimeError("HTTPAgent has no gateway: RolloutDataModule attaches one for `agentrl fit`; "
                               "elsewhere call agent.attach(agentrl.serve.gateway.TrainingGateway())")
        route = await self.routes.open(llm)
        try:
            result, error = await self._play(task, route), None
        except Exception as exc:
            result, error = None, exc
        finally:
            await self.routes.close(route)
        info = _episode_info(llm)
        if isinstance(route.stopped, ReplayMismatchError):
            raise route.stopped
        if isinstance(route.stopped, EpisodeTruncated):
            info.update(success=False, truncation=str(route.stopped))
            return self._finish(task, Outcome(0.0, terminated=False, truncated=True, info=info))
        if isinstance(error, EpisodeTruncated | ReplayMismatchError):
            raise error
        if error is not None:
            if isinstance(error, HTTPAgentError):
                raise error
            raise HTTPAgentError(f"the agent raised {type(error).__name__}: {error} "
                                 f"(after {len(llm.turns)} LLM calls)") from error
        result_score = await score(self.reward, task, result)
        apply_score(llm, result_score, info, self.success_threshold)
        return self._finish(task, Outcome(float(result_score.reward), terminated=True, info=info))

    async def _play(self, task: Task, route: EpisodeRoute) -> Any:
        if self.timeout is None:
            return await self._call(task, route)
        try:
            async with asyncio.timeout(self.timeout) as deadline:
                return await self._call(task, route)
        except TimeoutError as exc:
            if not deadline.expired():
                raise  # the agent's own timeout (an HTTP read timeout...): its error, not ours
            raise HTTPAgentError(f"the agent did not finish within timeout={self.timeout} s") from exc

    async def _call(self, task: Task, route: EpisodeRoute) -> Any:
        if _is_async(self.run_fn):
            return await self.run_fn(task, route.base_url, route.api_key)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="agentrl-http-agent")
        loop = asyncio.get_running_loop()
        # a cancelled episode (timeout) stops waiting here; the thread runs on until its next request gets 404
        return await loop.run_in_executor(self._executor, self.run_fn, task, route.base_url, route.api_key)

    def _finish(self, task: Task, outcome: Outcome) -> Outcome:
        if self.log_episodes:
            info = outcome.info
            log.info("episode %s: %d LLM calls, %d tool calls requested, reward %.3f%s", task.id,
                     info.get("llm_calls", 0), info.get("tool_calls_requested", 0), outcome.reward,
                     " (truncated)" if outcome.truncated else "")
        return outcome


def _episode_info(llm: LLMClient) -> dict[str, Any]:
    return {
        "llm_calls": len(llm.turns),
        "tool_calls_requested": sum(len(turn.tool_calls or []) for turn in llm.turns),
    }
