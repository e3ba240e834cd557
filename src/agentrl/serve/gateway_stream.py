"""Streaming answers of the training gateway: one finished turn presented as chat-completion chunks (SSE).

The turn is generated (or replayed) whole by the episode's `LLMClient` first, then streamed, so a streaming
request and a non-streaming one give the same tokens, text and tool calls; only the presentation differs. Chunk
shapes follow vLLM's ``ChatCompletionStreamResponse`` (``vllm/entrypoints/openai/chat_completion/protocol.py``):
a first chunk with the role, content deltas (one per token where the decoded text allows: a token that ends in the
middle of a UTF-8 character waits for the next), one delta per tool call (id, name and the whole arguments
string), a last chunk with ``finish_reason``, an optional usage chunk (``stream_options.include_usage``) and
``data: [DONE]``. With ``return_token_ids`` every chunk carries the ids it covers (vLLM's extension), so the
concatenated ids are the turn's response ids.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, Field

from agentrl.serve.openai_protocol import ChatMessage, UsageInfo, random_id


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    id: str | None = None
    type: Literal["function"] | None = None
    index: int
    function: DeltaFunctionCall | None = None


class DeltaMessage(BaseModel):
    role: str | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatCompletionResponseStreamChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    logprobs: None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class ChatCompletionStreamResponse(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = None


def text_pieces(tokenizer: Any, ids: list[int], text: str) -> list[tuple[list[int], str]]:
    """Split ``text`` (the decoded ``ids``, maybe without a final stop token) into per-token pieces.

    A piece is emitted once the decoded prefix is a clean prefix of ``text``; ids whose text is not (yet) one —
    half a UTF-8 character, the stop token — go with the next piece or the last. Joined, the pieces are ``text``
    and the ids are ``ids``.
    """
    pieces: list[tuple[list[int], str]] = []
    pending: list[int] = []
    sent = 0
    for i, token in enumerate(ids):
        pending.append(token)
        prefix = str(tokenizer.decode(ids[: i + 1], skip_special_tokens=False))
        if len(prefix) > sent and text.startswith(prefix) and not prefix.endswith("\ufffd"):
            pieces.append((pending, prefix[sent:]))
            pending, sent = [], len(prefix)
    if pending or sent < len(text):
        pieces.append((pending, text[sent:]))
    return pieces


def stream_chunks(tokenizer: Any, *, model: str, message: ChatMessage, finish_reason: str, raw_text: str,
                  response_ids: list[int], prompt_ids: list[int], with_ids: bool,
                  usage: UsageInfo | None) -> Iterator[str]:
    """The SSE lines (``data: ...\\n\\n``) of one finished choice."""
    chunk_id = random_id("chatcmpl")

    def chunk(delta: DeltaMessage, ids: list[int] | None = None, finish: str | None = None,
              prompt: list[int] | None = None) -> str:
        choice = ChatCompletionResponseStreamChoice(delta=delta, finish_reason=finish,
                                                    token_ids=ids if with_ids else None)
        body = ChatCompletionStreamResponse(id=chunk_id, model=model, choices=[choice],
                                            prompt_token_ids=prompt if with_ids else None)
        return f"data: {body.model_dump_json(exclude_none=True)}\n\n"

    yield chunk(DeltaMessage(role="assistant", content=""), [], prompt=prompt_ids)
    if message.tool_calls:
        if message.content:
            yield chunk(DeltaMessage(content=message.content))
        for i, call in enumerate(message.tool_calls):
            delta = DeltaToolCall(id=call.id, type="function", index=i,
                                  function=DeltaFunctionCall(name=call.function.name,
                                                             arguments=call.function.arguments))
            yield chunk(DeltaMessage(tool_calls=[delta]), response_ids if i == 0 else [])
    else:
        for ids, piece in text_pieces(tokenizer, response_ids, raw_text):
            yield chunk(DeltaMessage(content=piece), ids)
    yield chunk(DeltaMessage(), [], finish=finish_reason)
    if usage is not None:
        body = ChatCompletionStreamResponse(id=chunk_id, model=model, choices=[], usage=usage)
        yield f"data: {body.model_dump_json(exclude_none=True)}\n\n"
    yield "data: [DONE]\n\n"
