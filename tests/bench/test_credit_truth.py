"""The training-free credit ground truth (benchmarks/credit_truth.py): the oracle critic and the true advantage
worked out by hand on a 3-turn chain, checked against Monte Carlo, and the chooser's choices independent."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from credit_truth import (
    BagOfWordsCritic,
    Chooser,
    Episode,
    TruthArgs,
    episodes_of,
    evaluate,
    make_env,
    oracle_values,
    play,
    scored,
    true_advantage,
    turn_ppo,
)

# p(right | cue): apple 0.8, river 0.6, stone 0.4, cloud 0.2; uniform cues, so p̄ = 0.5
RATES = {"apple": 0.8, "river": 0.6, "stone": 0.4, "cloud": 0.2}


def chain() -> Episode:
    """M = 2 decisions first (apple answered right, stone answered wrong), then one distractor; σ = 0, so the only
    reward is the terminal fraction right, 1/2, on the last turn."""
    return Episode(task=0, seed=0, contexts=["", "", ""], replies=["red", "red", "blue"],
                   kinds=["decision", "decision", "distractor"], cues=["apple", "stone", None],
                   right=[True, False, None], rewards=[0.0, 0.0, 0.5])


def test_oracle_critic_by_hand() -> None:
    # V(s_0): nothing right yet, the apple cue shows (0.8), one decision to come at p̄ = 0.5: (0 + 0.8 + 0.5) / 2
    # V(s_1): apple was right (1), the stone cue shows (0.4), none to come:               (1 + 0.4 + 0) / 2
    # V(s_2): a distractor; one right of two, no decision left:                           (1 + 0) / 2
    assert oracle_values(chain(), RATES, 2) == pytest.approx([0.65, 0.70, 0.50])


def test_true_advantage_by_hand() -> None:
    # apple right: (1 − 0.8) / 2 = 0.1; stone wrong: (0 − 0.4) / 2 = −0.2; a distractor's reply changes nothing: 0
    assert true_advantage(chain(), RATES, 2) == pytest.approx([0.1, -0.2, 0.0])


def test_turn_gae_with_the_oracle_by_hand() -> None:
    ep = chain()
    values = [oracle_values(ep, RATES, 2)]
    # λ = 0: δ_0 = 0 + 0.70 − 0.65 = 0.05 (the true 0.1 plus the next cue's luck (0.4 − 0.5) / 2 = −0.05);
    #        δ_1 = 0 + 0.50 − 0.70 = −0.2 (exactly the truth); δ_2 = 0.5 − 0.5 = 0
    assert turn_ppo([ep], values, 1.0, 0.0) == pytest.approx([0.05, -0.2, 0.0])
    # λ = 1: A_n = R − V(s_n) = 0.5 − (0.65, 0.70, 0.50)
    assert turn_ppo([ep], values, 1.0, 1.0) == pytest.approx([-0.15, -0.2, 0.0])


def test_oracle_is_the_expected_return_to_go_by_monte_carlo() -> None:
    """Per history (turn n, the cues shown so far, which decisions were right), the oracle's V(s_n) against the mean
    return-to-go of the episodes with that history, over 20,000 episodes (σ = 0.3)."""
    env = make_env(TruthArgs(decisions=2, distractors=1, noise=0.3))
    eps = episodes_of(env, Chooser(env, RATES), range(5000), 4, seed=3)
    groups: dict[tuple[object, ...], tuple[float, list[float]]] = {}
    for ep in eps:
        values = oracle_values(ep, RATES, 2)
        for n in range(3):
            history: tuple[object, ...] = (n, tuple(ep.cues[: n + 1]), tuple(ep.right[:n]))
            v, returns = groups.setdefault(history, (values[n], []))
            assert v == values[n]  # the oracle is a function of the history
            returns.append(sum(ep.rewards[n:]))
    assert len(groups) == 4 + 4 * 2 * 4 + 4 * 2 * 4 * 2
    for history, (v, returns) in groups.items():
        se = np.std(returns) / np.sqrt(len(returns))
        assert abs(np.mean(returns) - v) < 4.5 * se + 1e-9, (history, v, np.mean(returns), len(returns))


def test_chooser_decisions_are_independent_and_at_the_rates() -> None:
    env = make_env(TruthArgs(decisions=3, distractors=2))
    eps = episodes_of(env, Chooser(env, RATES), range(2000), 2, seed=0)
    for cue, p in RATES.items():
        hits = [bool(r) for ep in eps for c, r in zip(ep.cues, ep.right, strict=True) if c == cue]
        assert abs(np.mean(hits) - p) < 4 * np.sqrt(p * (1 - p) / len(hits))
    # independence: the first two decisions' rightness is uncorrelated (the hash fallback made it negative)
    a = np.array([float(bool(ep.right[0])) for ep in eps])
    b = np.array([float(bool(ep.right[1])) for ep in eps])
    assert abs(np.corrcoef(a, b)[0, 1]) < 4 / np.sqrt(len(eps))


def test_a_sibling_replays_its_prefix_exactly() -> None:
    env = make_env(TruthArgs(decisions=3, distractors=2, noise=0.3))
    chooser = Chooser(env, RATES)
    trunk = play(env, chooser, 0, 5, np.random.default_rng(0))
    sib = play(env, chooser, 0, 5, np.random.default_rng(1), trunk.replies[:4])
    assert sib.replies[:4] == trunk.replies[:4] and sib.rewards[:3] == trunk.rewards[:3]


def test_learned_critic_reads_feedback_and_scores_are_sane() -> None:
    rows_on, facts_on = evaluate(TruthArgs(feedback=True, noise=0.0, boot=50))
    rows_off, facts_off = evaluate(TruthArgs(feedback=False, noise=0.0, boot=50))
    key = {(r["estimator"], r["critic"], r["lambda"]): r for r in rows_on}
    off = {(r["estimator"], r["critic"], r["lambda"]): r for r in rows_off}
    # the oracle needs no feedback; at σ = 0 and λ = 0 only the next cue's luck separates it from the truth
    assert key[("turn_ppo", "oracle", 0.0)]["corr"] == off[("turn_ppo", "oracle", 0.0)]["corr"] > 0.8
    # a bag-of-words critic values a decision at λ = 0 only when the feedback words tell it the outcome
    assert key[("turn_ppo", "learned", 0.0)]["corr"] > 0.6
    assert abs(off[("turn_ppo", "learned", 0.0)]["corr"]) < 0.2
    assert facts_on["learned_ev"] > facts_off["learned_ev"]


def test_bootstrap_se_shrinks_with_more_tasks() -> None:
    rng = np.random.default_rng(0)
    est, truth = rng.normal(size=800), rng.normal(size=800)
    truth = 0.5 * est + truth
    small = scored(est[:80], truth[:80], list(np.arange(80) // 5), 300, np.random.default_rng(1))
    large = scored(est, truth, list(np.arange(800) // 5), 300, np.random.default_rng(1))
    assert small["se"] > large["se"] > 0.0


def test_bag_of_words_critic_fits_a_linear_target() -> None:
    eps = [Episode(0, 0, ["right", "right right", "wrong"], ["r", "r", "r"], ["distractor"] * 3, [None] * 3,
                   [None] * 3, [0.0, 0.0, 1.0])] * 5
    critic = BagOfWordsCritic(ridge=1e-6).fit(eps)
    assert critic.values(eps[0]) == pytest.approx([1.0, 1.0, 1.0], abs=1e-4)


def test_guess_values_are_the_chooser_success_rate_and_bisection_scores_zero() -> None:
    from credit_tasks import Guess

    task = Guess(rate=0.5)
    # by hand: one number left, one guess: it is right (1); two numbers, one guess: 1/2
    assert task.value(1, 1) == 1.0 and task.value(2, 1) == 0.5
    # two numbers, two guesses: bisection and uniform both guess one of the two, then the other: 1
    assert task.value(2, 2) == 1.0
    eps = [task.play(i, np.random.default_rng(i)) for i in range(4000)]
    wins = np.array([sum(e.rewards) for e in eps])
    assert abs(wins.mean() - task.value(20, 5)) < 4 * wins.std() / np.sqrt(len(wins))
    assert all(e.oracle and e.oracle[0] == task.value(20, 5) for e in eps)
    # a bisection guess leaves what bisection leaves: interval truth 0
    bis = task.play(3, np.random.default_rng(0), ["10"])
    assert bis.truths["interval"][0] == 0.0


def test_sokoban_progress_is_plus_one_along_the_solution() -> None:
    from credit_tasks import Soko

    from agentrl.envs import SokobanEnv

    env = SokobanEnv()
    env.reset(4)
    solution = list(env.solution)
    ep = Soko(rate=0.0).play(4, np.random.default_rng(0), solution)
    assert ep.truths["progress"] == [1.0] * len(solution) and ep.rewards[-1] > 5
