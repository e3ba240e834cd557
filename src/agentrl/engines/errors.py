"""The errors of the HTTP rollout engine (`agentrl.engines.vllm.VLLMEngine`), each naming the server and what to do.

Kept apart from the client so the messages can be read (and imported) without the HTTP machinery;
`agentrl.engines.vllm` re-exports them.
"""

from __future__ import annotations


class EngineUnavailable(RuntimeError):  # noqa: N818 - named for what the user sees: the engine is unavailable
    """A server did not answer (connection refused, timeout, 5xx) after every retry."""

    def __init__(self, url: str, attempts: int, last_error: str) -> None:
        super().__init__(f"rollout server {url} is unavailable after {attempts} attempt(s): {last_error}. Is it "
                         "running and reachable? (model.engine.init_args.base_urls)")
        self.url = url


class EngineTimeout(EngineUnavailable):
    """A call did not complete within the engine's ``timeout`` (the whole call, retries included)."""

    def __init__(self, url: str, path: str, seconds: float) -> None:
        RuntimeError.__init__(self, f"rollout server {url} did not complete {path} within timeout={seconds:g} s "
                              "(the whole call, retries included); not resent. Is it overloaded? "
                              "(model.engine.init_args.timeout)")
        self.url = url


class EngineRequestError(RuntimeError):
    """A server refused a request (4xx); the message carries the server's error."""

    def __init__(self, url: str, status: int, message: str) -> None:
        hint = " (set model.engine.init_args.api_key or AGENTRL_API_KEY)" if status == 401 else ""
        super().__init__(f"rollout server {url} answered {status}: {message}{hint}")
        self.url, self.status = url, status


class EngineProtocolError(RuntimeError):
    """A server's answer does not have the shape of vLLM's protocol (or contradicts the request)."""


class FullWeightSyncUnsupported(NotImplementedError):  # noqa: N818 - reads as a statement of the limitation
    """The policy has no LoRA adapter, and full-weight sync to a vLLM server is not implemented."""


FULL_WEIGHT_REFUSAL = (
    "VLLMEngine pushes weights as a LoRA adapter, and this policy has no LoRA (model.policy.init_args.lora). "
    "Full-weight sync to vLLM needs its weight-transfer API (NCCL between trainer and server GPUs; on vLLM's CPU "
    "backend reload_weights answers 200 but updates only embeddings and norms), which agentrl does not implement: "
    "train with LoRA, or use the embedded engine.")


def check_lora(uses_lora: bool) -> None:
    """`FullWeightSyncUnsupported` for a policy without LoRA: the only verified push is a LoRA hot-load."""
    if not uses_lora:
        raise FullWeightSyncUnsupported(FULL_WEIGHT_REFUSAL)
