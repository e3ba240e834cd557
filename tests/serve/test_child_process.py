"""`agentrl.serve.child_process.wait_healthy`: a server that dies before it answers fails fast, named and with its
log's tail; one that never answers fails at the timeout; one that answers gives the seconds it took."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.serve.child_process import wait_healthy
from tests.faults.test_test_servers import HEALTH_SERVER
from tests.support.processes import free_port, stop_process


def test_a_server_that_exits_first_is_named_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("loading...\nValueError: no such model\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    began = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?s)the test server exited with 3 before .*/health answered:\n"
                                           r"loading\.\.\.\nValueError: no such model"):
        wait_healthy("the test server", f"http://127.0.0.1:{free_port()}", proc, 60, log=log, poll=0.05)
    assert time.monotonic() - began < 30  # not the timeout


def test_a_server_that_never_answers_fails_at_the_timeout(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(RuntimeError, match=r"the test server did not answer .*/health within 1 s$"):
            wait_healthy("the test server", f"http://127.0.0.1:{free_port()}", proc, 1.0, poll=0.05)
        assert proc.poll() is None  # left for the caller to stop
    finally:
        stop_process(proc)


def test_a_healthy_server_gives_the_seconds_it_took(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", HEALTH_SERVER, str(port)])
    try:
        waited = wait_healthy("the test server", f"http://127.0.0.1:{port}", proc, 60, poll=0.05)
        assert 0 < waited < 60
    finally:
        stop_process(proc)
