"""Chat messages to prompt text: the one rendering shared by the trainer's `LLMClient`, ``agentrl serve`` and
the adapters, so every path sends the model the same tokens for the same conversation."""

from __future__ import annotations

from typing import Any

from agentrl.chat.tools import ToolParser

Message = dict[str, Any]

_TOOL_SUPPORT: dict[int, bool] = {}
_TOKEN_BYTES: dict[int, int] = {}


def max_token_bytes(tokenizer: Any) -> int:
    """An upper bound on the UTF-8 bytes of text one token covers: the longest vocabulary entry, special tokens
    included, in UTF-8 (a byte-level entry's characters stand for one byte each, so this over-counts; never
    under). A text of more characters than ``context × max_token_bytes`` cannot fit the context, whatever it
    tokenizes to: that check costs nothing, where tokenizing a 15 MiB prompt held the event loop for 45 s."""
    key = id(tokenizer)
    if key not in _TOKEN_BYTES:
        _TOKEN_BYTES[key] = max((len(str(t).encode("utf-8", "surrogatepass")) for t in tokenizer.get_vocab()),
                                default=1) or 1
    return _TOKEN_BYTES[key]


def text_chars(value: Any) -> int:
    """Characters in every string inside ``value`` (messages, tools), iteratively: a lower bound on the length of
    anything rendered from it."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return total


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders a ``tools`` argument at all."""
    key = id(tokenizer)
    if key not in _TOOL_SUPPORT:
        probe = [{"role": "user", "content": "x"}]
        tool = {"type": "function", "function": {"name": "probe_tool_zz", "description": "d", "parameters": {}}}
        with_tools = tokenizer.apply_chat_template(probe, tools=[tool], tokenize=False)
        _TOOL_SUPPORT[key] = "probe_tool_zz" in with_tools
    return _TOOL_SUPPORT[key]


def render_prompt(tokenizer: Any, messages: list[Message], tools: list[dict[str, Any]] | None, parser: ToolParser,
                  *, add_generation_prompt: bool = True) -> str:
    """The prompt text of a chat, the one rendering shared by the trainer's `LLMClient` and ``agentrl serve``:
    ``tools`` go to the chat template when it renders them, otherwise the parser's tool block is appended to the
    system prompt (a system message is added when there is none)."""
    native = bool(tools) and template_renders_tools(tokenizer)
    conv = messages
    if tools and not native:
        block = parser.render_tools(tools)
        if conv and conv[0].get("role") == "system":
            conv = [{**conv[0], "content": f"{conv[0]['content']}\n\n{block}"}, *conv[1:]]
        else:
            conv = [{"role": "system", "content": block}, *conv]
    text = tokenizer.apply_chat_template(conv, tools=tools if native else None,
                                         add_generation_prompt=add_generation_prompt, tokenize=False)
    return str(text)
