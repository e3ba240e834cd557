"""A real ``mlflow server`` subprocess on 127.0.0.1 (a free port) over a given backend store, waited for on
``/health``: what the tracking tests read runs back through, or kill to make a store disappear mid-run."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class MlflowServer:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)


def start_mlflow_server(store: str, folder: Path, timeout: float = 120.0) -> MlflowServer:
    """``mlflow server`` over ``store`` (artifacts proxied to ``folder/artifacts``), ready when ``/health``
    answers."""
    port = free_port()
    log = folder / f"mlflow-server-{port}.log"
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
           "--backend-store-uri", store, "--artifacts-destination", str(folder / "artifacts")]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=folder)
    server = MlflowServer(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited: {log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"mlflow server not ready after {timeout} s: {log.read_text()[-3000:]}")
