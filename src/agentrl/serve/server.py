"""``agentrl serve``: the embedded engine behind a vLLM-compatible HTTP API (FastAPI + uvicorn).

It lets the HTTP rollout path (`agentrl.engines.vllm.VLLMEngine`) and agents written for any OpenAI-compatible
endpoint run on a machine without a GPU, and it is what the HTTP tests run against. Endpoints, with vLLM's
request and response shapes (`agentrl.serve.openai_protocol`):

* ``GET /health`` (never needs the key), ``GET /v1/models``;
* ``POST /v1/completions`` — a text or token-id prompt (or a list of them), ``logprobs``, ``return_token_ids``,
  ``n``, ``seed``, ``stop``, ``stop_token_ids``, ``max_tokens``, ``temperature``, ``top_p``, ``top_k``;
* ``POST /v1/chat/completions`` — messages and tools (Hermes tool calls; see `agentrl.serve.serving`);
* ``POST /v1/load_lora_adapter`` / ``POST /v1/unload_lora_adapter`` — hot-load a peft adapter folder into the
  served model (``--lora-rank``); one adapter is resident at a time (see `agentrl.serve.served_model`).

The engine runs on the server's event loop; forward passes run in worker threads. The server binds 127.0.0.1
unless told otherwise; with ``--api-key`` (or ``AGENTRL_API_KEY``) every ``/v1`` request needs
``Authorization: Bearer <key>`` (401 ``{"error": "Unauthorized"}`` otherwise, as vLLM answers).

Example::

    agentrl serve --model smollm2-135m-instruct --lora-rank 8 --lora-alpha 16 \\
        --lora-target-modules q_proj v_proj --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from agentrl.chat.tools import HermesToolParser
from agentrl.engines.vllm import API_KEY_ENV  # one name for the key on both sides of the protocol
from agentrl.serve.openai_protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    LoadLoRAAdapterRequest,
    ModelCard,
    ModelList,
    PromptTokenUsageInfo,
    UnloadLoRAAdapterRequest,
    UsageInfo,
    error_body,
    unsupported_fields,
)
from agentrl.serve.served_model import ServedModel, ServeError
from agentrl.serve.serving import (
    Generation,
    chat_logprobs,
    chat_message,
    check_prompt_ids,
    completion_logprobs,
    finish_reason,
    forced_prefix,
    forced_stop,
    gen_spec,
    generate,
    render_chat,
)

log = logging.getLogger(__name__)
_GUARDED = ("/v1",)
ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


class BearerAuth:
    """Pure ASGI middleware: ``/v1`` requests need ``Authorization: Bearer <key>`` (constant-time compare)."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self._digest = hashlib.sha256(key.encode()).digest()

    def _authorised(self, scope: dict[str, Any]) -> bool:
        headers = dict(scope.get("headers") or [])
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(
            hashlib.sha256(token.encode()).digest(), self._digest)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        guarded = scope["type"] == "http" and scope.get("method") != "OPTIONS" and str(
            scope.get("path", "")).startswith(_GUARDED)
        if guarded and not self._authorised(scope):
            await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _check_supported(req: CompletionRequest | ChatCompletionRequest) -> None:
    bad = unsupported_fields(req.model_extra or {})
    if bad:
        raise ServeError(f"agentrl serve does not implement {', '.join(bad)} (leave them unset)", param=bad[0])


def _usage(prompts: Sequence[list[int]], gens: Sequence[Sequence[Generation]]) -> UsageInfo:
    prompt_tokens = sum(len(p) for p in prompts)
    completion_tokens = sum(len(g.completion.token_ids) for group in gens for g in group)
    cached = sum(group[0].completion.cached_tokens for group in gens if group)
    return UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                     total_tokens=prompt_tokens + completion_tokens,
                     prompt_tokens_details=PromptTokenUsageInfo(cached_tokens=cached))


def _prompts(req: CompletionRequest, served: ServedModel) -> list[list[int]]:
    """Token ids of every prompt of a completion request (text is encoded as vLLM does)."""
    raw = req.prompt
    items: list[Any] = [raw] if isinstance(raw, str) or (raw and isinstance(raw[0], int)) else list(raw)
    out = []
    for item in items:
        ids = (list(served.tokenizer.encode(item, add_special_tokens=req.add_special_tokens))
               if isinstance(item, str) else list(item))
        check_prompt_ids(ids, served.vocab_size)
        out.append(ids)
    if not out:
        raise ServeError("Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
    return out


async def _completions(served: ServedModel, req: CompletionRequest) -> CompletionResponse:
    served.check_model(req.model)
    _check_supported(req)
    prompts = _prompts(req, served)
    max_tokens = 16 if req.max_tokens is None else req.max_tokens  # vLLM: null means the default, 16
    specs = [gen_spec(req, served, len(p), max_tokens, req.logprobs or 0) for p in prompts]
    async with served.engine_for(req.model) as (engine, base):
        gens = await asyncio.gather(*(generate(served, engine, base, p, s) for p, s in zip(prompts, specs,
                                                                                          strict=True)))
    tok, as_ids = served.tokenizer, bool(req.return_tokens_as_token_ids)
    choices = [
        CompletionResponseChoice(
            index=i * req.n + j, text=g.text, finish_reason=finish_reason(g), stop_reason=g.stop_reason,
            logprobs=None if req.logprobs is None else completion_logprobs(tok, g, req.logprobs, as_ids),
            token_ids=list(g.completion.token_ids) if req.return_token_ids else None,
            prompt_token_ids=prompt if req.return_token_ids else None,
        )
        for i, (prompt, group) in enumerate(zip(prompts, gens, strict=True)) for j, g in enumerate(group)
    ]
    return CompletionResponse(model=req.model or served.name, choices=choices, usage=_usage(prompts, gens))


async def _chat(served: ServedModel, req: ChatCompletionRequest, parser: HermesToolParser) -> ChatCompletionResponse:
    served.check_model(req.model)
    _check_supported(req)
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
    if choice != "none" and not tools:
        raise ServeError("When using `tool_choice`, `tools` must be set.", param="tool_choice")
    prefix = forced_prefix(choice, tools)
    text = render_chat(served.tokenizer, req.messages, tools, req.add_generation_prompt, parser) + prefix
    prompt = list(served.tokenizer.encode(text, add_special_tokens=False))
    check_prompt_ids(prompt, served.vocab_size)
    spec = gen_spec(req, served, len(prompt), req.max_completion_tokens or req.max_tokens,
                    (req.top_logprobs or 0) if req.logprobs else 0)
    spec.stop_when = forced_stop(served.tokenizer, choice)
    async with served.engine_for(req.model) as (engine, base):
        gens = await generate(served, engine, base, prompt, spec)
    choices = []
    for j, g in enumerate(gens):
        message, finish = chat_message(g, choice, prefix, parser)
        logprobs = chat_logprobs(served.tokenizer, g, req.top_logprobs or 0,
                                 bool(req.return_tokens_as_token_ids)) if req.logprobs else None
        choices.append(ChatCompletionResponseChoice(
            index=j, message=message, logprobs=logprobs, finish_reason=finish, stop_reason=g.stop_reason,
            token_ids=list(g.completion.token_ids) if req.return_token_ids else None))
    return ChatCompletionResponse(model=req.model or served.name, choices=choices, usage=_usage([prompt], [gens]),
                                  prompt_token_ids=prompt if req.return_token_ids else None)


def _models(served: ServedModel) -> ModelList:
    cards = [ModelCard(id=served.name, root=served.policy.name, max_model_len=served.max_context)]
    if served.resident is not None:
        cards.append(ModelCard(id=served.resident.name, root=served.resident.path, parent=served.name))
    return ModelList(data=cards)


def _add_routes(app: FastAPI, served: ServedModel) -> None:
    parser = HermesToolParser()

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse(_models(served).model_dump())

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> JSONResponse:
        return JSONResponse((await _completions(served, req)).model_dump())

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest) -> JSONResponse:
        return JSONResponse((await _chat(served, req, parser)).model_dump())

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(req: LoadLoRAAdapterRequest) -> Response:
        if not req.lora_name or not req.lora_path:
            raise ServeError("Both 'lora_name' and 'lora_path' must be provided.", 400, "InvalidUserInput")
        await served.load_adapter(req.lora_name, req.lora_path)
        log.info("loaded LoRA adapter '%s' from %s", req.lora_name, req.lora_path)
        return Response(f"Success: LoRA adapter '{req.lora_name}' added successfully.", status_code=200)

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(req: UnloadLoRAAdapterRequest) -> Response:
        served.unload_adapter(req.lora_name)
        return Response(f"Success: LoRA adapter '{req.lora_name}' removed successfully.", status_code=200)


def create_app(served: ServedModel, *, api_key: str | None = None) -> FastAPI:
    """The FastAPI app serving ``served``; with ``api_key``, ``/v1`` routes need it as a bearer token."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        for engine in (served.base, served.adapter_engine):
            if engine is not None:
                await engine.shutdown()

    app = FastAPI(title="agentrl serve", lifespan=lifespan)
    if api_key:
        app.add_middleware(BearerAuth, key=api_key)

    @app.exception_handler(ServeError)
    async def serve_error(_: Request, exc: ServeError) -> JSONResponse:
        return JSONResponse(error_body(exc.message, exc.err_type, exc.status, exc.param), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{where}: {first.get('msg', 'invalid request')}" if where else str(first.get("msg", exc))
        return JSONResponse(error_body(message, "BadRequestError", 400, where or None), status_code=400)

    @app.exception_handler(Exception)
    async def internal(_: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed")
        return JSONResponse(error_body(f"{type(exc).__name__}: {exc}", "InternalServerError", 500), status_code=500)

    _add_routes(app, served)
    return app


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentrl serve", description="Serve a model over a vLLM-compatible HTTP API "
                                "(completions, chat completions with tools, LoRA hot-loading).")
    model_help = ("smollm2-135m-instruct (default, as agentrl fit), tiny-random, a model folder, a .gguf file or a "
                  "hub id; given as `agentrl serve MODEL` (as vllm serve) or `--model MODEL`")
    p.add_argument("model_arg", nargs="?", default=None, metavar="MODEL", help=model_help)
    p.add_argument("--model", default=None, help=model_help)
    p.add_argument("--served-model-name", default=None, help="name clients use in 'model' (default: --model)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help=f"require this bearer token on /v1 (default: ${API_KEY_ENV})")
    p.add_argument("--max-batch-size", type=int, default=32, help="most sequences decoded together")
    p.add_argument("--prefix-cache-tokens", type=int, default=32768, help="prefix KV store budget (0 disables)")
    p.add_argument("--max-model-len", type=int, default=None, help="context window (default: the model's)")
    p.add_argument("--lora-rank", type=int, default=None, help="peft-wrap the model for LoRA hot-loading")
    p.add_argument("--lora-alpha", type=int, default=None, help="LoRA alpha (default: 2 x rank)")
    p.add_argument("--lora-target-modules", nargs="+", default=None, help="LoRA target modules (default: "
                   "agentrl's LoRASettings default)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--seed", type=int, default=0, help="initialisation seed of random models (tiny-random)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse ``agentrl serve`` arguments; the model comes positionally or from ``--model`` (default: SmolLM2)."""
    from agentrl.models.loading import SMOLLM2

    parser = build_parser()
    args = parser.parse_args(list(argv))
    if args.model_arg is not None and args.model is not None and args.model_arg != args.model:
        parser.error(f"the model is given twice, as {args.model_arg!r} and --model {args.model!r}: give it once")
    args.model = args.model_arg or args.model or SMOLLM2
    del args.model_arg
    return args


def serve_main(argv: Sequence[str]) -> int:
    """Entry point of ``agentrl serve``."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import uvicorn

    from agentrl.models.loading import ModelLoadError
    from agentrl.models.policy import LoRASettings, Policy

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    if args.host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        log.warning("agentrl serve is listening on %s without an API key: anyone who reaches it can use it",
                    args.host)
    lora = None
    if args.lora_rank is not None:
        lora = LoRASettings(r=args.lora_rank, alpha=args.lora_alpha or 2 * args.lora_rank)
        if args.lora_target_modules:
            lora = LoRASettings(r=lora.r, alpha=lora.alpha, target_modules=list(args.lora_target_modules))
    try:
        policy = Policy(args.model, lora=lora, dtype=args.dtype, seed=args.seed)
    except ModelLoadError as exc:
        log.error("%s", exc)
        return 2
    served = ServedModel(policy, args.served_model_name or args.model, max_batch_size=args.max_batch_size,
                         prefix_cache_tokens=args.prefix_cache_tokens, max_context=args.max_model_len)
    uvicorn.run(create_app(served, api_key=api_key), host=args.host, port=args.port, log_level=args.log_level)
    return 0
