"""The server the fault tests attack: a real ``agentrl serve`` subprocess on 127.0.0.1 (tiny random model, LoRA
slots, an API key) whose adapters load only from its own adapter root."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.server import API_KEY, LORA_ARGS, Server, start_server


@pytest.fixture(scope="session")
def adapter_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("adapter-root")


@pytest.fixture(scope="session")
def victim(tmp_path_factory: pytest.TempPathFactory, adapter_root: Path) -> Iterator[Server]:
    server = start_server(tmp_path_factory.mktemp("victim"), *LORA_ARGS, api_key=API_KEY, lora_root=adapter_root)
    yield server
    server.stop()


def metrics(server: Server) -> dict[str, float]:
    """The server's ``/metrics`` counters by name (``agentrl:`` prefix dropped)."""
    r = httpx.get(server.url + "/metrics", headers=server.headers, timeout=30)
    assert r.status_code == 200, r.text
    out = {}
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name.removeprefix("agentrl:")] = float(value)
    return out


def is_openai_error(r: httpx.Response) -> bool:
    """``{"error": {"message", "type", "param", "code"}}`` with ``code`` the HTTP status."""
    try:
        error = r.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return (isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}
            and error["code"] == r.status_code and isinstance(error["message"], str) and error["message"] != "")
