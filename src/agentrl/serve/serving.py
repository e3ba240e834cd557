"""What ``agentrl serve`` does with a request between parsing and answering; semantics follow vLLM where it has them:

* The stop token (EOS or one of ``stop_token_ids``) is always the last of ``token_ids``; its text is left out of
  ``text`` unless ``include_stop_str_in_output`` (vLLM's detokenizer does the same).
* Stop strings end generation once the decoded text contains one; ``text`` is cut there, ``token_ids`` keep all.
* ``stop_token_ids`` add to the model's EOS tokens; ``ignore_eos`` removes those.
* ``logprobs`` (completions) gives each sampled token's log-prob and, in ``top_logprobs``, the sampled token
  followed by the most likely ones, from the logits it samples from; chat's ``top_logprobs: k`` lists k entries.
* Log-probs are those of `agentrl.engines.base` (after temperature, before top-k/top-p: vLLM's
  ``processed_logprobs``).
* ``n`` choices of one request use seeds ``seed, seed + 1, ...`` (vLLM draws them from one generator).

Tool calls (chat): ``tool_choice`` ``auto`` parses Hermes ``<tool_call>{json}</tool_call>`` blocks from the reply
(``finish_reason: "tool_calls"`` when any parsed); ``none`` renders the tools but does not parse. A named tool
choice or ``required`` is implemented by *prefix forcing*, not by vLLM's grammar-guided decoding: the prompt is
extended with ``<tool_call>\\n{"name": "<name>", "arguments": `` (named) or ``<tool_call>\\n{"name": "``
(required) and the model writes the rest; generation stops when the arguments object closes (named) or at
``</tool_call>``. The name is forced; the arguments are the model's. A forced call the model did not complete —
arguments that are not a JSON object (a small model copies the format line's ``{<arguments>}``), or, with
``required``, no parsable call of a tool in ``tools`` — is answered 400 naming ``tool_choice`` (`check_forced_call`)
rather than returned as a call or as raw ``<tool_call>`` text. The forced tokens belong to the prompt
(``prompt_token_ids``), not to ``token_ids``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.chat.render import render_prompt, template_renders_tools
from agentrl.chat.tools import HermesToolParser
from agentrl.engines.base import Completion, SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.serve.openai_protocol import (
    MAX_JSON_DEPTH,
    ChatCompletionLogProb,
    ChatCompletionLogProbs,
    ChatCompletionLogProbsContent,
    ChatCompletionNamedToolChoiceParam,
    ChatMessage,
    CompletionLogProbs,
    FunctionCall,
    SamplingFields,
    ToolCall,
    ToolChoice,
    json_depth,
    random_id,
)
from agentrl.serve.served_model import ServedModel, ServeError

_FLOOR = -9999.0  # vLLM's JSON-safe stand-in for -inf
_TOO_DEEP = f"tool call arguments nest deeper than {MAX_JSON_DEPTH} levels"


@dataclass
class GenSpec:
    """How to generate and present the choices of one request."""

    sampling: SamplingParams
    n: int = 1
    stops: list[str] = field(default_factory=list)
    explicit_stop_ids: frozenset[int] = frozenset()
    include_stop_str: bool = False
    skip_special: bool = True
    top_k: int = 0  # alternatives to score per token
    stop_when: Callable[[list[int]], bool] | None = None


@dataclass
class Generation:
    """One choice: the engine's completion and its text."""

    completion: Completion
    text: str
    stop_reason: int | str | None
    top: list[list[tuple[int, float]]]


def gen_spec(req: SamplingFields, served: ServedModel, prompt_len: int, max_tokens: int | None,
             top_k: int) -> GenSpec:
    """Map a request's sampling fields onto the engine's `SamplingParams` (400 on values vLLM also refuses)."""
    ctx = served.max_context
    budget = ctx - prompt_len if max_tokens is None else max_tokens
    if budget < 1 or prompt_len + budget > ctx:
        raise ServeError(f"This model's maximum context length is {ctx} tokens. However, you requested "
                         f"{prompt_len + max(budget, 0)} tokens ({prompt_len} in the messages, {budget} in the "
                         "completion). Please reduce the length of the messages or completion.", param="max_tokens")
    explicit = frozenset(req.stop_token_ids or ())
    stop_ids = explicit if req.ignore_eos else explicit | set(served.policy.stop_token_ids)
    sampling = SamplingParams(
        max_tokens=budget, temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p, top_k=max(req.top_k or 0, 0), seed=req.seed,
        stop_token_ids=tuple(sorted(stop_ids)),
    )
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if any(not s for s in stops):
        raise ServeError("stop strings must not be empty", param="stop")
    return GenSpec(sampling, req.n, stops, explicit, req.include_stop_str_in_output, req.skip_special_tokens, top_k)


def check_prompt_ids(ids: list[int], vocab: int) -> None:
    if not ids:
        raise ServeError("Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise ServeError(f"prompt token id {bad[0]} is out of vocabulary (size {vocab})", param="prompt")


def stop_string_check(tokenizer: Any, stops: list[str], skip_special: bool) -> Callable[[list[int]], bool] | None:
    """True once the decoded tail of the output contains a stop string."""
    if not stops:
        return None
    window = 4 * max(len(s) for s in stops) + 8  # tokens: enough for any stop string of byte-level tokens

    def check(ids: list[int]) -> bool:
        text = tokenizer.decode(ids[-window:], skip_special_tokens=skip_special)
        return any(s in text for s in stops)

    return check


async def generate(served: ServedModel, engine: HFEngine, prompt_ids: list[int],
                   spec: GenSpec) -> list[Generation]:
    """Sample ``spec.n`` choices concurrently (one decode batch) and present them as vLLM does."""
    checks = [c for c in (stop_string_check(served.tokenizer, spec.stops, spec.skip_special), spec.stop_when) if c]

    def stop_when(ids: list[int]) -> bool:
        return any(c(ids) for c in checks)

    session = f"req-{uuid.uuid4().hex}"  # stores the KV for prefix reuse by later requests

    async def one(i: int) -> Generation:
        seed = None if spec.sampling.seed is None else spec.sampling.seed + i
        out = await engine.generate(prompt_ids, spec.sampling.with_seed(seed), session=f"{session}/{i}",
                                    stop_when=stop_when if checks else None, top_logprobs=spec.top_k)
        text, reason = present_text(served.tokenizer, out, spec)
        return Generation(out, text, reason, out.top_logprobs or [[] for _ in out.token_ids])

    return list(await asyncio.gather(*(one(i) for i in range(spec.n))))


def present_text(tokenizer: Any, out: Completion, spec: GenSpec) -> tuple[str, int | str | None]:
    """The choice's ``text`` and ``stop_reason`` (the stop string or explicit stop token id)."""
    ids = out.token_ids
    stopped_by_token = out.finish_reason == "stop" and bool(ids) and ids[-1] in (spec.sampling.stop_token_ids or ())
    if stopped_by_token and not spec.include_stop_str:
        ids = ids[:-1]
    text = str(tokenizer.decode(ids, skip_special_tokens=spec.skip_special))
    found = [(text.find(s), s) for s in spec.stops if s in text]
    if found:
        at, stop = min(found)
        return text[: at + len(stop) if spec.include_stop_str else at], stop
    if stopped_by_token and out.token_ids[-1] in spec.explicit_stop_ids:
        return text, out.token_ids[-1]
    return text, None


def finish_reason(gen: Generation) -> str:
    """vLLM's finish reason: a stop string that appeared just as the budget ran out still counts as ``stop``."""
    return "stop" if isinstance(gen.stop_reason, str) else gen.completion.finish_reason


def _token_str(tokenizer: Any, token_id: int, as_ids: bool) -> str:
    return f"token_id:{token_id}" if as_ids else str(tokenizer.decode([token_id]))


def _ranked(gen: Generation, i: int) -> dict[int, float]:
    """Sampled token first, then the alternatives by rank (vLLM's order; duplicates keep the first place)."""
    ranked = {gen.completion.token_ids[i]: gen.completion.logprobs[i]}
    for tid, lp in gen.top[i]:
        ranked.setdefault(tid, lp)
    return ranked


def completion_logprobs(tokenizer: Any, gen: Generation, k: int, as_ids: bool) -> CompletionLogProbs:
    out = CompletionLogProbs()
    offset = 0
    for i, (tid, lp) in enumerate(zip(gen.completion.token_ids, gen.completion.logprobs, strict=True)):
        token = _token_str(tokenizer, tid, as_ids)
        out.tokens.append(token)
        out.token_logprobs.append(max(lp, _FLOOR))
        entries = list(_ranked(gen, i).items())[: k + 1]
        out.top_logprobs.append({_token_str(tokenizer, t, as_ids): max(v, _FLOOR) for t, v in entries})
        out.text_offset.append(offset)
        offset += len(token)
    return out


def chat_logprobs(tokenizer: Any, gen: Generation, k: int, as_ids: bool) -> ChatCompletionLogProbs:
    def entry(tid: int, lp: float) -> ChatCompletionLogProb:
        token = _token_str(tokenizer, tid, as_ids)
        return ChatCompletionLogProb(token=token, logprob=max(lp, _FLOOR), bytes=list(token.encode("utf-8")))

    content = []
    for i, (tid, lp) in enumerate(zip(gen.completion.token_ids, gen.completion.logprobs, strict=True)):
        first = entry(tid, lp)
        top = [entry(t, v) for t, v in list(_ranked(gen, i).items())[:k]]
        content.append(ChatCompletionLogProbsContent(**first.model_dump(), top_logprobs=top))
    return ChatCompletionLogProbs(content=content)


# ---------------------------------------------------------------------------------------------- chat


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ServeError("agentrl serve accepts text content parts only", param="messages")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise ServeError("message content must be a string, a list of text parts, or null", param="messages")


class RawArguments(str):
    """Tool-call arguments sent back as a string that is not JSON (a model's own malformed call, as this server
    returned it): accepted, as vLLM accepts them, because failing it would fail every later turn of the
    conversation. The Hermes form renders the text verbatim, as the model wrote it; a template that renders tools
    itself gets ``{}`` (it needs an object; vLLM does the same)."""


def _call_args(call: dict[str, Any]) -> tuple[str, Any]:
    fn = call.get("function") or {}
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return str(fn.get("name", "")), RawArguments(args)
        except RecursionError:  # the C parser gives up past Python's recursion limit
            raise ServeError(_TOO_DEEP, param="messages") from None
        if json_depth(args) > MAX_JSON_DEPTH:
            raise ServeError(_TOO_DEEP, param="messages")
    return str(fn.get("name", "")), args


def _message(m: dict[str, Any], native: bool) -> dict[str, Any]:
    """A chat message as the template gets it: text content; tool calls and results in Hermes form unless the
    template renders tools itself (then calls keep their structure, with arguments as objects, as vLLM does)."""
    role = m.get("role")
    if not isinstance(role, str):
        raise ServeError("every message needs a string 'role'", param="messages")
    text = _text_of(m.get("content"))
    calls = m.get("tool_calls") or []
    if native:
        out: dict[str, Any] = {**m, "content": text}
        if calls:
            out["tool_calls"] = [{**c, "function": {"name": n, "arguments": {} if isinstance(a, RawArguments) else a}}
                                 for c, (n, a) in zip(calls, map(_call_args, calls), strict=True)]
        return out
    for name, args in map(_call_args, calls):
        block = (HermesToolParser.render_call(name, args) if not isinstance(args, RawArguments) else
                 '<tool_call>\n{"name": ' + json.dumps(name) + ', "arguments": ' + args + "}\n</tool_call>")
        text = f"{text}\n{block}" if text else block
    if role == "tool":
        text = HermesToolParser.render_response(text)
    return {"role": role, "content": text}


def template_messages(tokenizer: Any, messages: list[dict[str, Any]],
                      tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """OpenAI-shaped messages as the chat template gets them (`_message`); the training gateway hands these to
    the episode's `LLMClient`, so both paths render a conversation the same way."""
    native = bool(tools) and template_renders_tools(tokenizer)
    return [_message(m, native) for m in messages]


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                add_generation_prompt: bool, parser: HermesToolParser) -> str:
    """Render an OpenAI-shaped conversation with `agentrl.agents.llm.render_prompt`, the trainer's own rendering;
    a template error is a 400 naming ``messages``."""
    conv = template_messages(tokenizer, messages, tools)
    try:
        return render_prompt(tokenizer, conv, tools, parser, add_generation_prompt=add_generation_prompt)
    except Exception as exc:  # a template error is the request's fault (role order, missing fields)
        raise ServeError(f"chat template failed: {exc}", param="messages") from exc


def forced_prefix(choice: ToolChoice | None, tools: list[dict[str, Any]] | None) -> str:
    """Text appended to the prompt to force a tool call (empty when nothing is forced)."""
    if isinstance(choice, ChatCompletionNamedToolChoiceParam):
        names = {t["function"]["name"] for t in tools or []}
        if choice.function.name not in names:
            raise ServeError(f"tool_choice names '{choice.function.name}', which is not in tools", param="tool_choice")
        return '<tool_call>\n{"name": ' + json.dumps(choice.function.name) + ', "arguments": '
    if choice == "required":
        if not tools:
            raise ServeError("tool_choice 'required' needs tools", param="tool_choice")
        return '<tool_call>\n{"name": "'
    return ""


def json_object_end(text: str) -> int | None:
    """Index just past the JSON object that ``text`` starts with (after blanks), or None if it is not closed."""
    start = len(text) - len(text.lstrip())
    if start >= len(text) or text[start] != "{":
        return None
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if escaped:
            escaped = False
        elif in_string:
            escaped = ch == "\\"
            in_string = ch != '"'
        elif ch == '"':
            in_string = True
        elif ch in "{}":
            depth += 1 if ch == "{" else -1
            if depth == 0:
                return i + 1
    return None


def forced_stop(tokenizer: Any, choice: ToolChoice | None) -> Callable[[list[int]], bool] | None:
    """Stop a named call when its arguments object closes; ``required`` stops at ``</tool_call>``."""
    if isinstance(choice, ChatCompletionNamedToolChoiceParam):
        def closed(ids: list[int]) -> bool:
            # the object can only close on a token holding "}": skip the full decode and scan on the others
            return "}" in str(tokenizer.decode(ids[-1:])) and json_object_end(str(tokenizer.decode(ids))) is not None

        return closed
    if choice == "required":
        return lambda ids: "</tool_call>" in str(tokenizer.decode(ids[-16:]))
    return None


FORCED_HINT = ("agentrl serve forces the call's name and the model writes the rest (no grammar-guided decoding); "
               "retry with another seed or temperature, give an example call in the messages, or use tool_choice "
               "'auto'")


def check_forced_call(choice: ToolChoice | None, text: str, calls: list[Any], names: set[str]) -> None:
    """Refuse (400, ``tool_choice``) a forced call the model did not complete: named, ``text`` (the arguments)
    must be a JSON object; ``required``, ``calls`` (parsed) must be at least one, each of a tool in ``names``."""
    if isinstance(choice, ChatCompletionNamedToolChoiceParam):
        try:
            args = json.loads(text)
        except json.JSONDecodeError:
            args = None
        if not isinstance(args, dict):
            raise ServeError(f"tool_choice: the model's arguments for {choice.function.name} are not a JSON object "
                             f"({text[:60]!r}); {FORCED_HINT}", param="tool_choice")
    elif choice == "required":
        unknown = sorted({c.name for c in calls} - names)
        if not calls or unknown:
            found = f"a call of {', '.join(unknown)}, not one of the tools" if unknown else "no valid tool call"
            raise ServeError(f"tool_choice 'required': the model wrote {found} ({sorted(names)}); {FORCED_HINT}",
                             param="tool_choice")


def chat_message(gen: Generation, choice: ToolChoice | None, prefix: str, parser: HermesToolParser,
                 names: set[str]) -> tuple[ChatMessage, str]:
    """The assistant message and finish reason of one choice, with tool calls in the OpenAI shape; a forced call
    the model did not complete is refused (`check_forced_call`; ``names``: the tools offered)."""
    finish = finish_reason(gen)
    if isinstance(choice, ChatCompletionNamedToolChoiceParam):
        end = json_object_end(gen.text)
        args = gen.text[:end].strip() if end is not None else gen.text.strip()
        check_forced_call(choice, args, [], names)
        call = ToolCall(function=FunctionCall(name=choice.function.name, arguments=args))
        return ChatMessage(role="assistant", content="", tool_calls=[call]), finish
    if choice in ("auto", "required"):
        parsed = parser.parse(prefix + gen.text)
        if choice == "required":
            check_forced_call(choice, "", parsed.tool_calls, names)
        if parsed.tool_calls:
            calls = [ToolCall(id=random_id("chatcmpl-tool"),
                              function=FunctionCall(name=c.name, arguments=json.dumps(c.arguments)))
                     for c in parsed.tool_calls]
            content = "" if choice == "required" else (parsed.content or None)
            return ChatMessage(role="assistant", content=content, tool_calls=calls), (
                "tool_calls" if finish == "stop" else finish)
    return ChatMessage(role="assistant", content=prefix + gen.text), finish
