"""`benchmarks/credit.py` with a trained critic: a learning cell's checkpoint loads into the policy and critic it
trained (strictly), the critic's values through the benchmark's scorer are the trainer's own, and Turn-PPO's
advantages are `TurnPPO.critic_targets` on the re-scored rewards (with the neutral critic: turn GAE by hand)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from credit import CriticScorer, load_trained, score_turn_ppo

from agentrl.algorithms.advantages import turn_gae, whiten
from agentrl.training.batching import keys_of
from agentrl.training.schedules import TurnPPO
from agentrl.training.settings import CriticSettings, PPOSettings
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
    assert [a for a, _, _ in neutral] == pytest.approx([float(adv[b, n]) for b in range(B)
                                                        for n in range(len(rewards[b]))], abs=1e-6)
    assert next((k, right) for _, k, right in neutral) == ("decision", False)
    scored = score_turn_ppo(trajs, rewards, infos, CriticScorer(policy, critic))
    values = CriticScorer(policy, critic).values(trajs, keys_of(trajs))
    v = torch.zeros(B, T)
    for (b, n), vs in values.items():
        v[b, n] = vs[0]
    adv, _ = turn_gae(r, v, mask, gamma=ppo.gamma, lam=ppo.lam)
    assert [a for a, _, _ in scored] == pytest.approx([float(x) for b in range(B)
                                                       for x in whiten(adv, mask)[b, : len(rewards[b])]], abs=1e-5)
    assert [a for a, _, _ in scored] != pytest.approx([a for a, _, _ in neutral], abs=1e-6)  # the critic counts


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
