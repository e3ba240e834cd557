"""`LLMClient`: the model as an agent sees it, recording every call as a token-exact `Turn`.

Rendering. Messages are rendered with the model's chat template. When the conversation continues the previous
call (same earlier messages, our reply, then new messages), the new prompt is built as *previous prompt ids +
previous response ids + the tokens of the newly rendered tail*: the ids the model sampled are reused verbatim
instead of being decoded and re-tokenized (which can give different ids — the classic source of
rollout/training mismatch in multi-turn RL). So turn k+1's prompt starts with turn k's prompt and response,
which also lets the engine reuse their KV. When the template rewrites history (the tail check fails), the client
falls back to rendering the whole conversation and counts it in ``prefix_breaks``.

Tools. With ``tools``, a chat template that renders them gets them; for one that ignores them (SmolLM2's GGUF
template does) the client puts the Hermes tool block into the system message itself.

Replay (RTPO branching). With a `Replay`, calls before the branch turn k do not sample: the client checks that
the agent produced exactly the recorded prompt ids and returns the recorded response (a *forced* turn). Call k
checks the prompt against the trunk's c_k and samples fresh; later calls sample as usual (on-policy
continuation). A different prompt raises `ReplayMismatchError`: the agent or environment is not deterministic.
"""

from __future__ import annotations

import asyncio
import copy
import time
from dataclasses import dataclass, field
from typing import Any

from agentrl.agents.errors import EpisodeTruncated, ReplayMismatchError, check_reward
from agentrl.chat.render import Message, render_prompt, text_chars
from agentrl.chat.tools import HermesToolParser, ToolCall, ToolParser
from agentrl.engines.base import RolloutEngine, SamplingParams
from agentrl.seeding import derive_seed
from agentrl.types import Turn

_RENDER_INLINE_CHARS = 32_768
"""Conversations longer than this render and tokenize in a worker thread, so that one long request (the training
gateway takes them from any agent) cannot hold the rollout loop; shorter ones render inline, as cheap as a hop."""


@dataclass
class Replay:
    """Where a sibling branches from its trunk.

    Attributes:
        turns: The trunk's turns; turns ``< branch_turn`` are replayed, turn ``branch_turn``'s prompt is checked.
        branch_turn: k, the first turn sampled fresh.
        snapshot: What the client recorded at boundary k (`LLMClient.record_snapshot`, fast path), or None.
    """

    turns: list[Turn]
    branch_turn: int
    snapshot: BoundarySnapshot | None = None


@dataclass(frozen=True)
class BoundarySnapshot:
    """What `LLMClient.record_snapshot` keeps at a turn boundary for fast RTPO branching.

    Attributes:
        messages: The conversation the client had rendered before this boundary (its rendering state).
        agent_state: The agent's own state (e.g. `EnvAgent`'s environment snapshot and visible messages).
    """

    messages: list[Message]
    agent_state: Any


@dataclass
class AssistantReply:
    """What a chat call returns.

    Attributes:
        text: The decoded response, without the stop token (send it back as the assistant message content).
        content: ``text`` with tool-call blocks removed.
        tool_calls: Parsed tool calls.
        tool_call_errors: Why some tool-call blocks did not parse.
        finish_reason: The engine's finish reason.
        turn: The recorded turn.
    """

    text: str
    content: str
    tool_calls: list[ToolCall]
    tool_call_errors: list[str]
    finish_reason: str
    turn: Turn

    def message(self) -> Message:
        """The assistant message to append to the conversation."""
        return {"role": "assistant", "content": self.text}


@dataclass
class _Previous:
    messages: list[Message]
    prompt_ids: list[int]
    response_ids: list[int]
    text: str  # rendered prompt text + decoded response


@dataclass
class LLMClient:
    """One episode's view of the model.

    Attributes:
        engine: The rollout engine.
        tokenizer: The model's tokenizer (chat template).
        sampling: Sampling parameters (the seed is derived per turn from ``seed``).
        session: Episode id (engine cache reuse, server pinning).
        seed: Episode sampling seed.
        tool_parser: Tool-call format.
        replay: Trunk to replay (RTPO siblings), or None.
        max_turns: Hard cap on calls; the next call raises `EpisodeTruncated`.
    """

    engine: RolloutEngine
    tokenizer: Any
    sampling: SamplingParams = field(default_factory=SamplingParams)
    session: str = "episode"
    seed: int = 0
    tool_parser: ToolParser = field(default_factory=HermesToolParser)
    replay: Replay | None = None
    max_turns: int | None = None
    turns: list[Turn] = field(default_factory=list)
    snapshots: dict[int, BoundarySnapshot] = field(default_factory=dict)
    prefix_breaks: int = 0
    engine_wait_s: float = 0.0
    _engine_since: float | None = None
    _prev: _Previous | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    # ------------------------------------------------------------------ public API

    async def chat(self, messages: list[Message], *, tools: list[dict[str, Any]] | None = None) -> AssistantReply:
        """Render ``messages`` (and ``tools``), generate, record the turn, and parse the reply. Concurrent calls
        of one episode run one at a time, each its own turn (index, seed and prefix are read before generating)."""
        async with self._lock:
            return await self._chat(messages, tools)

    async def _chat(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> AssistantReply:
        k = len(self.turns)
        if self.max_turns is not None and k >= self.max_turns:
            raise EpisodeTruncated(f"turn limit of {self.max_turns} LLM calls reached")
        if text_chars(messages) + text_chars(tools) > _RENDER_INLINE_CHARS:  # a long one: off the event loop
            prompt_ids, prompt_text, delta = await asyncio.to_thread(self._prompt, messages, tools)
        else:
            prompt_ids, prompt_text, delta = self._prompt(messages, tools)
        if self.replay is not None and k <= self.replay.branch_turn:
            recorded = self.replay.turns[k]
            if prompt_ids != recorded.prompt_ids:
                raise ReplayMismatchError(
                    f"replaying turn {k}: the agent rendered {len(prompt_ids)} prompt tokens that differ from the "
                    f"trunk's {len(recorded.prompt_ids)}; the agent or environment is not deterministic for a seed"
                )
            if k < self.replay.branch_turn:
                now = time.time_ns()  # replayed, not generated: a turn of no duration
                turn = Turn(list(recorded.prompt_ids), list(recorded.response_ids), list(recorded.logprobs), index=k,
                            finish_reason=recorded.finish_reason, policy_version=recorded.policy_version,
                            forced=True, messages=delta, tools=tools, started_ns=now, ended_ns=now)
                return self._record(turn, messages, prompt_text)
        started = time.time_ns()
        self._engine_since = time.monotonic()
        try:
            completion = await self.engine.generate(
                prompt_ids, self.sampling.with_seed(derive_seed(self.seed, k)), session=self.session
            )
        finally:
            self.engine_wait_s += time.monotonic() - self._engine_since
            self._engine_since = None
        if not completion.token_ids:
            raise EpisodeTruncated(f"turn {k}: the prompt ({len(prompt_ids)} tokens) fills the context window")
        turn = Turn(prompt_ids, completion.token_ids, completion.logprobs, index=k,
                    finish_reason=completion.finish_reason, policy_version=completion.policy_version, messages=delta,
                    tools=tools, started_ns=started, ended_ns=time.time_ns())
        return self._record(turn, messages, prompt_text)

    def engine_seconds(self) -> float:
        """Seconds this episode has waited on the engine so far (queued behind other episodes or generating),
        the call in flight included; the collector's ``episode_timeout`` leaves them out."""
        since = self._engine_since
        return self.engine_wait_s + (time.monotonic() - since if since is not None else 0.0)

    def reward(self, value: float, turn: int = -1, *, source: str = "llm.reward") -> None:
        """Add a reward to a recorded turn (the last by default). A reward that is not a finite number raises
        `RewardError` naming ``source``: the episode fails, not the run."""
        if not self.turns:
            raise RuntimeError("llm.reward called before any LLM call: there is no turn to reward")
        self.turns[turn].reward += check_reward(value, source)

    def record_snapshot(self, state: Any) -> None:
        """Store agent state at the current boundary (before the next call) for fast RTPO branching; the
        client keeps its own rendering state beside it."""
        previous = self._prev.messages if self._prev is not None else []
        self.snapshots[len(self.turns)] = BoundarySnapshot(list(previous), state)

    def fast_forward(self) -> Any:
        """Adopt the trunk's turns before the branch turn without replaying them; returns the agent's snapshot.

        Only for agents that restore their own state (environment and messages) from the returned snapshot.
        """
        if self.replay is None or self.replay.snapshot is None:
            raise RuntimeError("fast_forward needs a Replay with a snapshot")
        if self.turns:
            raise RuntimeError("fast_forward must be called before the first LLM call")
        k = self.replay.branch_turn
        now = time.time_ns()  # adopted, not generated in this episode: turns of no duration
        for t in self.replay.turns[:k]:
            self.turns.append(Turn(list(t.prompt_ids), list(t.response_ids), list(t.logprobs), index=t.index,
                                   reward=t.reward, finish_reason=t.finish_reason, policy_version=t.policy_version,
                                   forced=True, messages=t.messages, text=t.text, tool_calls=t.tool_calls,
                                   tools=t.tools, started_ns=now, ended_ns=now))
        # a copy: every sibling of the trunk gets the same snapshot and may mutate what it restores
        snapshot = copy.deepcopy(self.replay.snapshot)
        if k > 0:
            last = self.turns[-1]
            self._prev = _Previous(snapshot.messages, last.prompt_ids, last.response_ids,
                                   self.tokenizer.decode(last.prompt_ids + last.response_ids))
        return snapshot.agent_state

    # ------------------------------------------------------------------ rendering

    def _render(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        return render_prompt(self.tokenizer, messages, tools, self.tool_parser)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _prompt(
        self, messages: list[Message], tools: list[dict[str, Any]] | None
    ) -> tuple[list[int], str, list[Message]]:
        """Prompt ids, their text, and the messages new since the previous call."""
        prev = self._prev
        if prev is not None and _continues(prev.messages, messages):
            # re-render with *our* record of the reply, whatever shape the agent passed it back in
            ours = [*prev.messages, {"role": "assistant", "content": self._reply_text(prev.response_ids)}]
            conv = ours + list(messages[len(ours):])
            text = self._render(conv, tools)
            delta = list(messages[len(ours):])
            if text.startswith(prev.text):
                ids = prev.prompt_ids + prev.response_ids + self._encode(text[len(prev.text):])
                return ids, text, delta
            self.prefix_breaks += 1
            return self._encode(text), text, delta
        text = self._render(messages, tools)
        return self._encode(text), text, list(messages)

    def _reply_text(self, response_ids: list[int]) -> str:
        ids = response_ids
        if ids and ids[-1] in set(self._stop_ids()):
            ids = ids[:-1]
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def _stop_ids(self) -> tuple[int, ...]:
        if self.sampling.stop_token_ids is not None:
            return self.sampling.stop_token_ids
        from agentrl.models.loading import stop_token_ids

        return tuple(stop_token_ids(self.tokenizer))

    def _record(self, turn: Turn, messages: list[Message], prompt_text: str) -> AssistantReply:
        text = self._reply_text(turn.response_ids)
        parsed = self.tool_parser.parse(text)
        turn.text = text
        turn.tool_calls = [{"name": c.name, "arguments": c.arguments} for c in parsed.tool_calls] or None
        self.turns.append(turn)
        full = prompt_text + str(self.tokenizer.decode(turn.response_ids, skip_special_tokens=False))
        self._prev = _Previous(list(messages), turn.prompt_ids, turn.response_ids, full)
        return AssistantReply(text, parsed.content, parsed.tool_calls, parsed.errors, turn.finish_reason, turn)


def _continues(previous: list[Message], messages: list[Message]) -> bool:
    """``messages`` = the previous call's messages, then an assistant message (our reply), then more."""
    n = len(previous)
    if len(messages) <= n + 1 or messages[n].get("role") != "assistant":
        return False
    return all(a.get("role") == b.get("role") and a.get("content") == b.get("content")
               for a, b in zip(previous, messages[:n], strict=True))
