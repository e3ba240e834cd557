"""Issue 14, item 12: the LoRA routes reach only the adapter root, and nothing answers a stranger.

* ``lora_path`` outside ``--lora-modules-root`` is refused, with the same answer whether the path exists or not
  (the API is no oracle for the server's disk), and without the path in it; a symbolic link out of the root
  counts as outside. A relative ``lora_path`` is taken inside the root.
* ``/v1/models`` shows names, not file-system paths.
* ``/docs``, ``/openapi.json`` and ``/metrics`` need the key; ``/health`` does not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from agentrl.models.policy import LoRASettings, Policy
from tests.support.server import Server

LORA = LoRASettings(r=8, alpha=16, target_modules=["q_proj", "v_proj"])


def _load(server: Server, name: str, path: str) -> httpx.Response:
    return httpx.post(server.url + "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path},
                      headers=server.headers, timeout=60)


def _error(r: httpx.Response) -> dict[str, Any]:
    error: dict[str, Any] = r.json()["error"]
    return error


def test_adapters_load_only_from_the_root(victim: Server, adapter_root: Path, tmp_path: Path) -> None:
    Policy("tiny-random", lora=LORA, seed=0).model.save_pretrained(tmp_path / "outside")
    (adapter_root / "escape").symlink_to(tmp_path / "outside", target_is_directory=True)
    refused = {
        "exists": _load(victim, "x1", str(tmp_path / "outside")),
        "missing": _load(victim, "x1", str(tmp_path / "no-such-folder")),
        "dotdot": _load(victim, "x1", str(adapter_root / ".." / tmp_path.name / "outside")),
        "symlink": _load(victim, "x1", str(adapter_root / "escape")),
        "system": _load(victim, "x1", "/etc"),
    }
    for how, r in refused.items():
        assert r.status_code == 400, (how, r.text)
        assert _error(r)["param"] == "lora_path" and "--lora-modules-root" in _error(r)["message"], how
        assert str(tmp_path) not in r.text and "/etc" not in r.text, how
    assert len({r.text for r in refused.values()}) == 1  # one answer whether the path exists or not

    Policy("tiny-random", lora=LORA, seed=0).model.save_pretrained(adapter_root / "inside")
    r = _load(victim, "root-a", "inside")  # relative: inside the root
    assert r.status_code == 200, r.text
    models = httpx.get(victim.url + "/v1/models", headers=victim.headers, timeout=30)
    assert [m["id"] for m in models.json()["data"]][-1] == "root-a"
    assert str(adapter_root) not in models.text and "inside" not in models.text
    r = _load(victim, "root-a-abs", str(adapter_root / "inside"))
    assert r.status_code == 200, r.text
    assert httpx.post(victim.url + "/v1/unload_lora_adapter", json={"lora_name": "root-a-abs"},
                      headers=victim.headers, timeout=30).status_code == 200


def test_pages_that_describe_the_server_need_the_key(victim: Server) -> None:
    for path in ("/docs", "/openapi.json", "/redoc", "/metrics", "/v1/models"):
        assert httpx.get(victim.url + path, timeout=30).status_code == 401, path
        assert httpx.get(victim.url + path, headers=victim.headers, timeout=30).status_code == 200, path
    assert httpx.get(victim.url + "/health", timeout=30).status_code == 200
