"""The trainer with the embedded engine's weight copy (``HFEngineSpec(weights="copy")``, the default): an fp32 copy
trains exactly as the shared engine does, and each step logs the push's cost and the copy's size."""

from __future__ import annotations

import pytest
import torch

from agentrl.engines.specs import HFEngineSpec
from agentrl.models.policy import Policy
from agentrl.training.schedules.grpo import GRPO
from agentrl.training.system.perf import STEP_PHASES
from agentrl.training.update.settings import PPOSettings
from tests.training.helpers import fit, letter_data, make_module


def _two_steps(engine: HFEngineSpec) -> tuple[list[dict[str, float]], dict[str, torch.Tensor]]:
    module = make_module(GRPO(group_size=2, ppo=PPOSettings(epochs=1)), engine=engine)
    logged: list[dict[str, float]] = []
    original = module.training_step

    def step(tasks, batch_idx):  # type: ignore[no-untyped-def]
        original(tasks, batch_idx)
        logged.append(dict(module.last_metrics))

    module.training_step = step  # type: ignore[method-assign]
    fit(module, letter_data(batch_size=2, steps=2))
    return logged, {k: v.clone() for k, v in module.policy.state_dict().items()}


def test_an_fp32_copy_trains_as_the_shared_engine_and_logs_its_push() -> None:
    shared, shared_weights = _two_steps(HFEngineSpec(weights="shared"))
    copied, copied_weights = _two_steps(HFEngineSpec(weights="copy", decode_dtype="float32"))
    for a, b in zip(shared, copied, strict=True):  # the same rollouts and the same update, step after step
        same = [k for k in a if not k.startswith("perf/") or k == "perf/generated_tokens"]  # not the timings
        assert "rollout/reward" in same and set(same) <= set(b)
        for key in same:
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9), key
        assert "rollout/logprob_mismatch_kl" not in b  # an fp32 copy is the trainer's code: no π_old recompute
    for name, value in shared_weights.items():
        torch.testing.assert_close(copied_weights[name], value, rtol=0, atol=0)
    params = sum(p.numel() for p in Policy("tiny-random").model.parameters())  # tied embeddings counted once
    for m in copied:
        assert m["perf/engine_push_s"] > 0
        assert m["perf/engine_weights_mib"] >= 4 * params / 2**20  # the fp32 copy (and its buffers)
        assert m["perf/engine_released_mib"] == 4 * params / 2**20  # freed for the update, allocated at the push
    assert all(m["perf/engine_weights_mib"] == 0 and m["perf/engine_released_mib"] == 0 for m in shared)
    for run in (shared, copied):  # the resident set after each step and the process's peak so far (Linux)
        peaks = [m["perf/peak_rss_mib"] for m in run]
        assert all(0 < m["perf/rss_mib"] <= m["perf/peak_rss_mib"] for m in run) and peaks == sorted(peaks)
        rises = [m[f"perf/{phase}_peak_rise_mib"] for m in run for phase in STEP_PHASES]  # what each phase set
        assert all(r >= 0 for r in rises) and sum(rises) <= peaks[-1]


def test_a_bf16_copy_makes_the_trainer_recompute_pi_old() -> None:
    logged, _ = _two_steps(HFEngineSpec(weights="copy", decode_dtype="bfloat16"))
    for m in logged:
        assert m["rollout/logprob_mismatch_kl"] > 0 and m["rollout/recomputed_tokens"] > 0
    kls = [m["train/approx_kl"] for m in logged if "train/approx_kl" in m]  # a group with equal rewards: no loss
    assert kls and max(kls) < 1e-10  # the first ratio starts at 1 against the recomputed π_old


def test_collecting_before_the_push_that_follows_an_update_is_refused_by_name() -> None:
    """The copy is freed for the update and allocated again at the push: a schedule that collects in between gets
    a clear error, not a step of failed episodes."""
    module = make_module(GRPO(group_size=2, ppo=PPOSettings(epochs=1)),
                         engine=HFEngineSpec(weights="copy", decode_dtype="float32"))
    module.push_weights = lambda: None  # type: ignore[method-assign]  # a schedule that forgets the push
    with pytest.raises(RuntimeError, match=r"released for the trainer.s update: push .* \(Learner.push_weights\)"):
        fit(module, letter_data(batch_size=2, steps=2))
