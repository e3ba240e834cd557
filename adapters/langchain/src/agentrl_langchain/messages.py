"""LangChain messages ⇄ the chat dicts `agentrl.agents.llm.LLMClient` renders, and replies back to `AIMessage`.

What the model sees must be what it produced. An `AIMessage` made by `AgentRLChatModel` keeps the exact text the
model generated (tool-call blocks included) under ``additional_kwargs["agentrl_raw_text"]``; converting it back
uses that text, so the history the client renders is the model's own output and the client's prefix reuse
(turn k+1's prompt = turn k's prompt + response ids + new tokens) applies. An `AIMessage` from elsewhere (a
few-shot example, another model) is rendered as its text followed by its tool calls in the Hermes format.

Tool results follow the chat template's convention: a template that renders ``tools`` natively (Qwen2.5, Hermes)
gets plain ``{"role": "tool", ...}`` messages and wraps them itself; for a plain ChatML template that ignores tools
(SmolLM2, the tiny test model) the result is wrapped in ``<tool_response>`` tags under the ``tool`` role, the
Hermes-2-Pro convention, matching the tool block the client injects into the system prompt and what ``agentrl
serve`` renders for the same conversation (so a model trained here sees the same text when served).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    InvalidToolCall,
    SystemMessage,
    ToolCall,
    ToolMessage,
)

from agentrl.agents.llm import AssistantReply
from agentrl.chat.tools import HermesToolParser, tool_call_id

RAW_TEXT_KEY = "agentrl_raw_text"
"""``AIMessage.additional_kwargs`` key holding the exact text the model generated."""

Message = dict[str, Any]

_ERROR_INDEX = re.compile(r"^tool call (\d+):")


def message_text(message: BaseMessage) -> str:
    """The text of a message; content blocks other than text are rejected (the policy is a text model)."""
    content = message.content
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        else:
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise ValueError(f"{type(message).__name__} has a '{kind}' content block; only text is supported")
    return "".join(parts)


def hermes_tool_call(name: str, args: Any) -> str:
    """One tool call in the Hermes format the tool parser reads."""
    return HermesToolParser.render_call(name, args)


def assistant_text(message: AIMessage) -> str:
    """The assistant turn as the model wrote it (or, for a foreign message, text then Hermes tool calls)."""
    raw = message.additional_kwargs.get(RAW_TEXT_KEY)
    if isinstance(raw, str):
        return raw
    text = message_text(message)
    parts = [text] if text else []
    parts += [hermes_tool_call(call["name"], call["args"]) for call in message.tool_calls]
    return "\n".join(parts)


def to_chat(messages: Sequence[BaseMessage], *, native_tools: bool) -> list[Message]:
    """Convert LangChain messages to chat dicts for `LLMClient.chat`.

    Args:
        messages: The conversation, as the agent passes it to the model.
        native_tools: The chat template renders tools itself (then tool results are passed unwrapped).

    Returns:
        ``{"role", "content"}`` dicts (tool messages also carry ``tool_call_id`` and ``name``).
    """
    return [_convert(message, native_tools) for message in messages]


def _convert(message: BaseMessage, native_tools: bool) -> Message:
    if isinstance(message, ToolMessage):
        text = message_text(message)
        content = text if native_tools else HermesToolParser.render_response(text)
        return {"role": "tool", "content": content, "tool_call_id": message.tool_call_id, "name": message.name or ""}
    if isinstance(message, AIMessage):
        return {"role": "assistant", "content": assistant_text(message)}
    if isinstance(message, SystemMessage):
        return {"role": "system", "content": message_text(message)}
    if isinstance(message, HumanMessage):
        return {"role": "user", "content": message_text(message)}
    if isinstance(message, ChatMessage):
        return {"role": message.role, "content": message_text(message)}
    raise ValueError(f"unsupported message type {type(message).__name__} (expected system, human, AI, tool or "
                     "chat messages)")


def to_ai_message(reply: AssistantReply, *, model_name: str) -> AIMessage:
    """The `AIMessage` of a reply: parsed tool calls, parse errors as ``invalid_tool_calls``, token usage, and
    turn metadata. Tool-call ids are `agentrl.chat.tools.tool_call_id`'s: unique within the episode and the same on
    replay."""
    turn = reply.turn
    calls = [ToolCall(name=c.name, args=c.arguments, id=tool_call_id(turn.index, i), type="tool_call")
             for i, c in enumerate(reply.tool_calls)]
    invalid = []
    for j, error in enumerate(reply.tool_call_errors):
        match = _ERROR_INDEX.match(error)
        position = match.group(1) if match else str(j)
        invalid.append(InvalidToolCall(name=None, args=None, id=f"invalid_{turn.index}_{position}", error=error,
                                       type="invalid_tool_call"))
    prompt, completion = len(turn.prompt_ids), len(turn.response_ids)
    return AIMessage(
        content=reply.content,
        tool_calls=calls,
        invalid_tool_calls=invalid,
        additional_kwargs={RAW_TEXT_KEY: reply.text},
        usage_metadata={"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion},
        response_metadata={
            "finish_reason": reply.finish_reason,
            "policy_version": turn.policy_version,
            "turn_index": turn.index,
            "forced": turn.forced,
            "model_name": model_name,
            "model_provider": "agentrl",
        },
    )


def model_replies(result: Any) -> list[AIMessage]:
    """The replies the policy generated in this episode, in order: the `AIMessage` s of ``result["messages"]`` (or
    of a message list) that `AgentRLChatModel` made. A worked example in the agent's input is not among them, so a
    reward that counts tool calls over these counts only the episode's own."""
    messages = result.get("messages", []) if isinstance(result, dict) else result
    return [m for m in messages or [] if isinstance(m, AIMessage) and RAW_TEXT_KEY in m.additional_kwargs]
