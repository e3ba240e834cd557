"""Ground truth for CreditChain credit without a language model: the true advantage, an oracle and a learned critic.

The *scored policy* is a seeded random chooser (`Chooser`): at a decision with cue c it answers the right colour
with probability p(c) (``--right-rates``, one per cue), else a wrong one; at a distractor it answers a uniformly
random colour. Every choice is an independent draw (the ``hash`` fallback of the LLM path made a reply a function
of the base model's text, which correlated an episode's decisions). The policy's p(c) is known exactly, so:

* the **true advantage** (γ = 1) of a decision with cue c is ``A^π = (1[right] − p(c)) / M``; of a distractor 0
  (its reply changes no expected reward: the noise σ·z has mean 0 whatever the reply);
* the **oracle critic** is ``V(s_n) = E[R | history] = (right so far + p(c_n) if turn n shows a cue +
  p̄ · later decisions) / M``, p̄ the mean of p over the cue distribution (uniform): the expected return-to-go from
  the state before reply n (past distractor noise is already paid; future noise has mean 0);
* the **learned critic** is a ridge regression of the Monte Carlo return-to-go on a bag of words of the context the
  agent sees at s_n (every observation and reply so far, the current observation included) plus the turn's
  position, fitted on separate rollouts of the same policy (``fit_episodes``, other seeds). It is linear in word
  counts, so it cannot represent the cue → colour rule (a word *pair*): with feedback off it can value a past
  decision only through its cue's rate; with feedback on the words "right" / "wrong" carry the outcome. A critic
  that learned the rule would sit between it and the oracle. It is cheap (least squares, milliseconds) and stands
  in for the project's `TurnCritic`, whose explained variance on the learning grid was 0.002-0.11.

Estimators, on the same episodes (``tasks`` × ``group``): Turn-PPO's turn GAE (`turn_gae`, γ, each λ, each critic),
GRPO (`grpo_advantages` over each task's group, on every turn), token-PPO (`token_gae`, γ = λ = 1, neutral critic,
a turn = the colour token and the end token, the turn's mean), and RTPO (`sibling_advantages`: per task the first
episode is the trunk; at every depth k, ``siblings`` continuations replay the trunk's first k replies, draw turn k
and the rest from the policy; scored on the siblings' turn k). Whitening is left out: over one batch it is an
affine map and does not change a correlation.

Score: the Pearson correlation of the estimator's per-turn advantage with A^π over all scored turns (distractors'
truth 0), with a cluster-bootstrap standard error (tasks resampled with replacement, ``boot`` resamples: the
episodes of one task share a GRPO group, an RTPO trunk and a seed).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from agentrl.algorithms.advantages import grpo_advantages, sibling_advantages, token_gae, turn_gae
from agentrl.envs import CreditChainEnv
from agentrl.envs.creditchain import CUES

_WORD = re.compile(r"[a-z]+")


@dataclass(frozen=True)
class Episode:
    """One episode of the chooser: per turn the state's text, the reply, the kind, the cue, right, the reward."""

    task: int
    seed: int
    contexts: list[str]  # the context the agent sees before reply n (observations and replies so far)
    replies: list[str]
    kinds: list[str]
    cues: list[str | None]
    right: list[bool | None]
    rewards: list[float]


class Chooser:
    """Independent random choices: right with probability ``rates[cue]`` at a decision, uniform at a distractor."""

    def __init__(self, env: CreditChainEnv, rates: dict[str, float]) -> None:
        self.env, self.rates = env, rates

    def reply(self, rng: np.random.Generator, seed: int, step: int) -> str:
        env = self.env
        if not env.is_decision(step):
            return env.words[int(rng.integers(env.options))]
        j = step if env.order == "decisions_first" else step - env.distractors
        right = env.right_reply(seed, j)
        if rng.random() < self.rates[env.cue(seed, j)]:
            return right
        wrong = [w for w in env.words if w != right]
        return wrong[int(rng.integers(len(wrong)))]


def play(env: CreditChainEnv, chooser: Chooser, task: int, seed: int, rng: np.random.Generator,
         prefix: Sequence[str] = ()) -> Episode:
    """One episode from ``seed``: the first ``len(prefix)`` replies given (an RTPO sibling), the rest drawn."""
    context = env.system_prompt + "\n" + env.reset(seed)
    contexts, replies, rewards = [], [], []
    info: dict[str, object] = {}
    for step in range(env.decisions + env.distractors):
        reply = prefix[step] if step < len(prefix) else chooser.reply(rng, seed, step)
        contexts.append(context)
        replies.append(reply)
        result = env.step(reply)
        rewards.append(result.reward)
        info = result.info
        context += f"\n{reply}\n{result.observation}"
    kinds = list(info["turn_kinds"])  # type: ignore[call-overload]
    cue_iter = iter(env.cue(seed, j) for j in range(env.decisions))
    cues = [next(cue_iter) if k == "decision" else None for k in kinds]
    return Episode(task, seed, contexts, replies, kinds, cues, list(info["turn_right"]), rewards)  # type: ignore[call-overload]


def true_advantage(ep: Episode, rates: dict[str, float], decisions: int) -> list[float]:
    """A^π per turn (γ = 1): ``(1[right] − p(cue)) / M`` on a decision, 0 on a distractor."""
    return [(float(bool(r)) - rates[c]) / decisions if k == "decision" and c is not None else 0.0
            for k, c, r in zip(ep.kinds, ep.cues, ep.right, strict=True)]


def oracle_values(ep: Episode, rates: dict[str, float], decisions: int) -> list[float]:
    """V(s_n) = E[return-to-go | history] for the chooser (see the module docstring)."""
    pbar = sum(rates.values()) / len(rates)
    values, right_so_far, made = [], 0, 0
    for kind, cue, right in zip(ep.kinds, ep.cues, ep.right, strict=True):
        if kind == "decision" and cue is not None:
            values.append((right_so_far + rates[cue] + pbar * (decisions - made - 1)) / decisions)
            right_so_far += int(bool(right))
            made += 1
        else:
            values.append((right_so_far + pbar * (decisions - made)) / decisions)
    return values


class BagOfWordsCritic:
    """Ridge regression of the return-to-go on word counts of the context and the turn position (fitted once)."""

    def __init__(self, ridge: float = 1.0) -> None:
        self.ridge = ridge
        self.vocab: dict[str, int] = {}
        self.weights: np.ndarray | None = None
        self.turns = 0

    def _features(self, episodes: Sequence[Episode]) -> np.ndarray:
        rows = []
        for ep in episodes:
            for n, context in enumerate(ep.contexts):
                x = np.zeros(len(self.vocab) + self.turns + 1)
                for word in _WORD.findall(context.lower()):
                    if word in self.vocab:
                        x[self.vocab[word]] += 1.0
                x[len(self.vocab) + min(n, self.turns - 1)] = 1.0
                x[-1] = 1.0
                rows.append(x)
        return np.array(rows)

    def fit(self, episodes: Sequence[Episode]) -> BagOfWordsCritic:
        words = sorted({w for ep in episodes for c in ep.contexts for w in _WORD.findall(c.lower())})
        self.vocab = {w: i for i, w in enumerate(words)}
        self.turns = max(len(ep.contexts) for ep in episodes)
        x, y = self._features(episodes), np.array([g for ep in episodes for g in returns_to_go(ep.rewards)])
        self.weights = np.linalg.solve(x.T @ x + self.ridge * np.eye(x.shape[1]), x.T @ y)
        return self

    def values(self, ep: Episode) -> list[float]:
        assert self.weights is not None, "fit the critic first"
        return (self._features([ep]) @ self.weights).tolist()


def returns_to_go(rewards: Sequence[float]) -> list[float]:
    return np.cumsum(np.asarray(rewards, dtype=float)[::-1])[::-1].tolist()


def turn_ppo(episodes: Sequence[Episode], values: Sequence[Sequence[float]], gamma: float, lam: float) -> list[float]:
    """Turn GAE per turn, episodes concatenated (all of one length: the chooser makes no format errors)."""
    r = torch.tensor([ep.rewards for ep in episodes], dtype=torch.float64)
    v = torch.tensor([list(x) for x in values], dtype=torch.float64)
    adv, _ = turn_gae(r, v, torch.ones_like(r, dtype=torch.bool), gamma=gamma, lam=lam)
    return adv.flatten().tolist()


def grpo(episodes: Sequence[Episode]) -> list[float]:
    """GRPO: each task's group-normalised return on every turn of the episode."""
    ret = torch.tensor([sum(ep.rewards) for ep in episodes], dtype=torch.float64)
    adv = grpo_advantages(ret, torch.tensor([ep.task for ep in episodes]))
    return [a for a, ep in zip(adv.tolist(), episodes, strict=True) for _ in ep.rewards]


def token_ppo(episodes: Sequence[Episode]) -> list[float]:
    """Token GAE (γ = λ = 1, neutral critic) over two tokens a turn (colour, end; reward on the end token)."""
    r = torch.tensor([[x for rew in ep.rewards for x in (0.0, rew)] for ep in episodes], dtype=torch.float64)
    adv, _ = token_gae(r, torch.zeros_like(r), torch.ones_like(r, dtype=torch.bool), gamma=1.0, lam=1.0)
    return adv.reshape(len(episodes), -1, 2).mean(-1).flatten().tolist()


def rtpo_siblings(env: CreditChainEnv, chooser: Chooser, trunks: Sequence[Episode], siblings: int,
                  rng: np.random.Generator) -> tuple[list[float], list[tuple[Episode, int]]]:
    """RTPO's sibling advantages at every depth of every trunk, and (sibling, depth) for each."""
    adv: list[float] = []
    where: list[tuple[Episode, int]] = []
    for k in range(env.decisions + env.distractors):
        sibs = [(play(env, chooser, t.task, t.seed, rng, t.replies[:k]), t.task) for t in trunks
                for _ in range(siblings)]
        ret = torch.tensor([sum(s.rewards) for s, _ in sibs], dtype=torch.float64)
        adv += sibling_advantages(ret, torch.tensor([g for _, g in sibs])).tolist()
        where += [(s, k) for s, _ in sibs]
    return adv, where


def correlation(a: np.ndarray, b: np.ndarray) -> float | None:
    if a.size < 3 or a.std() == 0 or b.std() == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def scored(estimate: Sequence[float] | np.ndarray, truth: Sequence[float] | np.ndarray, clusters: Sequence[int],
           boot: int, rng: np.random.Generator) -> dict[str, Any]:
    """The correlation and its cluster-bootstrap SE (clusters = tasks)."""
    est, tru, cl = np.asarray(estimate), np.asarray(truth), np.asarray(clusters)
    ids = np.unique(cl)
    members = [np.flatnonzero(cl == i) for i in ids]
    draws = []
    for _ in range(boot):
        idx = np.concatenate([members[i] for i in rng.integers(len(ids), size=len(ids))])
        c = correlation(est[idx], tru[idx])
        if c is not None:
            draws.append(c)
    return {"corr": correlation(est, tru), "se": float(np.std(draws, ddof=1)) if len(draws) > 1 else None,
            "turns": int(est.size), "clusters": len(ids)}


@dataclass
class TruthArgs:
    decisions: int = 3
    distractors: int = 2
    noise: float = 0.0
    feedback: bool = False
    options: int = 2
    cues: int = 4
    order: str = "decisions_first"
    rates: tuple[float, ...] = (0.8, 0.6, 0.4, 0.2)
    tasks: int = 16
    group: int = 4
    siblings: int = 2
    fit_episodes: int = 256
    lambdas: tuple[float, ...] = (0.0, 0.5, 0.9, 1.0)
    gamma: float = 1.0
    critics: tuple[str, ...] = ("oracle", "learned", "zero")
    boot: int = 1000
    seed: int = 0


def make_env(a: TruthArgs) -> CreditChainEnv:
    return CreditChainEnv(decisions=a.decisions, distractors=a.distractors, options=a.options, cues=a.cues,
                          order=a.order, noise=a.noise, feedback=a.feedback, context="full")  # type: ignore[arg-type]


def episodes_of(env: CreditChainEnv, chooser: Chooser, tasks: range, group: int, seed: int) -> list[Episode]:
    """``group`` episodes of each task (task i: env seed i), each from its own seeded generator: the same draws
    whatever σ and feedback are, so the settings are paired."""
    return [play(env, chooser, i, i, np.random.default_rng([seed, env.distractors, i, g]))
            for i in tasks for g in range(group)]


def evaluate(a: TruthArgs) -> tuple[list[dict[str, object]], dict[str, object]]:
    """Every estimator's row for one setting, and the setting's rollout facts."""
    env = make_env(a)
    rates = {CUES[i]: a.rates[i] for i in range(a.cues)}
    chooser = Chooser(env, rates)
    eps = episodes_of(env, chooser, range(a.tasks), a.group, a.seed)
    truth = [x for ep in eps for x in true_advantage(ep, rates, a.decisions)]
    clusters = [ep.task for ep in eps for _ in ep.rewards]
    rng = np.random.default_rng([a.seed, 7])
    critics: dict[str, Callable[[Episode], list[float]]] = {
        "oracle": lambda ep: oracle_values(ep, rates, a.decisions), "zero": lambda ep: [0.0] * len(ep.rewards)}
    facts: dict[str, object] = {"episodes": len(eps), "turns": len(truth),
                                "mean_return": float(np.mean([sum(ep.rewards) for ep in eps])),
                                "decision_right_rate": float(np.mean([r for ep in eps for r in ep.right
                                                                      if r is not None]))}
    if "learned" in a.critics:
        fit = episodes_of(env, chooser, range(10_000, 10_000 + a.fit_episodes), 1, a.seed)
        learned = BagOfWordsCritic().fit(fit)
        critics["learned"] = learned.values
        facts["learned_ev"] = explained_variance(eps, learned.values)
    rows: list[dict[str, object]] = []

    def add(estimator: str, critic: str | None, lam: float | None, est: list[float], tru: list[float],
            cl: list[int]) -> None:
        head: dict[str, Any] = {"estimator": estimator, "critic": critic, "lambda": lam}
        rows.append(head | scored(est, tru, cl, a.boot, rng))

    for name in a.critics:
        values = [critics[name](ep) for ep in eps]
        for lam in a.lambdas:
            add("turn_ppo", name, lam, turn_ppo(eps, values, a.gamma, lam), truth, clusters)
    add("grpo", None, None, grpo(eps), truth, clusters)
    add("token_ppo", "zero", 1.0, token_ppo(eps), truth, clusters)
    trunks = eps[:: a.group]
    adv, where = rtpo_siblings(env, chooser, trunks, a.siblings, np.random.default_rng([a.seed, 11, a.distractors]))
    add("rtpo", None, None, adv, [true_advantage(s, rates, a.decisions)[k] for s, k in where],
        [s.task for s, _ in where])
    return rows, facts


def explained_variance(eps: Sequence[Episode], critic: Callable[[Episode], list[float]]) -> float:
    """1 − Var(G − V) / Var(G) of a critic against the Monte Carlo return-to-go on the scored episodes."""
    g = np.array([x for ep in eps for x in returns_to_go(ep.rewards)])
    v = np.array([x for ep in eps for x in critic(ep)])
    return float(1.0 - np.var(g - v) / np.var(g))


def label(row: dict[str, object]) -> str:
    if row["estimator"] == "turn_ppo":
        return f"turn_ppo {row['critic']} λ={float(row['lambda']):g}"  # type: ignore[arg-type]
    return str(row["estimator"])


def run(base: TruthArgs, distractors: Sequence[int], noises: Sequence[float],
        feedbacks: Sequence[bool]) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """Every setting (D × σ × feedback): the rows (one per estimator) and each setting's rollout facts."""
    rows, settings = [], []
    print(f"{'estimator':28s} {'D':>2s} {'σ':>4s} {'fb':>3s} {'corr':>7s} {'± SE':>6s} {'turns':>5s}", flush=True)
    for d in distractors:
        for noise in noises:
            for fb in feedbacks:
                a = TruthArgs(**{**base.__dict__, "distractors": d, "noise": noise, "feedback": fb})
                out, facts = evaluate(a)
                setting = {"decisions": a.decisions, "distractors": d, "noise": noise, "feedback": fb}
                settings.append(setting | facts)
                for row in out:
                    rows.append(setting | row)
                    corr, se = row["corr"], row["se"]
                    print(f"{label(row):28s} {d:2d} {noise:4.1f} {'on' if fb else 'off':>3s} "
                          f"{'   -   ' if corr is None else format(corr, '+.3f'):>7s} "
                          f"{'  -  ' if se is None else format(se, '.3f'):>6s} {row['turns']:5d}", flush=True)
    return rows, settings
