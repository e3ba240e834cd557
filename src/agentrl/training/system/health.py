"""Whether a step could learn: the conditions under which an RL step trains nothing, said as it happens.

A step can finish without error and still teach the policy nothing. `step_health` looks at the step's episodes and
metrics for four such conditions and returns, for each one found, a `Finding`: a ``health/<code>`` metric (1.0,
logged with the step, so a dead step is visible in MLflow) and one line for the terminal that names the cause and
the likely fix. A fine step yields nothing.

* ``no_reward_spread``: every (non-failed) episode got the same return, so every advantage is 0 for a
  group-relative schedule and no episode is better than another for any schedule.
* ``no_optimizer_step``: the update took no optimizer step (``train/optimizer_steps`` is 0).
* ``no_tool_calls``: the agent offered tools on its turns and no reply called one.
* ``all_parse_failures``: every reply of an environment agent failed to parse (``info["format_errors"]`` counts
  as many as its turns), or every episode failed.

`DeadRun` counts consecutive dead steps for the end-of-run summary (``progress.dead_steps`` in a config sets how many
make a dead run). Under DDP the episode checks read the rank's own episodes (rank 0 prints).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agentrl.types import Trajectory


@dataclass(frozen=True)
class Finding:
    """One reason a step could not learn: its ``health/<code>`` metric and its terminal line."""

    code: str
    line: str


def _no_spread(ok: Sequence[Trajectory]) -> Finding | None:
    returns = {round(t.total_reward, 9) for t in ok}
    if len(ok) < 2 or len(returns) != 1:
        return None
    value = next(iter(returns))
    return Finding("no_reward_spread", (
        f"no learning signal: all {len(ok)} episodes returned {value:+.3f} (every advantage 0); make the task "
        "easier or the reward denser, sample more episodes per task (group size), or raise the temperature"))


def _no_tools(ok: Sequence[Trajectory]) -> Finding | None:
    sampled = [turn for t in ok for turn in t.turns if not turn.forced]
    if not sampled or not any(turn.tools for turn in sampled) or any(turn.tool_calls for turn in sampled):
        return None
    return Finding("no_tool_calls", (
        f"no tool call in {len(sampled)} replies: the model never used the tools it was offered; add a worked "
        "example of a call to the system prompt, use a larger or instruction-tuned model, or reward the format"))


def _parse_failures(trajs: Sequence[Trajectory], ok: Sequence[Trajectory]) -> Finding | None:
    if trajs and not ok:
        first = next((t.error for t in trajs if t.error), "?")
        return Finding("all_parse_failures", (
            f"every episode failed ({len(trajs)}); nothing to train on. First error: {first[:160]}"))
    counted = [t for t in ok if "format_errors" in t.info]
    turns = sum(t.num_turns for t in counted)
    if not counted or turns == 0 or sum(int(t.info["format_errors"]) for t in counted) < turns:
        return None
    return Finding("all_parse_failures", (
        f"every reply ({turns}) failed to parse as an action (format penalty on each turn); show the action "
        "format in the prompt with an example, or raise sampling.max_tokens if replies are cut off"))


def step_health(trajs: Sequence[Trajectory], metrics: Mapping[str, float]) -> list[Finding]:
    """What kept this step from learning (empty for a step that could learn)."""
    ok = [t for t in trajs if not t.failed]
    found = [_parse_failures(trajs, ok), _no_tools(ok), _no_spread(ok)]
    if metrics.get("train/optimizer_steps", 1.0) == 0:
        found.append(Finding("no_optimizer_step", (
            f"no optimizer step this step: {_why_no_step(metrics, found[2] is not None)}; the policy did not change")))
    return [f for f in found if f is not None]


def _why_no_step(metrics: Mapping[str, float], no_spread: bool) -> str:
    if no_spread or metrics.get("train/informative_samples", 1.0) == 0:
        return "no turn carried a non-zero advantage"
    skipped = metrics.get("train/skipped_updates", 0.0)
    if skipped:
        return f"{skipped:.0f} update(s) skipped (no policy signal, or non-finite values: see any warning above)"
    return "no turn to train on"


def health_metrics(findings: Sequence[Finding]) -> dict[str, float]:
    """``health/dead`` (1.0 when anything was found) and ``health/<code>`` of each finding, for the loggers."""
    out = {f"health/{f.code}": 1.0 for f in findings}
    out["health/dead"] = 1.0 if findings else 0.0
    return out


@dataclass
class DeadRun:
    """Consecutive dead steps; a run whose last ``after`` steps (or more) were all dead is a dead run."""

    after: int = 3
    streak: int = 0
    longest: int = 0
    causes: set[str] = field(default_factory=set)
    longest_causes: set[str] = field(default_factory=set)

    def add(self, findings: Sequence[Finding]) -> None:
        self.streak = self.streak + 1 if findings else 0
        self.causes = self.causes | {f.code for f in findings} if findings else set()
        if self.streak > self.longest or (self.streak and self.streak == self.longest):
            self.longest, self.longest_causes = self.streak, set(self.causes)

    def summary(self) -> str | None:
        """One line for the end-of-run summary, or None when no ``after`` consecutive steps were dead."""
        if self.after < 1 or self.longest < self.after:
            return None
        now = f"the last {self.streak} steps" if self.streak >= self.after else f"{self.longest} steps in a row"
        causes = ", ".join(sorted(self.causes if self.streak >= self.after else self.longest_causes))
        return f"  no learning: {now} could not learn ({causes}); the trained model is the base model or close to it"
