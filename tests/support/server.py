"""`agentrl serve` as a real subprocess on 127.0.0.1 (a free port), waited for on ``/health``.

The ``served`` fixture (tests/conftest.py) is one tiny-random server with LoRA slots and an API key, shared by the
HTTP tests of the session; tests that kill or train against a server start their own with `start_server`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import free_port, start_healthy, stop_process

API_KEY = "test-key-123"
LORA_ARGS = ("--lora-rank", "8", "--lora-alpha", "16", "--lora-target-modules", "q_proj", "v_proj")


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    api_key: str | None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def output(self, tail: int | None = 4000) -> str:
        text = self.log.read_text(errors="replace")
        return text if tail is None else text[-tail:]

    def stop(self) -> None:
        stop_process(self.proc)


def start_server(log_dir: Path, *args: str, model: str = "tiny-random", api_key: str | None = None,
                 timeout: float = 120.0, lora_root: Path | None = None, port: int | None = None,
                 positional: bool = False) -> Server:
    """Start ``agentrl serve --model <model> <args>`` (``agentrl serve <model> ...`` if ``positional``; on ``port``,
    default a free one) and wait until ``/health`` answers; adapters load from ``lora_root`` (default: ``log_dir``)."""
    port = port or free_port()
    log = log_dir / f"serve-{port}.log"
    if log.exists():  # the same port again (a restart): keep the earlier server's log
        log = log_dir / f"serve-{port}-{time.monotonic_ns()}.log"
    model_args = [model] if positional else ["--model", model]
    cmd = [sys.executable, "-m", "agentrl.cli", "serve", *model_args, "--port", str(port),
           "--lora-modules-root", str(lora_root or log_dir), *args]
    if api_key:
        cmd += ["--api-key", api_key]
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    env.pop("AGENTRL_API_KEY", None)
    url = f"http://127.0.0.1:{port}"
    return Server(url, start_healthy("agentrl serve", cmd, log, url, timeout=timeout, env=env), log, api_key)
