"""Memory hand-offs around an update (`agentrl.training.memory`): the update does not hold the rollouts' prefix
KV, the next rollouts do not hold the update's gradients, and freed pages go back to the OS on glibc."""

from __future__ import annotations

import platform
from typing import Any

import torch

from agentrl.models.memory import release_memory
from agentrl.training.schedules import GRPO
from agentrl.training.settings import PPOSettings
from tests.training.helpers import fit, guess_data, make_module


def test_the_update_holds_no_rollout_kv_and_leaves_no_gradients() -> None:
    module = make_module(GRPO(group_size=2, ppo=PPOSettings(epochs=1)))
    kv_before: list[int] = []
    kv_during: list[int] = []
    grads_after: list[int] = []
    original = module.update

    def update(*args: Any, **kwargs: Any) -> dict[str, float]:
        kv_before.append(module.session.engine._prefix.tokens)  # type: ignore[attr-defined]
        out = original(*args, **kwargs)
        grads_after.append(sum(p.grad is not None for p in module.parameters()))
        return out

    def training_forward(*_: Any) -> None:
        if torch.is_grad_enabled():  # not the engine's or the scoring passes
            kv_during.append(module.session.engine._prefix.tokens)  # type: ignore[attr-defined]

    module.update = update  # type: ignore[method-assign]
    hook = module.policy.backbone.register_forward_pre_hook(training_forward)
    try:
        fit(module, guess_data(batch_size=2, steps=2))
    finally:
        hook.remove()
    assert len(kv_before) == 2 and all(t > 0 for t in kv_before)  # the rollouts left reusable KV behind
    assert kv_during and set(kv_during) == {0}  # dropped before the update's forward passes
    assert grads_after == [0, 0]  # gradients freed after each update


def test_release_memory_trims_on_glibc() -> None:
    big = torch.ones(32 * 2**20 // 4)  # 32 MB
    del big
    assert release_memory() is (platform.libc_ver()[0] == "glibc")
