"""Message conversion: the model's own text comes back verbatim, foreign messages render as Hermes, tool results
follow the template's convention, replies carry tool calls, parse errors, usage and turn metadata."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, ChatMessage, HumanMessage, SystemMessage, ToolCall, ToolMessage

from agentrl.agents.base import Task
from agentrl.agents.llm import AssistantReply
from agentrl.chat.tools import HermesToolParser
from agentrl.types import Turn
from agentrl_langchain import RAW_TEXT_KEY, question_input, to_ai_message, to_chat

RAW = ('Let me look.\n<tool_call>\n{"name": "weather", "arguments": {"city": "oslo"}}\n</tool_call>\n'
       "<tool_call>\n{not json}\n</tool_call>")


def _reply(text: str = RAW, index: int = 3) -> AssistantReply:
    parsed = HermesToolParser().parse(text)
    turn = Turn([1, 2, 3, 4], [5, 6], [-0.1, -0.2], index=index, policy_version=7, finish_reason="stop")
    return AssistantReply(text, parsed.content, parsed.tool_calls, parsed.errors, "stop", turn)


def test_reply_becomes_an_ai_message_with_calls_errors_usage_and_metadata() -> None:
    message = to_ai_message(_reply(), model_name="tiny")
    assert message.content == "Let me look."
    assert message.tool_calls == [ToolCall(name="weather", args={"city": "oslo"}, id="call_3_0", type="tool_call")]
    (invalid,) = message.invalid_tool_calls
    assert invalid["id"] == "invalid_3_1" and "invalid JSON" in str(invalid["error"])
    assert message.usage_metadata == {"input_tokens": 4, "output_tokens": 2, "total_tokens": 6}
    meta = message.response_metadata
    assert (meta["finish_reason"], meta["policy_version"], meta["turn_index"], meta["forced"]) == ("stop", 7, 3, False)
    assert message.additional_kwargs[RAW_TEXT_KEY] == RAW


def test_the_models_own_text_is_sent_back_verbatim() -> None:
    ai = to_ai_message(_reply(), model_name="tiny")
    chat = to_chat([SystemMessage("s"), HumanMessage("q"), ai], native_tools=False)
    assert chat == [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                    {"role": "assistant", "content": RAW}]


def test_foreign_ai_messages_render_as_hermes_calls_that_parse_back() -> None:
    foreign = AIMessage("Checking.", tool_calls=[ToolCall(name="weather", args={"city": "lima"}, id="x"),
                                                 ToolCall(name="weather", args={"city": "oslo"}, id="y")])
    (chat,) = to_chat([foreign], native_tools=False)
    parsed = HermesToolParser().parse(chat["content"])
    assert parsed.content == "Checking."
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("weather", {"city": "lima"}),
                                                                 ("weather", {"city": "oslo"})]
    assert to_chat([AIMessage("plain")], native_tools=False) == [{"role": "assistant", "content": "plain"}]


def test_tool_results_follow_the_template_convention() -> None:
    result = ToolMessage("Oslo: 4 degrees", tool_call_id="call_0_0", name="weather")
    (hermes,) = to_chat([result], native_tools=False)
    assert hermes["role"] == "tool"
    assert hermes["content"] == "<tool_response>\nOslo: 4 degrees\n</tool_response>"
    (native,) = to_chat([result], native_tools=True)
    assert native == {"role": "tool", "content": "Oslo: 4 degrees", "tool_call_id": "call_0_0", "name": "weather"}


def test_text_blocks_join_other_blocks_are_refused() -> None:
    blocks = HumanMessage(content=[{"type": "text", "text": "a"}, "b"])
    assert to_chat([blocks, ChatMessage("c", role="critic")], native_tools=False) == [
        {"role": "user", "content": "ab"}, {"role": "critic", "content": "c"}]
    image = HumanMessage(content=[{"type": "image_url", "image_url": {"url": "http://x"}}])
    with pytest.raises(ValueError, match="'image_url' content block; only text"):
        to_chat([image], native_tools=False)


def test_default_input_is_the_question_and_a_missing_one_is_named() -> None:
    (message,) = question_input(Task("t", data={"question": "Why?"}))["messages"]
    assert isinstance(message, HumanMessage) and message.content == "Why?"
    with pytest.raises(ValueError, match="task 't' has no string 'question'.*input_mapping"):
        question_input(Task("t", data={"prompt": "x"}))
