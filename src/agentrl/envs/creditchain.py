"""CreditChain: a text-agent version of bsuite's ``umbrella_length`` — only the decision turns matter.

An episode is ``decisions`` *decision* turns and ``distractors`` *distractor* turns in a fixed order. A decision
turn shows a cue word and asks for one of ``options`` colours; one is right by a fixed cue → colour rule (per
``rule_seed``, so a policy can learn it). A distractor's reply does not change the outcome.
``order="decisions_first"`` is the long-delay case (the reward arrives ``distractors`` turns after the choice that
earned it); ``"decisions_last"`` is the control.

Rewards: the terminal reward is the fraction of decisions answered right (``reward="all"``: 1.0 only when all are
right). With ``noise = σ > 0`` each valid distractor reply also earns ``σ·z``, z a standard normal hashed from the
episode seed and the parsed replies so far (a replayed RTPO prefix gets the same noise).

Action format: the **first option word** anywhere in the reply, case-insensitive. A reply without one is a format
error as in `base` (``format_penalty``, the step shown again; ``spare_turns`` allows retries, then the episode is
truncated). ``context="summary"`` adds a running summary line for ``EnvAgent(history=1)``.

``feedback=True`` (off by default): the observation after a decision begins "Last answer: right." or "Last answer:
wrong." (rewards unchanged), so a decision's consequence is observable before the terminal reward and a turn-level
critic V(s_{n+1}) can value it without knowing the rule.

Held-out games (seeds ≥ ``heldout_seed``): every block of ``cues`` consecutive seeds shows each cue once at every
decision position (`balanced_cues`) and pays no noise, so a cue-blind reply is right on exactly half the decisions
and a held-out game's return is its fraction of decisions right.

The final step's ``info`` holds the ground truth the credit benchmark scores against: ``turn_kinds``,
``turn_right`` (True/False for decisions, None for distractors), ``replies`` and ``decisions_right``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from agentrl.envs.base import EpisodeSnapshots, StepResult, format_error

COLOURS = ("red", "blue", "green", "yellow", "purple", "orange")
CUES = ("apple", "river", "stone", "cloud", "tiger", "candle", "mirror", "forest")
Order = Literal["decisions_first", "decisions_last"]
RewardMode = Literal["fraction", "all"]
Context = Literal["summary", "full"]
Fallback = Literal["error", "hash"]


def distractor_noise(seed: int, history: tuple[str, ...], sigma: float) -> float:
    """``σ·z``, z ~ N(0, 1) drawn from a hash of (seed, parsed action history): the same for a replayed prefix."""
    if sigma == 0.0:
        return 0.0
    digest = hashlib.blake2b(repr((seed, history)).encode(), digest_size=8).digest()
    return sigma * float(np.random.default_rng(int.from_bytes(digest, "little")).standard_normal())


@dataclass(frozen=True)
class _TurnRecord:
    kind: str  # "decision" or "distractor"
    right: bool | None  # decision right (a format error is not); None for a distractor
    reply: str  # the parsed reply, "" for a format error


@dataclass(frozen=True)
class _ChainState:
    seed: int = 0
    cues: tuple[int, ...] = ()  # cue index of each decision, in order
    step: int = 0  # position in the plan (steps answered validly)
    turn: int = 0  # turns taken, format errors included
    history: tuple[str, ...] = ()  # parsed valid replies, in order (the noise key; format errors leave it as is)
    turn_log: tuple[_TurnRecord, ...] = ()  # one record per turn, format errors included (the ground truth)
    answers: tuple[str, ...] = ()  # "cue=reply" of every answered decision, for the summary
    done: bool = False
    started: bool = False


class CreditChainEnv(EpisodeSnapshots):
    """M decision turns and D distractor turns; the terminal reward scores the decisions only.

    Args:
        decisions: M, decision turns (>= 1).
        distractors: D, distractor turns (>= 0).
        options: K, colour words offered at every turn, in [2, 6].
        order: ``decisions_first`` (long delay) or ``decisions_last`` (control).
        reward: ``fraction`` of decisions right, or ``all`` (1.0 only when every decision is right).
        noise: σ >= 0, the scale of the hashed Gaussian reward of each valid distractor reply.
        context: ``summary`` (a running summary line in every observation; use ``EnvAgent(history=1)``) or ``full``.
        rule_seed: Seed of the cue → right colour rule (shared by all episodes).
        spare_turns: Turns beyond M + D allowed for format errors before truncation.
        format_penalty: Reward of a reply without an option word (<= 0).
        prompt_example: End the system prompt with one example reply (the last option word).
        fallback: What a non-empty reply without an option word is: ``error`` (a format error, the protocol) or
            ``hash`` (the option ``hash(reply) mod K``: every reply is an action, for measuring credit with a base
            model that rarely names a colour).
        cues: How many distinct cue words episodes draw from (the first ``cues`` of the list), in [1, 8]: the rule a
            policy must learn has this many entries (fewer cues = less to learn, so a small budget is left for
            the credit problem itself).
        feedback: Begin the observation after a decision with "Last answer: right." / "Last answer: wrong.".
        heldout_seed: Seeds at or above it are held-out games: cues balanced per position, no distractor noise.
    """

    episode_type = _ChainState

    def __init__(
        self,
        decisions: int = 1,
        distractors: int = 4,
        options: int = 2,
        order: Order = "decisions_first",
        reward: RewardMode = "fraction",
        noise: float = 0.0,
        context: Context = "summary",
        rule_seed: int = 0,
        spare_turns: int = 2,
        format_penalty: float = -0.1,
        prompt_example: bool = True,
        fallback: Fallback = "error",
        cues: int = len(CUES),
        feedback: bool = False,
        heldout_seed: int | None = None,
    ) -> None:
        if not 1 <= cues <= len(CUES):
            raise ValueError(f"env.cues must be in [1, {len(CUES)}], got {cues}")
        self.cues = cues
        _validate(decisions, distractors, options, order, reward, noise, context, spare_turns, format_penalty)
        if fallback not in ("error", "hash"):
            raise ValueError(f"env.fallback must be 'error' or 'hash', got {fallback!r}")
        self.fallback = fallback
        if not isinstance(feedback, bool):
            raise ValueError(f"env.feedback must be true or false, got {feedback!r}")
        if heldout_seed is not None and (not isinstance(heldout_seed, int) or heldout_seed < 0):
            raise ValueError(f"env.heldout_seed must be null or an integer >= 0, got {heldout_seed!r}")
        self.feedback, self.heldout_seed = feedback, heldout_seed
        self.decisions, self.distractors, self.options = decisions, distractors, options
        self.order, self.reward_mode, self.noise, self.context = order, reward, float(noise), context
        self.rule_seed, self.spare_turns, self.format_penalty = rule_seed, spare_turns, format_penalty
        self.words = COLOURS[:options]
        self.prompt_example = prompt_example
        self.max_turns = decisions + distractors + spare_turns
        self.rule = balanced_rule(rule_seed, cues, self.words)
        self._pattern = re.compile(r"\b(" + "|".join(self.words) + r")\b", re.IGNORECASE)
        n = decisions + distractors
        self.system_prompt = (
            f"A word game of {n} steps. At every step reply with one colour word only. "
            "When a step shows a cue, one colour is right for that cue."
        )
        if prompt_example:
            self.system_prompt += f"\nExample reply: {self.words[-1]}"
        self._episode = _ChainState()

    @property
    def agent_history(self) -> int | None:
        """The ``EnvAgent(history=...)`` the context policy is meant for: 1 with ``summary``, None with ``full``."""
        return 1 if self.context == "summary" else None

    def metadata(self) -> dict[str, Any]:
        """Every setting, the context policy included (recorded by the credit benchmark)."""
        return {"env": "creditchain", "decisions": self.decisions, "distractors": self.distractors,
                "options": self.options, "order": self.order, "reward": self.reward_mode, "noise": self.noise,
                "context": self.context, "agent_history": self.agent_history, "rule_seed": self.rule_seed,
                "spare_turns": self.spare_turns, "format_penalty": self.format_penalty,
                "prompt_example": self.prompt_example, "fallback": self.fallback, "cues": self.cues,
                "feedback": self.feedback, "heldout_seed": self.heldout_seed}

    def is_decision(self, step: int) -> bool:
        """Whether plan position ``step`` is a decision."""
        if self.order == "decisions_first":
            return step < self.decisions
        return step >= self.distractors

    def cue(self, seed: int, decision: int) -> str:
        """The cue word of decision ``decision`` (0-based) of the episode with ``seed``."""
        return CUES[self._cues_of(seed)[decision]]

    def right_reply(self, seed: int, decision: int) -> str:
        """The right colour of decision ``decision`` (0-based) of the episode with ``seed``."""
        return self.rule[self.cue(seed, decision)]

    def judge(self, cue: str, reply: str) -> bool | None:
        """How `step` scores ``reply`` to a decision showing ``cue``: right or wrong, or None for a reply that names
        no option (a format error: the decision is asked again)."""
        word = self._parse(reply)
        return None if word is None else word == self.rule[cue]

    def reset(self, seed: int) -> str:
        """Draw the cues from ``seed`` and return the first step's observation."""
        self._episode = _ChainState(seed=seed, cues=self._cues_of(seed), started=True)
        return self._observation()

    def step(self, action: str) -> StepResult:
        """Score the first option word of ``action`` at the current step."""
        state = self._episode
        if not state.started or state.done:
            raise RuntimeError("CreditChainEnv.step called before reset() or after the episode ended")
        kind = "decision" if self.is_decision(state.step) else "distractor"
        word = self._parse(action)
        turn = state.turn + 1
        truncated = turn >= self.max_turns
        if word is None:
            record = _TurnRecord(kind, False if kind == "decision" else None, "")
            state = replace(state, turn=turn, turn_log=(*state.turn_log, record), done=truncated)
            self._episode = state
            if truncated:
                return self._finish(self.format_penalty, truncated=True)
            return format_error(f"Invalid reply. Reply with one word: {self._choices()}.\n{self._observation()}",
                                self.format_penalty, False)
        history = (*state.history, word)
        reward, answers, right = 0.0, state.answers, None
        if kind == "decision":
            cue = CUES[state.cues[self._decision_index(state.step)]]
            right = word == self.rule[cue]  # `judge` says the same of a raw reply
            answers = (*answers, f"{cue}={word}")
        else:
            reward = distractor_noise(state.seed, history, 0.0 if self._heldout(state.seed) else self.noise)
        step = state.step + 1
        ended = step == self.decisions + self.distractors
        self._episode = replace(state, step=step, turn=turn, history=history, answers=answers,
                                turn_log=(*state.turn_log, _TurnRecord(kind, right, word)), done=ended or truncated)
        if ended or truncated:
            return self._finish(reward, truncated=truncated and not ended)
        return StepResult(self._observation(), reward, False, False, {"format_error": False})

    def _finish(self, reward: float, *, truncated: bool) -> StepResult:
        """The last step: the terminal reward (unanswered decisions count as wrong) and the ground truth."""
        state = self._episode
        log = state.turn_log
        n_right = sum(1 for r in log if r.right)
        score = n_right / self.decisions if self.reward_mode == "fraction" else float(n_right == self.decisions)
        info: dict[str, Any] = {"format_error": log[-1].reply == "", "success": n_right == self.decisions,
                                "decisions_right": n_right, "turn_kinds": [r.kind for r in log],
                                "turn_right": [r.right for r in log], "replies": [r.reply for r in log]}
        obs = f"Game over: {n_right} of {self.decisions} cues right."
        return StepResult(obs, reward + score, not truncated, truncated, info)

    def names_option(self, reply: str) -> bool:
        """Whether ``reply`` names an option word (is valid without the ``hash`` fallback)."""
        return self._pattern.search(reply[:10_000]) is not None

    def _parse(self, action: str) -> str | None:
        """The first option word of the reply; with ``fallback="hash"`` any other non-empty reply hashes to one."""
        match = self._pattern.search(action[:10_000])
        if match is not None:
            return match.group(1).lower()
        reply = " ".join(action[:10_000].lower().split())
        if self.fallback == "error" or not reply:
            return None
        digest = hashlib.blake2b(reply.encode(), digest_size=8).digest()
        return self.words[int.from_bytes(digest, "little") % self.options]

    def _heldout(self, seed: int) -> bool:
        return self.heldout_seed is not None and seed >= self.heldout_seed

    def _cues_of(self, seed: int) -> tuple[int, ...]:
        """The cue index of each decision: drawn from the seed, or balanced for a held-out seed."""
        if self.heldout_seed is not None and seed >= self.heldout_seed:
            return balanced_cues(seed - self.heldout_seed, self.decisions, self.cues)
        return _draw_cues(seed, self.decisions, self.cues)

    def _decision_index(self, step: int) -> int:
        return step if self.order == "decisions_first" else step - self.distractors

    def _choices(self) -> str:
        return ", ".join(self.words[:-1]) + " or " + self.words[-1]

    def _observation(self) -> str:
        state = self._episode
        n = self.decisions + self.distractors
        if self.is_decision(state.step):
            cue = CUES[state.cues[self._decision_index(state.step)]]
            body = f"Cue: {cue}. Reply {self._choices()}."
        else:
            body = f"No cue. Reply {self._choices()}."
        last = state.turn_log[-1] if state.turn_log else None
        if self.feedback and last is not None and last.kind == "decision" and last.reply:
            body = f"Last answer: {'right' if last.right else 'wrong'}.\n{body}"
        if self.context == "full":
            return body
        done = ", ".join(state.answers) if state.answers else "none"
        return f"{body}\n(Step {state.step + 1} of {n}; cues answered: {done}.)"

def balanced_rule(rule_seed: int, cues: int, words: tuple[str, ...]) -> dict[str, str]:
    """The cue → right colour rule over the first ``cues`` cue words: each colour is right for ``cues // K`` or
    ``cues // K + 1`` of them, so no reply that ignores the cue beats chance by more than one cue's share.

    A random permutation of all eight cues ranks the cues in play; a cue's colour is its rank mod K. With all eight
    cues in play the rank is the permutation itself. Keeping a subset's eight-cue colours instead can give one
    colour most cues, so that one reply at every turn wins most episodes with no credit to assign
    (docs/benchmarks-log.md).
    """
    perm = np.random.default_rng(rule_seed).permutation(len(CUES))[:cues]
    ranks = np.argsort(np.argsort(perm))
    return {CUES[i]: words[int(ranks[i]) % len(words)] for i in range(cues)}


def balanced_cues(index: int, decisions: int, cues: int) -> tuple[int, ...]:
    """The cues of held-out game ``index``: decision 0 shows cue ``index mod cues`` and decision j >= 1 that cue
    shifted by digit j − 1 of the block number ``index // cues`` in base ``cues``. In each block of ``cues``
    consecutive games every position shows every cue once; the first ``cues^(M−1)`` blocks together hold every
    combination of cues once (all distinct games)."""
    block = index // cues
    return tuple((index + (block // cues ** (j - 1) if j else 0)) % cues for j in range(decisions))


def _draw_cues(seed: int, decisions: int, cues: int) -> tuple[int, ...]:
    rng = np.random.default_rng(seed)
    return tuple(int(c) for c in rng.integers(0, cues, size=decisions))


def _validate(decisions: int, distractors: int, options: int, order: str, reward: str, noise: float, context: str,
              spare_turns: int, format_penalty: float) -> None:
    """One-line errors naming the field and its allowed range."""
    checks = [
        (decisions >= 1, f"env.decisions (M) must be >= 1, got {decisions}"),
        (distractors >= 0, f"env.distractors (D) must be >= 0, got {distractors}"),
        (2 <= options <= len(COLOURS), f"env.options (K) must be in [2, {len(COLOURS)}], got {options}"),
        (order in ("decisions_first", "decisions_last"),
         f"env.order must be 'decisions_first' or 'decisions_last', got {order!r}"),
        (reward in ("fraction", "all"), f"env.reward must be 'fraction' or 'all', got {reward!r}"),
        (noise >= 0 and np.isfinite(noise), f"env.noise (sigma) must be a finite number >= 0, got {noise}"),
        (context in ("summary", "full"), f"env.context must be 'summary' or 'full', got {context!r}"),
        (0 <= spare_turns <= 100, f"env.spare_turns must be in [0, 100], got {spare_turns}"),
        (-10.0 <= format_penalty <= 0.0, f"env.format_penalty must be in [-10, 0], got {format_penalty}"),
        (decisions + distractors <= 1000, f"env.decisions + env.distractors must be <= 1000, got "
                                          f"{decisions + distractors}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
