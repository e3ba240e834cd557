"""The training gateway: an OpenAI-compatible endpoint per episode, so agents that only speak the OpenAI API train
with turn-level credit and RTPO replay.

``POST /episodes/<episode-id>/v1/chat/completions`` (streaming and not, tools, n = 1) and ``GET .../v1/models``
on 127.0.0.1. Each request goes through that episode's `agentrl.agents.llm.LLMClient`: the messages are converted
as ``agentrl serve`` converts them (`agentrl.serve.serving.template_messages`), rendered with the one chat
rendering (`agentrl.chat.render.render_prompt`), sampled (or, for an RTPO sibling before its branch turn, checked
against the trunk's prompt and replayed), recorded with exact prompt ids, response ids and behaviour log-probs,
and parsed for tool calls. The answer is built from that record; tool call ids ``call_<turn>_<i>`` are the same on
replay, so a replayed conversation renders the same.

Sampling belongs to the trainer (``data.sampling``): a request asking for other sampling (temperature, top_p,
seed, stop strings, logprobs, a forced ``tool_choice``, n > 1, ...) or for fields ``agentrl serve`` does not
implement is refused with 400 (`agentrl.serve.openai_protocol.unsupported_fields`). Unknown and finished episodes
get 404, a wrong key 401, in the OpenAI error shape. A turn limit or full context (`EpisodeTruncated`) and a
replay mismatch (`ReplayMismatchError`) answer 400 and are recorded on the episode's route, so
`agentrl.agents.http_agent.HTTPAgent` ends the episode truncated or failed whatever the agent did with the error.

The server runs as a task on the rollout loop, not on a loop of its own: the episodes' clients, their locks and
the engine belong to that loop (`agentrl.collect.runtime`), so a handler simply awaits ``llm.chat`` with no
cross-thread hand-off, and the gateway ends with the loop. It costs no parallelism: forward passes run in worker
threads, and long conversations render in one too. An async agent ``run`` runs on the loop, a sync one in a worker
thread. The server starts lazily, on the first episode that asks for a route.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response, StreamingResponse
from jinja2 import TemplateError

from agentrl.agents.base import EpisodeTruncated, ReplayMismatchError
from agentrl.agents.http_agent import EpisodeRoute
from agentrl.agents.llm import AssistantReply, LLMClient
from agentrl.chat.render import max_token_bytes, text_chars
from agentrl.chat.tools import tool_call_id
from agentrl.serve.gateway_checks import check_request
from agentrl.serve.gateway_stream import stream_chunks
from agentrl.serve.http_guards import install_guards
from agentrl.serve.openai_protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatMessage,
    FunctionCall,
    ModelCard,
    ModelList,
    ToolCall,
    UsageInfo,
    error_body,
)
from agentrl.serve.served_model import ServeError
from agentrl.serve.serving import template_messages

log = logging.getLogger(__name__)


@dataclass
class _Episode:
    llm: LLMClient
    route: EpisodeRoute
    inflight: set[asyncio.Future[AssistantReply]] = field(default_factory=set)


class TrainingGateway:
    """Episode-scoped OpenAI chat completions over episodes' LLM clients (`agentrl.agents.http_agent.EpisodeRoutes`).

    Args:
        host: Bind address (loopback: the agents run on this machine).
        port: Port; 0 picks a free one.
        api_key: Bearer token every ``/episodes`` request needs; None: a random one (agents get it with the route).
        model_name: Model id reported by ``/models`` and in answers when a request names none.
        remember_finished: How many finished episode ids are remembered (their requests get "finished" 404s).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
                 model_name: str = "agentrl", remember_finished: int = 100_000) -> None:
        if not 0 <= port < 65536:
            raise ValueError(f"gateway port must be in [0, 65535], got {port}")
        if api_key is not None and not api_key.strip():
            raise ValueError("the training gateway's api_key must be a non-empty string or None (a random key)")
        self.host, self.port = host, port
        self.api_key = api_key or secrets.token_urlsafe(24)
        self.model_name = model_name
        self.remember_finished = remember_finished
        self._episodes: dict[str, _Episode] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._bound_port = 0
        self._starting: asyncio.Lock | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server."""
        if not self._bound_port:
            raise RuntimeError("the training gateway is not running (it starts with the first episode)")
        return f"http://{self.host}:{self._bound_port}"

    # ------------------------------------------------------------------ routes (EpisodeRoutes)

    async def open(self, llm: LLMClient) -> EpisodeRoute:
        """Register ``llm`` under a fresh, unguessable episode id; returns its OpenAI ``base_url`` and key."""
        await self._ensure_started()
        episode_id = uuid.uuid4().hex
        route = EpisodeRoute(episode_id, f"{self.url}/episodes/{episode_id}/v1", self.api_key)
        self._episodes[episode_id] = _Episode(llm, route)
        return route

    async def close(self, route: EpisodeRoute) -> None:
        """Finish the episode: cancel its requests still in flight (so no turn lands after the episode ended) and
        answer later ones with 404."""
        episode = self._episodes.pop(route.episode_id, None)
        self._finished[route.episode_id] = None
        while len(self._finished) > self.remember_finished:
            self._finished.popitem(last=False)
        if episode is None:
            return
        pending = list(episode.inflight)
        for future in pending:
            future.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def aclose(self) -> None:
        """Stop the server (it also stops when the rollout loop is closed)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            self._server.should_exit = True
            await asyncio.gather(task, return_exceptions=True)
        self._bound_port = 0

    # ------------------------------------------------------------------ server

    async def _ensure_started(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use, or a new rollout loop (a second fit): start afresh there
            self._loop, self._task, self._bound_port = loop, None, 0
            self._starting = asyncio.Lock()
            self._episodes.clear()
        assert self._starting is not None
        async with self._starting:
            if self._task is not None and not self._task.done():
                return
            await self._start()

    async def _start(self) -> None:
        import uvicorn

        config = uvicorn.Config(create_gateway_app(self), host=self.host, port=self.port, lifespan="off",
                                log_level="warning", access_log=False)
        server = uvicorn.Server(config)
        self._server = server
        self._task = asyncio.get_running_loop().create_task(_serve(server), name="agentrl-training-gateway")
        while not server.started:
            if self._task.done():
                error = self._task.exception()
                raise RuntimeError(f"the training gateway could not listen on {self.host}:{self.port}: {error!r}")
            await asyncio.sleep(0.01)
        self._bound_port = int(server.servers[0].sockets[0].getsockname()[1])
        log.info("training gateway listening on %s", self.url)

    # ------------------------------------------------------------------ requests

    def episode(self, episode_id: str) -> _Episode:
        """The live episode ``episode_id`` (404 when it is unknown or finished)."""
        episode = self._episodes.get(episode_id)
        if episode is not None:
            return episode
        if episode_id in self._finished:
            raise _finished(episode_id)
        raise ServeError(f"The episode `{episode_id}` does not exist.", 404, "NotFoundError", "episode_id")

    async def chat(self, episode: _Episode, req: ChatCompletionRequest) -> Response:
        """Answer one chat completion with the episode's next turn."""
        if episode.route.stopped is not None:
            raise _stopped(episode.route.stopped)
        check_request(req, episode.llm.sampling)
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        shown = None if req.tool_choice == "none" else tools
        self._check_size(episode, text_chars(req.messages) + text_chars(shown))
        conv = template_messages(episode.llm.tokenizer, req.messages, shown)
        reply = await self._turn(episode, conv, shown)
        message, finish = reply_message(reply, parse_tools=bool(shown))
        turn = reply.turn
        prompt, completion = len(turn.prompt_ids), len(turn.response_ids)
        usage = UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
        model = req.model or self.model_name
        with_ids = bool(req.return_token_ids)
        extra = req.model_extra or {}
        if extra.get("stream"):
            options = extra.get("stream_options") or {}
            include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
            lines = stream_chunks(episode.llm.tokenizer, model=model, message=message, finish_reason=finish,
                                  raw_text=reply.text, response_ids=list(turn.response_ids),
                                  prompt_ids=list(turn.prompt_ids), with_ids=with_ids,
                                  usage=usage if include_usage else None)
            return StreamingResponse(lines, media_type="text/event-stream")
        choice = ChatCompletionResponseChoice(index=0, message=message, finish_reason=finish,
                                              token_ids=list(turn.response_ids) if with_ids else None)
        body = ChatCompletionResponse(model=model, choices=[choice], usage=usage,
                                      prompt_token_ids=list(turn.prompt_ids) if with_ids else None)
        return JSONResponse(body.model_dump())

    @staticmethod
    def _check_size(episode: _Episode, chars: int) -> None:
        """A conversation that cannot fit the context whatever it tokenizes to truncates the episode at once, as a
        full context does (`EpisodeTruncated`), before anything renders it."""
        llm = episode.llm
        ctx = llm.engine.max_context
        if chars > ctx * max_token_bytes(llm.tokenizer):
            stopped = EpisodeTruncated(f"turn {len(llm.turns)}: the messages hold {chars} characters, more than the "
                                       f"{ctx}-token context window can hold")
            episode.route.stopped = stopped
            raise _stopped(stopped)

    async def _turn(self, episode: _Episode, conv: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None) -> AssistantReply:
        future = asyncio.ensure_future(episode.llm.chat(conv, tools=tools))
        episode.inflight.add(future)
        try:
            return await future
        except (EpisodeTruncated, ReplayMismatchError) as exc:
            episode.route.stopped = exc
            raise _stopped(exc) from exc
        except TemplateError as exc:
            raise ServeError(f"chat template failed: {exc}", param="messages") from exc
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if future.cancelled() and (current is None or not current.cancelling()):
                raise _finished(episode.route.episode_id) from None
            raise
        finally:
            episode.inflight.discard(future)


async def _serve(server: Any) -> None:
    try:
        await server.serve()
    except SystemExit as exc:  # uvicorn exits on a startup failure (port in use): that must not stop the loop
        raise RuntimeError(f"uvicorn stopped with exit code {exc.code}") from None
    except asyncio.CancelledError:  # the rollout loop is closing: close the socket before it goes
        server.force_exit = True
        with contextlib.suppress(Exception):
            await server.shutdown()
        raise


def _finished(episode_id: str) -> ServeError:
    return ServeError(f"The episode `{episode_id}` has finished.", 404, "NotFoundError", "episode_id")


def _stopped(exc: BaseException) -> ServeError:
    if isinstance(exc, ReplayMismatchError):
        return ServeError(f"ReplayMismatchError: {exc}", 400, "ReplayMismatchError", "messages")
    return ServeError(f"the episode was truncated: {exc}", 400, "EpisodeTruncated", "messages")


def reply_message(reply: AssistantReply, *, parse_tools: bool) -> tuple[ChatMessage, str]:
    """The OpenAI assistant message of a recorded turn and its finish reason (``agentrl serve``'s shape for
    ``tool_choice: auto``: the raw text when no call parsed, else the text around the calls and the calls)."""
    finish = reply.finish_reason
    if not (parse_tools and reply.tool_calls):
        return ChatMessage(role="assistant", content=reply.text), finish
    calls = [ToolCall(id=tool_call_id(reply.turn.index, i),
                      function=FunctionCall(name=c.name, arguments=json.dumps(c.arguments)))
             for i, c in enumerate(reply.tool_calls)]
    return ChatMessage(role="assistant", content=reply.content or None, tool_calls=calls), (
        "tool_calls" if finish == "stop" else finish)


def create_gateway_app(gateway: TrainingGateway) -> FastAPI:
    """The FastAPI app of ``gateway``: episode-scoped ``/v1`` routes behind the bearer key."""
    app = FastAPI(title="agentrl training gateway", docs_url=None, redoc_url=None, openapi_url=None)
    # the same guards as `agentrl serve`: key checked before the body is read, 16 MiB limit, one error shape
    install_guards(app, api_key=gateway.api_key, max_request_bytes=16 << 20, unauthorised=error_body(
        "Incorrect API key provided: use the api_key handed to your run function.", "AuthenticationError", 401),
        not_found_hint=" (routes are /episodes/<episode-id>/v1/...)")

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/episodes/{episode_id}/v1/models")
    async def models(episode_id: str) -> JSONResponse:
        gateway.episode(episode_id)
        return JSONResponse(ModelList(data=[ModelCard(id=gateway.model_name)]).model_dump())

    @app.post("/episodes/{episode_id}/v1/chat/completions")
    async def chat(episode_id: str, req: ChatCompletionRequest) -> Response:
        return await gateway.chat(gateway.episode(episode_id), req)

    return app
