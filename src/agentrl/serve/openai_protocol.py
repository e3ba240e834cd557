"""Request and response models of the vLLM-compatible HTTP API of ``agentrl serve``.

Field names, types and nesting follow vLLM's own pydantic models, read from the vLLM repository (main branch,
2026): ``vllm/entrypoints/openai/completion/protocol.py`` (``CompletionRequest``, ``CompletionResponse``,
``CompletionResponseChoice``, ``CompletionLogProbs``), ``vllm/entrypoints/openai/chat_completion/protocol.py``
(``ChatCompletionRequest``, ``ChatCompletionResponse``, ``ChatMessage``, ``ChatCompletionLogProbs``),
``vllm/entrypoints/generate/base/protocol.py`` (``ToolCall``, ``FunctionCall``),
``vllm/entrypoints/serve/engine/protocol.py`` (``ErrorResponse``, ``ModelList``, ``UsageInfo``) and
``vllm/entrypoints/serve/lora/protocol.py`` (``LoadLoRAAdapterRequest``). ``tests/serve/vllm_protocol.py`` holds an
independent copy of those models that the conformance tests validate against.

Requests declare only the fields ``agentrl serve`` implements. Like vLLM, other fields are accepted and ignored,
except those that would change the result and are not implemented (penalties, beam search, echo, ...):
`unsupported_fields` names them and the server answers 400 instead of silently returning something else.

Validation that every OpenAI-compatible front end of agentrl shares (``agentrl serve``, the training gateway) lives
here, in the models, so that a malformed request is a 400 before any engine sees it:

* bodies nest at most `MAX_JSON_DEPTH` levels (deeper JSON is refused before anything recurses over it);
* every string and object key is valid Unicode: JSON can write lone UTF-16 surrogates (``"\\ud800"``), which no
  tokenizer, template or UTF-8 encoder accepts; such a body is a 400 whose ``param`` is the field's path;
* ``seed`` is a 64-bit signed integer and ``temperature``/``top_p`` are finite (vLLM's bounds); a temperature in
  (0, `MIN_TEMPERATURE`) is raised to `MIN_TEMPERATURE`, as vLLM does, because dividing logits by it overflows;
* chat messages have a string ``role`` and, when given, ``tool_calls`` of the OpenAI shape
  (``[{"id", "type": "function", "function": {"name", "arguments"}}]``).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer, model_validator
from pydantic_core import PydanticCustomError

from agentrl.engines.base import MIN_TEMPERATURE

StopParam = str | list[str] | None
MAX_JSON_DEPTH = 64
"""Deepest nesting of lists and objects accepted in a request body (or a tool call's JSON arguments)."""
_INT64 = 2**63

# field -> values that mean "off"; any other value of these fields is refused with 400
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "stream": (False, None),
    "echo": (False, None),
    "use_beam_search": (False, None),
    "best_of": (None, 1),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "min_p": (None, 0, 0.0),
    "min_tokens": (None, 0),
    "logit_bias": (None, {}),
    "allowed_token_ids": (None,),
    "bad_words": (None, []),
    "prompt_logprobs": (None,),
    "prompt_embeds": (None,),
    "suffix": (None, ""),
    "response_format": (None, {"type": "text"}),
    "structured_outputs": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "logprob_token_ids": (None,),
    "continue_final_message": (None, False),
    "truncate_prompt_tokens": (None,),
}


def unsupported_fields(body: dict[str, Any]) -> list[str]:
    """Names of request fields set to a value ``agentrl serve`` does not implement."""
    return sorted(k for k, neutral in _NEUTRAL.items() if k in body and body[k] not in neutral)


def json_depth(value: Any) -> int:
    """Nesting depth of lists and dicts in ``value`` (0 for a scalar), computed without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth <= MAX_JSON_DEPTH and _CONTAINERS & set(map(type, children)):  # deeper: all a caller needs to know
            stack.extend((child, depth + 1) for child in children if type(child) in _CONTAINERS)
    return deepest


_CONTAINERS = {list, dict}
"""JSON's containers (a parsed body holds exactly these types: no subclasses). ``set(map(type, ...))`` runs in C:
a list of millions of numbers is skipped in milliseconds instead of walked item by item."""


def _is_text(value: str) -> bool:
    """Whether ``value`` is valid Unicode text (JSON's ``\\ud800`` escapes give lone surrogates, which are not)."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def printable(text: str) -> str:
    """``text`` with lone surrogates escaped (``\\ud800``), so that it can be encoded as UTF-8."""
    return text if _is_text(text) else text.encode("utf-8", "backslashreplace").decode("utf-8")


def _child(path: str, key: Any) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else str(key)


def first_non_text(value: Any) -> str | None:
    """The path (``messages[0].content``, ``prompt[3]``) of the first string or object key in ``value`` that is not
    valid Unicode (a lone UTF-16 surrogate), or None; iterative, like `json_depth` (run after it)."""
    if isinstance(value, str):
        return None if _is_text(value) else "body"
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        pairs = item.items() if isinstance(item, dict) else enumerate(item) if isinstance(item, list) else ()
        kinds = set(map(type, item.values() if isinstance(item, dict) else item)) if pairs else set()
        if isinstance(item, dict) and not all(_is_text(k) for k in item if type(k) is str):
            return f"{path or 'body'} (a key)"
        if not kinds & _WALKED:  # numbers, booleans, nulls only: nothing to check, nothing to walk
            continue
        nested = []
        for key, child in pairs:
            kind = type(child)
            if kind is str and not _is_text(child):
                return _child(path, key)
            if kind in _CONTAINERS:
                nested.append((child, _child(path, key)))
        stack.extend(reversed(nested))  # the first bad field in document order
    return None


_WALKED = {str, list, dict}


def check_body(data: Any) -> Any:
    """The checks every request body passes before its fields are read: nesting depth, then valid Unicode."""
    if json_depth(data) > MAX_JSON_DEPTH:
        raise PydanticCustomError("too_deep", "the request body nests deeper than {limit} levels",
                                  {"limit": MAX_JSON_DEPTH})
    where = first_non_text(data)
    if where is not None:
        raise PydanticCustomError(NOT_TEXT, "{field}: the string is not valid Unicode text (it holds a lone UTF-16 "
                                  "surrogate such as \\ud800)", {"field": where})
    return data


NOT_TEXT = "not_unicode_text"
"""Pydantic error type of a string that is not valid Unicode; its ``ctx["field"]`` is the field's path."""


class _Checked(BaseModel):
    @model_validator(mode="before")
    @classmethod
    def _check_body(cls, data: Any) -> Any:
        return check_body(data)


class _Request(_Checked):
    model_config = ConfigDict(extra="allow")


class SamplingFields(_Request):
    """Sampling fields shared by completions and chat completions (vLLM names and defaults)."""

    model: str | None = None
    n: int = Field(1, ge=1, le=64)
    seed: int | None = Field(None, ge=-_INT64, le=_INT64 - 1)
    temperature: float | None = Field(None, ge=0.0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=-1)
    stop: StopParam = Field(default_factory=list)
    stop_token_ids: list[int] | None = Field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    session_id: str | None = None

    @field_validator("temperature")
    @classmethod
    def _raise_tiny_temperature(cls, value: float | None) -> float | None:
        """vLLM raises a temperature in (0, 0.01) to 0.01: dividing logits by less overflows float32."""
        return MIN_TEMPERATURE if value is not None and 0.0 < value < MIN_TEMPERATURE else value


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``: a text prompt, a token-id prompt, or a list of either."""

    prompt: list[int] | list[list[int]] | str | list[str]
    max_tokens: int | None = 16
    logprobs: int | None = Field(None, ge=0, le=20)
    add_special_tokens: bool = True


class FunctionDefinition(BaseModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ChatCompletionToolsParam(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ChatCompletionNamedFunction(BaseModel):
    name: str


class ChatCompletionNamedToolChoiceParam(BaseModel):
    function: ChatCompletionNamedFunction
    type: Literal["function"] = "function"


ToolChoice = Literal["none", "auto", "required"] | ChatCompletionNamedToolChoiceParam


class FunctionCallParam(BaseModel):
    """The ``function`` of a tool call in a request message (``arguments``: a JSON string, or the object)."""

    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallParam(BaseModel):
    """A tool call of an assistant message in a request."""

    model_config = ConfigDict(extra="allow")
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallParam


class ChatMessageParam(BaseModel):
    """The checked part of a request message; the message itself reaches the chat template as sent."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCallParam] | None = None


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(0, ge=0, le=20)
    tools: list[ChatCompletionToolsParam] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = True
    add_generation_prompt: bool = True

    @field_validator("messages")
    @classmethod
    def _check_messages(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, message in enumerate(messages):
            try:
                ChatMessageParam.model_validate(message)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
                raise PydanticCustomError("invalid_message", "messages[{i}]{where}: {msg}",
                                          {"i": i, "where": where, "msg": first["msg"]}) from None
        return messages


class LoadLoRAAdapterRequest(_Checked):
    """``POST /v1/load_lora_adapter``."""

    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(_Checked):
    """``POST /v1/unload_lora_adapter``."""

    lora_name: str
    lora_int_id: int | None = None


# ---------------------------------------------------------------------------------------------- responses


def _now() -> int:
    return int(time.time())


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorInfo


class ModelPermission(BaseModel):
    id: str = Field(default_factory=lambda: random_id("modelperm"))
    object: str = "model_permission"
    created: int = Field(default_factory=_now)
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "agentrl"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[ModelPermission] = Field(default_factory=lambda: [ModelPermission()])


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard] = Field(default_factory=list)


class PromptTokenUsageInfo(BaseModel):
    cached_tokens: int | None = None


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: PromptTokenUsageInfo | None = None


class CompletionLogProbs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionResponseChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None


class CompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: random_id("cmpl"))
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionResponseChoice]
    system_fingerprint: str | None = None
    usage: UsageInfo


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str = Field(default_factory=lambda: random_id("chatcmpl-tool"))
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    role: str
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)

    @model_serializer(mode="wrap")
    def _drop_empty_tool_calls(self, handler: Any) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not data.get("tool_calls"):
            data.pop("tool_calls", None)  # as vLLM: no key when there are no calls
        return data


class ChatCompletionLogProb(BaseModel):
    token: str
    logprob: float = -9999.0
    bytes: list[int] | None = None


class ChatCompletionLogProbsContent(ChatCompletionLogProb):
    top_logprobs: list[ChatCompletionLogProb] = Field(default_factory=list)


class ChatCompletionLogProbs(BaseModel):
    content: list[ChatCompletionLogProbsContent] | None = None


class ChatCompletionResponseChoice(BaseModel):
    index: int
    message: ChatMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: random_id("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatCompletionResponseChoice]
    system_fingerprint: str | None = None
    usage: UsageInfo
    prompt_token_ids: list[int] | None = None


def error_body(message: str, err_type: str, code: int, param: str | None = None) -> dict[str, Any]:
    """The vLLM/OpenAI error JSON: ``{"error": {"message", "type", "param", "code"}}``; text that is not valid
    Unicode (a request's own lone surrogates, quoted back) is escaped, so the answer can always be encoded."""
    message, param = printable(message), None if param is None else printable(param)
    return ErrorResponse(error=ErrorInfo(message=message, type=err_type, param=param, code=code)).model_dump()
