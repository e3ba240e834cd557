"""The HTTP bodies agentrl sends and serves, checked field by field against vLLM's protocol (`vllm_protocol`).

* What `VLLMEngine` sends (completions, LoRA load/unload) must validate as vLLM's request models: no field vLLM
  lacks, right types.
* What `agentrl serve` answers must validate as vLLM's response models: every field vLLM requires is present, no
  field vLLM does not define, right types and nesting.
* `VLLMEngine` must read a response built from vLLM's models.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from agentrl.engines.base import SamplingParams
from agentrl.engines.vllm import EngineProtocolError, VLLMEngine, completion_request, parse_completion
from agentrl.models.policy import LoRASettings, Policy
from tests.serve import vllm_protocol as v
from tests.support.server import Server

LORA = LoRASettings(r=8, alpha=16, target_modules=["q_proj", "v_proj"])
PROMPT = [1, 87, 85, 71, 84, 201, 74, 75, 2, 201, 1, 67]


def _validate(model: type[BaseModel], response: httpx.Response) -> Any:
    """Validate the wire JSON (``model_validate_json``: JSON's own strictness rules)."""
    return model.model_validate_json(response.text)


@pytest.mark.parametrize("sampling", [
    SamplingParams(),
    SamplingParams(max_tokens=7, temperature=0.7, top_p=0.9, top_k=20, seed=123, stop_token_ids=(2, 5)),
    SamplingParams(temperature=0.0, stop_token_ids=()),
], ids=["defaults", "everything", "greedy-no-stop"])
def test_engine_completion_bodies_are_vllm_completion_requests(sampling: SamplingParams) -> None:
    body = completion_request(PROMPT, sampling, "agentrl-v3", 9)
    req = v.CompletionRequest.model_validate_json(json.dumps(body))
    assert req.prompt == PROMPT and req.model == "agentrl-v3" and req.max_tokens == 9
    assert req.logprobs == 0 and req.return_token_ids is True  # the sampled token's log-prob and the ids
    assert req.skip_special_tokens is False and req.include_stop_str_in_output is True
    assert req.temperature == sampling.temperature and req.top_p == sampling.top_p
    assert req.top_k == (sampling.top_k or None) and req.seed == sampling.seed
    if sampling.stop_token_ids is None:
        assert "stop_token_ids" not in body and not req.ignore_eos  # the server's EOS handling
    else:
        assert req.stop_token_ids == list(sampling.stop_token_ids) and req.ignore_eos


def test_engine_reads_a_response_built_from_vllm_models() -> None:
    choice = v.CompletionResponseChoice(
        index=0, text="ab", finish_reason="stop", stop_reason=None, token_ids=[97, 98, 2], prompt_token_ids=PROMPT,
        logprobs=v.CompletionLogProbs(text_offset=[0, 1, 2], token_logprobs=[-0.5, -1.25, -0.125],
                                      tokens=["a", "b", ""], top_logprobs=[{"a": -0.5}, {"b": -1.25}, {"": -0.125}]))
    usage = v.UsageInfo(prompt_tokens=12, completion_tokens=3, total_tokens=15,
                        prompt_tokens_details=v.PromptTokenUsageInfo(cached_tokens=8))
    data = v.CompletionResponse(id="cmpl-1", created=1, model="m", choices=[choice], usage=usage).model_dump()
    out = parse_completion(json.loads(json.dumps(data)), PROMPT, version=4)
    assert out.token_ids == [97, 98, 2] and out.logprobs == [-0.5, -1.25, -0.125]
    assert out.finish_reason == "stop" and out.policy_version == 4 and out.cached_tokens == 8
    assert out.prompt_len == len(PROMPT)

    data["choices"][0]["prompt_token_ids"] = PROMPT[:-1]
    with pytest.raises(EngineProtocolError, match="prompt_token_ids differ"):
        parse_completion(data, PROMPT, version=4)
    data["choices"][0]["token_ids"] = None
    with pytest.raises(EngineProtocolError, match="return_token_ids"):
        parse_completion(data, PROMPT, version=4)


class _Recording(VLLMEngine):
    """Records the JSON body of every request it sends (httpx request hook; real HTTP to a real server)."""

    sent: list[tuple[str, Any]]

    def _http(self) -> httpx.AsyncClient:
        client = super()._http()
        if not hasattr(self, "sent"):
            self.sent = []
        if self._record not in client.event_hooks["request"]:
            client.event_hooks["request"].append(self._record)
        return client

    async def _record(self, request: httpx.Request) -> None:
        self.sent.append((request.url.path, json.loads(request.content) if request.content else None))


def test_engine_requests_over_http_are_vllm_requests(served: Server, tmp_path: Path) -> None:
    policy = Policy("tiny-random", lora=LORA, seed=0)
    engine = _Recording([served.url], adapter_dir=str(tmp_path), api_key=served.api_key, retries=0)

    async def run() -> None:
        await engine.generate(PROMPT, SamplingParams(max_tokens=4, seed=1), session="s")
        await engine.update_weights(policy, version=101)
        await engine.update_weights(policy, version=102)  # loads v102, unloads v101
        await engine.generate(PROMPT, SamplingParams(max_tokens=4, seed=1, stop_token_ids=()), session="s")
        await engine.shutdown()

    asyncio.run(run())
    models: dict[str, type[BaseModel]] = {
        "/v1/completions": v.CompletionRequest, "/v1/load_lora_adapter": v.LoadLoRAAdapterRequest,
        "/v1/unload_lora_adapter": v.UnloadLoRAAdapterRequest}
    paths = [p for p, _ in engine.sent]
    # each load is followed by the push's probe (`agentrl.engines.push_check`), a completion naming the new adapter
    assert paths == ["/v1/models", "/v1/completions", "/v1/load_lora_adapter", "/v1/completions",
                     "/v1/load_lora_adapter", "/v1/completions", "/v1/unload_lora_adapter", "/v1/completions"]
    assert [engine.sent[i][1]["model"] for i in (3, 5)] == ["agentrl-v101", "agentrl-v102"]
    for path, body in engine.sent:
        if path in models:
            models[path].model_validate_json(json.dumps(body))
    assert engine.sent[-1][1]["model"] == "agentrl-v102"


def _post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=server.headers, timeout=60)


@pytest.mark.parametrize("body", [
    {"prompt": PROMPT, "max_tokens": 5, "seed": 1},
    {"prompt": PROMPT, "max_tokens": 5, "seed": 1, "logprobs": 0, "return_token_ids": True},
    {"prompt": "Hello there", "max_tokens": 6, "logprobs": 3, "n": 2, "return_token_ids": True, "stop": ["e"]},
    {"prompt": [PROMPT, PROMPT[:6]], "max_tokens": 4, "temperature": 0, "stop_token_ids": [40, 41]},
    {"prompt": PROMPT, "max_tokens": 4, "logprobs": 2, "return_tokens_as_token_ids": True, "top_k": 5},
], ids=["plain", "engine-like", "text-n2-stop", "batch-greedy", "token-id-strings"])
def test_completion_responses_are_vllm_responses(served: Server, body: dict[str, Any]) -> None:
    r = _post(served, "/v1/completions", body)
    assert r.status_code == 200, r.text
    resp = _validate(v.CompletionResponse, r)
    n_prompts = 2 if isinstance(body["prompt"][0], list) else 1
    assert [c.index for c in resp.choices] == list(range(n_prompts * body.get("n", 1)))
    for c in resp.choices:
        if body.get("return_token_ids"):
            assert c.token_ids is not None and c.prompt_token_ids is not None
        if "logprobs" in body:
            assert c.logprobs is not None and len(c.logprobs.tokens) == len(c.logprobs.token_logprobs)
            assert all(d is not None and 1 <= len(d) <= body["logprobs"] + 1 for d in c.logprobs.top_logprobs)
            # the sampled token comes first (as in vLLM, tokens that decode alike share one dict key)
            assert [next(iter(d)) for d in c.logprobs.top_logprobs] == c.logprobs.tokens
            if body.get("return_tokens_as_token_ids"):  # unique keys: the first value is the sampled log-prob
                assert c.token_ids is None and all(t.startswith("token_id:") for t in c.logprobs.tokens)
                assert [next(iter(d.values())) for d in c.logprobs.top_logprobs] == c.logprobs.token_logprobs
    if "logprobs" in body:
        assert resp.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in resp.choices if c.logprobs)


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "seed": 2},
    {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text",
     "text": "hi"}]}], "max_completion_tokens": 5, "logprobs": True, "top_logprobs": 2, "return_token_ids": True},
    {"messages": [{"role": "user", "content": "weather?"}], "max_tokens": 12, "temperature": 0,
     "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
     "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
], ids=["plain", "logprobs-token-ids", "named-tool"])
def test_chat_responses_are_vllm_responses(served: Server, body: dict[str, Any]) -> None:
    v.ChatCompletionRequest.model_validate_json(json.dumps(body))  # a valid vLLM request, served as vLLM would
    r = _post(served, "/v1/chat/completions", body)
    if "tool_choice" in body and r.status_code == 400:  # the random model did not finish the forced call
        assert _validate(v.ErrorResponse, r).error.param == "tool_choice"
        return
    assert r.status_code == 200, r.text
    resp = _validate(v.ChatCompletionResponse, r)
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    if body.get("logprobs"):
        content = choice.logprobs.content if choice.logprobs else None
        assert content and all(len(c.top_logprobs) == body["top_logprobs"] for c in content)
        assert resp.prompt_token_ids and choice.token_ids is not None and len(content) == len(choice.token_ids)
    if "tool_choice" in body:
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather" and call.type == "function"
        assert "tool_calls" in r.json()["choices"][0]["message"]
    else:
        assert "tool_calls" not in r.json()["choices"][0]["message"]  # vLLM drops an empty list


def test_models_errors_and_lora_routes_are_vllm_shaped(served: Server, tmp_path: Path) -> None:
    _validate(v.ModelList, httpx.get(served.url + "/v1/models", headers=served.headers))
    r = _post(served, "/v1/completions", {"model": "no-such-model", "prompt": PROMPT})
    assert r.status_code == 404
    assert _validate(v.ErrorResponse, r).error.code == 404
    for bad in ({"prompt": PROMPT, "max_tokens": "many"}, {"prompt": PROMPT, "presence_penalty": 0.5},
                {"prompt": PROMPT, "max_tokens": 10**6}, {"prompt": [10**6]}):
        r = _post(served, "/v1/completions", bad)
        assert r.status_code == 400, (bad, r.text)
        assert _validate(v.ErrorResponse, r).error.type == "BadRequestError"
    r = httpx.get(served.url + "/v1/models")
    assert r.status_code == 401
    _validate(v.Unauthorized, r)

    Policy("tiny-random", lora=LORA).model.save_pretrained(tmp_path / "a")
    r = _post(served, "/v1/load_lora_adapter", {"lora_name": "conformance-a", "lora_path": str(tmp_path / "a")})
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'conformance-a' added successfully."
    models = _validate(v.ModelList, httpx.get(served.url + "/v1/models", headers=served.headers))
    assert [m.id for m in models.data][-1] == "conformance-a" and models.data[-1].parent == models.data[0].id
    r = _post(served, "/v1/unload_lora_adapter", {"lora_name": "conformance-a"})
    assert r.status_code == 200 and "removed successfully" in r.text
    r = _post(served, "/v1/unload_lora_adapter", {"lora_name": "conformance-a"})
    assert r.status_code == 404
    _validate(v.ErrorResponse, r)
