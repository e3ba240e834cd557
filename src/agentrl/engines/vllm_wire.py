"""The wire side of `agentrl.engines.vllm.VLLMEngine`: the ``/v1/completions`` request body for token-id prompts,
the parse of vLLM's answer into a `Completion` (token ids and log-probs as the server returned them), the model card
of ``/v1/models``, error bodies, and the atomic adapter write a server loads from."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from agentrl.engines.base import Completion, SamplingParams
from agentrl.engines.errors import EngineProtocolError, EngineRequestError
from agentrl.types import FinishReason

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def completion_request(prompt_ids: Sequence[int], sampling: SamplingParams, model: str,
                       max_tokens: int) -> dict[str, Any]:
    """The ``/v1/completions`` body for one token-id prompt (fields of vLLM's ``CompletionRequest``)."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "logprobs": 0,
        "return_token_ids": True,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
    }
    if sampling.top_k > 0:
        body["top_k"] = sampling.top_k  # omitted otherwise: vLLM versions differ on 0 vs -1 for "off"
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.stop_token_ids is not None:
        body["stop_token_ids"] = list(sampling.stop_token_ids)
        body["ignore_eos"] = True
    return body


def parse_completion(data: dict[str, Any], prompt_ids: Sequence[int], version: int) -> Completion:
    """A `Completion` from a ``/v1/completions`` answer to `completion_request`."""
    try:
        choice = data["choices"][0]
        token_ids = [int(t) for t in choice["token_ids"]]
        logprobs = choice["logprobs"]["token_logprobs"]
        reason = choice.get("finish_reason")
    except (KeyError, IndexError, TypeError) as exc:
        raise EngineProtocolError(f"completion answer lacks {exc}: is the server vLLM >= 0.10.2 (return_token_ids)?"
                                  f" got keys {sorted(data)}") from exc
    if len(logprobs) != len(token_ids) or any(lp is None for lp in logprobs):
        raise EngineProtocolError(f"{len(token_ids)} token ids but log-probs {logprobs!r:.200}")
    sent = choice.get("prompt_token_ids")
    if sent is not None and list(sent) != list(prompt_ids):
        raise EngineProtocolError("the server's prompt_token_ids differ from the ids sent (it re-tokenized or "
                                  "added special tokens): token-in/token-out is broken")
    usage = data.get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    finish = _FINISH.get(str(reason), "abort")
    info = {} if reason in _FINISH else {"finish_reason": reason}
    return Completion(token_ids, [float(x) for x in logprobs], finish, policy_version=version,
                      prompt_len=len(prompt_ids), cached_tokens=int(cached), info=info)


def reached_server(exc: httpx.TransportError) -> bool:
    """The request was sent and the server went quiet (read/write timeout): it may be working on it."""
    return isinstance(exc, httpx.ReadTimeout | httpx.WriteTimeout)


def json_body(response: httpx.Response, url: str, path: str) -> Any:
    """The answer's JSON, or `EngineProtocolError` naming the URL with an excerpt of what came instead."""
    try:
        return response.json()
    except ValueError as exc:
        excerpt = " ".join(response.text[:200].split()) or "(empty body)"
        kind = response.headers.get("content-type", "no content-type")
        raise EngineProtocolError(f"{url}{path} answered {response.status_code} with a body that is not JSON "
                                  f"({kind}): {excerpt!r}. Is base_urls pointing at a vLLM server (not a proxy or "
                                  "a web page)?") from exc


def error_message(response: httpx.Response) -> str:
    """The error text of a 4xx/5xx answer (vLLM's ``{"error": {"message": ...}}`` or the raw body), shortened."""
    try:
        data = response.json()
    except ValueError:
        return response.text[:300]
    err = data.get("error", data) if isinstance(data, dict) else data
    return str(err.get("message", err) if isinstance(err, dict) else err)[:500]


def save_adapter(policy: Any, path: Path) -> None:
    """Write the adapter to a temporary folder, then rename it into place (a server never reads half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save(tmp)
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)


def model_info(response: httpx.Response, url: str) -> tuple[str, int]:
    """The served model's name and ``max_model_len`` from a ``/v1/models`` answer (the first card that has one)."""
    if response.status_code != 200:
        raise EngineRequestError(url, response.status_code, error_message(response))
    data = json_body(response, url, "/v1/models")
    cards = (data.get("data") if isinstance(data, dict) else None) or []
    lengths = [c["max_model_len"] for c in cards if c.get("max_model_len")]
    if not cards or not lengths:
        raise EngineProtocolError(f"{url}/v1/models lists no model with max_model_len; set engine max_context")
    return str(cards[0]["id"]), int(lengths[0])
