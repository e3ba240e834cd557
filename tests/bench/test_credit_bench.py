"""`benchmarks/credit.py` with a trained critic: a learning cell's checkpoint loads into the policy and critic it
trained (strictly), the critic's values through the benchmark's scorer are the trainer's own, and Turn-PPO's
advantages are `TurnPPO.critic_targets` on the re-scored rewards (with the neutral critic: turn GAE by hand)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from credit import CriticScorer, critic_profile, load_trained, score_turn_ppo, within_cue_auc

from agentrl.algorithms.advantages import turn_gae, whiten
from agentrl.training.schedules.turn_ppo import TurnPPO
from agentrl.training.update.batching import keys_of
from agentrl.training.update.settings import CriticSettings, PPOSettings
from tests.training.helpers import fit, letter_data, make_module


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Two Turn-PPO steps on the tiny model (the critic head leaves zero), and their checkpoint."""
    module = make_module(TurnPPO(ppo=PPOSettings(epochs=1)), critic=CriticSettings(shared_backbone=False))
    trainer = fit(module, letter_data(batch_size=4, steps=2))
    path = tmp_path_factory.mktemp("ckpt") / "last.ckpt"
    trainer.save_checkpoint(str(path))
    return module, path


def test_a_checkpoint_loads_the_critic_it_trained_and_scores_as_the_trainer(trained) -> None:  # type: ignore[no-untyped-def]
    module, path = trained
    policy, critic = load_trained(path, "tiny-random")
    assert critic is not None and critic.backbone is not None  # the run's own critic backbone, not shared
    assert float(critic.head.weight.detach().abs().sum()) > 0  # trained: no longer the neutral start
    for name, value in module.critic.state_dict().items():
        torch.testing.assert_close(critic.state_dict()[name], value, rtol=0, atol=0)
    for name, value in module.policy.state_dict().items():
        torch.testing.assert_close(policy.state_dict()[name], value, rtol=0, atol=0)
    trajs = [t for t in module.last_trajectories if not t.failed]
    keys = keys_of(trajs)
    ours, theirs = CriticScorer(policy, critic).values(trajs, keys), module.values(trajs, keys)
    assert set(ours) == set(theirs) and any(abs(v[0]) > 1e-6 for v in ours.values())
    for key in keys:
        assert ours[key] == pytest.approx(theirs[key], abs=1e-5)


def test_turn_ppo_credit_is_the_schedules_own_and_the_neutral_critic_is_turn_gae(trained) -> None:  # type: ignore[no-untyped-def]
    module, path = trained
    policy, critic = load_trained(path, "tiny-random")
    trajs = [t for t in module.last_trajectories if not t.failed]
    rewards = [[0.0] * (t.num_turns - 1) + [1.0 if b % 2 else -0.5] for b, t in enumerate(trajs)]  # re-scored
    infos = [{"turn_kinds": ["decision"] + ["distractor"] * (t.num_turns - 1),
              "turn_right": [bool(b % 2)] + [None] * (t.num_turns - 1)} for b, t in enumerate(trajs)]
    neutral = score_turn_ppo(trajs, rewards, infos, CriticScorer(policy, None))
    B, T = len(rewards), max(len(r) for r in rewards)
    r, mask = torch.zeros(B, T), torch.zeros(B, T, dtype=torch.bool)
    for b, row in enumerate(rewards):
        r[b, : len(row)], mask[b, : len(row)] = torch.tensor(row), True
    ppo = TurnPPO()
    adv, _ = turn_gae(r, torch.zeros_like(r), mask, gamma=ppo.gamma, lam=ppo.lam)
    adv = whiten(adv, mask)
    assert [x[0] for x in neutral] == pytest.approx([float(adv[b, n]) for b in range(B)
                                                        for n in range(len(rewards[b]))], abs=1e-6)
    assert next((x[1], x[2]) for x in neutral) == ("decision", False)
    scored = score_turn_ppo(trajs, rewards, infos, CriticScorer(policy, critic))
    values = CriticScorer(policy, critic).values(trajs, keys_of(trajs))
    v = torch.zeros(B, T)
    for (b, n), vs in values.items():
        v[b, n] = vs[0]
    adv, _ = turn_gae(r, v, mask, gamma=ppo.gamma, lam=ppo.lam)
    assert [x[0] for x in scored] == pytest.approx([float(x) for b in range(B)
                                                       for x in whiten(adv, mask)[b, : len(rewards[b])]], abs=1e-5)
    assert [x[0] for x in scored] != pytest.approx([x[0] for x in neutral], abs=1e-6)  # the critic counts


def test_a_checkpoint_without_a_critic_and_a_bad_file(trained, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, path = trained
    state = torch.load(path, map_location="cpu", weights_only=True)
    state["state_dict"] = {k: v for k, v in state["state_dict"].items() if not k.startswith("critic.")}
    bare = tmp_path / "grpo.ckpt"
    torch.save(state, bare)
    policy, critic = load_trained(bare, "tiny-random")
    assert critic is None and policy is not None
    (tmp_path / "junk.ckpt").write_text("not a checkpoint")
    with pytest.raises(SystemExit, match="junk.ckpt: not a readable agentrl checkpoint"):
        load_trained(tmp_path / "junk.ckpt", "tiny-random")


def test_the_critic_profile_averages_v_by_turn_over_right_and_wrong_decisions(trained) -> None:  # type: ignore[no-untyped-def]
    module, path = trained
    policy, critic = load_trained(path, "tiny-random")
    trajs = [t for t in module.last_trajectories if not t.failed]
    infos = [{"turn_kinds": ["decision"] + ["distractor"] * (t.num_turns - 1),
              "turn_right": [b < 2] + [None] * (t.num_turns - 1)} for b, t in enumerate(trajs)]
    scorer = CriticScorer(policy, critic)
    values = scorer.values(trajs, keys_of(trajs))
    got = critic_profile(scorer, trajs, infos)
    assert got["right"]["episodes"] == 2 and got["wrong"]["episodes"] == len(trajs) - 2
    assert got["right"]["mean_v_by_turn"][0] == pytest.approx((values[(0, 0)][0] + values[(1, 0)][0]) / 2)
    wrong = [values[(b, 0)][0] for b in range(2, len(trajs))]
    assert got["wrong"]["mean_v_by_turn"][0] == pytest.approx(sum(wrong) / len(wrong))
    neutral = critic_profile(CriticScorer(policy, None), trajs, infos)
    assert all(v == 0.0 for side in neutral.values() for v in side["mean_v_by_turn"])


def test_within_cue_auc_compares_right_and_wrong_on_the_same_cue_only() -> None:
    scored = [(-0.1, "decision", True, "apple"), (-0.3, "decision", False, "apple"), (-0.1, "decision", False, "apple"),
              (0.9, "decision", True, "river"), (0.5, "distractor", None, None), (-2.0, "decision", False, "stone")]
    # apple: right -0.1 against wrong -0.3 (win) and -0.1 (tie: half); river and stone have no pair
    assert within_cue_auc(scored) == (pytest.approx(0.75), 2)
    # pooled, right (-0.1, 0.9) against wrong (-0.3, -0.1, -2.0): the same reply on two cues would rank anything
    assert within_cue_auc([(0.0, "decision", True, "a"), (1.0, "decision", False, "b")]) == (None, 0)
