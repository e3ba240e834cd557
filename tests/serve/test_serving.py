"""The pieces of `agentrl serve` below HTTP: the engine hooks it uses, stop strings, chat rendering with tools,
forced tool choice and refusing unimplemented fields."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from agentrl.chat.tools import HermesToolParser
from agentrl.engines.base import Completion, SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.models.policy import Policy
from agentrl.serve.openai_protocol import ChatCompletionNamedToolChoiceParam, unsupported_fields
from agentrl.serve.served_model import ServeError
from agentrl.serve.serving import GenSpec, forced_prefix, json_object_end, present_text, render_chat

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add", "parameters": {"type": "object"}}}]


def test_engine_hooks_stop_when_and_step_context(tiny_policy: Policy) -> None:
    steps = []

    @contextlib.contextmanager
    def counting() -> Iterator[None]:
        steps.append(1)
        yield

    engine = HFEngine(tiny_policy, step_context=counting)
    sp = SamplingParams(max_tokens=10, seed=0, stop_token_ids=())
    full = asyncio.run(engine.generate([5, 6, 7, 8], sp))
    cut = asyncio.run(engine.generate([5, 6, 7, 8], sp, stop_when=lambda ids: len(ids) >= 3))
    assert cut.finish_reason == "stop" and cut.token_ids == full.token_ids[:3] and cut.logprobs == full.logprobs[:3]
    assert len(steps) == 2 * 1 + 9 + 2  # every prefill and decode step ran inside the context


def test_top_logprobs_come_from_the_sampling_logits_without_another_forward(tiny_policy: Policy) -> None:
    """``top_logprobs`` are read from the logits each token was sampled from: they equal a teacher-forced scoring
    of the completion, the sampled token's own log-prob is among them, and only the engine's own prefill and
    decode steps run the model (no scoring pass; ``generate`` here is what `agentrl serve` calls)."""
    from agentrl.serve.served_model import ServedModel
    from agentrl.serve.serving import generate

    served = ServedModel(tiny_policy, "tiny")
    calls = []
    hook = tiny_policy.backbone.register_forward_hook(lambda *_: calls.append(1))
    spec = GenSpec(SamplingParams(max_tokens=6, seed=3, stop_token_ids=()), n=2, top_k=4)
    prompt = [5, 6, 7, 8, 9]
    try:
        gens = asyncio.run(generate(served, served.base, prompt, spec))
    finally:
        hook.remove()
    assert len(calls) == 1 + 5  # one batched prefill of both choices, five decode steps
    for gen in gens:
        ids = gen.completion.token_ids
        assert len(gen.top) == len(ids) == 6 and all(len(t) == 4 for t in gen.top)
        with torch.no_grad():
            logits = tiny_policy.model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits, -1).topk(4)
        for step, top in enumerate(gen.top):
            assert [t for t, _ in top] == expected.indices[step].tolist()
            torch.testing.assert_close(torch.tensor([v for _, v in top]), expected.values[step], atol=1e-5, rtol=0)
            sampled = dict(top).get(ids[step])
            assert sampled is None or sampled == gen.completion.logprobs[step]


@pytest.mark.parametrize("text,end", [
    ('{"a": 1} tail', 8), ('  {"a": {"b": [1, {"c": 2}]}}}', 29), ('{"a": "}"}', 10), ('{"a": "x\\"}"}x', 13),
    ('{"a": "\\\\"}', 11), ('{"a": 1', None), ('[1]', None), ("", None),
])
def test_json_object_end(text: str, end: int | None) -> None:
    assert json_object_end(text) == end
    if end is not None:
        json.loads(text[:end])


def test_stop_strings_cut_text_and_stop_tokens_leave_it(tiny_policy: Policy) -> None:
    tok = tiny_policy.tokenizer
    ids = [*tok.encode("hello world. more"), 2]
    spec = GenSpec(SamplingParams(stop_token_ids=(2,)), stops=["o w", "."], explicit_stop_ids=frozenset({2}))
    out = Completion(ids, [0.0] * len(ids), "stop")
    assert present_text(tok, out, spec) == ("hell", "o w")  # the earliest stop string
    spec.include_stop_str = True
    assert present_text(tok, out, spec) == ("hello w", "o w")
    plain = GenSpec(SamplingParams(stop_token_ids=(2,)), explicit_stop_ids=frozenset({2}), skip_special=False)
    assert present_text(tok, out, plain) == ("hello world. more", 2)  # the stop token's text is left out
    eos = GenSpec(SamplingParams(stop_token_ids=(2,)), skip_special=False)
    assert present_text(tok, out, eos)[1] is None  # the model's EOS is not a stop_reason (vLLM: None)


def test_chat_rendering_puts_tools_and_calls_in_hermes_form(tiny_policy: Policy) -> None:
    parser = HermesToolParser()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You add."},
        {"role": "user", "content": [{"type": "text", "text": "1+2?"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
        {"role": "tool", "tool_call_id": "c0", "content": "3"},
    ]
    text = render_chat(tiny_policy.tokenizer, messages, TOOLS, True, parser)
    assert text.startswith("<|im_start|>system\nYou add.\n\n" + parser.render_tools(TOOLS)[:20])
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>' in text
    assert "<|im_start|>tool\n<tool_response>\n3\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    with pytest.raises(ServeError, match="text content parts"):
        render_chat(tiny_policy.tokenizer, [{"role": "user", "content": [{"type": "image_url"}]}], None, True, parser)


def test_forced_tool_choice_prefixes() -> None:
    named = ChatCompletionNamedToolChoiceParam.model_validate({"type": "function", "function": {"name": "add"}})
    assert forced_prefix(named, TOOLS) == '<tool_call>\n{"name": "add", "arguments": '
    assert forced_prefix("required", TOOLS) == '<tool_call>\n{"name": "'
    assert forced_prefix("auto", TOOLS) == forced_prefix("none", TOOLS) == ""
    other = ChatCompletionNamedToolChoiceParam.model_validate({"function": {"name": "mul"}})
    with pytest.raises(ServeError, match="not in tools"):
        forced_prefix(other, TOOLS)


def test_unimplemented_fields_are_named() -> None:
    assert unsupported_fields({"stream": False, "presence_penalty": 0.0, "response_format": {"type": "text"}}) == []
    assert unsupported_fields({"stream": True, "logit_bias": {"5": 1.0}, "user": "x"}) == ["logit_bias", "stream"]
