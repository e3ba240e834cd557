"""The behaviour policy is not the trainer: an engine that deliberately differs from the trainer (the real
`HFEngine` over a perturbed copy of the weights), π_old recomputed before the update, the TIS/MIS weights that reach
the loss, the mismatch metrics, and when recompute turns on by itself."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from agentrl.algorithms.correction import masked_is, truncated_is, turn_masked_is
from agentrl.engines.hf import HFEngine
from agentrl.engines.specs import HFEngineSpec
from agentrl.engines.vllm import VLLMEngineSpec
from agentrl.models.policy import Policy
from agentrl.training.schedules.grpo import GRPO
from agentrl.training.schedules.rtpo import RTPO
from agentrl.training.schedules.token_ppo import TokenPPO
from agentrl.training.schedules.turn_ppo import TurnPPO
from agentrl.training.update.batching import TurnTargets, collate, pack_rows
from agentrl.training.update.mismatch import recompute_on, with_old_logprobs
from agentrl.training.update.settings import PPOSettings
from agentrl.types import Trajectory
from tests.reference.loops import mismatch_kl_ref
from tests.training.helpers import fit, letter_data, make_module


class PerturbedEngine(HFEngine):
    """The real in-process engine over its own copy of the weights: a behaviour policy that is not the trainer."""

    async def update_weights(self, policy: Any = None, *, version: int | None = None) -> None:
        await super().update_weights(None, version=version)  # the copy stays as it was: only the version moves


class PerturbedEngineSpec:
    """``model.engine`` building a `PerturbedEngine` over the policy's weights plus N(0, sigma²) noise."""

    def __init__(self, sigma: float = 0.05) -> None:
        self.sigma = sigma

    def build(self, policy: Any) -> PerturbedEngine:
        behaviour = copy.deepcopy(policy)
        gen = torch.Generator().manual_seed(123)
        with torch.no_grad():
            for p in behaviour.model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * self.sigma)
        return PerturbedEngine(behaviour)


def _ok(trajs: list[Trajectory]) -> list[Trajectory]:
    return [t for t in trajs if not t.failed and any(turn.response_ids for turn in t.turns)]


def _log_ratio(module: Any, rows: list[Any]) -> torch.Tensor:
    """PPO's first log-ratio log π_θ − log π_old at every trained token, θ = the weights the update starts from."""
    batch = collate(rows, module.scorer.pad_id)
    with torch.no_grad():
        lp = module.policy.logprobs(batch, temperature=module.session.temperature).logprobs
    return (lp - batch.old_logprobs)[batch.response_mask]


def test_recompute_makes_the_first_ratio_one_when_the_engine_differs() -> None:
    module = make_module(GRPO(group_size=2, ppo=PPOSettings(epochs=1)), engine=PerturbedEngineSpec())
    start = copy.deepcopy(module.policy.state_dict())
    fit(module, letter_data(batch_size=2, steps=1))
    logged = module.last_metrics
    trajs = _ok(module.last_trajectories)
    assert trajs
    module.policy.load_state_dict(start)  # θ_old: the weights the step's update started from

    rows = pack_rows(trajs, {(b, t.index): TurnTargets(1.0) for b, tr in enumerate(trajs) for t in tr.turns})
    ppo = PPOSettings()
    plain, none = with_old_logprobs(trajs, rows, ppo, None)
    fixed, stats = with_old_logprobs(trajs, rows, ppo, module.logprobs)
    assert none == {}
    without, with_recompute = _log_ratio(module, plain), _log_ratio(module, fixed)
    assert without.abs().max() > 1e-2  # the engine's log-probs are not π_old: the first ratio is not 1
    assert with_recompute.abs().max() < 1e-6  # recomputed: the first ratio is 1 to 1e-6

    # the metric against a hand computation: each turn scored on its own (no packing), k3 by a plain loop
    old, behaviour = [], []
    for traj in trajs:
        for turn in traj.turns:
            ids = torch.tensor([turn.prompt_ids + turn.response_ids])
            pos = torch.zeros_like(ids, dtype=torch.bool)
            pos[0, len(turn.prompt_ids):] = True
            with torch.no_grad():
                old += module.policy.token_logprobs(ids, torch.ones_like(ids), pos).logprobs[pos].tolist()
            behaviour += turn.logprobs
    by_hand = mismatch_kl_ref(old, behaviour)
    assert by_hand > 1e-4
    assert stats["rollout/logprob_mismatch_kl"] == pytest.approx(by_hand, rel=1e-4)
    assert logged["rollout/logprob_mismatch_kl"] == pytest.approx(by_hand, rel=1e-4)  # what the step logged
    assert stats["rollout/logprob_max_abs_diff"] == pytest.approx(
        max(abs(o - b) for o, b in zip(old, behaviour, strict=True)), rel=1e-4)

    # the TIS weights reach the loss's per-token weights
    batch = collate(fixed, module.scorer.pad_id)
    d = (batch.old_logprobs - collate(plain, module.scorer.pad_id).old_logprobs)[None]
    expected = truncated_is(d, batch.response_mask[None], None, ppo.correction_cap).weights[0]
    torch.testing.assert_close(batch.weights[batch.response_mask], expected[batch.response_mask].float())
    frac = float((d[0][batch.response_mask] > torch.log(torch.tensor(ppo.correction_cap))).double().mean())
    assert stats["rollout/is_corrected_frac"] == pytest.approx(frac)


def test_the_logged_first_ratio_with_and_without_recompute() -> None:
    """End to end through the trainer: one epoch, one minibatch, so ``train/approx_kl`` is the k3 of the first
    ratio. Recompute is on by default here (the engine is not the trainer's own code)."""
    kl = {}
    for recompute in (None, False):
        ppo = PPOSettings(epochs=1, recompute_old_logprobs=recompute)
        module = make_module(GRPO(group_size=2, ppo=ppo), engine=PerturbedEngineSpec())
        fit(module, letter_data(batch_size=2, steps=1))
        kl[recompute] = module.last_metrics["train/approx_kl"]
        assert ("rollout/logprob_mismatch_kl" in module.last_metrics) == (recompute is None)
    assert kl[None] < 1e-10 and kl[False] > 1e-4


@pytest.mark.parametrize("correction", [truncated_is, masked_is, turn_masked_is, None])
def test_every_schedule_trains_with_recompute_and_each_correction(correction: Any) -> None:
    ppo = PPOSettings(epochs=1, recompute_old_logprobs=True, correction=correction, correction_cap=1.05)
    for schedule in (TurnPPO(ppo=ppo), TokenPPO(ppo=ppo), RTPO(group_size=3, ppo=ppo, max_depth=2)):
        module = make_module(schedule, engine=PerturbedEngineSpec())
        fit(module, letter_data(batch_size=2, steps=1))
        m = module.last_metrics
        assert m["rollout/logprob_mismatch_kl"] > 0
        # the ratio starts at 1 against the recomputed π_old; an RTPO depth whose two siblings sampled the same reply
        # has no signal and computes no loss (the critic schedules always do: their value targets)
        assert m["train/approx_kl"] < 1e-10 if "train/approx_kl" in m else isinstance(schedule, RTPO)
        if correction is None:
            assert "rollout/is_corrected_frac" not in m
        else:  # a tight cap (1.05) against sigma = 0.05 noise: some tokens are truncated or masked
            assert 0 < m["rollout/is_corrected_frac"] <= 1


def test_recompute_turns_on_whenever_the_engine_is_not_the_trainers_fp32_code() -> None:
    fp32 = Policy("tiny-random", compute_dtype="float32")
    bf16 = Policy("tiny-random", compute_dtype="bfloat16")
    bf16_weights = Policy("tiny-random", dtype="bfloat16", compute_dtype="float32")
    vllm = VLLMEngineSpec(["http://127.0.0.1:1"])
    auto = PPOSettings()
    assert not recompute_on(auto, HFEngineSpec(), fp32)
    assert recompute_on(auto, HFEngineSpec(), bf16)
    assert recompute_on(auto, HFEngineSpec(), bf16_weights)
    assert recompute_on(auto, vllm, fp32)
    assert recompute_on(auto, PerturbedEngineSpec(), fp32)  # an engine that does not say it is the trainer
    assert recompute_on(PPOSettings(recompute_old_logprobs=True), HFEngineSpec(), fp32)
    assert not recompute_on(PPOSettings(recompute_old_logprobs=False), vllm, bf16)


def test_bad_correction_cap_names_the_key() -> None:
    with pytest.raises(ValueError, match="ppo.correction_cap"):
        PPOSettings(correction_cap=0.5)
