"""What an `agentrl fit` run changed: its checkpoint's policy weights against the tiny random model it started from.

A smoke run whose rewards are all equal has zero advantages and takes no optimizer step (an AdamW step with no
signal would still move the weights, so the update skips it); a test that says a run *trains* checks the weights
moved, with this.
"""

from __future__ import annotations

from pathlib import Path

import torch

from agentrl.models.policy import Policy


def changed_policy_tensors(checkpoint: Path, seed: int = 0) -> tuple[int, int]:
    """``(changed, total)``: how many of ``Policy("tiny-random", seed=seed)``'s tensors differ in ``checkpoint``
    (a Lightning checkpoint of `AgentRLModule`, whose policy weights are under ``policy.``)."""
    saved = torch.load(checkpoint, weights_only=True, map_location="cpu")["state_dict"]
    start = Policy("tiny-random", seed=seed).state_dict()
    return sum(not torch.equal(saved[f"policy.{name}"], value) for name, value in start.items()), len(start)
