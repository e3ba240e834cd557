"""``agentrl vllm-serve`` does not leave its server behind: stopped politely (SIGTERM) or killed outright (SIGKILL,
which runs no clean-up in the wrapper), the server it started ends too.

The server here is a stand-in named as such: the venv's ``bin/python`` is a script that answers ``/health`` on the
``--port`` vLLM would get (what is tested is the wrapper's hold on its child, which does not depend on what the
child serves; the real vLLM server's start and stop are in the vLLM tier, tests/vllm)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults.test_test_servers import HEALTH_SERVER, _alive
from tests.support.processes import free_port


def _venv(tmp_path: Path) -> Path:
    """A folder laid out as a venv whose python serves /health on --port (the stand-in for vLLM's API server)."""
    server = tmp_path / "health_server.py"
    server.write_text(HEALTH_SERVER)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"  # reads --port from vLLM's command line, serves /health there
    python.write_text('#!/bin/sh\nwhile [ "$1" != "--port" ]; do shift; done\n'
                      f'exec {sys.executable} {server} "$2"\n')
    python.chmod(0o755)
    return venv


def _child_pid(wrapper: subprocess.Popen[str]) -> int:
    """The wrapper's one child (the server), once the wrapper has said it is healthy."""
    assert wrapper.stdout is not None
    for line in wrapper.stdout:
        if line.startswith("base_urls"):
            break
    else:
        raise AssertionError("agentrl vllm-serve ended before its server was healthy")
    children = Path(f"/proc/{wrapper.pid}/task/{wrapper.pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["terminated", "killed"])
def test_the_server_ends_with_the_wrapper(stop: signal.Signals, tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # a local HF folder is passed on as it is
    cmd = [sys.executable, "-m", "agentrl", "vllm-serve", "--venv", str(_venv(tmp_path)), "--model", str(model),
           "--port", str(free_port()), "--timeout", "60"]
    wrapper = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    server = _child_pid(wrapper)
    try:
        assert _alive(server)
        wrapper.send_signal(stop)
        wrapper.wait(timeout=60)
        deadline = time.monotonic() + 30
        while _alive(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server), f"the server outlived agentrl vllm-serve stopped by {stop.name}"
    finally:
        if _alive(server):
            os.kill(server, signal.SIGKILL)
        if wrapper.poll() is None:
            wrapper.kill()
