"""A real ``mlflow server`` subprocess on 127.0.0.1 (a free port) over a given backend store, waited for on
``/health``: what the tracking tests read runs back through, or kill to make a store disappear mid-run."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import free_port, start_healthy, stop_process


@dataclass
class MlflowServer:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        stop_process(self.proc)


def start_mlflow_server(store: str, folder: Path, timeout: float = 120.0) -> MlflowServer:
    """``mlflow server`` over ``store`` (artifacts proxied to ``folder/artifacts``), ready when ``/health``
    answers."""
    port = free_port()
    log = folder / f"mlflow-server-{port}.log"
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
           "--backend-store-uri", store, "--artifacts-destination", str(folder / "artifacts")]
    url = f"http://127.0.0.1:{port}"
    return MlflowServer(url, start_healthy("mlflow server", cmd, log, url, timeout=timeout, cwd=folder), log)
