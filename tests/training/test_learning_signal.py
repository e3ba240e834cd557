"""The learning signal is what it says (issue 26): no optimizer step without a gradient behind it, metrics at their
stated scale and never stale, π_old from the weights that sampled, a critic that starts neutral and warms up, a
KL early stop that acts, and a learning rate scaled by the evidence of the update. Expected values are worked out
by hand or by the policy itself on the same ids, on real tiny Lightning runs."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from agentrl.models.critic import TurnCritic
from agentrl.training.schedules.grpo import GRPO
from agentrl.training.schedules.rtpo import RTPO, _roll_up_depths
from agentrl.training.schedules.token_ppo import TokenPPO
from agentrl.training.schedules.turn_ppo import TurnPPO
from agentrl.training.system.health import step_health
from agentrl.training.update.batching import TurnTargets, collate, pack_rows
from agentrl.training.update.settings import OptimSettings, PPOSettings
from agentrl.types import Trajectory
from tests.training.exactness_run import _trajectory, fixed_schedule
from tests.training.helpers import PolicyLRs, fit, letter_data, make_module
from tests.training.test_evaluation import Recorder
from tests.training.test_update_rules import _tied_groups


def _behaviour_from_policy(module: Any, trajs: list[Trajectory]) -> None:
    """Behaviour log-probs = the initial policy's (ratios start at 1: the gradient is the policy gradient)."""
    for t in trajs:
        lp = module.logprobs([t], [(0, turn.index) for turn in t.turns])
        for turn in t.turns:
            turn.logprobs = lp[(0, turn.index)]


@pytest.mark.parametrize("minibatch_size", [None, 1])
def test_identical_replies_whose_advantages_cancel_take_no_optimizer_step(minibatch_size: int | None) -> None:
    """Two samples with the same context and the same reply but returns 0 and 1 (RTPO siblings that sampled the
    same turn-k reply, here a GRPO group): advantages ±a, a gradient that cancels exactly; the old rule stepped
    AdamW on it (momentum and a float-noise gradient normalised to full size). With one row per minibatch the
    twins land in different minibatches: the fold is over the whole update, so neither half steps either."""
    same = _trajectory(("twin",), 1, 0)
    twin = copy.deepcopy(same)
    same.turns[-1].reward, twin.turns[-1].reward = 0.0, 1.0
    trajs = [same, twin]
    ppo = PPOSettings(epochs=2, minibatch_size=minibatch_size)
    module = make_module(fixed_schedule(GRPO, [trajs], group_size=2, ppo=ppo), optim=OptimSettings(lr=1e-3))
    _behaviour_from_policy(module, trajs)
    before = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
    trainer = fit(module, letter_data(batch_size=2, steps=1))
    assert all(torch.equal(before[n], p) for n, p in module.policy.named_parameters())
    opt = trainer.optimizers[0]
    assert all("step" not in opt.state[p] for g in opt.param_groups for p in g["params"])
    m = module.last_metrics
    assert m["train/zero_advantage_frac"] == 0.0  # each advantage alone is non-zero: ±1
    assert m["train/skipped_updates"] == (2.0 if minibatch_size is None else 4.0)
    assert m["train/optimizer_steps"] == 0.0
    assert m["train/informative_samples"] == 0.0


def test_rtpo_rolls_up_the_trained_depths_only() -> None:
    """Depth 2 trained (entropy 0.46, grad norm 1.2), depth 1 skipped for lack of signal, depth 0 trained (entropy
    0.30, grad norm 0.8): the step's entropy is (0.46 + 0.30) / 2 = 0.38, not / 3."""
    per_depth = [
        {"train/entropy": 0.46, "train/grad_norm": 1.2, "train/optimizer_steps": 1.0, "train/skipped_updates": 0.0},
        {"train/skipped_updates": 1.0, "train/optimizer_steps": 0.0},
        {"train/entropy": 0.30, "train/grad_norm": 0.8, "train/optimizer_steps": 2.0, "train/skipped_updates": 0.0},
    ]
    out = _roll_up_depths(per_depth)
    assert out["train/entropy"] == 0.38
    assert out["train/grad_norm"] == 1.0
    assert out["rtpo/trained_depths"] == 2.0
    assert out["train/optimizer_steps"] == 3.0 and out["train/skipped_updates"] == 1.0


class ProbeOnce(GRPO):
    """GRPO that reports one extra metric at its first step only."""

    def step(self, learner: Any, tasks: list[Any]) -> dict[str, float]:
        out = super().step(learner, tasks)
        if learner.rl_step == 0:
            out["train/probe"] = 7.0
        return out


def test_a_metric_a_step_did_not_measure_is_not_logged_again() -> None:
    """Lightning's ``log_dict`` re-logs every key of the epoch at every later step: the probe of step 1 came back
    at steps 2 and 3 as if measured there."""
    module = make_module(ProbeOnce(group_size=2))
    logger = Recorder()
    fit(module, letter_data(batch_size=2, steps=3), logger=logger, log_every_n_steps=1)
    rows = [m for _, m in logger.rows if "rollout/reward" in m]
    assert len(rows) == 3
    assert rows[0]["train/probe"] == 7.0
    assert ["train/probe" in m for m in rows[1:]] == [False, False]


def test_grpo_statistics_are_means_over_turns_not_times_the_turns_per_trajectory() -> None:
    """Two-turn trajectories (trajectory weighting: each turn 1/2 unit). The logged entropy is the mean over the
    four turns of each turn's token-mean entropy, computed here by the policy on the same ids; the old reduction
    gave twice that (share = turns / trajectories)."""
    trajs = [_trajectory(("ent", g, j), 2, g) for g in range(2) for j in range(2)]
    for i, t in enumerate(trajs):
        t.turns[-1].reward = float(i % 2)
    module = make_module(fixed_schedule(GRPO, [trajs], group_size=2, ppo=PPOSettings(epochs=1)))
    _behaviour_from_policy(module, trajs)
    expected = []
    with torch.no_grad():
        for t in trajs:
            for turn in t.turns:
                rows = pack_rows([t], {(0, turn.index): TurnTargets(0.0)}, pack=False)
                b = collate(rows, module.scorer.pad_id)
                lp = module.policy.logprobs_from_hidden(module.policy.hidden_states(b.input_ids, b.attention_mask),
                                                        b.input_ids, b.response_mask, with_entropy=True)
                assert lp.entropy is not None
                expected.append(float(lp.entropy[b.response_mask].mean()))
    fit(module, letter_data(batch_size=2, steps=1))
    logged = module.last_metrics["train/entropy"]
    assert abs(logged - sum(expected) / len(expected)) < 1e-4 * abs(logged)
    assert 0.0 <= module.last_metrics["train/clipfrac"] <= 1.0


def test_the_off_policy_ablation_takes_pi_old_from_the_weights_that_sampled() -> None:
    """Off-policy continuation samples every depth up front with θ_0. With π_old recomputed, depth 0's first
    ratio must be π_θ / π_θ0 after depths 2 and 1 moved the weights (approx_kl > 0), not π_θ / π_θ (recomputed
    with the current weights: approx_kl ≈ 1e-12)."""
    ppo = PPOSettings(epochs=1, recompute_old_logprobs=True)
    module = make_module(RTPO(group_size=3, off_policy_continuation=True, ppo=ppo), optim=OptimSettings(lr=1e-3))
    fit(module, letter_data(batch_size=2, steps=1))
    m = module.last_metrics
    assert m["rtpo/trained_depths"] == 3.0  # every depth moved the weights
    assert m["rtpo/depth2/approx_kl"] < 1e-9  # the deepest depth trains first, at θ_0 itself
    assert m["rtpo/depth0/approx_kl"] > 1e-6


def test_the_critic_starts_neutral_and_warms_up_before_the_first_policy_update() -> None:
    module = make_module(TurnPPO(value_warmup_epochs=3, ppo=PPOSettings(epochs=1)), optim=OptimSettings(lr=1e-3))
    critic = module.critic
    assert isinstance(critic, TurnCritic)
    ids = torch.randint(3, 300, (2, 12))
    assert torch.equal(critic(ids, torch.ones_like(ids)), torch.zeros(2, 12))  # V = 0 everywhere at the start
    calls: list[tuple[str, bool, bool]] = []
    original = module.update
    policy0 = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
    head0 = critic.head.weight.detach().clone()

    def update(*args: Any, **kwargs: Any) -> dict[str, float]:
        out = original(*args, **kwargs)
        moved = any(not torch.equal(policy0[n], p) for n, p in module.policy.named_parameters())
        calls.append((kwargs.get("tag", ""), moved, not torch.equal(head0, critic.head.weight)))
        return out

    module.update = update  # type: ignore[method-assign]
    fit(module, letter_data(batch_size=2, steps=2))
    # step 1: the warm-up moves the critic only, then the policy update; step 2: no second warm-up
    assert calls == [("value-warmup", False, True), ("", True, True), ("", True, True)]
    assert module.last_metrics.get("train/value_warmup_loss") is None  # only the first step warms up


@pytest.mark.parametrize("schedule", ["turn", "token"])
def test_critic_only_steps_fit_the_critic_on_fresh_batches_before_the_policy_moves(schedule: str) -> None:
    """`value_warmup_steps: 2`: steps 1 and 2 each collect a batch and move the critic only (no policy optimizer
    step, `train/critic_only`), step 3 is a normal update. The health check sees no dead step in the critic-only
    ones; the budget counts their tokens."""
    cls = TurnPPO if schedule == "turn" else TokenPPO
    module = make_module(cls(value_warmup_steps=2, value_warmup_epochs=2, ppo=PPOSettings(epochs=1)),
                         optim=OptimSettings(lr=1e-3))
    critic = module.critic
    assert critic is not None
    calls: list[tuple[str, int, bool, bool]] = []
    original = module.update

    def update(*args: Any, **kwargs: Any) -> dict[str, float]:
        policy0 = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
        critic0 = {n: p.detach().clone() for n, p in critic.named_parameters()}
        out = original(*args, **kwargs)
        moved = any(not torch.equal(policy0[n], p) for n, p in module.policy.named_parameters())
        critic_moved = any(not torch.equal(critic0[n], p) for n, p in critic.named_parameters())
        calls.append((kwargs.get("tag", ""), args[2].epochs, moved, critic_moved))
        return out

    module.update = update  # type: ignore[method-assign]
    per_step: list[dict[str, float]] = []
    original_step = module.algorithm.step

    def step(*args: Any, **kwargs: Any) -> dict[str, float]:
        out = original_step(*args, **kwargs)
        per_step.append(dict(out))
        return out

    module.algorithm.step = step  # type: ignore[method-assign]
    data = letter_data(batch_size=2, steps=3)
    fit(module, data)
    # steps 1-2: the critic alone, value_warmup_epochs epochs each, from its own batch; step 3: policy and critic
    assert calls == [("value-warmup", 2, False, True), ("value-warmup", 2, False, True), ("", 1, True, True)]
    assert [m.get("train/critic_only") for m in per_step] == [1.0, 1.0, None]
    assert all("rollout/reward" in m for m in per_step)  # each critic-only step collected its own batch
    assert module.rl_step == 3 and module.generated_tokens > 0
    assert not any(f.code == "no_optimizer_step" for f in step_health([], per_step[0]))


def test_critic_only_steps_are_checked() -> None:
    with pytest.raises(ValueError, match="value_warmup_steps must be >= 0"):
        TurnPPO(value_warmup_steps=-1)
    with pytest.raises(ValueError, match="value_warmup_steps must be 0 with zero_critic"):
        TurnPPO(zero_critic=True, value_warmup_steps=2)


def test_target_kl_stops_the_update_at_the_first_minibatch_over_it() -> None:
    """Four epochs at a high learning rate: the first step starts at ratio 1 (KL 0) and is taken; the second
    epoch's KL exceeds a tiny target, so it stops there. The control without a target takes all four."""
    steps = {}
    for target in (None, 1e-9):
        ppo = PPOSettings(epochs=4, target_kl=target)
        module = make_module(GRPO(group_size=2, ppo=ppo), optim=OptimSettings(lr=1e-3))
        log = PolicyLRs()
        fit(module, letter_data(batch_size=4, steps=1), callbacks=[log])
        steps[target] = (len(log.lrs), module.last_metrics["train/optimizer_steps"],
                         module.last_metrics.get("train/early_stopped", 0.0))
    assert steps[None] == (4, 4.0, 0.0)
    assert steps[1e-9] == (1, 1.0, 1.0)


def test_the_learning_rate_scales_with_the_informative_samples_of_an_update() -> None:
    """Three informative turns (two tied groups, one untied: its trajectories have 1 and 2 turns) against a
    reference of 12: the policy steps at lr · 3/12; without a reference at lr."""
    trajs = _tied_groups()
    trajs[3].turns[-1].reward = 1.0  # group 1 untied: returns 0.5 and 1.0
    seen = {}
    for reference in (None, 12):
        batch = copy.deepcopy(trajs)
        module = make_module(fixed_schedule(GRPO, [batch], group_size=2,
                                            ppo=PPOSettings(epochs=1, lr_reference_samples=reference)),
                             optim=OptimSettings(lr=1e-3))
        _behaviour_from_policy(module, batch)
        log = PolicyLRs()
        fit(module, letter_data(batch_size=2, steps=1), callbacks=[log])
        seen[reference] = (log.lrs, module.last_metrics["train/informative_samples"])
        assert module.trainer.optimizers[0].param_groups[0]["lr"] == 1e-3  # restored after the update
    assert seen[None] == ([1e-3], 3.0)
    assert seen[12][1] == 3.0 and abs(seen[12][0][0] - 1e-3 * 3 / 12) < 1e-12


def test_each_optimizer_step_is_sized_by_the_informative_samples_behind_it() -> None:
    """The same three informative turns split into one-row minibatches: the untied group's 1-turn trajectory and
    its 2-turn one are two steps, at lr · 1/12 and lr · 2/12 (the tied rows take no step). Summed, the update moves
    as far as one step on all three (lr · 3/12); sizing each step by the whole update's 3 samples would move twice
    as far (both steps at lr · 3/12)."""
    trajs = _tied_groups()
    trajs[3].turns[-1].reward = 1.0  # group 1 untied: returns 0.5 and 1.0
    batch = copy.deepcopy(trajs)
    ppo = PPOSettings(epochs=1, minibatch_size=1, lr_reference_samples=12)
    module = make_module(fixed_schedule(GRPO, [batch], group_size=2, ppo=ppo), optim=OptimSettings(lr=1e-3))
    _behaviour_from_policy(module, batch)
    log = PolicyLRs()
    fit(module, letter_data(batch_size=2, steps=1), callbacks=[log])
    assert sorted(log.lrs) == pytest.approx([1e-3 * 1 / 12, 1e-3 * 2 / 12], abs=1e-12)
    assert module.last_metrics["train/informative_samples"] == 3.0
    assert module.last_metrics["train/lr_scale"] == pytest.approx(1.5 / 12)  # the mean over the two steps
    assert module.trainer.optimizers[0].param_groups[0]["lr"] == 1e-3  # restored after each step


@pytest.mark.parametrize("schedule", [TurnPPO, TokenPPO])
def test_a_batch_with_one_return_is_left_unscaled_when_asked(schedule: type[TurnPPO] | type[TokenPPO]) -> None:
    """Three episodes that all won (R = 1): R − V is the critic's error alone. Whitened (the default) it becomes
    unit-sized noise around 0, so some equally good replies are pushed down; with ``whiten_equal_returns=False``
    it stays R − V exactly (γ = λ = 1: the return minus the critic's value, at every turn or token). A batch whose
    returns differ is whitened the same under both settings."""
    trajs = [_trajectory(("one-return", k), 2, k) for k in range(3)]
    results: dict[tuple[bool, bool], tuple[list[float], dict[str, float], list[float]]] = {}
    for whiten_equal in (True, False):
        chosen = schedule(whiten_equal_returns=whiten_equal)
        module = make_module(chosen)
        assert module.critic is not None
        with torch.no_grad():  # a critic with an opinion: V differs from state to state
            module.critic.head.weight.normal_(0.0, 0.5)
        for vary in (False, True):
            for k, t in enumerate(trajs):
                t.turns[-1].reward = 0.0 if vary and k == 1 else 1.0
            targets, stats = chosen.critic_targets(module, trajs)
            values = module.values(trajs, [(b, n) for b in range(3) for n in range(2)])
            adv = [a for b in range(3) for n in range(2) for a in _as_list(targets[(b, n)].advantage)]
            raw = [trajs[b].turns[-1].reward - v for b in range(3) for n in range(2)
                   for v in (values[(b, n)] if schedule is TokenPPO else values[(b, n)][:1])]
            results[(whiten_equal, vary)] = (adv, stats, raw)
    adv, stats, raw = results[(True, False)]
    assert abs(sum(adv)) < 1e-5 and abs(float(torch.tensor(adv).std()) - 1.0) < 1e-4  # whitened critic error
    assert "train/whitened" not in stats
    adv, stats, raw = results[(False, False)]
    assert adv == pytest.approx(raw, abs=1e-6) and stats["train/whitened"] == 0.0
    assert max(abs(a) for a in adv) > 1e-3  # the critic's error is there, and not scaled up
    assert results[(False, True)][0] == pytest.approx(results[(True, True)][0], abs=1e-6)
    assert results[(False, True)][1]["train/whitened"] == 1.0


def _as_list(x: float | list[float]) -> list[float]:
    return x if isinstance(x, list) else [x]


@pytest.mark.parametrize("critic_lam", [None, 1.0])
def test_decoupled_gae_gives_the_critic_its_own_lambda(critic_lam: float | None) -> None:
    """Turn-PPO at λ 0.5 on a 3-turn episode (rewards 0, 0.5, 1; γ = 1), with a critic whose values V0..V2 are
    read from the module. The policy's advantages are λ 0.5 GAE in both cases; the critic's targets are the λ 0.5
    returns A_n + V_n (coupled, ``critic_lam`` None) or the Monte Carlo return-to-go 1.5, 1.5, 1.0 (``critic_lam``
    1). Worked by hand: δ_n = r_n + V_{n+1} − V_n (V_3 = 0), A_2 = δ_2, A_1 = δ_1 + 0.5 A_2, A_0 = δ_0 + 0.5 A_1."""
    traj = _trajectory(("decoupled",), 3, 0)
    for turn, r in zip(traj.turns, (0.0, 0.5, 1.0), strict=True):
        turn.reward = r
    chosen = TurnPPO(lam=0.5, critic_lam=critic_lam, whiten_advantages=False)
    module = make_module(chosen)
    assert module.critic is not None
    with torch.no_grad():
        module.critic.head.weight.normal_(0.0, 0.5)  # a critic with an opinion
    values = module.values([traj], [(0, n) for n in range(3)])
    v = [values[(0, n)][0] for n in range(3)]
    assert len(set(v)) == 3
    d2 = 1.0 - v[2]
    d1 = 0.5 + v[2] - v[1]
    d0 = 0.0 + v[1] - v[0]
    a2 = d2
    a1 = d1 + 0.5 * a2
    a0 = d0 + 0.5 * a1
    targets, _ = chosen.critic_targets(module, [traj])
    assert [targets[(0, n)].advantage for n in range(3)] == pytest.approx([a0, a1, a2], abs=1e-5)
    expected = [a0 + v[0], a1 + v[1], a2 + v[2]] if critic_lam is None else [1.5, 1.5, 1.0]
    assert [targets[(0, n)].returns for n in range(3)] == pytest.approx(expected, abs=1e-5)


def test_critic_lam_is_checked() -> None:
    with pytest.raises(ValueError, match="critic_lam must be in"):
        TurnPPO(critic_lam=1.5)
