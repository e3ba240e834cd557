"""`AgentRLChatModel`: a LangChain chat model whose every call is one recorded, token-exact RL turn.

The model is a thin `BaseChatModel` over one episode's `agentrl.agents.llm.LLMClient`: messages are converted to
chat dicts (`agentrl_langchain.messages`), the client renders them with the policy's chat template, reuses the
previous prompt and response token ids when the conversation continues, samples from the rollout engine (or
replays the trunk's response during RTPO branching), records a `Turn` with the engine's log-probs, and parses
Hermes tool calls; the reply comes back as an `AIMessage` with ``tool_calls``, ``invalid_tool_calls``,
``usage_metadata`` and ``response_metadata`` (finish reason, policy version, turn index).

Threads. The client lives on the rollout event loop. ``ainvoke`` runs there directly. ``invoke`` (LangChain and
LangGraph run sync nodes and sync tools in worker threads) hands the call to that loop with
`asyncio.run_coroutine_threadsafe` and waits; ``invoke`` from the loop's own thread would deadlock, so it raises
with a message saying to ``await ainvoke`` instead. Calls of one episode are serialised with a lock, so two
concurrent calls never interleave their turns (with worker threads the order they take the lock in is the
threads' order, which a replay may not reproduce: keep RTPO agents' model calls on one path).

Not supported, each with a clear error: ``stop`` sequences and per-call sampling arguments (``temperature`` ...):
sampling belongs to the trainer (``data.sampling``), and cutting text after generation would break token-exactness.
``tool_choice`` other than ``"none"`` is not enforced (the engine samples freely); ``with_structured_output``
therefore works through tool calling and yields None when the model does not call the schema tool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.caches import BaseCache
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput, ModelProfile
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field, field_validator

from agentrl.agents.llm import LLMClient
from agentrl.chat.render import template_renders_tools
from agentrl_langchain.messages import to_ai_message, to_chat

# Keyword arguments LangChain itself passes to a chat model; anything else is a per-call setting we refuse.
_KNOWN_KWARGS = frozenset({"tools", "tool_choice", "parallel_tool_calls", "strict", "ls_structured_output_format"})


class AgentRLChatModel(BaseChatModel):
    """A chat model bound to one episode's `LLMClient` (`agentrl_langchain.LangChainAgent` makes one per episode).

    Attributes:
        client: The episode's LLM client: every call becomes one of its recorded turns.
        loop: The event loop the client runs on (captured at construction when one is running).
        model_name: Name reported in ``response_metadata``.
    """

    client: Any = Field(exclude=True, repr=False)  # an LLMClient (a dataclass pydantic must not rebuild)
    loop: asyncio.AbstractEventLoop | None = Field(default=None, exclude=True, repr=False)
    model_name: str = "agentrl"
    cache: BaseCache | bool | None = False  # a cache hit would skip the client: no turn, no tokens, no log-probs

    @field_validator("client")
    @classmethod
    def _check_client(cls, value: Any) -> LLMClient:
        if not isinstance(value, LLMClient):
            raise TypeError(f"client must be an agentrl LLMClient, got {type(value).__name__}")
        return value

    @field_validator("cache")
    @classmethod
    def _no_cache(cls, value: Any) -> bool:
        if value is not False:
            raise ValueError("AgentRLChatModel cannot use an LLM cache: a cache hit records no turn")
        return False

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        if self.loop is None:
            try:
                self.loop = asyncio.get_running_loop()
            except RuntimeError:
                self.loop = None

    @property
    def _llm_type(self) -> str:
        return "agentrl"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name, "session": self.client.session}

    def _resolve_model_profile(self) -> ModelProfile | None:
        context = getattr(self.client.engine, "max_context", None)
        profile = ModelProfile(tool_calling=True, structured_output=False, text_inputs=True, text_outputs=True)
        if isinstance(context, int):
            profile["max_input_tokens"] = context
        return profile

    # ------------------------------------------------------------------ tools

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools (converted with `convert_to_openai_tool`); the client renders them with the chat template
        or, when the template ignores tools, as a Hermes block in the system prompt.

        Args:
            tools: LangChain tools, functions, pydantic models or OpenAI tool dicts.
            tool_choice: ``"none"`` hides the tools; other values are accepted but not enforced.
            **kwargs: Further bound arguments (LangChain's own, e.g. ``ls_structured_output_format``).
        """
        formatted = [convert_to_openai_tool(tool) for tool in tools]
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=formatted, **kwargs)

    # ------------------------------------------------------------------ generation

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return await self._chat(messages, stop, kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        loop = self.loop
        if loop is None or loop.is_closed():
            raise RuntimeError("AgentRLChatModel has no running episode loop: create it inside the episode "
                               "(LangChainAgent does) and call it while the episode runs")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError(
                "AgentRLChatModel.invoke was called synchronously on the rollout event loop, which would block "
                "it forever: use `await model.ainvoke(...)` in async code (an async node or tool), or make the "
                "node a plain function (LangGraph runs sync nodes in a worker thread)"
            )
        future = asyncio.run_coroutine_threadsafe(self._chat(messages, stop, kwargs), loop)
        return future.result()

    async def _chat(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> ChatResult:
        if stop:
            raise ValueError(f"AgentRLChatModel does not support stop sequences ({stop!r}): the response must stay "
                             "the exact tokens the engine sampled; end turns with stop tokens (data.sampling)")
        unknown = sorted(set(kwargs) - _KNOWN_KWARGS)
        if unknown:
            raise ValueError(f"AgentRLChatModel does not take per-call arguments {unknown}: sampling is set by the "
                             "trainer (data.sampling), identically for every call of an episode")
        tools = kwargs.get("tools") or None
        if kwargs.get("tool_choice") == "none":
            tools = None
        chat = to_chat(messages, native_tools=template_renders_tools(self.client.tokenizer))
        reply = await self.client.chat(chat, tools=tools)  # the client serialises concurrent calls
        message = to_ai_message(reply, model_name=self.model_name)
        return ChatResult(generations=[ChatGeneration(message=message)],
                          llm_output={"model_name": self.model_name, "token_usage": message.usage_metadata})
