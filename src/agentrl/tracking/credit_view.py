"""The credit of a logged step on the run's own page: a table and a figure, no trace to open.

The traces carry each turn's credit as span attributes (`agentrl.tracking.chat`), three clicks deep. This writes
the same numbers, for the episodes the step logged, where a reviewer looks first — the run's Artifacts tab:

* ``credit.json`` (an MLflow table, every logged step): one row per turn — step, episode, task, RTPO role and
  depth, turn, the turn's reward, the episode's return, ``advantage`` (the schedule's), ``advantage_used`` (what
  the loss used), ``value`` and ``return`` (critic schedules), ``trained``, the update, and ``why`` in words
  whenever the two advantages differ or the turn was not trained;
* ``credit.png`` (the latest logged step): episodes × turns, each cell the advantage the loss used, with the
  schedule's advantage beside it where folding changed it, and a footnote saying why they can differ.

Why ``advantage_used`` differs from ``advantage``: the update folds *identical* turns (same context and same reply,
`agentrl.training.update.objective.fold_identical`) to the mean of their advantages, so a reply sampled twice with
advantages 0.5 and -0.17 is trained once at 0.17 each; a fold whose advantages cancel gets exactly 0. The fold size
written here is counted over every turn the step's updates saw (same update, same context and reply).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from agentrl.credit import StepRecord, TurnCredit
from agentrl.types import Trajectory

FOLD_NOTE = ("advantage_used differs from advantage where identical turns (same context, same reply) were folded "
             "to the mean of their advantages; a fold that cancels trains at 0")
UNTRAINED = "not trained: no update saw this turn (RTPO trunk, replayed prefix or continuation)"


def _key(turn: Any, update: str) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
    return update, tuple(turn.prompt_ids), tuple(turn.response_ids)


def fold_sizes(record: StepRecord) -> Counter[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """How many credited turns of the step share each (update, context, reply)."""
    sizes: Counter[tuple[str, tuple[int, ...], tuple[int, ...]]] = Counter()
    for episode in record.episodes:
        for turn, credit in zip(episode.turns, record.credit(episode), strict=True):
            if credit is not None:
                sizes[_key(turn, credit.update)] += 1
    return sizes


def why(credit: TurnCredit | None, fold: int) -> str:
    """In words, why a turn trained as it did (empty when it trained at its own advantage)."""
    if credit is None:
        return UNTRAINED
    if credit.advantage != 0.0 and credit.advantage_used == 0.0:
        return f"cancelled: {fold} identical turns (same context and reply) whose advantages sum to 0"
    if abs(credit.advantage - credit.advantage_used) > 1e-9:
        return f"folded: {fold} identical turns (same context and reply); the loss used their mean"
    if credit.advantage == 0.0:
        return "zero advantage: the returns it was compared with were equal, so no gradient"
    return ""


def _role(episode: Trajectory) -> str:
    if episode.tree is None:
        return f"group {episode.group}"
    return "trunk" if episode.branch_turn is None else f"sibling k={episode.branch_turn}"


def credit_rows(record: StepRecord, episodes: Sequence[Trajectory], step: int) -> list[dict[str, Any]]:
    """One row per turn of ``episodes`` (the ones the step logged), with its credit from ``record``."""
    sizes = fold_sizes(record)
    rows = []
    for e, episode in enumerate(episodes):
        for turn, credit in zip(episode.turns, record.credit(episode), strict=True):
            fold = sizes[_key(turn, credit.update)] if credit is not None else 0
            rows.append({
                "step": step, "episode": e, "task": episode.task_id, "role": _role(episode), "turn": turn.index,
                "reward": turn.reward, "episode_return": episode.total_reward,
                "advantage": None if credit is None else credit.advantage,
                "advantage_used": None if credit is None else credit.advantage_used,
                "value": None if credit is None else credit.value,
                "return": None if credit is None else credit.returns,
                "trained": credit is not None and credit.trained,
                "update": "" if credit is None else credit.update, "why": why(credit, fold)})
    return rows


def credit_figure(rows: Sequence[dict[str, Any]], title: str) -> Any:
    """Episodes × turns; each cell the advantage the loss used ("a → u" where folding changed it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    episodes = sorted({r["episode"] for r in rows})
    turns = max((r["turn"] for r in rows), default=0) + 1
    grid = np.full((len(episodes), turns), np.nan)
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * turns, 1.2 + 0.42 * len(episodes)))
    labels = {}
    for r in rows:
        i = episodes.index(r["episode"])
        labels[i] = f"{r['episode']}: {r['role']}, {r['task']}, R {r['episode_return']:+.2f}"
        used, adv = r["advantage_used"], r["advantage"]
        if used is None:
            ax.text(r["turn"], i, "—", ha="center", va="center", fontsize=8, color="gray")
            continue
        grid[i, r["turn"]] = used
        text = f"{used:+.2f}" if abs(adv - used) <= 1e-9 else f"{adv:+.2f}→{used:+.2f}"
        ax.text(r["turn"], i, text, ha="center", va="center", fontsize=8,
                fontweight="bold" if r["trained"] else "normal")
    bound = max(float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 0.0, 1e-6)
    image = ax.imshow(grid, cmap="coolwarm", vmin=-bound, vmax=bound, aspect="auto")
    ax.set_xticks(range(turns), [f"turn {k}" for k in range(turns)])
    ax.set_yticks(range(len(episodes)), [labels.get(i, "") for i in range(len(episodes))], fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label="advantage used")
    fig.text(0.01, 0.01, f"— not trained.  a→u: {FOLD_NOTE}.", fontsize=7, wrap=True)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def log_credit(client: Any, run_id: str, rows: Sequence[dict[str, Any]], step: int) -> None:
    """``credit.json`` (every row so far) and ``credit.png`` (the rows of ``step``) on the run."""
    if not rows:
        return
    columns = {key: [r[key] for r in rows] for key in rows[0]}
    client.log_table(run_id, data=columns, artifact_file="credit.json")
    latest = [r for r in rows if r["step"] == step]
    if latest:
        import matplotlib.pyplot as plt

        fig = credit_figure(latest, f"step {step}: the advantage each turn trained with (bold: trained)")
        client.log_figure(run_id, fig, "credit.png")
        plt.close(fig)
