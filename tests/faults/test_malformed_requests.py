"""Issue 14, item 6: every malformed request is a 4xx in the OpenAI error shape, with one log line and no traceback.

The inputs are the ones that answered 500 (or ``{"detail": ...}``) when the server was attacked: out-of-range seeds,
tool calls of the wrong shape, tool arguments nested 5,000 deep, bodies that are not UTF-8, not JSON or too deep,
and adapter folders with broken configs, corrupt safetensors or a pickle that ``torch.load(weights_only=True)``
refuses.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentrl.models.policy import LoRASettings, Policy
from tests.faults.conftest import is_openai_error
from tests.support.server import Server

PROMPT = [1, 87, 85, 71, 84, 201, 74, 75, 2, 201, 1, 67]
LORA = LoRASettings(r=8, alpha=16, target_modules=["q_proj", "v_proj"])
DEEP = "[" * 5000 + "]" * 5000


def _call(function: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": function},
            {"role": "user", "content": "and?"}]


JSON_CASES = {
    "seed-2**64-1": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "seed": 2**64 - 1}),
    "seed-2**70": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "seed": 2**70}),
    "chat-seed-2**70": ("/v1/chat/completions", {"messages": _call(None), "max_tokens": 2, "seed": 2**70}),
    "tool-calls-str": ("/v1/chat/completions", {"messages": _call("abc"), "max_tokens": 2}),
    "tool-calls-list-of-str": ("/v1/chat/completions", {"messages": _call(["abc"]), "max_tokens": 2}),
    "tool-call-function-str": ("/v1/chat/completions", {"messages": _call([{"function": "f"}]), "max_tokens": 2}),
    "tool-arguments-5000-deep": ("/v1/chat/completions", {
        "messages": _call([{"id": "c1", "type": "function", "function": {"name": "f", "arguments": DEEP}}]),
        "max_tokens": 2}),
    "role-not-a-string": ("/v1/chat/completions", {"messages": [{"role": 7, "content": "x"}], "max_tokens": 2}),
}
RAW_CASES = {
    "not-utf8": ("/v1/completions", b'{"prompt": "\xff\xfe", "max_tokens": 2}'),
    "not-json": ("/v1/completions", b'{"prompt": [1, 2'),
    "body-5000-deep": ("/v1/completions", b'{"prompt": [1], "extra": ' + DEEP.encode() + b"}"),
    "object-arguments-5000-deep": ("/v1/chat/completions", json.dumps({"messages": _call([{"function": {
        "name": "f", "arguments": {"a": 1}}}])}).encode().replace(b'{"a": 1}', b'{"a": ' + DEEP.encode() + b"}")),
    "body-100-deep": ("/v1/completions", b'{"prompt": [1], "extra": ' + b"[" * 100 + b"]" * 100 + b"}"),
}


def _check(server: Server, r: httpx.Response, log_from: int) -> None:
    assert 400 <= r.status_code < 500, r.text[:300]
    assert is_openai_error(r), r.text[:300]
    assert "Traceback" not in server.output(tail=None)[log_from:]


@pytest.mark.parametrize("case", list(JSON_CASES))
def test_malformed_json_requests_are_openai_400s(victim: Server, case: str) -> None:
    path, body = JSON_CASES[case]
    start = len(victim.output(tail=None))
    _check(victim, httpx.post(victim.url + path, json=body, headers=victim.headers, timeout=60), start)


@pytest.mark.parametrize("case", list(RAW_CASES))
def test_malformed_bodies_are_openai_400s(victim: Server, case: str) -> None:
    path, body = RAW_CASES[case]
    start = len(victim.output(tail=None))
    r = httpx.post(victim.url + path, content=body, timeout=60,
                   headers={**victim.headers, "Content-Type": "application/json"})
    _check(victim, r, start)
    if case == "not-json":
        assert r.json()["error"]["param"] is None  # not the byte offset of the JSON error


def _adapter(folder: Path) -> Path:
    Policy("tiny-random", lora=LORA, seed=0).model.save_pretrained(folder)
    return folder


def _break_config_json(folder: Path) -> None:
    (folder / "adapter_config.json").write_text('{"r": 8, ')


def _break_config_utf8(folder: Path) -> None:
    (folder / "adapter_config.json").write_bytes(b'{"r": "\xff"}')


def _break_config_type(folder: Path) -> None:
    (folder / "adapter_config.json").write_text("[1, 2, 3]")


def _break_safetensors(folder: Path) -> None:
    data = (folder / "adapter_model.safetensors").read_bytes()
    (folder / "adapter_model.safetensors").write_bytes(data[:8] + b"{not a header" + data[40:])


def _pickle_bin(folder: Path) -> None:
    (folder / "adapter_model.safetensors").unlink()
    (folder / "adapter_model.bin").write_bytes(pickle.dumps({"w": print}))  # a global weights_only refuses


@pytest.mark.parametrize("breakage", [_break_config_json, _break_config_utf8, _break_config_type, _break_safetensors,
                                      _pickle_bin], ids=lambda f: f.__name__.strip("_"))
def test_malformed_adapters_are_openai_400s(victim: Server, adapter_root: Path, breakage: Any) -> None:
    name = breakage.__name__.strip("_")
    folder = _adapter(adapter_root / name)
    breakage(folder)
    start = len(victim.output(tail=None))
    r = httpx.post(victim.url + "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(folder)},
                   headers=victim.headers, timeout=60)
    _check(victim, r, start)
    assert str(adapter_root) not in r.text  # the answer names the adapter and the file, not the path


def test_server_answers_after_the_malformed_requests(victim: Server) -> None:
    r = httpx.post(victim.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 3},
                   headers=victim.headers, timeout=60)
    assert r.status_code == 200, r.text
