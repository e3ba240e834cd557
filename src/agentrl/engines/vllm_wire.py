"""The ``/v1/completions`` wire format of `agentrl.engines.vllm.VLLMEngine`: the request body for token-id prompts
and the parse of vLLM's answer into a `Completion` (token ids and log-probs as the server returned them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrl.engines.base import Completion, SamplingParams
from agentrl.engines.errors import EngineProtocolError
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
