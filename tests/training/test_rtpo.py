"""RTPO on the real trainer with a tiny model: reverse order, fresh weights per depth, turn-k-only gradients,
exact shared prefixes, and the sibling advantages."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from agentrl.training.schedules.rtpo import RTPO, _roll_up_depths
from agentrl.training.system.module import AgentRLModule
from agentrl.training.update.batching import TurnTargets, collate, pack_rows
from agentrl.training.update.settings import OptimSettings, PPOSettings
from agentrl.types import Trajectory
from tests.training.helpers import LetterAgent, PolicyLRs, fit, letter_data


class RecordingModule(AgentRLModule):
    """The real module, keeping what each update was asked to train."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.updates: list[tuple[str, list[Trajectory], dict[tuple[int, int], TurnTargets], int]] = []

    def update(self, trajectories: Any, targets: Any, ppo: PPOSettings, *, tag: str = "") -> dict[str, float]:
        self.updates.append((tag, list(trajectories), dict(targets), self.policy_version))
        return super().update(trajectories, targets, ppo, tag=tag)


def _run(algo: RTPO, steps: int = 1) -> RecordingModule:
    import lightning.pytorch as pl

    pl.seed_everything(0, verbose=False)
    from agentrl.models.policy import Policy

    module = RecordingModule(Policy("tiny-random"), algo, peak_flops=1e11)
    fit(module, letter_data(batch_size=3, steps=steps))
    return module


def test_rtpo_updates_in_reverse_turn_order_with_fresh_weights() -> None:
    algo = RTPO(group_size=3, ppo=PPOSettings(epochs=1))
    module = _run(algo, steps=2)
    tags = [u[0] for u in module.updates]
    assert tags == ["k2", "k1", "k0", "k2", "k1", "k0"]  # LetterAgent episodes have 3 turns
    for tag, siblings, targets, version in module.updates:
        k = int(tag[1:])
        # every sampled turn of depth k (turn k and the continuation) used the weights current at depth k
        assert {t.policy_version for s in siblings for t in s.turns[k:]} == {version}
        assert all(t.forced for s in siblings for t in s.turns[:k])
        assert set(targets) == {(b, k) for b in range(len(siblings))}
    assert [v for _, _, _, v in module.updates] == sorted(v for _, _, _, v in module.updates)
    assert module.policy_version == 2 * 3  # one push per depth


def test_only_turn_k_tokens_have_loss_weight_and_prefixes_match_the_trunk() -> None:
    module = _run(RTPO(group_size=3, ppo=PPOSettings(epochs=1)))
    for tag, siblings, targets, _ in module.updates:
        k = int(tag[1:])
        batch = collate(pack_rows(siblings, targets), 0)
        for b, sib in enumerate(siblings):
            turn = sib.turns[k]
            expected = torch.zeros(batch.input_ids.shape[1], dtype=torch.bool)
            expected[len(turn.prompt_ids) : turn.num_tokens] = True
            assert torch.equal(batch.response_mask[b], expected)
        # siblings of one trunk share its exact prompt ids up to turn k (c_k) and its responses before k
        by_group: dict[int, list[Trajectory]] = {}
        for s in siblings:
            by_group.setdefault(s.group, []).append(s)
        for group in by_group.values():
            assert len(group) == 2  # G − 1 siblings
            first = group[0]
            for other in group[1:]:
                for i in range(k + 1):
                    assert other.turns[i].prompt_ids == first.turns[i].prompt_ids
                for i in range(k):
                    assert other.turns[i].response_ids == first.turns[i].response_ids


def test_sibling_advantages_sum_to_zero_per_pair_and_vanish_for_g2() -> None:
    module = _run(RTPO(group_size=3, ppo=PPOSettings(epochs=1)))
    for _, siblings, targets, _ in module.updates:
        sums: dict[int, float] = {}
        for (b, _), tgt in targets.items():
            sums[siblings[b].group] = sums.get(siblings[b].group, 0.0) + float(tgt.advantage)  # type: ignore[arg-type]
        assert all(abs(v) < 1e-9 for v in sums.values())
    g2 = _run(RTPO(group_size=2, ppo=PPOSettings(epochs=1)))
    assert all(float(t.advantage) == 0.0 for _, _, targets, _ in g2.updates for t in targets.values())  # type: ignore[arg-type]


def test_off_policy_continuation_samples_up_front_with_is_weights() -> None:
    module = _run(RTPO(group_size=3, off_policy_continuation=True, is_clamp=1.5, ppo=PPOSettings(epochs=1)))
    versions = [v for _, _, _, v in module.updates]
    sampled = {t.policy_version for _, sib, _, _ in module.updates for s in sib for t in s.turns if not t.forced}
    assert sampled == {0}  # every depth's siblings come from the step's initial weights
    assert versions == [0, 1, 2]
    weights = [t.weight for _, _, targets, _ in module.updates for t in targets.values()]
    assert all(1 / 1.5 - 1e-9 <= w <= 1.5 + 1e-9 for w in weights)
    assert any(w != 1.0 for w in weights)  # downstream turns moved after the first update


def test_rtpo_validation() -> None:
    with pytest.raises(ValueError, match="group_size"):
        RTPO(group_size=1)
    with pytest.raises(ValueError, match="max_depth"):
        RTPO(max_depth=0)


def test_max_depth_caps_the_sweep() -> None:
    module = _run(RTPO(group_size=3, max_depth=2, ppo=PPOSettings(epochs=1)))
    assert [u[0] for u in module.updates] == ["k1", "k0"]


def test_depth_roll_up_weights_the_correction_metrics_by_recomputed_tokens() -> None:
    deep = {"train/policy_loss": 0.3, "rollout/recomputed_tokens": 10.0, "rollout/logprob_mismatch_kl": 0.1,
            "rollout/is_corrected_frac": 0.0, "rollout/logprob_max_abs_diff": 0.9, "train/optimizer_steps": 1.0}
    shallow = {"train/policy_loss": 0.1, "rollout/recomputed_tokens": 30.0, "rollout/logprob_mismatch_kl": 0.4,
               "rollout/is_corrected_frac": 0.2, "rollout/logprob_max_abs_diff": 0.5, "train/optimizer_steps": 1.0}
    # a depth trained on another rank only: the step decision is global, the shares here are none
    elsewhere: dict[str, float] = {"train/optimizer_steps": 1.0, "train/skipped_updates": 0.0}
    skipped: dict[str, float] = {"train/skipped_updates": 1.0, "train/optimizer_steps": 0.0}  # trained nowhere
    out = _roll_up_depths([deep, elsewhere, skipped, shallow])
    assert out["rollout/recomputed_tokens"] == 40.0
    assert out["rollout/logprob_mismatch_kl"] == pytest.approx((0.1 * 10 + 0.4 * 30) / 40)  # the 40 tokens' mean
    assert out["rollout/is_corrected_frac"] == pytest.approx(0.2 * 30 / 40)
    assert out["rollout/logprob_max_abs_diff"] == 0.9
    assert out["rtpo/trained_depths"] == 3.0
    # shares over the trained depths: the one trained elsewhere counts 0 here, the skipped one not at all
    assert out["train/policy_loss"] == pytest.approx((0.3 + 0.0 + 0.1) / 3)


class CoinAgent(LetterAgent):
    """LetterAgent whose episode succeeds when the last reply's code points sum to an even number: about half the
    trunks and siblings of a random model win, so a pooled success rate is not trivially 0 or 1."""

    async def run(self, task: Any, llm: Any) -> Any:
        from agentrl.agents.base import Outcome

        messages = [{"role": "user", "content": task.id}]
        text = ""
        for _ in range(self.turns):
            reply = await llm.chat(messages)
            text = reply.text
            llm.reward(0.0)
            messages += [reply.message(), {"role": "user", "content": "again"}]
        return Outcome(1.0 if sum(map(ord, text)) % 2 == 0 else 0.0, info={"success": sum(map(ord, text)) % 2 == 0})


def test_generated_success_pools_trunks_and_every_sibling() -> None:
    """``rollout/generated_success`` (the sweep's score) is the success rate over trunks and siblings together,
    worked out here from the trunks' logged rate and the siblings each depth trained."""
    import lightning.pytorch as pl

    from agentrl.engines.base import SamplingParams
    from agentrl.models.policy import Policy
    from agentrl.training.rollout.datamodule import RolloutDataModule

    pl.seed_everything(0, verbose=False)
    module = RecordingModule(Policy("tiny-random"), RTPO(group_size=3, ppo=PPOSettings(epochs=1)), peak_flops=1e11)
    fit(module, RolloutDataModule(CoinAgent(), batch_size=4, steps=1, sampling=SamplingParams(max_tokens=6)))
    m = module.last_metrics
    trunks_won = m["rollout/success"] * m["rollout/ok_episodes"]
    siblings = [s for _, sibs, _, _ in module.updates for s in sibs]
    assert len(siblings) == 3 * 4 * 2  # three depths, four trunks, two siblings each
    won = trunks_won + sum(s.success for s in siblings)
    assert m["rollout/generated_episodes"] == 4 + len(siblings)
    assert m["rollout/generated_success"] == pytest.approx(won / (m["rollout/ok_episodes"] + len(siblings)))
    assert 0.0 < m["rollout/generated_success"] < 1.0  # the case is not degenerate
    assert m["rollout/generated_success"] != pytest.approx(m["rollout/success"])  # and differs from trunks alone


class _InformativeModule(RecordingModule):
    """The real module, keeping each depth update's informative samples (one minibatch a depth here)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.informative: list[float] = []

    def update(self, trajectories: Any, targets: Any, ppo: PPOSettings, *, tag: str = "") -> dict[str, float]:
        out = super().update(trajectories, targets, ppo, tag=tag)
        self.informative.append(out.get("train/informative_samples", 0.0))
        return out


def _policy_lrs(algo: RTPO, lr: float) -> tuple[list[float], list[float]]:
    from agentrl.models.policy import Policy

    pl.seed_everything(0, verbose=False)
    module = _InformativeModule(Policy("tiny-random"), algo, peak_flops=1e11, optim=OptimSettings(lr=lr))
    log = PolicyLRs()
    fit(module, letter_data(batch_size=3, steps=2), callbacks=[log])
    assert module.trainer.optimizers[0].param_groups[0]["lr"] == lr  # the configured rate is left as it was
    return log.lrs, module.informative


def test_rtpo_steps_at_its_configured_rate_unless_the_informative_sibling_factor_is_asked_for() -> None:
    """By default RTPO has no informative-sibling rate factor (not in the paper): every policy step runs at the
    configured lr. ``ppo.lr_reference_samples: 16`` restores the earlier rule of the grid's RTPO: each depth's
    step (one minibatch a depth here) at lr · min(1, n / 16), n that depth's informative siblings."""
    assert RTPO().ppo.lr_reference_samples is None
    lr = 1e-3
    plain, _ = _policy_lrs(RTPO(group_size=3, ppo=PPOSettings(epochs=1)), lr)
    assert plain and plain == [lr] * len(plain)
    scaled, informative = _policy_lrs(RTPO(group_size=3, ppo=PPOSettings(epochs=1, lr_reference_samples=16)), lr)
    expected = [lr * min(1.0, n / 16) for n in informative if n > 0]
    assert scaled == pytest.approx(expected, rel=1e-9, abs=0.0)
    assert scaled and max(scaled) < lr  # 3 trunks x 2 siblings: at most 6 of 16 informative
