"""Hermes tool-call parsing never raises and never evaluates model output."""

from __future__ import annotations

from agentrl.chat.tools import HermesToolParser


def test_parse_valid_and_invalid_calls() -> None:
    parser = HermesToolParser()
    text = (
        'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"query": "river"}}\n</tool_call>\n'
        '<tool_call>{"name": "answer", "arguments": "{\\"text\\": \\"Oslo\\"}"}</tool_call>'
        "<tool_call>{not json}</tool_call><tool_call>[1, 2]</tool_call>"
    )
    out = parser.parse(text)
    assert out.content == "Let me look."
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("search", {"query": "river"}),
                                                             ("answer", {"text": "Oslo"})]
    assert len(out.errors) == 2 and "invalid JSON" in out.errors[0]


def test_unclosed_call_at_end_and_no_eval() -> None:
    parser = HermesToolParser()
    out = parser.parse('<tool_call>{"name": "f", "arguments": {"x": 1}}')
    assert out.tool_calls[0].arguments == {"x": 1}
    evil = parser.parse('<tool_call>__import__("os").system("echo pwned")</tool_call>')
    assert not evil.tool_calls and evil.errors


def test_render_tools_lists_schemas() -> None:
    block = HermesToolParser().render_tools(
        [{"type": "function", "function": {"name": "search", "description": "find", "parameters": {}}}]
    )
    assert "<tools>" in block and '"name": "search"' in block and "<tool_call>" in block
