"""CreditChain: determinism, exact replay of the hashed noise, the order knob, and credit worked out by hand."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from agentrl.agents.base import Task
from agentrl.agents.env_agent import EnvAgent
from agentrl.algorithms.advantages import grpo_advantages, sibling_advantages, token_gae, turn_gae
from agentrl.collect.collector import Collector
from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.envs import CreditChainEnv
from agentrl.envs.creditchain import CUES, RewardMode, distractor_noise
from agentrl.models.policy import Policy


def play(env: CreditChainEnv, seed: int, replies: list[str]) -> tuple[list[str], list[float], dict[str, Any]]:
    """Observations, per-turn rewards and the last info of ``replies`` played from ``seed``."""
    observations, rewards, info = [env.reset(seed)], [], {}
    for reply in replies:
        result = env.step(reply)
        observations.append(result.observation)
        rewards.append(result.reward)
        info = result.info
    return observations, rewards, info


def right_and_wrong(env: CreditChainEnv, seed: int) -> tuple[str, str]:
    right = env.right_reply(seed, 0)
    return right, next(w for w in env.words if w != right)


def test_cues_knob_limits_the_cue_words_and_keeps_the_default_draw() -> None:
    def cue(env: CreditChainEnv, seed: int) -> str:
        return env.reset(seed).split(".")[0].removeprefix("Cue: ")

    two = CreditChainEnv(decisions=1, cues=2)
    assert {cue(two, seed) for seed in range(40)} == set(CUES[:2])  # both drawn, nothing else
    default, eight = CreditChainEnv(decisions=1), CreditChainEnv(decisions=1, cues=8)
    assert [cue(default, s) for s in range(20)] == [cue(eight, s) for s in range(20)]
    assert len({cue(default, s) for s in range(40)}) > 2
    assert two.metadata()["cues"] == 2



@pytest.mark.parametrize("cues", range(1, 9))
@pytest.mark.parametrize("options", range(2, 7))
def test_no_reply_that_ignores_the_cue_beats_chance_by_more_than_one_cue(cues: int, options: int) -> None:
    """Each colour is right for cues // K or cues // K + 1 of the cues in play. The learning grid's 4 cues over 2
    colours once drew red for 3 of them, and "red" at every turn won 75 % of episodes with nothing learned."""
    env = CreditChainEnv(cues=cues, options=options)
    assert set(env.rule) == set(CUES[:cues])  # a rule for the cues in play, all of them
    counts = [list(env.rule.values()).count(word) for word in env.words]
    assert max(counts) - min(counts) <= 1, counts
    for seed in range(30):  # and the environment scores by it
        right = env.right_reply(seed, 0)
        assert play(env, seed, [right] + ["red"] * env.distractors)[2]["decisions_right"] == 1


def test_the_eight_cue_rule_is_the_permutation_mod_k_as_before() -> None:
    """All eight cues in play: the rule the credit benchmark's committed results were measured under."""
    for options in (2, 3, 6):
        perm = np.random.default_rng(0).permutation(len(CUES))
        before = {cue: ("red", "blue", "green", "yellow", "purple", "orange")[int(perm[i]) % options]
                  for i, cue in enumerate(CUES)}
        assert CreditChainEnv(options=options).rule == before

def test_deterministic_for_a_seed_and_cues_vary_across_seeds() -> None:
    env = CreditChainEnv(decisions=2, distractors=3, noise=0.5)
    replies = ["red", "I say blue", "blue", "red", "red"]
    assert play(env, 7, replies) == play(CreditChainEnv(decisions=2, distractors=3, noise=0.5), 7, replies)
    firsts = {CreditChainEnv(decisions=1).reset(seed).split(".")[0] for seed in range(20)}
    assert len(firsts) > 2  # the cue is drawn from the seed


def test_replayed_prefix_reproduces_the_noise_and_new_continuations_get_independent_noise() -> None:
    env = CreditChainEnv(decisions=1, distractors=4, noise=0.5)
    _, trunk, _ = play(env, 11, ["red", "blue", "red", "red", "blue"])
    env.reset(11)
    for reply in ["red", "blue"]:
        env.step(reply)
    boundary = env.snapshot()
    env.restore(boundary)
    same = [env.step(r).reward for r in ["red", "red", "blue"]]
    env.restore(boundary)
    other = [env.step(r).reward for r in ["blue", "red", "blue"]]
    assert same == trunk[2:]  # exact, bit for bit
    # a different reply at turn 2 changes the history, so turns 2-4 draw new noise
    assert all(a != b for a, b in zip(other[:2], trunk[2:4], strict=True))
    # the noise is σ·z with z from the hash of (seed, parsed history): check one value by hand
    assert trunk[1] == pytest.approx(distractor_noise(11, ("red", "blue"), 0.5))
    assert distractor_noise(11, ("red", "blue"), 0.5) != distractor_noise(12, ("red", "blue"), 0.5)
    assert distractor_noise(11, ("red", "blue"), 0.0) == 0.0


def test_replay_through_the_collector_reproduces_the_trunks_rewards(tiny_policy: Policy) -> None:
    # no snapshots: RTPO replays the trunk's first k replies through env.step, and the noise must come back exactly
    env = CreditChainEnv(decisions=1, distractors=3, noise=0.5, fallback="hash")
    col = Collector(HFEngine(tiny_policy), EnvAgent(env, history=env.agent_history, use_snapshots=False),
                    tiny_policy.tokenizer, sampling=SamplingParams(max_tokens=3))
    task = Task("a", 5)
    trunks = asyncio.run(col.collect_trunks([task], step=0))
    k = trunks[0].num_turns - 1
    siblings = asyncio.run(col.branch(trunks, {"a": task}, k, 2, step=0))
    trunk_rewards = [t.reward for t in trunks[0].turns]
    assert k >= 3 and len(siblings) == 2
    for sib in siblings:
        assert [t.reward for t in sib.turns[:k]] == trunk_rewards[:k]  # the replayed prefix: same noise
        _, rewards, info = play(CreditChainEnv(decisions=1, distractors=3, noise=0.5, fallback="hash"), 5,
                                [t.text or "" for t in sib.turns])
        assert [t.reward for t in sib.turns] == rewards and info["replies"] == sib.info["replies"]


def test_order_knob_puts_the_decisions_first_or_last() -> None:
    first, last = CreditChainEnv(decisions=2, distractors=3), CreditChainEnv(decisions=2, distractors=3,
                                                                              order="decisions_last")
    assert first.reset(0).startswith("Cue:") and last.reset(0).startswith("No cue.")
    _, _, info_first = play(first, 0, ["red"] * 5)
    _, _, info_last = play(last, 0, ["red"] * 5)
    assert info_first["turn_kinds"] == ["decision"] * 2 + ["distractor"] * 3
    assert info_last["turn_kinds"] == ["distractor"] * 3 + ["decision"] * 2
    assert info_last["turn_right"][:3] == [None] * 3 and all(isinstance(r, bool) for r in info_last["turn_right"][3:])


def test_terminal_reward_is_the_fraction_or_all_of_the_decisions() -> None:
    cases: tuple[tuple[RewardMode, float], ...] = (("fraction", 0.5), ("all", 0.0))
    for mode, expected in cases:
        env = CreditChainEnv(decisions=2, distractors=1, order="decisions_last", reward=mode)
        env.reset(3)
        right0 = env.right_reply(3, 0)
        wrong1 = next(w for w in env.words if w != env.right_reply(3, 1))
        _, rewards, info = play(env, 3, ["blue", right0, wrong1])
        assert rewards == [0.0, 0.0, expected] and info["decisions_right"] == 1 and info["success"] is False


def test_format_errors_follow_the_protocol_and_truncate_after_the_spare_turns() -> None:
    env = CreditChainEnv(decisions=1, distractors=1, spare_turns=1, format_penalty=-0.2)
    env.reset(0)
    first = env.step("no colour here")
    assert first.info["format_error"] and first.reward == -0.2 and "Cue:" in first.observation  # same step again
    env.step("red")
    last = env.step("still nothing")  # turn 3 = max_turns: truncated, the decision was answered
    assert last.truncated and not last.terminated and last.info["turn_kinds"] == ["decision", "decision",
                                                                                  "distractor"]
    assert last.reward == pytest.approx(-0.2 + float(last.info["decisions_right"]))
    hashed = CreditChainEnv(decisions=1, distractors=1, fallback="hash")
    hashed.reset(0)
    assert not hashed.step("no colour here").info["format_error"]  # mapped to a colour by its hash
    assert hashed.step("   ").info["format_error"]  # an empty reply is still an error


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"decisions": 0}, "env.decisions"), ({"distractors": -1}, "env.distractors"), ({"options": 1}, "env.options"),
    ({"options": 7}, "env.options"), ({"noise": -0.1}, "env.noise"), ({"noise": math.inf}, "env.noise"),
    ({"order": "middle"}, "env.order"), ({"reward": "sum"}, "env.reward"), ({"context": "none"}, "env.context"),
    ({"format_penalty": 0.5}, "env.format_penalty"), ({"fallback": "guess"}, "env.fallback"),
    ({"cues": 0}, "env.cues"), ({"cues": 9}, "env.cues"),
])
def test_bad_knobs_raise_one_line_errors_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field) as err:
        CreditChainEnv(**kwargs)
    assert "\n" not in str(err.value)


def test_context_policy_is_recorded() -> None:
    summary, full = CreditChainEnv(), CreditChainEnv(context="full")
    assert summary.metadata()["context"] == "summary" and summary.agent_history == 1
    assert full.metadata()["agent_history"] is None and "Step" not in full.reset(0)
    first = summary.reset(0)
    cue = first.removeprefix("Cue: ").split(".")[0]
    assert first.endswith("(Step 1 of 5; cues answered: none.)")
    assert summary.step("blue").observation.endswith(f"(Step 2 of 5; cues answered: {cue}=blue.)")


# ---------------------------------------------------------------- credit worked out by hand
# One chain, M = 1 decision first, D = 2 distractors, σ = 0: three turns, the terminal reward (1 if the decision
# was right) on the last turn. Trajectory "R" answers the decision right, trajectory "W" wrong.


def two_trajectories() -> tuple[list[float], list[float], list[str]]:
    env = CreditChainEnv(decisions=1, distractors=2)
    right, wrong = right_and_wrong(env, 4)
    _, rewards_r, info_r = play(env, 4, [right, "red", "blue"])
    _, rewards_w, _ = play(env, 4, [wrong, "red", "blue"])
    return rewards_r, rewards_w, info_r["turn_kinds"]


def test_hand_credit_grpo_gives_every_turn_the_same_advantage() -> None:
    rewards_r, rewards_w, kinds = two_trajectories()
    assert rewards_r == [0.0, 0.0, 1.0] and rewards_w == [0.0, 0.0, 0.0] and kinds[0] == "decision"
    # returns 1 and 0; group mean 0.5, unbiased std sqrt((0.25 + 0.25) / 1) = 0.7071 → A = ±0.5 / 0.7071 = ±0.7071
    adv = grpo_advantages(torch.tensor([sum(rewards_r), sum(rewards_w)]), torch.tensor([0, 0]))
    assert_close(adv, torch.tensor([0.70711, -0.70711]), atol=1e-4, rtol=0)
    # broadcast: the decision turn and both distractors of R get +0.7071 (the distractors' credit is not 0)
    per_turn = adv[:, None].expand(2, 3)
    assert bool((per_turn[0] > 0).all()) and bool((per_turn[1] < 0).all())


def test_hand_credit_turn_gae_with_a_given_critic() -> None:
    rewards_r, rewards_w, _ = two_trajectories()
    rewards = torch.tensor([rewards_r, rewards_w])
    mask = torch.ones(2, 3, dtype=torch.bool)
    # critic V = 0.5 everywhere, γ = 0.9, λ = 0.5 (γλ = 0.45):
    #   R: δ2 = 1 − 0.5 = 0.5; δ1 = δ0 = 0 + 0.9·0.5 − 0.5 = −0.05
    #      A2 = 0.5; A1 = −0.05 + 0.45·0.5 = 0.175; A0 = −0.05 + 0.45·0.175 = 0.02875 (> 0: right, but shrunk)
    #   W: δ2 = −0.5; A1 = −0.05 − 0.225 = −0.275; A0 = −0.05 + 0.45·(−0.275) = −0.17375
    adv, _ = turn_gae(rewards, torch.full((2, 3), 0.5), mask, gamma=0.9, lam=0.5)
    assert_close(adv, torch.tensor([[0.02875, 0.175, 0.5], [-0.17375, -0.275, -0.5]]))
    # a critic that is too optimistic (V = 0.8) flips the right decision's sign two turns before the reward:
    #   R: δ2 = 0.2; δ1 = δ0 = 0.72 − 0.8 = −0.08; A1 = −0.08 + 0.45·0.2 = 0.01; A0 = −0.08 + 0.45·0.01 = −0.0755
    adv, _ = turn_gae(rewards[:1], torch.full((1, 3), 0.8), mask[:1], gamma=0.9, lam=0.5)
    assert_close(adv, torch.tensor([[-0.0755, 0.01, 0.2]]))


def test_hand_credit_token_gae_on_the_decisions_tokens() -> None:
    """Token-PPO's estimator on the same chain: replies of 2, 1 and 2 tokens (the decision's two first), each turn's
    reward on its last token, as `TokenPPO` places it."""
    rewards_r, rewards_w, _ = two_trajectories()
    rewards = torch.zeros(2, 5)
    for b, per_turn in enumerate((rewards_r, rewards_w)):
        for last, r in zip((1, 2, 4), per_turn, strict=True):
            rewards[b, last] = r
    mask = torch.ones(2, 5, dtype=torch.bool)
    # critic V = 0.5 on every token, γ = 1, λ = 0.5: δ_t = 0 before the last token, δ_4 = r − 0.5 (R +0.5, W −0.5)
    #   A_4 = ±0.5, A_3 = ±0.25, A_2 = ±0.125, A_1 = ±0.0625, A_0 = ±0.03125: the decision's tokens (0, 1) keep the
    #   sign of the outcome, shrunk by λ per token — a turn of many tokens is discounted by all of them
    adv, _ = token_gae(rewards, torch.full((2, 5), 0.5), mask, gamma=1.0, lam=0.5)
    by_hand = torch.tensor([0.03125, 0.0625, 0.125, 0.25, 0.5])
    assert_close(adv, torch.stack([by_hand, -by_hand]))
    assert float(adv[0, :2].mean()) == pytest.approx(0.046875) and float(adv[1, :2].mean()) == pytest.approx(-0.046875)
    # the neutral critic (V = 0) with γ = λ = 1, what benchmarks/credit.py scores: every token gets the return, 1 or 0
    adv, _ = token_gae(rewards, torch.zeros(2, 5), mask, gamma=1.0, lam=1.0)
    assert_close(adv, torch.tensor([[1.0] * 5, [0.0] * 5]))


def test_hand_credit_rtpo_siblings_at_the_decision_and_distractor_depths() -> None:
    env = CreditChainEnv(decisions=1, distractors=2, noise=0.5)
    right, wrong = right_and_wrong(env, 4)
    # three siblings branch at the decision depth k = 0 and each continue with ("red", "blue")
    decision = [[right, "red", "blue"], [wrong, "red", "blue"], [right, "blue", "blue"]]
    returns = torch.tensor([sum(play(env, 4, replies)[1]) for replies in decision], dtype=torch.float64)
    # by hand: R_j = 1[right_j] + σ z(4, (a0, a1)) + σ z(4, (a0, a1, a2)), A_j = R_j − mean R
    expected = torch.tensor([float(replies[0] == right) + distractor_noise(4, tuple(replies[:2]), 0.5)
                             + distractor_noise(4, tuple(replies), 0.5) for replies in decision], dtype=torch.float64)
    adv = sibling_advantages(returns, torch.zeros(3, dtype=torch.long))
    assert_close(adv, expected - expected.mean())
    assert float(adv[0]) > 0 > float(adv[1])  # this seed's noise leaves the right decisions above the wrong one
    # without noise: 1, 0, 1 → mean 2/3 → A = +1/3, −2/3, +1/3
    quiet = CreditChainEnv(decisions=1, distractors=2)
    returns = torch.tensor([sum(play(quiet, 4, replies)[1]) for replies in decision], dtype=torch.float64)
    assert_close(sibling_advantages(returns, torch.zeros(3, dtype=torch.long)),
                 torch.tensor([1 / 3, -2 / 3, 1 / 3], dtype=torch.float64))
    # at the distractor depth k = 1 the siblings share the decision: equal returns, A = 0 exactly for σ = 0
    distractor = [[right, "red", "blue"], [right, "blue", "red"], [right, "blue", "blue"]]
    returns = torch.tensor([sum(play(quiet, 4, replies)[1]) for replies in distractor], dtype=torch.float64)
    assert sibling_advantages(returns, torch.zeros(3, dtype=torch.long)).abs().max() == 0.0


def test_judge_scores_a_reply_as_step_does() -> None:
    """Three decisions, no distractors, terminal reward = fraction right: the judged replies add up to it; a reply
    naming no colour is None (a format error), one naming a colour in a sentence is judged by that colour."""
    env = CreditChainEnv(decisions=3, distractors=0, options=2)
    seed = 7
    wrong = next(w for w in env.words if w != env.right_reply(seed, 1))
    replies = [f"I pick {env.right_reply(seed, 0).title()}.", wrong, env.right_reply(seed, 2)]
    verdicts = [env.judge(env.cue(seed, j), r) for j, r in enumerate(replies)]
    assert verdicts == [True, False, True]
    _, rewards, _ = play(env, seed, replies)
    assert rewards[-1] == pytest.approx(sum(v is True for v in verdicts) / 3)
    assert env.judge(env.cue(seed, 0), "no idea") is None
