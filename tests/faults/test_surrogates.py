"""Issue 29, items 2 and 5: strings that are not Unicode are a 400 naming the field, and no answer — a 400 or a
500 — drops the client's kept-alive connection.

JSON can write lone UTF-16 surrogates (``"\\ud800"``); Python's parser turns them into strings that no tokenizer,
template or UTF-8 encoder accepts. Before, each of these fields answered 500 with two tracebacks, and uvicorn
closed the connection, so the client's *next* request on it failed too. The requests go over one
`http.client.HTTPConnection`, which never reconnects silently: a dropped connection fails the test.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import uvicorn
from fastapi import FastAPI

from tests.support.server import Server, free_port

S = "a\ud800b"  # a lone high surrogate inside ordinary text
PROMPT = [1, 87, 85, 71, 84]
TOOL = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
USER = [{"role": "user", "content": "hi"}]

# name: (path, body, the param the answer must name)
CASES: dict[str, tuple[str, dict[str, Any], str]] = {
    "prompt-string": ("/v1/completions", {"prompt": S, "max_tokens": 2}, "prompt"),
    "prompt-list-item": ("/v1/completions", {"prompt": ["ok", S], "max_tokens": 2}, "prompt[1]"),
    "completion-model": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "model": S}, "model"),
    "chat-content": ("/v1/chat/completions", {"messages": [{"role": "user", "content": S}], "max_tokens": 2},
                     "messages[0].content"),
    "chat-text-part": ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "x"}, {"type": "text", "text": S}]}], "max_tokens": 2}, "messages[0].content[1].text"),
    "chat-role": ("/v1/chat/completions", {"messages": [{"role": S, "content": "x"}], "max_tokens": 2},
                  "messages[0].role"),
    "chat-model": ("/v1/chat/completions", {"messages": USER, "max_tokens": 2, "model": S}, "model"),
    "tool-choice-name": ("/v1/chat/completions", {"messages": USER, "max_tokens": 2, "tools": TOOL, "tool_choice": {
        "type": "function", "function": {"name": S}}}, "tool_choice.function.name"),
    "lora-name": ("/v1/load_lora_adapter", {"lora_name": S, "lora_path": "x"}, "lora_name"),
    "unload-lora-name": ("/v1/unload_lora_adapter", {"lora_name": S}, "lora_name"),
    "stop-string": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "stop": [S]}, "stop[0]"),
    "extra-key": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2, S: 1}, "body (a key)"),
}


def post(conn: http.client.HTTPConnection, path: str, body: Any, headers: dict[str, str]) -> tuple[int, Any]:
    """POST on the kept-alive connection (json.dumps writes surrogates as \\ud800 escapes)."""
    conn.request("POST", path, body=json.dumps(body), headers={**headers, "Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    return r.status, json.loads(data) if data else None


def health(conn: http.client.HTTPConnection) -> int:
    conn.request("GET", "/health")
    r = conn.getresponse()
    r.read()
    return r.status


def test_strings_that_are_not_unicode_are_400s_naming_the_field_on_one_connection(victim: Server) -> None:
    start = len(victim.output(tail=None))
    url = urlsplit(victim.url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=60)
    try:
        for name, (path, body, param) in CASES.items():
            status, answer = post(conn, path, body, victim.headers)  # a dropped connection raises here, next time
            assert status == 400, (name, answer)
            assert answer["error"]["param"] == param, (name, answer)
            assert answer["error"]["code"] == 400 and "not valid Unicode" in answer["error"]["message"], answer
            assert health(conn) == 200
    finally:
        conn.close()
    assert "Traceback" not in victim.output(tail=None)[start:]


@pytest.fixture
def failing_app() -> Iterator[str]:
    """A FastAPI app with the shared guards and a route that fails unexpectedly, served by uvicorn on 127.0.0.1."""
    from agentrl.serve.http_guards import install_guards

    app = FastAPI()
    install_guards(app, api_key="k", max_request_bytes=1 << 20)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret detail /home/someone/.cache/file")

    @app.get("/health")
    async def ok() -> dict[str, str]:
        return {"ok": "yes"}

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_a_500_keeps_the_connection_and_never_carries_the_exception_text(failing_app: str) -> None:
    host, port = failing_app.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        for _ in range(3):
            conn.request("GET", "/boom", headers={"Authorization": "Bearer k"})
            r = conn.getresponse()
            body = r.read().decode()
            assert r.status == 500 and "RuntimeError" in body and "secret" not in body, body
            assert r.getheader("connection", "").lower() != "close"
            assert health(conn) == 200  # the same socket: before, uvicorn had closed it after the 500
    finally:
        conn.close()


def test_the_error_body_escapes_what_it_cannot_encode() -> None:
    from agentrl.serve.openai_protocol import error_body

    body = error_body(f"no model {S}", "NotFoundError", 404, S)
    assert json.dumps(body, ensure_ascii=False).encode("utf-8")
    assert body["error"]["param"] == "a\\ud800b"
