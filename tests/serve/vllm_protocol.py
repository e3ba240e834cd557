"""vLLM's OpenAI-server protocol, re-encoded for conformance tests (written from vLLM's source, not from ours).

Read from the vLLM repository (github.com/vllm-project/vllm, main branch as stored in 2026; the protocol then lives
in split modules):

* ``vllm/entrypoints/openai/completion/protocol.py`` @ 002032ee2b18e1f7bd924ec47b62504ba3866063 —
  ``CompletionRequest``, ``CompletionLogProbs``, ``CompletionResponseChoice``, ``CompletionResponse``;
* ``vllm/entrypoints/openai/chat_completion/protocol.py`` @ 002032ee2b18e1f7bd924ec47b62504ba3866063 —
  ``ChatMessage``, ``ChatCompletionLogProb(s)``, ``ChatCompletionLogProbsContent``,
  ``ChatCompletionResponseChoice``, ``ChatCompletionResponse``, ``ChatCompletionRequest``,
  ``ChatCompletionToolsParam``, ``ChatCompletionNamedToolChoiceParam``;
* ``vllm/entrypoints/generate/base/protocol.py`` @ 567b35aa7b691e82dd80bd41854f8499002d5c0f — ``FunctionCall``,
  ``ToolCall``, ``FunctionDefinition``;
* ``vllm/entrypoints/serve/engine/protocol.py`` @ f1bf7bd07a112d72d905d355a8206b8d1e82cb5d — ``ErrorInfo``,
  ``ErrorResponse``, ``ModelPermission``, ``ModelCard``, ``ModelList``, ``UsageInfo``, ``PromptTokenUsageInfo``;
* ``vllm/entrypoints/serve/lora/protocol.py`` @ 7fd1b43852e1c71c7cde24ab80ccbe46c2c68a18 —
  ``LoadLoRAAdapterRequest``, ``UnloadLoRAAdapterRequest``; the routes (``serve/lora/api_router.py`` @ 27873cab)
  answer 200 with a plain-text body;
* ``vllm/entrypoints/serve/middleware/authenticate.py`` @ baaf6e9c — 401 body ``{"error": "Unauthorized"}``.

The older single-file ``vllm/entrypoints/openai/protocol.py`` (v0.10 era, @ 0052bed3) has the same shapes for the
models used here. Differences from vLLM's own classes: every model here *forbids* extra fields (vLLM's request
models allow and ignore them; a response field vLLM does not define is a conformance failure), and fields that only
matter to features the tests do not touch (multimodal, streaming, KV transfer) are typed loosely as ``Any``.
Required fields are vLLM's required fields, plus the ``id`` and ``created`` fields that vLLM fills with default
factories (so they are always on its wire).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

_INT64 = 2**63


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


StopParam = str | list[str] | None
TokenId = Annotated[int, Field(ge=0)]


class CompletionRequest(Strict):
    model: str | None = None
    prompt: list[TokenId] | list[list[TokenId]] | str | list[str] | None = None
    echo: bool | None = False
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = None
    max_tokens: int | None = 16
    n: int = 1
    presence_penalty: float | None = None
    seed: int | None = Field(None, ge=-_INT64, le=_INT64 - 1)
    stop: StopParam = []
    stream: bool | None = False
    stream_options: Any = None
    suffix: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    use_beam_search: bool = False
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    watermarking: bool | None = None
    length_penalty: float = 1.0
    stop_token_ids: list[int] | None = []
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    truncation_side: Literal["left", "right"] | None = None
    allowed_token_ids: list[int] | None = None
    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] | None = None
    bad_words: list[str] = Field(default_factory=list)
    prompt_embeds: Any = None
    add_special_tokens: bool = True
    response_format: Any = None
    structured_outputs: Any = None
    priority: int = 0
    request_id: str | None = None
    session_id: str | None = None
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None
    cache_salt: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _vllm_checks(self) -> CompletionRequest:
        # CompletionRequest.check_logprobs and validate_prompt_and_prompt_embeds
        if self.logprobs is not None and self.logprobs < 0 and self.logprobs != -1:
            raise ValueError("`logprobs` must be a positive value or -1.")
        if self.prompt is None or self.prompt in ("", []):
            raise ValueError("Either prompt or prompt_embeds must be provided and non-empty.")
        return self


class FunctionDefinition(Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatCompletionToolsParam(Strict):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ChatCompletionNamedFunction(Strict):
    name: str


class ChatCompletionNamedToolChoiceParam(Strict):
    function: ChatCompletionNamedFunction
    type: Literal["function"] = "function"


class ChatCompletionRequest(Strict):
    messages: list[dict[str, Any]]
    model: str | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int | None = 1
    presence_penalty: float | None = None
    response_format: Any = None
    seed: int | None = Field(None, ge=-_INT64, le=_INT64 - 1)
    stop: StopParam = []
    stream: bool | None = False
    stream_options: Any = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[ChatCompletionToolsParam] | None = None
    tool_choice: Literal["none", "auto", "required"] | ChatCompletionNamedToolChoiceParam | None = "none"
    reasoning_effort: str | None = None
    include_reasoning: bool = True
    parallel_tool_calls: bool | None = True
    user: str | None = None
    use_beam_search: bool = False
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    length_penalty: float = 1.0
    stop_token_ids: list[int] | None = []
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    prompt_logprobs: int | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] = Field(default_factory=list)
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    structured_outputs: Any = None
    priority: int = 0
    request_id: str | None = None
    session_id: str | None = None
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None
    cache_salt: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None


class CompletionLogProbs(Strict):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionResponseChoice(Strict):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_logprobs: list[dict[int, Any] | None] | None = None
    prompt_token_ids: list[int] | None = None
    routed_experts: str | None = None


class PromptTokenUsageInfo(Strict):
    cached_tokens: int | None = None
    created_cache_tokens: int | None = None
    multimodal_tokens: dict[str, int] | None = None


class CompletionTokenUsageInfo(Strict):
    reasoning_tokens: int = 0


class UsageInfo(Strict):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: PromptTokenUsageInfo | None = None
    completion_tokens_details: CompletionTokenUsageInfo | None = None


ServiceTier = Literal["auto", "default", "flex", "scale", "priority"] | None


class CompletionResponse(Strict):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionResponseChoice]
    service_tier: ServiceTier = None
    system_fingerprint: str | None = None
    usage: UsageInfo
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    metrics: Any = None


class FunctionCall(Strict):
    name: str
    arguments: str


class ToolCall(Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Strict):
    role: str
    content: str | None = None
    refusal: str | None = None
    annotations: Any = None
    audio: Any = None
    function_call: FunctionCall | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    reasoning: str | None = None


class ChatCompletionLogProb(Strict):
    token: str
    logprob: float = -9999.0
    bytes: list[int] | None = None


class ChatCompletionLogProbsContent(ChatCompletionLogProb):
    top_logprobs: list[ChatCompletionLogProb] = Field(default_factory=list)


class ChatCompletionLogProbs(Strict):
    content: list[ChatCompletionLogProbsContent] | None = None


class ChatCompletionResponseChoice(Strict):
    index: int
    message: ChatMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    routed_experts: str | None = None


class ChatCompletionResponse(Strict):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionResponseChoice]
    service_tier: ServiceTier = None
    system_fingerprint: str | None = None
    usage: UsageInfo
    prompt_logprobs: Any = None
    prompt_token_ids: list[int] | None = None
    prompt_text: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    metrics: Any = None


class ErrorInfo(Strict):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(Strict):
    error: ErrorInfo


class Unauthorized(Strict):
    error: Literal["Unauthorized"]


class ModelPermission(Strict):
    id: str
    object: str = "model_permission"
    created: int
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(Strict):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "vllm"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[ModelPermission] = Field(default_factory=list)


class ModelList(Strict):
    object: str = "list"
    data: list[ModelCard] = Field(default_factory=list)


class LoadLoRAAdapterRequest(Strict):
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(Strict):
    lora_name: str
    lora_int_id: int | None = None
