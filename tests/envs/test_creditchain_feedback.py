"""CreditChain's feedback knob (the observation after a decision says whether it was right) and its held-out games
(cues balanced per position, no distractor noise)."""

from __future__ import annotations

from collections import Counter

import pytest

from agentrl.envs import CreditChainEnv
from agentrl.envs.creditchain import CUES, balanced_cues
from tests.envs.test_creditchain import play


def wrong_of(env: CreditChainEnv, seed: int, j: int) -> str:
    return next(w for w in env.words if w != env.right_reply(seed, j))


def test_feedback_says_right_or_wrong_after_each_decision_only() -> None:
    env = CreditChainEnv(decisions=2, distractors=2, cues=4, context="full", noise=0.3, feedback=True)
    seed = 7
    replies = [env.right_reply(seed, 0), wrong_of(env, seed, 1), "red", "blue"]
    obs, _, info = play(env, seed, replies)
    assert not obs[0].startswith("Last answer")  # nothing before the first decision
    assert obs[1].startswith(f"Last answer: right.\nCue: {env.cue(seed, 1)}.")  # after decision 1 (right)
    assert obs[2].startswith("Last answer: wrong.\nNo cue.")  # after decision 2 (wrong), on the first distractor
    assert not obs[3].startswith("Last answer")  # after a distractor: no feedback
    assert info["decisions_right"] == 1


def test_feedback_leaves_rewards_and_ground_truth_unchanged() -> None:
    kwargs = dict(decisions=3, distractors=2, cues=4, context="full", noise=0.3)
    on, off = CreditChainEnv(**kwargs, feedback=True), CreditChainEnv(**kwargs)  # type: ignore[arg-type]
    for seed in range(20):
        replies = [on.right_reply(seed, 0), wrong_of(on, seed, 1), on.right_reply(seed, 2), "blue", "red"]
        obs_on, rew_on, info_on = play(on, seed, replies)
        obs_off, rew_off, info_off = play(off, seed, replies)
        assert rew_on == rew_off and info_on == info_off
        assert [o.split("\n")[-1] for o in obs_on] == [o.split("\n")[-1] for o in obs_off]
        assert sum("Last answer" in o for o in obs_on) == 3 and not any("Last answer" in o for o in obs_off)


def test_feedback_is_not_shown_after_a_format_error_on_a_decision() -> None:
    env = CreditChainEnv(decisions=1, distractors=1, cues=4, context="full", feedback=True)
    obs, rewards, _ = play(env, 3, ["no colour here", env.right_reply(3, 0)])
    assert rewards[0] == env.format_penalty and "Last answer" not in obs[1]  # the same step shown again
    assert obs[2].startswith("Last answer: right.")


def test_feedback_off_by_default_and_recorded() -> None:
    env = CreditChainEnv()
    assert env.feedback is False and env.metadata()["feedback"] is False
    assert CreditChainEnv(feedback=True).metadata()["feedback"] is True
    with pytest.raises(ValueError, match="env.feedback"):
        CreditChainEnv(feedback="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="env.heldout_seed"):
        CreditChainEnv(heldout_seed=-1)


def test_heldout_games_balance_every_cue_at_every_position_and_pay_no_noise() -> None:
    env = CreditChainEnv(decisions=3, distractors=2, cues=4, context="full", noise=0.3, heldout_seed=1_000_000)
    games = [tuple(env.cue(1_000_000 + i, j) for j in range(3)) for i in range(48)]
    for j in range(3):
        assert Counter(g[j] for g in games) == {c: 12 for c in CUES[:4]}
    assert len(set(games)) == 48  # the blocks combine the positions' cues differently: no game repeats
    # a cue-blind reply ("red" at every decision) is right on exactly half of the held-out decisions
    right = sum(env.rule[c] == "red" for g in games for c in g)
    assert right == 72
    _, rewards, info = play(env, 1_000_005, ["red", "red", "red", "blue", "blue"])
    assert rewards[3] == 0.0 and rewards[4] == info["decisions_right"] / 3
    # training seeds keep the random draw and the noise
    plain = CreditChainEnv(decisions=3, distractors=2, cues=4, context="full", noise=0.3)
    assert [env.cue(5, j) for j in range(3)] == [plain.cue(5, j) for j in range(3)]
    _, noisy, _ = play(env, 5, ["red", "red", "red", "blue", "blue"])
    assert noisy[3] != 0.0


def test_balanced_cues_formula() -> None:
    assert [balanced_cues(i, 3, 4) for i in (0, 1, 4, 5)] == [(0, 0, 0), (1, 1, 1), (0, 1, 0), (1, 2, 1)]
