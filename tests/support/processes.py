"""Servers the tests start as real subprocesses on 127.0.0.1: a free port, start and wait until ``/health``
answers, stop (terminate, then kill). `tests.support.server` (``agentrl serve``) and
`tests.support.mlflow_server` (``mlflow server``) are built on these. A server started from the main thread gets
SIGTERM when the test process dies (`agentrl.serve.child_process.die_with_parent`, as ``agentrl vllm-serve`` gives
its server), so a test run that is killed (a CI timeout, ``kill``) does not leave servers behind holding cores and
ports; a server started from another thread goes without it (see that module)."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from agentrl.serve.child_process import die_with_parent, wait_healthy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """Terminate ``proc`` (SIGTERM, what a user's Ctrl-C or a supervisor sends); kill it after 20 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


def start_healthy(name: str, cmd: Sequence[str], log: Path, url: str, *, timeout: float = 120.0,
                  env: Mapping[str, str] | None = None, cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start ``cmd`` with its output in ``log`` and return once ``{url}/health`` answers 200; raise (naming it
    ``name``, with the log's tail) if it exits first or is not healthy within ``timeout`` seconds (then stopped)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                env=dict(env) if env is not None else dict(os.environ),
                                preexec_fn=die_with_parent())  # noqa: PLW1509
    try:
        wait_healthy(name, url, proc, timeout, log=log, poll=0.2)
    except RuntimeError:
        stop_process(proc)
        raise
    return proc
