"""Tool calls: the Hermes format (``<tool_call>{json}</tool_call>``), parsing and rendering.

Parsing never evaluates model output: it only runs ``json.loads`` on the text between the tags. Malformed calls
are reported as errors next to the parsed ones, never raised.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


@dataclass
class ToolCall:
    """A parsed tool call."""

    name: str
    arguments: dict[str, Any]
    id: str = ""


def tool_call_id(turn: int, call: int) -> str:
    """The OpenAI id of call ``call`` in turn ``turn``'s reply, ``call_<turn>_<call>``: unique within an episode and
    the same when the episode is replayed. The training gateway's replies, the MLflow traces and the LangChain
    adapter's messages all name calls so, and a tool result names its call back by this id."""
    return f"call_{turn}_{call}"


@dataclass
class ParsedReply:
    """Text content (tool-call blocks removed), the calls, and the errors of calls that did not parse."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class ToolParser(Protocol):
    def parse(self, text: str) -> ParsedReply:
        ...

    def render_tools(self, tools: list[dict[str, Any]]) -> str:
        ...


class HermesToolParser:
    """Hermes / Qwen style tool calls, one JSON object per ``<tool_call>`` block."""

    def parse(self, text: str) -> ParsedReply:
        calls: list[ToolCall] = []
        errors: list[str] = []
        for i, match in enumerate(_TOOL_CALL.finditer(text)):
            body = match.group(1).strip()
            try:
                obj = json.loads(body)
            except json.JSONDecodeError as exc:
                errors.append(f"tool call {i}: invalid JSON ({exc.msg})")
                continue
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                errors.append(f"tool call {i}: expected an object with a string 'name'")
                continue
            args = obj.get("arguments", obj.get("parameters", {}))
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    errors.append(f"tool call {i}: 'arguments' is a string that is not JSON")
                    continue
            if not isinstance(args, dict):
                errors.append(f"tool call {i}: 'arguments' must be an object")
                continue
            calls.append(ToolCall(obj["name"], args, id=f"call_{i}"))
        content = _TOOL_CALL.sub("", text).strip()
        return ParsedReply(content, calls, errors)

    @staticmethod
    def render_call(name: str, arguments: Any) -> str:
        """One call in the form `parse` reads (how a template that ignores ``tools`` sees an assistant's call)."""
        return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"

    @staticmethod
    def render_response(text: str) -> str:
        """A tool result as Hermes templates show it to the model."""
        return f"<tool_response>\n{text}\n</tool_response>"

    def render_tools(self, tools: list[dict[str, Any]]) -> str:
        """The Hermes system-prompt block that lists the tools, for chat templates that ignore ``tools``."""
        schemas = "\n".join(json.dumps(_function_schema(t)) for t in tools)
        return (
            "You can call tools. Available tools:\n<tools>\n" + schemas + "\n</tools>\n"
            "To call a tool, reply with a JSON object inside tags, for example:\n"
            '<tool_call>\n{"name": "<tool name>", "arguments": {<arguments>}}\n</tool_call>'
        )


def _function_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """Accept both ``{"type": "function", "function": {...}}`` and a bare function schema."""
    fn = tool.get("function", tool)
    return {"name": fn.get("name"), "description": fn.get("description", ""),
            "parameters": fn.get("parameters", {})}
