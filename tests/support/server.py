"""`agentrl serve` as a real subprocess on 127.0.0.1 (a free port), waited for on ``/health``.

The ``served`` fixture (tests/conftest.py) is one tiny-random server with LoRA slots and an API key, shared by the
HTTP tests of the session; tests that kill or train against a server start their own with `start_server`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

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
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    server = Server(f"http://127.0.0.1:{port}", proc, log, api_key)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"agentrl serve exited with {proc.returncode}:\n{server.output()}")
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"agentrl serve did not become healthy in {timeout} s:\n{server.output()}")
