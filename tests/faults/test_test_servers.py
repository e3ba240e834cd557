"""The tests' own servers do not outlive a killed test run: `tests.support.processes.start_healthy` gives each
server SIGTERM when the process that started it dies (a CI timeout or ``kill`` runs no fixture teardown)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.support.processes import free_port, start_healthy, stop_process

ROOT = Path(__file__).resolve().parents[2]

HEALTH_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""

STARTER = """
import sys, time
from pathlib import Path
from tests.support.processes import free_port, start_healthy
port = free_port()
proc = start_healthy("health", [sys.executable, "-c", sys.argv[1], str(port)], Path(sys.argv[2]),
                     f"http://127.0.0.1:{port}", timeout=60)
print(proc.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")  # a zombie is gone


def test_a_server_stops_when_the_test_process_that_started_it_is_killed(tmp_path: Path) -> None:
    starter = subprocess.Popen([sys.executable, "-c", STARTER, HEALTH_SERVER, str(tmp_path / "server.log")],
                               cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert starter.stdout is not None
    server_pid = int(starter.stdout.readline())
    assert _alive(server_pid)
    starter.send_signal(signal.SIGKILL)  # no teardown runs
    starter.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _alive(server_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = _alive(server_pid)
    if alive:
        os.kill(server_pid, signal.SIGKILL)
    assert not alive, "the server outlived the killed process that started it"


def test_a_server_started_from_a_thread_outlives_the_thread(tmp_path: Path) -> None:
    """The parent-death signal follows the thread that forked: a server restarted in a background thread (as the
    vLLM tier's mid-fit restart does) must not be stopped when that thread returns."""
    port, started = free_port(), []
    thread = threading.Thread(target=lambda: started.append(start_healthy(
        "health", [sys.executable, "-c", HEALTH_SERVER, str(port)], tmp_path / "server.log",
        f"http://127.0.0.1:{port}", timeout=60)))
    thread.start()
    thread.join()
    try:
        time.sleep(1.0)
        assert started and started[0].poll() is None, "the server stopped when the thread that started it ended"
    finally:
        if started:
            stop_process(started[0])
