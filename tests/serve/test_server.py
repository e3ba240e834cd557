"""`agentrl serve` as a user meets it: a real subprocess on loopback, the tiny random model, and real clients
(httpx and the official ``openai`` package)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from agentrl.models.loading import build_tiny_tokenizer
from agentrl.models.policy import LoRASettings, Policy
from tests.support.server import API_KEY, Server, start_server

PROMPT = [1, 87, 85, 71, 84, 201, 74, 75, 2, 201, 1, 67]
LORA = LoRASettings(r=8, alpha=16, target_modules=["q_proj", "v_proj"])


def _post(server: Server, path: str, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=kw.pop("headers", server.headers), timeout=60, **kw)


def _complete(server: Server, **body: Any) -> dict[str, Any]:
    r = _post(server, "/v1/completions", {"prompt": PROMPT, "return_token_ids": True, "logprobs": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_api_key_is_required_on_v1_but_not_on_health(served: Server) -> None:
    body = {"prompt": PROMPT, "max_tokens": 2}
    assert httpx.get(served.url + "/health").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {API_KEY}"}):
        assert httpx.get(served.url + "/v1/models", headers=headers).status_code == 401
        r = httpx.post(served.url + "/v1/completions", json=body, headers=headers)
        assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
    assert httpx.get(served.url + "/v1/models", headers=served.headers).status_code == 200
    assert _post(served, "/v1/completions", body).status_code == 200


def test_text_and_token_prompts_and_seeds(served: Server) -> None:
    a, again = _complete(served, max_tokens=8, seed=3), _complete(served, max_tokens=8, seed=3)
    assert a["token_ids"] == again["token_ids"]  # seeded: reproducible (the second reuses the prompt's KV)
    assert a["logprobs"]["token_logprobs"] == pytest.approx(again["logprobs"]["token_logprobs"], abs=1e-5)
    assert a["token_ids"] != _complete(served, max_tokens=8, seed=4)["token_ids"]
    text = "Hello agent"
    by_text = _complete(served, prompt=text, max_tokens=6, seed=1)
    ids = by_text["prompt_token_ids"]
    assert ids == build_tiny_tokenizer().encode(text)
    assert _complete(served, prompt=ids, max_tokens=6, seed=1)["token_ids"] == by_text["token_ids"]
    r = _post(served, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "n": 3, "seed": 9,
                                          "return_token_ids": True})
    tokens = [tuple(c["token_ids"]) for c in r.json()["choices"]]
    assert len(tokens) == 3 and len(set(tokens)) > 1  # n choices, seeds 9, 10, 11


def test_stop_token_ids_and_stop_strings(served: Server) -> None:
    free = _complete(served, max_tokens=12, temperature=0, stop_token_ids=[], ignore_eos=True)
    assert free["finish_reason"] == "length" and len(free["token_ids"]) == 12
    third = free["token_ids"][2]
    stopped = _complete(served, max_tokens=12, temperature=0, stop_token_ids=[third])
    # the stop token is the last id (vLLM keeps it in token_ids); its text is left out unless asked for
    assert stopped["token_ids"] == free["token_ids"][: free["token_ids"].index(third) + 1]
    assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == third

    prompt = "The answer is"
    long = _complete(served, prompt=prompt, max_tokens=24, temperature=0, ignore_eos=True)
    text = long["text"]
    stop = next((text[i:i + 2] for i in range(3, len(text) - 2) if text[i:i + 2].isprintable()
                 and text[i:i + 2].strip()), None)
    assert stop is not None, f"the seeded random model wrote no printable text to stop on: {text!r}"
    cut = _complete(served, prompt=prompt, max_tokens=24, temperature=0, ignore_eos=True, stop=[stop])
    assert cut["finish_reason"] == "stop" and cut["stop_reason"] == stop
    assert cut["text"] == text[: text.index(stop)]
    assert long["token_ids"][: len(cut["token_ids"])] == cut["token_ids"]  # stopped early, same tokens
    kept = _complete(served, prompt=prompt, max_tokens=24, temperature=0, ignore_eos=True, stop=[stop],
                     include_stop_str_in_output=True)
    assert kept["text"] == text[: text.index(stop) + len(stop)]


def test_top_logprobs_match_the_model(served: Server) -> None:
    choice = _complete(served, max_tokens=5, temperature=0, logprobs=3, return_tokens_as_token_ids=True)
    policy = Policy("tiny-random", seed=0)
    ids = torch.tensor([PROMPT + choice["token_ids"]])
    with torch.no_grad():
        logits = policy.model(ids).logits[0, len(PROMPT) - 1: -1]
    expected = torch.log_softmax(logits, -1).topk(3)
    for step, top in enumerate(choice["logprobs"]["top_logprobs"]):
        got = {int(k.removeprefix("token_id:")): lp for k, lp in top.items()}
        assert int(expected.indices[step, 0]) == choice["token_ids"][step]  # greedy: the sampled one is top-1
        for tid, lp in zip(expected.indices[step].tolist(), expected.values[step].tolist(), strict=True):
            assert got[tid] == pytest.approx(lp, abs=1e-4)


def test_bad_requests_name_the_problem(served: Server) -> None:
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"model": "gpt-17", "prompt": PROMPT}, 404, "The model `gpt-17` does not exist."),
        ({"prompt": PROMPT, "max_tokens": 0}, 400, "maximum context length"),
        ({"prompt": PROMPT, "max_tokens": 5000}, 400, "maximum context length is 4096"),
        ({"prompt": PROMPT, "stream": "yes"}, 400, "stream must be a boolean"),  # true streams: test_server_stream
        ({"prompt": PROMPT, "temperature": -1}, 400, "temperature"),
        ({"prompt": []}, 400, "prompt"),
        ({"prompt": [999999]}, 400, "out of vocabulary"),
        ({"max_tokens": 3}, 400, "prompt"),
    ]
    for body, status, words in cases:
        r = _post(served, "/v1/completions", body)
        assert r.status_code == status, (body, r.text)
        assert words in r.json()["error"]["message"], (body, r.text)
    r = _post(served, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"})
    assert r.status_code == 400 and "tools" in r.json()["error"]["message"]


def test_lora_adapters_load_route_and_unload(served: Server, tmp_path: Path) -> None:
    base_before = _complete(served, max_tokens=6, seed=5)
    policy = Policy("tiny-random", lora=LORA, seed=0)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    policy.model.save_pretrained(tmp_path / "trained")
    r = _post(served, "/v1/load_lora_adapter", {"lora_name": "srv-a", "lora_path": str(tmp_path / "trained")})
    assert r.status_code == 200, r.text
    adapted = _complete(served, model="srv-a", max_tokens=6, seed=5)
    assert adapted["logprobs"]["token_logprobs"] != pytest.approx(base_before["logprobs"]["token_logprobs"], abs=1e-3)
    base_after = _complete(served, max_tokens=6, seed=5)  # the base name still serves the base weights
    assert base_after["token_ids"] == base_before["token_ids"]
    assert base_after["logprobs"]["token_logprobs"] == pytest.approx(base_before["logprobs"]["token_logprobs"],
                                                                     abs=1e-5)

    again = _post(served, "/v1/load_lora_adapter", {"lora_name": "srv-a", "lora_path": str(tmp_path / "trained")})
    assert again.status_code == 400 and "already been loaded" in again.text
    Policy("tiny-random", lora=LORA, seed=1).model.save_pretrained(tmp_path / "other")
    assert _post(served, "/v1/load_lora_adapter", {"lora_name": "srv-b", "lora_path": str(tmp_path / "other")}
                 ).status_code == 200
    # one resident adapter: loading srv-b replaced srv-a
    r = _post(served, "/v1/completions", {"model": "srv-a", "prompt": PROMPT})
    assert r.status_code == 404
    # vLLM's sequence (load the new adapter, then unload the old one) succeeds once, then the name is unknown
    assert _post(served, "/v1/unload_lora_adapter", {"lora_name": "srv-a"}).status_code == 200
    assert _post(served, "/v1/unload_lora_adapter", {"lora_name": "srv-a"}).status_code == 404
    assert _post(served, "/v1/completions", {"model": "srv-b", "prompt": PROMPT}).status_code == 200
    assert _post(served, "/v1/unload_lora_adapter", {"lora_name": "srv-b"}).status_code == 200
    assert _post(served, "/v1/completions", {"model": "srv-b", "prompt": PROMPT}).status_code == 404

    wrong = LoRASettings(r=4, alpha=16, target_modules=["q_proj", "v_proj"])
    Policy("tiny-random", lora=wrong).model.save_pretrained(tmp_path / "r4")
    r = _post(served, "/v1/load_lora_adapter", {"lora_name": "srv-c", "lora_path": str(tmp_path / "r4")})
    assert r.status_code == 400 and "adapter r is 4" in r.json()["error"]["message"]
    r = _post(served, "/v1/load_lora_adapter", {"lora_name": "srv-d", "lora_path": str(tmp_path / "missing")})
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"


def test_openai_client_completions_with_token_ids(served: Server) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=served.url + "/v1", api_key=API_KEY)
    model = client.models.list().data[0].id
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=4, logprobs=1, seed=0,
                                    extra_body={"return_token_ids": True})
    choice = out.choices[0]
    assert choice.logprobs is not None and len(choice.logprobs.token_logprobs or []) == 4
    assert len(choice.model_extra["token_ids"]) == 4  # type: ignore[index]


def test_server_without_lora_refuses_adapters(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        assert httpx.get(server.url + "/v1/models").status_code == 200  # no key configured: open
        Policy("tiny-random", lora=LORA).model.save_pretrained(tmp_path / "a")
        r = _post(server, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(tmp_path / "a")})
        assert r.status_code == 400 and "--lora-rank" in r.json()["error"]["message"]
    finally:
        server.stop()


@pytest.mark.slow
def test_openai_client_chat_with_tool_calls_on_smollm2(tmp_path: Path) -> None:
    """SmolLM2-135M-Instruct at temperature 0: with one worked example it writes a Hermes tool call itself
    (``tool_choice="auto"``); a named ``tool_choice`` forces one (prefix forcing), or is refused when the model does
    not write a JSON object as the arguments."""
    from openai import BadRequestError, OpenAI
    from openai.types.chat import (
        ChatCompletionAssistantMessageParam,
        ChatCompletionMessageParam,
        ChatCompletionNamedToolChoiceParam,
        ChatCompletionToolParam,
    )

    server = start_server(tmp_path, model="smollm2-135m-instruct", timeout=300)
    try:
        client = OpenAI(base_url=server.url + "/v1", api_key="unused")
        tools: list[ChatCompletionToolParam] = [{"type": "function", "function": {
            "name": "get_weather", "description": "Get the current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
        example: ChatCompletionAssistantMessageParam = {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_0", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]}
        messages: list[ChatCompletionMessageParam] = [
            {"role": "user", "content": "What is the weather in Rome?"}, example,
            {"role": "user", "content": "What is the weather in Paris?"}]
        out = client.chat.completions.create(model="smollm2-135m-instruct", messages=messages, tools=tools,
                                             temperature=0, max_tokens=60)
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls or []
        assert call.type == "function" and call.function.name == "get_weather" and "Paris" in call.function.arguments

        named: ChatCompletionNamedToolChoiceParam = {"type": "function", "function": {"name": "get_weather"}}
        forced = client.chat.completions.create(
            model="smollm2-135m-instruct", messages=[*messages[:2], {"role": "user", "content": "And in Oslo?"}],
            tools=tools, tool_choice=named, temperature=0, max_tokens=40)
        (call,) = forced.choices[0].message.tool_calls or []
        assert call.type == "function" and call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Oslo"}
        # without the worked example it writes the tool's schema where the arguments go: refused, not returned
        with pytest.raises(BadRequestError, match="tool_choice: the model's arguments for get_weather"):
            client.chat.completions.create(
                model="smollm2-135m-instruct", messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
                tools=tools, tool_choice=named, temperature=0, max_tokens=40)
    finally:
        server.stop()


def test_a_body_over_the_limit_is_refused_before_it_is_buffered(served: Server) -> None:
    """16 MiB by default (`--max-request-mb`): a larger declared length gets 413 at once; a chunked body with no
    length gets 413 once it passes the limit; the server keeps serving."""
    big = b'{"prompt": "' + b"a" * (17 << 20) + b'"}'
    r = httpx.post(served.url + "/v1/completions", content=big,
                   headers={**served.headers, "Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 413, r.text
    assert r.json()["error"]["type"] == "RequestTooLargeError" and "max-request-mb" in r.json()["error"]["message"]

    def chunks() -> Any:
        yield b'{"prompt": "'
        for _ in range(17):
            yield b"a" * (1 << 20)
        yield b'"}'

    r = httpx.post(served.url + "/v1/completions", content=chunks(),
                   headers={**served.headers, "Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 413, r.text
    assert r.json()["error"]["type"] == "RequestTooLargeError"
    assert _complete(served, max_tokens=2)["token_ids"]  # still serving
