"""``agentrl serve`` with ``stream: true`` and with a tool call whose arguments are not JSON sent back: the official
``openai`` client and LangChain's ``ChatOpenAI(streaming=True)`` against a real server on 127.0.0.1 (the tiny random
model).

Before `agentrl.serve.server_stream`, ``stream: true`` answered 400; a tool call whose arguments were not JSON,
sent back in the next request, answered 400 ("tool call arguments are not JSON"). Such a call came from this server
itself (a named ``tool_choice`` the model did not finish; now refused, `agentrl.serve.serving.check_forced_call`)
and may come from any other server or client."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.support.server import API_KEY, Server

MESSAGES = [{"role": "user", "content": "Where is Orlan?"}]
TOOLS = [{"type": "function", "function": {"name": "search", "description": "Search the notes.",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]


def _client(server: Server) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)


def test_chat_streams_the_same_answer_as_chunks_ending_with_done(served: Server) -> None:
    client = _client(served)
    args: dict[str, Any] = {"model": "tiny-random", "messages": MESSAGES, "max_tokens": 12, "seed": 5,
                            "temperature": 1.0}
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # split at token boundaries
    raw = httpx.post(served.url + "/v1/chat/completions", json={**args, "stream": True}, headers=served.headers,
                     timeout=60)
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.rstrip().endswith("data: [DONE]")


def test_completions_stream_per_choice(served: Server) -> None:
    client = _client(served)
    args: dict[str, Any] = {"model": "tiny-random", "prompt": "Hello agent", "max_tokens": 8, "seed": 2, "n": 2}
    whole = client.completions.create(**args)
    chunks = list(client.completions.create(**args, stream=True))
    for choice in whole.choices:
        mine = [c.choices[0] for c in chunks if c.choices[0].index == choice.index]
        assert "".join(c.text for c in mine) == choice.text
        assert [c.finish_reason for c in mine if c.finish_reason] == [choice.finish_reason]


def test_langchain_chat_openai_streaming(served: Server) -> None:
    from langchain_openai import ChatOpenAI
    from pydantic import SecretStr

    # max_completion_tokens: the alias of the `max_tokens` field, the name ChatOpenAI sends it under
    model = ChatOpenAI(base_url=served.url + "/v1", api_key=SecretStr(API_KEY), model="tiny-random",
                       max_completion_tokens=8, streaming=True, max_retries=0)
    pieces = [chunk.content for chunk in model.stream("Where is Orlan?")]
    assert len(pieces) > 1 and isinstance(model.invoke("Where is Orlan?").content, str)


def test_a_tool_call_is_accepted_back_when_its_arguments_are_not_json(served: Server) -> None:
    client = _client(served)
    arguments = '{"q": "Orl'  # cut off, as a model that ran out of tokens leaves it
    try:
        json.loads(arguments)
        raise AssertionError("the arguments must not be JSON for this check")
    except json.JSONDecodeError:
        pass
    call = {"id": "call_0", "type": "function", "function": {"name": "search", "arguments": arguments}}
    history = [*MESSAGES, {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_0", "content": "Orlan is in Vell."}]
    second = client.chat.completions.create(model="tiny-random", messages=history, tools=TOOLS, max_tokens=4,
                                            seed=2)  # before: 400 "tool call arguments are not JSON"
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
