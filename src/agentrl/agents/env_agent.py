"""`EnvAgent`: the built-in agent loop over a text environment.

system prompt → observation → LLM → the reply text is the action → ``env.step`` → next observation, until the
environment ends the episode or the turn limit is reached. Each step's reward is attached to the turn that
caused it (``llm.reward``), so per-step rewards (Sokoban) reach turn-level GAE where they belong.

The context is the whole conversation (the identity ψ of the RTPO paper) unless ``history`` keeps only the last
few exchanges. Environments with ``snapshot()/restore()`` let RTPO siblings start at boundary k directly instead of
replaying the trunk's first k steps.

The environment's calls (``reset``, ``step``, ``snapshot``, ``restore``) are synchronous code: they run in a worker
thread (`agentrl.agents.blocking.run_blocking`), so an environment that blocks stalls only its own episode and
``data.episode_timeout`` still ends it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from agentrl.agents.base import Outcome, Task
from agentrl.agents.blocking import run_blocking
from agentrl.agents.llm import LLMClient
from agentrl.chat.render import Message
from agentrl.envs.base import SnapshotEnv, TextEnv


@dataclass(frozen=True)
class EnvAgentState:
    """`EnvAgent`'s state at a turn boundary (an RTPO snapshot): the environment's snapshot, the first observation
    and the (reply, observation) exchanges so far."""

    env_state: Any
    first: Message
    exchanges: list[Message]


class EnvAgent:
    """Drive a `TextEnv` with an LLM.

    Args:
        env: A prototype environment; each episode plays on a deep copy, so episodes run concurrently.
        max_turns: Most LLM calls per episode (defaults to the environment's ``max_turns``).
        history: Keep only the last ``history`` (reply, observation) exchanges in the prompt; None keeps all.
        use_snapshots: Let RTPO branching restore environment snapshots when the environment supports them.
    """

    def __init__(self, env: TextEnv, *, max_turns: int | None = None, history: int | None = None,
                 use_snapshots: bool = True) -> None:
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"agent.max_turns must be >= 1, got {max_turns}")
        if history is not None and history < 0:
            raise ValueError(f"agent.history must be >= 0, got {history}")
        self.env = env
        self.max_turns = max_turns or env.max_turns
        self.history = history
        self.use_snapshots = use_snapshots

    @property
    def system_prompt(self) -> str:
        return self.env.system_prompt

    def _context(self, system: Message, first: Message, exchanges: list[Message]) -> list[Message]:
        if self.history is None:
            return [system, first, *exchanges]
        keep = exchanges[len(exchanges) - 2 * self.history:] if self.history else []
        return [system, first, *keep]

    async def run(self, task: Task, llm: LLMClient) -> Outcome:
        env = copy.deepcopy(self.env)
        snapshots = self.use_snapshots and isinstance(env, SnapshotEnv)
        system: Message = {"role": "system", "content": env.system_prompt}
        exchanges: list[Message] = []
        if snapshots and llm.replay is not None and llm.replay.snapshot is not None:
            state: EnvAgentState = llm.fast_forward()
            await run_blocking(env.restore, state.env_state)  # type: ignore[attr-defined]
            first, exchanges = state.first, list(state.exchanges)
        else:
            first = {"role": "user", "content": await run_blocking(env.reset, task.seed)}
        info: dict[str, Any] = {"format_errors": 0}
        for _ in range(len(llm.turns), self.max_turns):
            if snapshots:
                env_state = await run_blocking(env.snapshot)  # type: ignore[attr-defined]
                llm.record_snapshot(EnvAgentState(env_state, first, list(exchanges)))
            reply = await llm.chat(self._context(system, first, exchanges))
            result = await run_blocking(env.step, reply.text)
            llm.reward(result.reward, source=f"{type(env).__name__}.step")
            info["format_errors"] += int(bool(result.info.get("format_error")))
            if result.terminated or result.truncated:
                info.update({k: v for k, v in result.info.items() if k != "format_error"})
                info["success"] = bool(result.info.get("success", False))
                return Outcome(0.0, terminated=result.terminated, truncated=result.truncated, info=info)
            exchanges += [reply.message(), {"role": "user", "content": result.observation}]
        info["success"] = False
        return Outcome(0.0, terminated=False, truncated=True, info=info)
