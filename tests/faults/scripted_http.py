"""A real HTTP/1.1 server on 127.0.0.1 whose answers a test scripts byte by byte: hang, drip, answer HTML.

Faults like "the server reads the request and never answers" or "it sends one byte every 0.1 s" cannot be asked of
`agentrl serve`, so these tests put a raw asyncio socket server on a free loopback port, in its own thread and
event loop, and let a handler write whatever the fault needs. Every request is recorded (method, path, body) so a
test can count what the client sent.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Request:
    method: str
    path: str
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body or b"null")


Handler = Callable[[Request, asyncio.StreamWriter], Awaitable[None]]


def response_head(status: int, content_type: str, length: int) -> bytes:
    return (f"HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {length}\r\n\r\n").encode()


async def answer(writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str = "application/json"
                 ) -> None:
    writer.write(response_head(status, content_type, len(body)) + body)
    await writer.drain()


class ScriptedServer:
    """``with ScriptedServer(handler) as server: ... server.url ... server.requests``."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[Request] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="scripted-http", daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def posts(self, path: str) -> int:
        return sum(r.method == "POST" and r.path == path for r in self.requests)

    async def _start(self) -> asyncio.base_events.Server:
        return await asyncio.start_server(self._connection, "127.0.0.1", 0)

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):  # handlers that hang or drip end with the test
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                request = Request(method, path, body)
                self.requests.append(request)
                await self.handler(request, writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()
