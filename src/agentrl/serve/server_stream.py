"""``stream: true`` for ``agentrl serve``: a finished answer presented as server-sent events, as vLLM streams it.

The embedded engine generates a choice whole, so a streaming request is answered like a non-streaming one and
then presented as chunks: the same tokens, text and tool calls either way (``ChatOpenAI(streaming=True)``, the
``openai`` client's ``stream=True``). Chat completions reuse the training gateway's chunks
(`agentrl.serve.gateway_stream.stream_chunks`: a role chunk, content deltas split at token boundaries, one delta
per tool call, the finish reason, the usage chunk with ``stream_options.include_usage``, ``data: [DONE]``);
completions use vLLM's ``CompletionStreamResponse`` (``object: text_completion``, one text delta per token, a last
delta per choice with its ``finish_reason``). Streaming is not incremental: the first chunk comes when the answer
is finished. ``n`` > 1 streams only for completions (each choice in turn, by ``index``); for chat it is refused.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from agentrl.serve.gateway_stream import stream_chunks, text_pieces
from agentrl.serve.openai_protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    UsageInfo,
    random_id,
)
from agentrl.serve.served_model import ServeError


@dataclass(frozen=True)
class Streaming:
    """What a streaming request asked for besides the answer."""

    include_usage: bool
    token_ids: bool  # the client asked for ``return_token_ids`` itself


def take_stream(req: CompletionRequest | ChatCompletionRequest) -> Streaming | None:
    """Remove ``stream`` / ``stream_options`` from ``req`` (the rest of the request is served as usual); None when
    it does not stream. Splitting text at token boundaries needs the token ids: they are asked for here."""
    extra = req.model_extra if req.model_extra is not None else {}
    stream, options = extra.pop("stream", None), extra.pop("stream_options", None)
    if stream not in (None, True, False):
        raise ServeError(f"stream must be a boolean, got {stream!r}", param="stream")
    if not stream:
        return None
    if options is not None and not isinstance(options, dict):
        raise ServeError("stream_options must be an object", param="stream_options")
    if isinstance(req, ChatCompletionRequest) and req.n not in (None, 1):
        raise ServeError("agentrl serve streams chat completions with n = 1 only", param="n")
    wanted = Streaming(include_usage=bool((options or {}).get("include_usage")), token_ids=bool(req.return_token_ids))
    req.return_token_ids = True
    return wanted


class CompletionStreamChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None


class CompletionStreamResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionStreamChoice]
    usage: UsageInfo | None = None


def _completion_events(tokenizer: Any, resp: CompletionResponse, how: Streaming) -> Iterator[str]:
    chunk_id = random_id("cmpl")

    def event(choice: CompletionStreamChoice | None, usage: UsageInfo | None = None) -> str:
        body = CompletionStreamResponse(id=chunk_id, model=resp.model, choices=[choice] if choice else [], usage=usage)
        return f"data: {body.model_dump_json(exclude_none=True)}\n\n"

    for choice in resp.choices:
        ids = list(choice.token_ids or [])
        pieces = text_pieces(tokenizer, ids, choice.text)
        for k, (piece_ids, text) in enumerate(pieces):
            last = k == len(pieces) - 1
            yield event(CompletionStreamChoice(
                index=choice.index, text=text, finish_reason=choice.finish_reason if last else None,
                stop_reason=choice.stop_reason if last else None, token_ids=piece_ids if how.token_ids else None,
                prompt_token_ids=choice.prompt_token_ids if how.token_ids and k == 0 else None))
        if not pieces:
            yield event(CompletionStreamChoice(index=choice.index, text="", finish_reason=choice.finish_reason))
    if how.include_usage:
        yield event(None, resp.usage)
    yield "data: [DONE]\n\n"


def _chat_events(tokenizer: Any, resp: ChatCompletionResponse, how: Streaming) -> Iterator[str]:
    (choice,) = resp.choices
    message = choice.message
    return stream_chunks(tokenizer, model=resp.model, message=message, finish_reason=choice.finish_reason or "stop",
                         raw_text=message.content or "", response_ids=list(choice.token_ids or []),
                         prompt_ids=list(resp.prompt_token_ids or []), with_ids=how.token_ids,
                         usage=resp.usage if how.include_usage else None)


def stream_response(tokenizer: Any, resp: CompletionResponse | ChatCompletionResponse,
                    how: Streaming) -> StreamingResponse:
    """The finished ``resp`` as an SSE response (``text/event-stream``)."""
    events = _chat_events(tokenizer, resp, how) if isinstance(resp, ChatCompletionResponse) else \
        _completion_events(tokenizer, resp, how)
    return StreamingResponse(events, media_type="text/event-stream")
