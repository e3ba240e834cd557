"""What stands between an HTTP client and the engine: the API key, the error shape, and client disconnects.

Shared by ``agentrl serve`` and any other OpenAI-compatible front end of agentrl, so that all of them fail the same
way:

* **One error shape.** Every error answer, whatever raised it (a `ServeError`, a request that does not validate,
  a body that is not JSON or not UTF-8 or nests too deeply, an unknown route), is vLLM's/OpenAI's
  ``{"error": {"message", "type", "param", "code"}}``. A client error (4xx) writes one log line; a server fault
  (500) writes a traceback and answers with the exception type only (messages can hold file-system paths).
* **A client that leaves costs nothing more.** `until_disconnected` runs a handler's work as a task and cancels
  it when the client closes the connection; the engine then drops the request from its batch
  (`agentrl.engines.hf.HFEngine`).
* **A body has a size limit** (`BodyLimit`, ``--max-request-mb``, 16 MiB by default): a larger declared
  ``Content-Length`` is refused before a byte of it is read, a chunked body once it passes the limit; both 413
  ``RequestTooLargeError``. A client cannot make the server buffer an unbounded body.
* **The key guards everything but ``/health``** (the API, ``/metrics``, ``/docs``, ``/openapi.json``), and is
  checked before the body is read: a caller without the key makes the server parse nothing.
* **A server fault keeps the connection.** An unexpected exception is answered by `InternalErrors` (500) and goes
  no further: past it, Starlette would re-raise and uvicorn close the kept-alive connection.
* **Strings that are not Unicode** (lone UTF-16 surrogates, which JSON can write) are a 400 naming the field
  (`agentrl.serve.openai_protocol.check_body`), and any message that quotes one back is escaped.

`install_guards` puts all of this on an app; ``agentrl serve`` and the training gateway both use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from agentrl.serve.openai_protocol import NOT_TEXT, error_body, printable
from agentrl.serve.served_model import ServeError

log = logging.getLogger("agentrl.serve")
ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
T = TypeVar("T")
OPEN_PATHS = ("/health",)
"""Paths that never need the key (load balancers and start-up probes call them)."""
_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 405: "MethodNotAllowedError",
          413: "RequestTooLargeError", 422: "BadRequestError"}


class BearerAuth:
    """Pure ASGI middleware: every path but `OPEN_PATHS` needs ``Authorization: Bearer <key>`` (constant-time
    compare); 401 ``{"error": "Unauthorized"}`` otherwise, as vLLM answers."""

    def __init__(self, app: ASGIApp, key: str, answer: dict[str, Any] | None = None) -> None:
        self.app = app
        self._digest = hashlib.sha256(key.encode()).digest()
        self._answer = answer or {"error": "Unauthorized"}

    def _authorised(self, scope: dict[str, Any]) -> bool:
        headers = dict(scope.get("headers") or [])
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(
            hashlib.sha256(token.encode()).digest(), self._digest)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        guarded = scope["type"] == "http" and scope.get("method") != "OPTIONS" and str(
            scope.get("path", "")) not in OPEN_PATHS
        if guarded and not self._authorised(scope):
            await JSONResponse(self._answer, status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)


class RequestTooLarge(HTTPException):
    """A request body over `BodyLimit`'s limit (413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than the server's limit of {limit} bytes "
                              "(agentrl serve --max-request-mb)")


class BodyLimit:
    """Pure ASGI middleware: refuse bodies over ``max_bytes`` with 413 (see the module docstring)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            exc = RequestTooLarge(self.max_bytes)
            log.info("%s %s -> 413: %s", scope.get("method"), scope.get("path"), exc.detail)
            await JSONResponse(error_body(str(exc.detail), _TYPES[413], 413), status_code=413)(scope, receive, send)
            return
        seen = 0

        async def counted() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:  # a chunked body (no length declared) that keeps coming
                    raise RequestTooLarge(self.max_bytes)
            return message

        await self.app(scope, counted, send)


class InternalErrors:
    """Pure ASGI middleware: an exception no handler took becomes a 500 in the OpenAI shape (its type, never its
    message: messages can hold file-system paths), logged once with its traceback, and is not raised further, so
    uvicorn keeps the connection open."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            if started:  # half an answer is out: nothing valid can follow it
                return
            body = error_body(f"internal error ({type(exc).__name__}); the server log has the details",
                              "InternalServerError", 500)
            await JSONResponse(body, status_code=500)(scope, receive, send)


def install_guards(app: FastAPI, *, api_key: str | None, max_request_bytes: int,
                   unauthorised: dict[str, Any] | None = None, not_found_hint: str = "") -> None:
    """Everything the module docstring lists, on ``app``: the error answers, server faults that keep the
    connection, the key (checked before the body is read; ``unauthorised`` is the 401 body) and the body limit."""
    if api_key is not None and not api_key.strip():
        raise ValueError("api_key must be a non-empty string or None (no authentication)")
    install_error_handlers(app, not_found_hint=not_found_hint)
    app.add_middleware(InternalErrors)
    if api_key:
        app.add_middleware(BearerAuth, key=api_key, answer=unauthorised)
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes)  # outermost: before the key check reads anything


def _client_error(request: Request, status: int, message: str, err_type: str, param: str | None) -> JSONResponse:
    log.info("%s %s -> %d %s: %s", request.method, request.url.path, status, err_type, printable(message))
    return JSONResponse(error_body(message, err_type, status, param), status_code=status)


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """A one-line message and the ``param`` (dotted field path, or None) of a request that did not validate."""
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":  # its loc holds a byte offset, not a field
        return f"the request body is not valid JSON: {(first.get('ctx') or {}).get('error', 'decode error')}", None
    if first.get("type") == NOT_TEXT:  # raised for the whole body: the field is in the context
        return str(first.get("msg")), str((first.get("ctx") or {}).get("field")) or None
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    msg = str(first.get("msg", "invalid request"))
    return (f"{where}: {msg}" if where else msg), where or None


def _http_message(exc: HTTPException) -> str:
    cause = exc.__cause__
    if isinstance(cause, UnicodeDecodeError):
        return "the request body is not UTF-8 encoded JSON"
    if isinstance(cause, RecursionError):
        return "the request body nests too deeply to parse"
    return str(exc.detail)


def install_error_handlers(app: FastAPI, *, not_found_hint: str = "") -> None:
    """Answer every error with the OpenAI error JSON (see the module docstring); ``not_found_hint`` is added to
    the message of an unknown route's 404. Server faults are `InternalErrors`' (added by `install_guards`)."""

    @app.exception_handler(ServeError)
    async def serve_error(request: Request, exc: ServeError) -> JSONResponse:
        return _client_error(request, exc.status, exc.message, exc.err_type, exc.param)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc)
        return _client_error(request, 400, message, "BadRequestError", param)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        err_type = _TYPES.get(exc.status_code, "BadRequestError" if exc.status_code < 500 else "InternalServerError")
        hint = not_found_hint if exc.status_code == 404 else ""
        return _client_error(request, exc.status_code, _http_message(exc) + hint, err_type, None)

    @app.exception_handler(ClientDisconnected)
    async def gone(_: Request, __: ClientDisconnected) -> Response:
        return Response(status_code=499)  # nobody reads it; nginx's code for "client closed request"


class ClientDisconnected(Exception):  # noqa: N818 - names the event, as asyncio.CancelledError does
    """The client closed the connection before the answer was ready; its work was cancelled."""


async def _disconnected(request: Request) -> None:
    """Return once the client has gone (the body is already read, so the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; if the client disconnects first, cancel it and raise `ClientDisconnected`."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
        watcher.cancel()
    if task.cancelled() or not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await task
        log.info("%s %s: client disconnected, request cancelled", request.method, request.url.path)
        raise ClientDisconnected
    return task.result()
