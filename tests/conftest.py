"""Shared fixtures: tiny random policies (fast) and the real SmolLM2 policy (loaded once per session)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.server import API_KEY, LORA_ARGS, Server, start_server

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session", autouse=True)
def _own_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """agentrl's cache folder (the migrated empty MLflow store new stores copy) is the session's own, not the
    user's: made once per test process, inherited by every `agentrl fit` a test starts."""
    os.environ["AGENTRL_CACHE"] = str(tmp_path_factory.mktemp("agentrl-cache"))


@pytest.fixture
def tiny_policy():  # type: ignore[no-untyped-def]
    from agentrl.models.policy import Policy

    return Policy("tiny-random", seed=0)


@pytest.fixture(scope="session")
def smollm2_policy():  # type: ignore[no-untyped-def]
    from agentrl.models.policy import Policy

    return Policy("smollm2-135m-instruct", compute_dtype="float32")  # exact engine/trainer agreement is tested


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A shared tiny-random server with LoRA slots (r=8, alpha=16, q/v) and an API key; adapters load from any
    of the session's temporary folders."""
    server = start_server(tmp_path_factory.mktemp("serve"), *LORA_ARGS, api_key=API_KEY,
                          lora_root=tmp_path_factory.getbasetemp())
    yield server
    server.stop()
