"""``agentrl serve`` as a separate process on a free port of 127.0.0.1, for the benchmarks that train against a
server (``async.py``, ``lora_push.py``): started with a LoRA shape and adapter root, returned once ``/health``
answers; the server's output goes to ``root/serve.log``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from agentrl.models.policy import LoRASettings
from agentrl.serve.child_process import wait_healthy


def start_serve(model: str, root: Path, lora: LoRASettings, *, threads: int | None = None,
                timeout: float = 600.0) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``agentrl serve --model model`` with adapters of shape ``lora`` loaded from ``root`` (one torch thread
    each with ``threads=1``); (process, base url). Raises with the log's tail if it exits or is not healthy in time."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "agentrl.cli", "serve", "--model", model, "--port", str(port), "--lora-rank",
           str(lora.r), "--lora-alpha", str(lora.alpha), "--lora-target-modules", *lora.target_modules,
           "--lora-modules-root", str(root), "--log-level", "warning"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    log = root / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy("agentrl serve", url, proc, timeout, log=log)
    except RuntimeError:
        proc.terminate()
        raise
    return proc, url
