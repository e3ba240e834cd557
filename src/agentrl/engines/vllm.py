"""`VLLMEngine`: the rollout engine as an HTTP client of vLLM's OpenAI-compatible server (or ``agentrl serve``).

* **Token ids in and out.** ``generate`` posts the exact prompt ids to ``/v1/completions`` with
  ``return_token_ids`` and ``logprobs: 0`` and reads ``choices[0].token_ids`` and ``logprobs.token_logprobs``
  (a stop token is the last id). The response's ``prompt_token_ids`` must equal the ids sent.
* **Stops.** A ``stop_token_ids`` tuple is sent with ``ignore_eos: true``: the completion stops on exactly those ids.
* **Log-probs.** ``logprobs_mode`` declares the server's ``--logprobs-mode``; with vLLM's default ``raw_logprobs``
  a temperature other than 1 raises `LogprobsModeError` before any rollout (`agentrl.engines.logprobs_mode`).
* **Servers.** Each episode is pinned to one of several base URLs (a hash of its id) for its prefix cache.
* **Faults.** ``timeout`` bounds a whole call (`EngineTimeout`). A request that never reached the server, or got a
  5xx, is resent with backoff up to ``retries`` times (`EngineUnavailable`); one the server timed out on is not.
  A server that lost the adapter (it restarted) gets it pushed again and the request is sent once more.
* **Pushes while requests are in flight** (``data.max_staleness`` >= 1): a request a push overtook is resent naming
  the new adapter; the previous adapter is unloaded once no request names it.
* **Weight sync is a LoRA hot-load.** ``update_weights`` saves the adapter to ``adapter_dir/<run>/agentrl-v<N>``,
  posts ``/v1/load_lora_adapter`` to every server, routes later requests to it, then unloads and deletes the
  previous one (server flags in docs/vllm.md). Preflight refuses a policy without LoRA (no full-weight sync).
  ``<run>``: this engine's own folder (`VLLMEngine.push_dir`: why).
* **Every push verified.** Before any request names the new adapter, every server decodes a fixed prompt greedily
  under it and the trainer scores those tokens with the pushed policy (`agentrl.engines.push_check`): a server
  that answers with other weights raises `PushNotApplied` naming its URL, the adapter and the version.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import itertools
import logging
import os
import secrets
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from agentrl.engines import logprobs_mode as lpm
from agentrl.engines import push_check as pcheck
from agentrl.engines.base import Completion, RolloutEngine, SamplingParams
from agentrl.engines.errors import (
    FULL_WEIGHT_REFUSAL,
    EngineProtocolError,
    EngineRequestError,
    EngineTimeout,
    EngineUnavailable,
    FullWeightSyncUnsupported,
    check_lora,
)
from agentrl.engines.logprobs_mode import LogprobsMode
from agentrl.engines.push_check import ProbeResult, PushCheck, PushNotApplied
from agentrl.engines.vllm_wire import completion_request, parse_completion
from agentrl.engines.vllm_wire import error_message as _error_message
from agentrl.engines.vllm_wire import json_body as _json
from agentrl.engines.vllm_wire import model_info as _model_info
from agentrl.engines.vllm_wire import reached_server as _reached_server
from agentrl.engines.vllm_wire import save_adapter as _save_adapter

log = logging.getLogger(__name__)
API_KEY_ENV = "AGENTRL_API_KEY"
DEFAULT_PUSH_CHECK = PushCheck()
__all__ = ["API_KEY_ENV", "EngineProtocolError", "EngineRequestError", "EngineTimeout", "EngineUnavailable",
           "FullWeightSyncUnsupported", "PushCheck", "PushNotApplied", "VLLMEngine", "VLLMEngineSpec",
           "completion_request", "parse_completion"]


def _server_index(session: str, n: int) -> int:
    return int.from_bytes(hashlib.blake2b(session.encode(), digest_size=8).digest(), "little") % n


class VLLMEngine:
    """Rollouts from one or more vLLM-compatible servers; weights pushed as LoRA adapters.

    Args:
        base_urls: Server URLs (``http://host:port``, without ``/v1``).
        adapter_dir: Folder for pushed adapters, readable by every server (required for ``update_weights``). Each
            engine writes into a new subfolder of it, `push_dir`.
        api_key: Bearer token of the servers (default: ``$AGENTRL_API_KEY``).
        timeout: Seconds one call may take in all (a whole completion; retries and backoff included).
        connect_timeout: Seconds to establish a connection.
        retries: Extra attempts after a connection error or 5xx answer (never after a read timeout).
        backoff: Seconds before the first retry; doubled at each further one.
        max_context: Context window; default: ``max_model_len`` from ``/v1/models`` (smallest over servers).
        model: Served base model name; default: the first model of ``/v1/models``.
        unload_previous: Unload the previous adapter (and delete its folder) after a push.
        logprobs_mode: The servers' ``--logprobs-mode`` (``raw_logprobs``, vLLM's default, or
            ``processed_logprobs``; ``agentrl serve`` is processed).
        push_check: How every push is verified (`agentrl.engines.push_check`); None skips the probe (only for
            servers that do not compute, such as protocol fakes).
    """

    def __init__(self, base_urls: Sequence[str], *, adapter_dir: str | None = None, api_key: str | None = None,
                 timeout: float = 300.0, connect_timeout: float = 10.0, retries: int = 3, backoff: float = 0.5,
                 max_context: int | None = None, model: str | None = None, unload_previous: bool = True,
                 logprobs_mode: LogprobsMode = "raw_logprobs",
                 push_check: PushCheck | None = DEFAULT_PUSH_CHECK) -> None:
        if not base_urls:
            raise ValueError("engine.base_urls must list at least one server URL")
        lpm.check_mode_name(logprobs_mode)
        self.logprobs_mode = logprobs_mode
        self.base_urls = [u.rstrip("/") for u in base_urls]
        self.adapter_dir = Path(adapter_dir).resolve() if adapter_dir else None
        self.push_dir = (self.adapter_dir / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
                         if self.adapter_dir else None)
        """Where this engine's adapters are written: a folder of its own. vLLM keys its prefix cache on the
        adapter's name *and path* and keeps cached blocks after an unload, so a second run (or a resumed one) that
        pushed ``agentrl-v1`` to the first run's path would be served key/value blocks computed with the first
        run's weights; a new path per engine makes those keys new."""
        self.api_key = api_key or os.environ.get(API_KEY_ENV) or None
        self.deadline = float(timeout)
        self.timeout = httpx.Timeout(timeout, connect=min(connect_timeout, timeout))
        self.retries, self.backoff = retries, backoff
        self.unload_previous = unload_previous
        self.push_check = push_check
        self.push_check_seconds = 0.0  # the probes' wall time, summed over pushes (part of each push's time)
        self.last_probe: list[ProbeResult] = []
        self._probe_ids: list[int] | None = None
        self._expected: tuple[str, list[int], pcheck.TrainerScores] | None = None  # the last verified push
        self._max_context = max_context
        self._base_model = model
        self._model: str | None = model
        self._adapter: str | None = None
        self._version = 0
        self._round_robin = itertools.count()
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._reloading: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._in_flight: collections.Counter[str] = collections.Counter()  # requests in flight per model name
        self._pushing: asyncio.Future[None] | None = None  # set while update_weights loads a new adapter
        if logging.getLogger("httpx").level == logging.NOTSET:
            logging.getLogger("httpx").setLevel(logging.WARNING)  # not one INFO line per rollout request

    # ------------------------------------------------------------------ protocol

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_context(self) -> int:
        if self._max_context is None:  # a blocking look-up, once: the protocol's property is synchronous
            with httpx.Client(timeout=self.timeout, headers=self._headers()) as client:
                self._max_context = min(_model_info(client.get(f"{u}/v1/models"), u)[1]
                                        for u in self.base_urls)
        return self._max_context

    @property
    def model(self) -> str | None:
        """The model name requests are sent to: the base model, then the latest pushed adapter."""
        return self._model

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, *,
                       session: str | None = None) -> Completion:
        if not prompt_ids:
            raise ValueError("generate: prompt_ids is empty")
        await self._ensure_info()
        assert self._max_context is not None and self._model is not None
        version, model = self._version, self._model
        room = self._max_context - len(prompt_ids)
        if room <= 0:
            return Completion([], [], "length", policy_version=version, prompt_len=len(prompt_ids))
        lpm.check_temperature(self.logprobs_mode, sampling.temperature)
        url = self._url_for(session)
        max_tokens = min(sampling.max_tokens, room)
        try:
            response = await self._post(url, completion_request(prompt_ids, sampling, model, max_tokens), model)
        except EngineRequestError as exc:
            if exc.status == 404 and (self._pushing is not None or model != self._model):
                await self._push_done()  # a push overtook this request: send it again, naming the new adapter
                version, model = self._version, self._model
                body = completion_request(prompt_ids, sampling, model, max_tokens)
                response = await self._post(url, body, model)
            elif self._adapter_lost(exc, model):
                await self._reload_adapter(url, model)  # the server restarted: push the adapter again, resend once
                response = await self._post(url, completion_request(prompt_ids, sampling, model, max_tokens), model)
            else:
                raise
        return parse_completion(_json(response, url, "/v1/completions"), prompt_ids, version)

    async def _post(self, url: str, body: dict[str, Any], model: str) -> httpx.Response:
        """POST a completion naming ``model``, counted in flight for that name (a push unloads it only after)."""
        self._in_flight[model] += 1
        try:
            return await self._call("POST", url, "/v1/completions", body)
        finally:
            self._in_flight[model] -= 1

    async def _push_done(self) -> None:
        if self._pushing is not None:
            await asyncio.shield(self._pushing)

    async def preflight(self, sampling: SamplingParams) -> None:
        """Before any rollout: `LogprobsModeError` if the declared log-prob mode does not report sampling at
        ``sampling.temperature``, or if a server's ``/server_info`` (vLLM dev mode) reports another mode."""
        lpm.check_temperature(self.logprobs_mode, sampling.temperature)
        for url in self.base_urls:
            try:
                response = await self._call("GET", url, "/server_info?config_format=json")
            except EngineRequestError:
                continue  # no dev endpoints (404) or not allowed: the declaration stands
            try:
                info = response.json()
            except ValueError:
                continue  # not vLLM's endpoint: the declaration stands
            lpm.check_reported(url, self.logprobs_mode, lpm.reported_mode(info))

    async def update_weights(self, policy: Any, *, version: int | None = None) -> None:
        """Save the policy's LoRA adapter and hot-load it on every server as ``agentrl-v<version>``."""
        check_lora(bool(getattr(policy, "uses_lora", False)))
        if self.push_dir is None:
            raise ValueError("VLLMEngine.update_weights needs adapter_dir (model.engine.init_args.adapter_dir): a "
                             "folder the servers can read")
        await self._ensure_info()
        new_version = self._version + 1 if version is None else int(version)
        name = f"agentrl-v{new_version}"
        path = self.push_dir / name
        await asyncio.to_thread(_save_adapter, policy, path)
        self._pushing = asyncio.get_running_loop().create_future()
        try:
            await asyncio.gather(*(self._load(url, name, path) for url in self.base_urls))
            if self.push_check is not None:  # before any request names the new adapter
                await self._verify(policy, name, new_version, self.push_check)
            previous = self._adapter
            self._model, self._adapter, self._version = name, name, new_version
        finally:
            self._pushing.set_result(None)
            self._pushing = None
        if self.unload_previous and previous is not None and previous != name:
            while self._in_flight[previous]:  # requests still decoding with it (vLLM keeps it while they run)
                await asyncio.sleep(0.01)
            await asyncio.gather(*(self._unload(url, previous) for url in self.base_urls))
            shutil.rmtree(self.push_dir / previous, ignore_errors=True)

    async def _verify(self, policy: Any, name: str, version: int, check: PushCheck) -> None:
        """The parity probe of `agentrl.engines.push_check` on every server: `PushNotApplied` names the first
        server whose greedy ids or log-probs under ``name`` are not the trainer's. The trainer's scores are kept
        to verify a later re-push of the same adapter (a restarted server) without the policy."""
        began = time.perf_counter()
        if self._probe_ids is None:
            self._probe_ids = pcheck.probe_prompt(policy.tokenizer)
        prompt = self._probe_ids
        done = await asyncio.gather(*(self._probe(url, name, version, check) for url in self.base_urls))
        served = time.perf_counter() - began
        results, scored = [], {}
        for url, out in zip(self.base_urls, done, strict=True):
            key = tuple(out.token_ids)
            if key not in scored:  # servers that agree on the ids share one trainer forward
                scored[key] = await asyncio.to_thread(pcheck.trainer_scores, policy, prompt, out.token_ids)
            results.append(pcheck.compare(url, name, version, out.token_ids, out.logprobs, scored[key], check))
        self._expected = (name, results[0].token_ids, scored[tuple(results[0].token_ids)])
        self.last_probe = results
        spent = time.perf_counter() - began
        self.push_check_seconds += spent
        log.info("push v%d verified on %d server(s) in %.3f s (servers %.3f s, trainer %.3f s): largest log-prob "
                 "gap %.4f", version, len(results), spent, served, spent - served,
                 max(r.max_abs_diff for r in results))

    async def _probe(self, url: str, name: str, version: int, check: PushCheck) -> Completion:
        """The probe prompt decoded greedily by ``url`` under adapter ``name`` (EOS ignored)."""
        assert self._probe_ids is not None
        body = completion_request(self._probe_ids, SamplingParams(max_tokens=check.tokens, temperature=0.0,
                                                                  stop_token_ids=()), name, check.tokens)
        response = await self._call("POST", url, "/v1/completions", body)
        return parse_completion(_json(response, url, "/v1/completions"), self._probe_ids, version)

    async def _verify_repush(self, url: str, name: str) -> None:
        """A re-pushed adapter (a restarted server) checked against the scores kept at its push."""
        if self.push_check is None or self._expected is None or self._expected[0] != name:
            return
        _, ids, scores = self._expected
        out = await self._probe(url, name, self._version, self.push_check)
        result = pcheck.compare(url, name, self._version, out.token_ids, out.logprobs, scores, self.push_check,
                                scored_ids=ids)
        log.info("re-push of %s to %s verified: largest log-prob gap %.4f", name, url, result.max_abs_diff)

    async def shutdown(self) -> None:
        """Close the HTTP connections."""
        if self._client is not None and self._client_loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = self._client_loop = None

    # ------------------------------------------------------------------ HTTP

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _http(self) -> httpx.AsyncClient:
        """One client per event loop (an AsyncClient's connections belong to the loop that opened them)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
            self._client = httpx.AsyncClient(timeout=self.timeout, headers=self._headers(), limits=limits)
            self._client_loop = loop
        return self._client

    def _url_for(self, session: str | None) -> str:
        n = len(self.base_urls)
        i = next(self._round_robin) % n if session is None else _server_index(session, n)
        return self.base_urls[i]

    async def _call(self, method: str, url: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        """One request within ``timeout`` (whole call): resent after connection errors and 5xx, not after a read
        timeout (the server has it); 4xx raise at once."""
        try:
            async with asyncio.timeout(self.deadline):
                return await self._attempts(method, url, path, body)
        except TimeoutError as exc:
            raise EngineTimeout(url, path, self.deadline) from exc

    async def _attempts(self, method: str, url: str, path: str, body: dict[str, Any] | None) -> httpx.Response:
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response = await self._http().request(method, url + path, json=body)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                if _reached_server(exc) and method != "GET":
                    raise EngineUnavailable(url, attempt + 1, f"{last} (not resent: the server may still be "
                                            "working on it)") from exc
                continue
            if response.status_code >= 500:
                last = f"HTTP {response.status_code}: {response.text[:300]}"
                continue
            if response.status_code >= 400:
                raise EngineRequestError(url, response.status_code, _error_message(response))
            return response
        raise EngineUnavailable(url, self.retries + 1, last)

    async def _ensure_info(self) -> None:
        if self._max_context is not None and self._model is not None:
            return
        infos = [_model_info(await self._call("GET", u, "/v1/models"), u) for u in self.base_urls]
        if self._base_model is None:
            self._base_model = infos[0][0]
        if self._model is None:
            self._model = self._base_model
        if self._max_context is None:
            self._max_context = min(ctx for _, ctx in infos)

    async def _load(self, url: str, name: str, path: Path, *, replace: bool = True) -> None:
        body = {"lora_name": name, "lora_path": str(path)}
        try:
            await self._call("POST", url, "/v1/load_lora_adapter", body)
        except EngineRequestError as exc:
            if exc.status != 400 or "already" not in str(exc):
                raise
            if not replace:  # another request re-pushed it first
                return
            # same version pushed again (a resumed run, a restarted trainer): replace it
            await self._unload(url, name)
            await self._call("POST", url, "/v1/load_lora_adapter", body)
        log.info("server %s serves adapter %s", url, name)

    def _adapter_lost(self, exc: EngineRequestError, model: str) -> bool:
        """A 404 naming the pushed adapter: the server no longer has it (it restarted since the push)."""
        return (exc.status == 404 and model == self._adapter and self.push_dir is not None
                and model in str(exc) and "does not exist" in str(exc))

    async def _reload_adapter(self, url: str, name: str) -> None:
        """Load adapter ``name`` on ``url`` again from ``adapter_dir``; concurrent callers share one load."""
        key = (url, name)
        pending = self._reloading.get(key)
        if pending is None:
            log.warning("server %s lost adapter %s (restarted?): pushing it again", url, name)
            assert self.push_dir is not None
            pending = asyncio.ensure_future(self._load_verified(url, name))
            self._reloading[key] = pending
            pending.add_done_callback(lambda _: self._reloading.pop(key, None))
        await asyncio.shield(pending)

    async def _load_verified(self, url: str, name: str) -> None:
        assert self.push_dir is not None
        await self._load(url, name, self.push_dir / name, replace=False)
        await self._verify_repush(url, name)

    async def _unload(self, url: str, name: str) -> None:
        try:
            await self._call("POST", url, "/v1/unload_lora_adapter", {"lora_name": name})
        except EngineRequestError as exc:
            if exc.status != 404:  # already gone (e.g. a server restarted since the load)
                raise


class VLLMEngineSpec:
    """Config of the vLLM HTTP engine (``model.engine`` in YAML); see `VLLMEngine` for the arguments.

    Args:
        base_urls: Server URLs, e.g. ``[http://127.0.0.1:8000]``.
        adapter_dir: Folder for pushed LoRA adapters, readable by every server.
        api_key: Bearer token of the servers (default: ``$AGENTRL_API_KEY``; prefer the variable to the file).
        timeout: Seconds one call may take in all (retries and backoff included).
        retries: Extra attempts after a connection error or 5xx answer (never after a read timeout).
        backoff: Seconds before the first retry (doubled each time).
        max_context: Context window (default: from ``/v1/models``).
        model: Served base model name (default: the first of ``/v1/models``).
        unload_previous: Unload the previous adapter after each push.
        logprobs_mode: The servers' ``--logprobs-mode`` (``processed_logprobs`` for a temperature other than 1).
        verify_push: Probe every server after every push (`agentrl.engines.push_check`); keep it on.
        push_tolerance: Largest accepted gap between a server's and the trainer's probe log-probs (nats).
        probe_tokens: Greedy tokens the probe decodes.
    """

    def __init__(self, base_urls: list[str], adapter_dir: str = "adapters", api_key: str | None = None,
                 timeout: float = 300.0, retries: int = 3, backoff: float = 0.5, max_context: int | None = None,
                 model: str | None = None, unload_previous: bool = True,
                 logprobs_mode: LogprobsMode = "raw_logprobs", verify_push: bool = True,
                 push_tolerance: float = PushCheck.tolerance, probe_tokens: int = PushCheck.tokens) -> None:
        lpm.check_mode_name(logprobs_mode)
        self.push_check = PushCheck(tokens=probe_tokens, tolerance=push_tolerance) if verify_push else None
        if not base_urls or any(not u.startswith(("http://", "https://")) for u in base_urls):
            raise ValueError(f"engine.base_urls must be http(s) URLs, got {base_urls!r}")
        if timeout <= 0:
            raise ValueError(f"engine.timeout must be > 0 seconds, got {timeout}")
        if retries < 0:
            raise ValueError(f"engine.retries must be >= 0, got {retries}")
        if backoff < 0:
            raise ValueError(f"engine.backoff must be >= 0, got {backoff}")
        if max_context is not None and max_context < 2:
            raise ValueError(f"engine.max_context must be >= 2, got {max_context}")
        self.base_urls, self.adapter_dir, self.api_key = list(base_urls), adapter_dir, api_key
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.max_context, self.model, self.unload_previous = max_context, model, unload_previous
        self.logprobs_mode = logprobs_mode

    def check_sampling(self, sampling: SamplingParams) -> None:
        """The config-time check (`agentrl.training.command.preflight`): `LogprobsModeError` for a temperature the
        declared log-prob mode does not report."""
        lpm.check_temperature(self.logprobs_mode, sampling.temperature)

    def check_policy(self, uses_lora: bool) -> None:
        """The config-time check of the policy this engine serves: a ``ValueError`` (what `agentrl fit`'s preflight
        reports) without LoRA."""
        if not uses_lora:
            raise ValueError(FULL_WEIGHT_REFUSAL)

    def build(self, policy: Any) -> RolloutEngine:
        return VLLMEngine(self.base_urls, adapter_dir=self.adapter_dir, api_key=self.api_key, timeout=self.timeout,
                          retries=self.retries, backoff=self.backoff, max_context=self.max_context,
                          model=self.model, unload_previous=self.unload_previous, logprobs_mode=self.logprobs_mode,
                          push_check=self.push_check)
