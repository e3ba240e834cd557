"""Fixtures of the adapter tests: a tiny random policy (fast) on the embedded engine."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def tiny_policy():  # type: ignore[no-untyped-def]
    from agentrl.models.policy import Policy

    return Policy("tiny-random", seed=0)
