"""What the training gateway refuses: requests it would otherwise answer with something other than they ask.

During training every LLM call of an episode samples with the trainer's ``data.sampling`` (the behaviour policy the
loss assumes) and returns the exact tokens sampled. A request that asks for other sampling, for stop strings that
would cut the text, for a forced tool call, for several choices or for log-probs is therefore refused with 400 and a
message naming the field, instead of being silently answered differently. Sampling fields equal to the trainer's
(or a ``max_tokens`` at least as large) are accepted, so agents that always send them keep working.
"""

from __future__ import annotations

from agentrl.engines.base import SamplingParams
from agentrl.serve.openai_protocol import ChatCompletionRequest, unsupported_fields
from agentrl.serve.served_model import ServeError


def check_request(req: ChatCompletionRequest, sampling: SamplingParams) -> None:
    """Raise a 400 `ServeError` naming the first field the gateway cannot honour."""
    extra = {k: v for k, v in (req.model_extra or {}).items() if k != "stream"}
    bad = unsupported_fields(extra)
    if bad:
        raise ServeError(f"the training gateway does not implement {', '.join(bad)} (leave them unset)", param=bad[0])
    stream = (req.model_extra or {}).get("stream")
    if stream not in (None, True, False):
        raise ServeError(f"stream must be a boolean, got {stream!r}", param="stream")
    for name, problem in _conflicts(req, sampling):
        raise ServeError(
            f"`{name}`: {problem}. While training, every LLM call samples with the trainer's data.sampling "
            f"(temperature={sampling.temperature}, top_p={sampling.top_p}, top_k={sampling.top_k}, "
            f"max_tokens={sampling.max_tokens}) and returns the exact tokens sampled: leave `{name}` unset",
            param=name)


def _conflicts(req: ChatCompletionRequest, s: SamplingParams) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    checks = [
        ("n", req.n != 1, "only n = 1 is supported (RTPO makes the samples of a turn itself)"),
        ("temperature", req.temperature is not None and req.temperature != s.temperature,
         f"{req.temperature} differs from the trainer's"),
        ("top_p", req.top_p is not None and req.top_p != s.top_p, f"{req.top_p} differs from the trainer's"),
        ("top_k", req.top_k is not None and max(req.top_k, 0) != s.top_k, f"{req.top_k} differs from the trainer's"),
        ("seed", req.seed is not None, "the trainer derives each turn's seed (reproducible rollouts)"),
        ("stop", bool(req.stop), "stop strings would cut the sampled tokens"),
        ("stop_token_ids", bool(req.stop_token_ids), "stop tokens are the trainer's"),
        ("ignore_eos", req.ignore_eos, "stop tokens are the trainer's"),
        ("include_stop_str_in_output", req.include_stop_str_in_output, "not supported"),
        ("max_tokens", limit is not None and limit < s.max_tokens,
         f"{limit} is below the trainer's max_tokens"),
        ("logprobs", bool(req.logprobs) or bool(req.top_logprobs), "log-probs are recorded by the trainer"),
        ("tool_choice", req.tool_choice not in (None, "auto", "none"),
         "a forced tool call is not enforced while training (only 'auto' and 'none')"),
        ("add_generation_prompt", not req.add_generation_prompt, "every call is a new assistant turn"),
    ]
    for name, bad, problem in checks:
        if bad:
            found.append((name, problem))
    return found
