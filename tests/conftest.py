"""Shared fixtures: tiny random policies (fast) and the real SmolLM2 policy (loaded once per session)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def tiny_policy():  # type: ignore[no-untyped-def]
    from agentrl.models.policy import Policy

    return Policy("tiny-random", seed=0)


@pytest.fixture(scope="session")
def smollm2_policy():  # type: ignore[no-untyped-def]
    from agentrl.models.policy import Policy

    return Policy("smollm2-135m-instruct")
