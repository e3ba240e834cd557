"""Rules of the update: no optimizer step without signal, each schedule's aggregation default, GRPO's trajectory
weighting, and scoring without dropout."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.agents.env_agent import EnvAgent
from agentrl.algorithms.losses import token_mean, turn_mean
from agentrl.engines.base import SamplingParams
from agentrl.envs import CreditChainEnv
from agentrl.models.loading import build_tiny_model, build_tiny_tokenizer
from agentrl.models.policy import Policy
from agentrl.training.rollout.datamodule import RolloutDataModule
from agentrl.training.schedules.grpo import GRPO
from agentrl.training.schedules.rtpo import RTPO
from agentrl.training.schedules.token_ppo import TokenPPO
from agentrl.training.schedules.turn_ppo import TurnPPO
from agentrl.training.update.ppo import minibatch_split
from agentrl.training.update.settings import OptimSettings, PPOSettings
from agentrl.types import Trajectory
from tests.training.exactness_run import _trajectory, fixed_schedule
from tests.training.helpers import fit, letter_data, make_module


def _tied_groups() -> list[Trajectory]:
    """Two groups of two whose members have equal returns: every GRPO advantage is zero."""
    trajs = []
    for g in range(2):
        for j in range(2):
            t = _trajectory(("tied", g, j), 1 + j, g)
            for turn in t.turns:
                turn.reward = 0.0
            t.turns[-1].reward = 0.5 * g
            trajs.append(t)
    return trajs


def test_an_all_tied_minibatch_takes_no_optimizer_step() -> None:
    trajs = _tied_groups()
    module = make_module(fixed_schedule(GRPO, [trajs], group_size=2, ppo=PPOSettings(epochs=2)))
    for t in trajs:  # behaviour log-probs of the initial policy (else the clip would hide any movement)
        lp = module.logprobs([t], [(0, turn.index) for turn in t.turns])
        for turn in t.turns:
            turn.logprobs = lp[(0, turn.index)]
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    trainer = fit(module, letter_data(batch_size=2, steps=1))
    after = dict(module.named_parameters())
    assert all(torch.equal(before[n], after[n]) for n in before)
    optimizer = trainer.optimizers[0]
    assert all("step" not in optimizer.state[p] for group in optimizer.param_groups for p in group["params"])
    assert module.last_metrics["train/skipped_updates"] == 2.0  # one per epoch
    assert module.last_metrics["train/zero_advantage_frac"] == 1.0


def test_a_minibatch_with_signal_does_step() -> None:
    """The control: the same setup with one group untied moves the weights."""
    trajs = _tied_groups()
    trajs[1].turns[-1].reward = 1.0
    module = make_module(fixed_schedule(GRPO, [trajs], group_size=2, ppo=PPOSettings(epochs=1)))
    for t in trajs:
        lp = module.logprobs([t], [(0, turn.index) for turn in t.turns])
        for turn in t.turns:
            turn.logprobs = lp[(0, turn.index)]
    before = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
    fit(module, letter_data(batch_size=2, steps=1))
    assert any(not torch.equal(before[n], p) for n, p in module.policy.named_parameters())
    assert module.last_metrics["train/skipped_updates"] == 0.0


def test_adamw_is_fused_on_the_cpu_by_default_and_steps_as_the_loop_does() -> None:
    """``optim.fused`` (default on): the trainer's AdamW runs PyTorch's fused kernel on plain CPU tensors, and a step
    moves the weights as the loop implementation does, to float32 rounding; ``fused: false`` keeps the loop."""
    trajs = _tied_groups()
    trajs[1].turns[-1].reward = 1.0
    after: dict[bool, dict[str, torch.Tensor]] = {}
    for fused in (True, False):
        torch.manual_seed(0)
        module = make_module(fixed_schedule(GRPO, [trajs], group_size=2, ppo=PPOSettings(epochs=1)),
                             optim=OptimSettings(lr=1e-3, fused=fused))
        for t in trajs:
            lp = module.logprobs([t], [(0, turn.index) for turn in t.turns])
            for turn in t.turns:
                turn.logprobs = lp[(0, turn.index)]
        before = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
        trainer = fit(module, letter_data(batch_size=2, steps=1))
        assert trainer.optimizers[0].defaults["fused"] is (True if fused else None)
        after[fused] = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
        assert max((after[fused][n] - before[n]).abs().max().item() for n in before) > 1e-4  # it stepped
    assert max((after[True][n] - after[False][n]).abs().max().item() for n in after[True]) <= 1e-6


def test_each_schedule_owns_its_aggregation_default_and_an_explicit_one_wins() -> None:
    assert TokenPPO(ppo=PPOSettings(epochs=2)).ppo.aggregate is token_mean
    assert TokenPPO().ppo.aggregate is token_mean
    assert TurnPPO(ppo=PPOSettings(epochs=2)).ppo.aggregate is turn_mean
    assert RTPO(ppo=PPOSettings(clip_low=0.1)).ppo.aggregate is turn_mean
    assert GRPO(ppo=PPOSettings(epochs=3)).ppo.aggregate is turn_mean
    assert TokenPPO(ppo=PPOSettings(aggregate=turn_mean)).ppo.aggregate is turn_mean
    assert GRPO(ppo=PPOSettings(aggregate=token_mean)).ppo.aggregate is token_mean


def test_grpo_weighs_trajectories_equally_by_default() -> None:
    """A 4-turn failure and a 1-turn success of one group: each trajectory's turns add up to one unit, so the
    failure no longer outweighs the success four to one; the flat option keeps one unit per turn."""
    fail, win = _trajectory(("w", 0), 4, 0), _trajectory(("w", 1), 1, 0)
    fail.turns[-1].reward, win.turns[-1].reward = -1.0, 1.0
    for schedule, expected in ((GRPO(group_size=2), [1.0, 1.0]),
                               (GRPO(group_size=2, trajectory_weighting=False), [4.0, 1.0])):
        targets, _ = schedule.targets(None, [fail, win])  # type: ignore[arg-type]
        units = [sum(tgt.unit for (b, _), tgt in targets.items() if b == i) for i in (0, 1)]
        assert units == expected
        first, second = targets[(0, 0)].advantage, targets[(1, 0)].advantage
        assert isinstance(first, float) and isinstance(second, float)  # GRPO: one advantage per turn
        assert first < 0 < second
    tokens = GRPO(group_size=2, ppo=PPOSettings(aggregate=token_mean))
    targets, _ = tokens.targets(None, [fail, win])  # type: ignore[arg-type]
    per_traj = [sum(tgt.unit * len(t.response_ids) for (b, n), tgt in targets.items() if b == i
                    for t in [[fail, win][i].turns[n]]) for i in (0, 1)]
    assert per_traj == [1.0, 1.0]


def test_scoring_ignores_dropout_in_training_mode(tmp_path: Path) -> None:
    """A model with dropout (as GPT-2 and OPT ship) scores the same ids the same way in Lightning's training mode:
    PPO's first ratio is exactly 1."""
    model = build_tiny_model()
    model.config.attention_dropout = 0.5
    model.save_pretrained(tmp_path / "m")
    build_tiny_tokenizer().save_pretrained(tmp_path / "m")
    policy = Policy(str(tmp_path / "m"))
    assert policy.model.config.attention_dropout == 0.5
    module = make_module(TurnPPO())
    module.policy = policy
    module.train()
    assert module.training and not policy.training
    ids = torch.randint(3, 300, (1, 24))
    mask = torch.zeros(1, 24, dtype=torch.bool)
    mask[0, 12:] = True
    a = policy.token_logprobs(ids, torch.ones_like(ids), mask).logprobs
    b = policy.token_logprobs(ids, torch.ones_like(ids), mask).logprobs
    assert torch.equal(a, b)
    policy.train()  # the control: with dropout on, the same ids score differently
    c = policy.token_logprobs(ids, torch.ones_like(ids), mask).logprobs
    assert not torch.equal(a, c)


def test_minibatch_split_by_count_or_by_size_worked_by_hand() -> None:
    """(rows per minibatch on this rank, minibatches per epoch)."""
    assert minibatch_split(10, 10, PPOSettings(minibatches=2)) == (5, 2)
    assert minibatch_split(7, 7, PPOSettings(minibatches=2)) == (4, 2)  # 4 + 3
    assert minibatch_split(1, 1, PPOSettings(minibatches=2)) == (1, 1)  # never more minibatches than rows
    assert minibatch_split(3, 10, PPOSettings(minibatches=2)) == (2, 2)  # a smaller rank: the largest's count
    assert minibatch_split(0, 10, PPOSettings(minibatches=2)) == (1, 2)  # an empty rank still takes every step
    assert minibatch_split(10, 10, PPOSettings(minibatch_size=4)) == (4, 3)
    assert minibatch_split(10, 10, PPOSettings()) == (10, 1)
    with pytest.raises(ValueError, match="ppo.minibatches"):
        PPOSettings(minibatches=2, minibatch_size=4)
    with pytest.raises(ValueError, match="ppo.minibatches"):
        PPOSettings(minibatches=0)


@pytest.mark.parametrize(("ppo", "planned"), [({"minibatches": 2}, lambda n: n == 2),
                                              ({"minibatch_size": 4}, lambda n: n > 2)])
def test_a_turn_per_row_context_takes_the_minibatch_count_it_is_given(ppo: dict[str, Any],
                                                                     planned: Callable[[float], bool]) -> None:
    """CreditChain with the summary context (`EnvAgent(history=1)`): no turn's prompt extends the last, so every turn
    is its own row and ``minibatch_size: 4`` plans one optimizer step per 4 turns (more steps per update the longer
    the chain); ``minibatches: 2`` plans two, whatever the episode length. Planned = taken + skipped (no signal)."""
    env = CreditChainEnv(decisions=1, distractors=4, options=2, cues=4, context="summary", prompt_example=True)
    data = RolloutDataModule(EnvAgent(env, history=1), batch_size=8, steps=1, sampling=SamplingParams(max_tokens=3))
    module = make_module(GRPO(group_size=4, ppo=PPOSettings(epochs=1, **ppo)), optim=OptimSettings(lr=1e-3))
    fit(module, data)
    m = module.last_metrics
    assert m["rollout/turns"] >= 5.0  # the decision and four distractors at least
    assert planned(m.get("train/minibatches", 0.0) + m["train/skipped_updates"])
