"""Which distribution a vLLM server's log-probs describe, checked against the temperature agentrl samples at.

vLLM's ``--logprobs-mode`` is a *server* flag (``ModelConfig.logprobs_mode``), not a request field:

* ``raw_logprobs`` (vLLM's default) — the model's log-softmax *before* temperature, penalties and top-k/top-p: at a
  temperature other than 1 these are not the log-probs of the distribution the server sampled from;
* ``processed_logprobs`` — after every processor, temperature included: the sampling distribution (with top-k/top-p
  on, the truncated one, which is the true behaviour policy).

A client cannot see the flag in the OpenAI-compatible API. vLLM shows it only in ``GET /server_info`` (JSON:
``vllm_config.model_config.logprobs_mode``), a development endpoint that exists when the server runs with
``VLLM_SERVER_DEV_MODE=1``. So the user *declares* the server's mode (``VLLMEngine(logprobs_mode=...)``), agentrl
refuses a temperature other than 1 (or 0) with ``raw_logprobs`` before any rollout, and where ``/server_info`` answers,
the declaration is checked against it. ``agentrl serve`` returns log-probs after temperature: declare
``processed_logprobs`` for it.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

LogprobsMode = Literal["raw_logprobs", "processed_logprobs"]
MODES: tuple[str, ...] = get_args(LogprobsMode)
KEY = "model.engine.init_args.logprobs_mode"


class LogprobsModeError(ValueError):
    """The server's log-prob mode does not report the distribution agentrl samples from (or contradicts the
    declared mode)."""


def check_mode_name(mode: str) -> None:
    """A ``ValueError`` naming the key when ``mode`` is not one agentrl can use."""
    if mode not in MODES:
        raise ValueError(f"{KEY} must be one of {list(MODES)} (the server's --logprobs-mode), got {mode!r}")


def check_temperature(mode: str, temperature: float) -> None:
    """Raise `LogprobsModeError` when log-probs in ``mode`` are not those of sampling at ``temperature``."""
    if mode == "raw_logprobs" and temperature not in (0.0, 1.0):
        raise LogprobsModeError(
            f"data.sampling.temperature={temperature:g}, but {KEY} is raw_logprobs (vLLM's default): the server "
            "would report log-probs before temperature, not those of the distribution it samples from. Start vLLM "
            f"with --logprobs-mode processed_logprobs and set {KEY}: processed_logprobs (agentrl serve: always "
            "processed), or sample at temperature 1.")


def reported_mode(server_info: Any) -> str | None:
    """The ``logprobs_mode`` in a ``/server_info?config_format=json`` answer, or None when it has none."""
    try:
        mode = server_info["vllm_config"]["model_config"]["logprobs_mode"]
    except (KeyError, TypeError):
        return None
    return str(mode) if mode is not None else None


def check_reported(url: str, declared: str, reported: str | None) -> None:
    """Raise `LogprobsModeError` when a server reports a mode other than the declared one."""
    if reported is not None and reported != declared:
        raise LogprobsModeError(f"{url} runs with --logprobs-mode {reported} (its /server_info), but {KEY} "
                                f"declares {declared}: make them agree")
