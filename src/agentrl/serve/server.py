"""``agentrl serve``: the embedded engine behind a vLLM-compatible HTTP API (FastAPI + uvicorn).

It lets the HTTP rollout path (`agentrl.engines.vllm.VLLMEngine`) and agents written for any OpenAI-compatible
endpoint run on a machine without a GPU, and it is what the HTTP tests run against. Endpoints, with vLLM's
request and response shapes (`agentrl.serve.openai_protocol`):

* ``GET /health`` (never needs the key), ``GET /v1/models``, ``GET /metrics`` (Prometheus text: requests running
  and waiting, generated tokens, requests cancelled because their client left, requests failed alone);
* ``POST /v1/completions`` — a text or token-id prompt (or a list of them), ``logprobs``, ``return_token_ids``,
  ``n``, ``seed``, ``stop``, ``stop_token_ids``, ``max_tokens``, ``temperature``, ``top_p``, ``top_k``;
* ``POST /v1/chat/completions`` — messages and tools (Hermes tool calls; see `agentrl.serve.serving`);
* both with ``stream: true`` (`agentrl.serve.server_stream`: the finished answer as vLLM's chunks);
* ``POST /v1/load_lora_adapter`` / ``POST /v1/unload_lora_adapter`` — hot-load a peft adapter folder into the
  served model (``--lora-rank``); one adapter is resident at a time, loaded only from inside
  ``--lora-modules-root`` (see `agentrl.serve.served_model`).

The engine runs on the server's event loop; forward passes, chat rendering and tokenizing run in worker threads,
after the prompt's size is checked from its length (`MAX_SEQUENCES` caps prompts × ``n``), so that one request
cannot hold the loop. A completion whose client
disconnects is cancelled and leaves the decode batch. The server binds 127.0.0.1 unless told otherwise; with
``--api-key`` (or ``AGENTRL_API_KEY``) every request but ``/health`` needs ``Authorization: Bearer <key>`` (401
``{"error": "Unauthorized"}`` otherwise, as vLLM answers), the ``/docs`` and ``/openapi.json`` pages included.
Errors have the OpenAI shape (`agentrl.serve.http_guards`).

Example::

    agentrl serve --model smollm2-135m-instruct --lora-rank 8 --lora-alpha 16 \\
        --lora-target-modules q_proj v_proj --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from agentrl.chat.render import max_token_bytes, text_chars
from agentrl.chat.tools import HermesToolParser
from agentrl.engines.vllm import API_KEY_ENV  # one name for the key on both sides of the protocol
from agentrl.serve.http_guards import install_guards, until_disconnected
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
    unsupported_fields,
)
from agentrl.serve.served_model import DEFAULT_LORA_ROOT, ServedModel, ServeError
from agentrl.serve.server_stream import stream_response, take_stream
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


MAX_SEQUENCES = 256
"""Most sequences one request may ask for (prompts × ``n``): ``[[1]] * 10000`` with ``n: 64``, a 50 KB body, asked
for 640,000 and held the server for minutes."""


def _check_sequences(prompts: int, n: int) -> None:
    if prompts * n > MAX_SEQUENCES:
        raise ServeError(f"the request asks for {prompts} prompt(s) x n={n} = {prompts * n} sequences; agentrl serve "
                         f"takes at most {MAX_SEQUENCES} per request (send several requests)",
                         param="prompt" if prompts > 1 else "n")


def _check_chars(chars: int, served: ServedModel, param: str) -> None:
    """Refuse text that cannot fit the context whatever it tokenizes to (`max_token_bytes`), before any work."""
    ctx, per_token = served.max_context, max_token_bytes(served.tokenizer)
    if chars > ctx * per_token:
        raise ServeError(f"This model's maximum context length is {ctx} tokens. However, the {param} holds {chars} "
                         f"characters, more than {ctx} tokens can cover (at most {per_token} bytes each). Please "
                         "reduce the length of the prompt.", param=param)


def _check_length(ids: list[int], served: ServedModel, param: str) -> None:
    if len(ids) > served.max_context:
        raise ServeError(f"This model's maximum context length is {served.max_context} tokens. However, the "
                         f"{param} has {len(ids)} tokens. Please reduce the length of the prompt.", param=param)


async def _prompts(req: CompletionRequest, served: ServedModel) -> list[list[int]]:
    """Token ids of every prompt of a completion request (text is encoded as vLLM does). The counts and sizes are
    checked first, from the lengths alone; the text is encoded in a worker thread, off the event loop."""
    raw = req.prompt
    items: list[Any] = [raw] if isinstance(raw, str) or (raw and isinstance(raw[0], int)) else list(raw)
    if not items:
        raise ServeError("Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
    _check_sequences(len(items), req.n)
    for item in items:
        if isinstance(item, str):
            _check_chars(len(item), served, "prompt")
        else:
            _check_length(item, served, "prompt")
    tokenizer, special = served.tokenizer, req.add_special_tokens

    def encode() -> list[list[int]]:
        return [list(tokenizer.encode(item, add_special_tokens=special)) if isinstance(item, str) else list(item)
                for item in items]

    out = await asyncio.to_thread(encode) if any(isinstance(i, str) for i in items) else encode()
    for ids in out:
        _check_length(ids, served, "prompt")
        check_prompt_ids(ids, served.vocab_size)
    return out


async def _completions(served: ServedModel, req: CompletionRequest) -> CompletionResponse:
    served.check_model(req.model)
    _check_supported(req)
    prompts = await _prompts(req, served)
    max_tokens = 16 if req.max_tokens is None else req.max_tokens  # vLLM: null means the default, 16
    specs = [gen_spec(req, served, len(p), max_tokens, req.logprobs or 0) for p in prompts]
    async with served.engine_for(req.model) as (engine, _base):
        gens = await asyncio.gather(*(generate(served, engine, p, s) for p, s in zip(prompts, specs,
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
    _check_sequences(1, req.n)
    _check_chars(text_chars(req.messages) + text_chars(tools), served, "messages")
    tokenizer = served.tokenizer

    def render() -> list[int]:  # a worker thread: a long conversation renders and tokenizes off the event loop
        text = render_chat(tokenizer, req.messages, tools, req.add_generation_prompt, parser) + prefix
        return list(tokenizer.encode(text, add_special_tokens=False))

    prompt = await asyncio.to_thread(render)
    _check_length(prompt, served, "messages")
    check_prompt_ids(prompt, served.vocab_size)
    spec = gen_spec(req, served, len(prompt), req.max_completion_tokens or req.max_tokens,
                    (req.top_logprobs or 0) if req.logprobs else 0)
    spec.stop_when = forced_stop(served.tokenizer, choice)
    async with served.engine_for(req.model) as (engine, _base):
        gens = await generate(served, engine, prompt, spec)
    choices = []
    for j, g in enumerate(gens):
        message, finish = chat_message(g, choice, prefix, parser, {t["function"]["name"] for t in tools or []})
        logprobs = chat_logprobs(served.tokenizer, g, req.top_logprobs or 0,
                                 bool(req.return_tokens_as_token_ids)) if req.logprobs else None
        choices.append(ChatCompletionResponseChoice(
            index=j, message=message, logprobs=logprobs, finish_reason=finish, stop_reason=g.stop_reason,
            token_ids=list(g.completion.token_ids) if req.return_token_ids else None))
    return ChatCompletionResponse(model=req.model or served.name, choices=choices, usage=_usage([prompt], [gens]),
                                  prompt_token_ids=prompt if req.return_token_ids else None)


def _models(served: ServedModel) -> ModelList:
    """The served names; ``root`` is a name too, never a file-system path (vLLM shows the adapter's path)."""
    cards = [ModelCard(id=served.name, root=served.name, max_model_len=served.max_context)]
    if served.resident is not None:
        cards.append(ModelCard(id=served.resident.name, root=served.resident.name, parent=served.name))
    return ModelList(data=cards)


_METRICS = (  # name, type, help, value
    ("num_requests_running", "gauge", "Requests in a decode batch.", lambda e: e.running),
    ("num_requests_waiting", "gauge", "Requests waiting for a batch slot.", lambda e: e.waiting),
    ("requests_total", "counter", "Requests received by the engines.", lambda e: e.stats.requests),
    ("generation_tokens_total", "counter", "Tokens sampled.", lambda e: e.stats.generated_tokens),
    ("prompt_tokens_total", "counter", "Prompt tokens prefilled (not from the prefix cache).",
     lambda e: e.stats.prefill_tokens),
    ("request_cancelled_total", "counter", "Requests dropped because their client disconnected.",
     lambda e: e.stats.cancelled),
    ("request_failed_total", "counter", "Requests that failed alone (their batch went on).",
     lambda e: e.stats.failed),
)


def metrics_text(served: ServedModel) -> str:
    """Prometheus text exposition of both engines' counters, summed (names as vLLM's, prefix ``agentrl:``)."""
    engines = [e for e in (served.base, served.adapter_engine) if e is not None]
    lines = []
    for name, kind, doc, value in _METRICS:
        lines += [f"# HELP agentrl:{name} {doc}", f"# TYPE agentrl:{name} {kind}",
                  f"agentrl:{name} {sum(int(value(e)) for e in engines)}"]
    return "\n".join(lines) + "\n"


def _add_routes(app: FastAPI, served: ServedModel) -> None:
    parser = HermesToolParser()

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(metrics_text(served), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse(_models(served).model_dump())

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Response:
        stream = take_stream(req)  # `stream: true`: the same answer as events (agentrl.serve.server_stream)
        resp = await until_disconnected(request, _completions(served, req))
        return stream_response(served.tokenizer, resp, stream) if stream else JSONResponse(resp.model_dump())

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, request: Request) -> Response:
        stream = take_stream(req)
        resp = await until_disconnected(request, _chat(served, req, parser))
        return stream_response(served.tokenizer, resp, stream) if stream else JSONResponse(resp.model_dump())

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(req: LoadLoRAAdapterRequest) -> Response:
        if not req.lora_name or not req.lora_path:
            raise ServeError("Both 'lora_name' and 'lora_path' must be provided.", 400, "InvalidUserInput")
        await served.load_adapter(req.lora_name, req.lora_path)
        log.info("loaded LoRA adapter '%s' from %s", req.lora_name, served.resident.path if served.resident else "?")
        return Response(f"Success: LoRA adapter '{req.lora_name}' added successfully.", status_code=200)

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(req: UnloadLoRAAdapterRequest) -> Response:
        served.unload_adapter(req.lora_name)
        return Response(f"Success: LoRA adapter '{req.lora_name}' removed successfully.", status_code=200)


def create_app(served: ServedModel, *, api_key: str | None = None, max_request_bytes: int = 16 << 20) -> FastAPI:
    """The FastAPI app serving ``served``; with ``api_key``, ``/v1`` routes need it as a bearer token; bodies over
    ``max_request_bytes`` are refused (413)."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        for engine in (served.base, served.adapter_engine):
            if engine is not None:
                await engine.shutdown()

    app = FastAPI(title="agentrl serve", lifespan=lifespan)
    install_guards(app, api_key=api_key, max_request_bytes=max_request_bytes)
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
    p.add_argument("--max-request-mb", type=float, default=16.0, help="largest request body, MiB (413 above it)")
    p.add_argument("--prefix-cache-tokens", type=int, default=32768, help="prefix KV store budget (0 disables)")
    p.add_argument("--max-model-len", type=int, default=None, help="context window (default: the model's)")
    p.add_argument("--lora-rank", type=int, default=None, help="peft-wrap the model for LoRA hot-loading")
    p.add_argument("--lora-alpha", type=int, default=None, help="LoRA alpha (default: 2 x rank)")
    p.add_argument("--lora-modules-root", default=DEFAULT_LORA_ROOT, help="the only folder LoRA adapters load from;"
                   " a trainer's adapter_dir must lie inside it (default: ./adapters, the trainer's default)")
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
    if not args.max_request_mb > 0:
        parser.error(f"--max-request-mb must be > 0, got {args.max_request_mb}")
    if args.dtype == "bfloat16":  # on a CPU without native bf16, decoding would crawl (agentrl.models.precision)
        import torch

        from agentrl.models.precision import check_explicit_bf16

        try:
            check_explicit_bf16("--dtype", torch.device("cpu"))
        except ValueError as exc:
            parser.error(str(exc))
    try:
        args.api_key = resolve_api_key(args.api_key, os.environ)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def resolve_api_key(given: str | None, environ: Mapping[str, str]) -> str | None:
    """The key from ``--api-key``, else from ``$AGENTRL_API_KEY``; None when neither is set. An empty (or blank)
    key is refused: it would otherwise turn authentication off without a word."""
    if given is not None:
        if not given.strip():
            raise ValueError("--api-key is empty: give a key, or leave the option out to serve without one")
        return given
    from_env = environ.get(API_KEY_ENV)
    if from_env is not None and not from_env.strip():
        raise ValueError(f"${API_KEY_ENV} is set but empty: set a key, or unset it to serve without one")
    return from_env


def serve_main(argv: Sequence[str]) -> int:
    """Entry point of ``agentrl serve``."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import uvicorn

    from agentrl.models.loading import ModelLoadError
    from agentrl.models.policy import LoRASettings, Policy

    api_key = args.api_key
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
                         prefix_cache_tokens=args.prefix_cache_tokens, max_context=args.max_model_len,
                         lora_root=args.lora_modules_root)
    if lora is not None:
        log.info("LoRA adapters load only from %s (--lora-modules-root)", served.lora_root)
    app = create_app(served, api_key=api_key, max_request_bytes=int(args.max_request_mb * (1 << 20)))
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
