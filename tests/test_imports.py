"""House rule 1: `agentrl.algorithms` is pure torch; the CLI starts without heavy imports."""

from __future__ import annotations

import subprocess
import sys

BLOCKER = """
import importlib.abc, sys
BLOCKED = ("lightning", "pytorch_lightning", "httpx", "requests", "aiohttp", "urllib3", "langchain",
           "langchain_core", "langgraph", "fastapi", "uvicorn", "mlflow", "transformers")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked import of {name}")
        return None
sys.meta_path.insert(0, Block())
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCKER + code], capture_output=True, text=True, timeout=120)


def test_algorithms_import_without_lightning_http_or_langchain() -> None:
    proc = _run(
        "import agentrl.algorithms as a, agentrl.types\n"
        "import sys\n"
        "assert callable(a.turn_gae) and callable(a.ppo_policy_loss)\n"
        "print('ok')\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_blocker_really_blocks() -> None:
    proc = _run("import lightning\n")
    assert proc.returncode != 0 and "blocked import of lightning" in proc.stderr


def test_cli_help_and_version() -> None:
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "agentrl fit --config configs/rtpo.yaml" in out.stdout
    ver = subprocess.run([sys.executable, "-m", "agentrl.cli", "--version"], capture_output=True, text=True, timeout=60)
    from agentrl import __version__
    assert ver.stdout.strip() == f"agentrl {__version__}"
