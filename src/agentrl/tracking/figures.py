"""End-of-run figures drawn from the run's own metric history in MLflow: the reward curve and, for RTPO, the
per-depth statistics (share of zero advantages, mean |A|, clip fraction at each boundary k over the steps).

Each function takes ``(client, run_id)`` and logs one PNG to the run (nothing when the metrics are absent).
"""

from __future__ import annotations

import re
from typing import Any

DEPTH_KEY = re.compile(r"rtpo/depth(\d+)/(zero_advantage_frac|mean_abs_advantage|clipfrac)$")
DEPTH_PANELS = (("zero_advantage_frac", "zero-advantage fraction"), ("mean_abs_advantage", "mean |A|"),
                ("clipfrac", "clip fraction"))


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _history(client: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def reward_curve(client: Any, run_id: str) -> None:
    """``reward_curve.png``: rollout reward, held-out reward and success per step."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key, style in (("rollout/reward", "-"), ("eval/reward", "o--"), ("rollout/success", ":")):
        hist = _history(client, run_id, key)
        if hist:
            ax.plot([s for s, _ in hist], [v for _, v in hist], style, label=key)
    ax.set_xlabel("step")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    client.log_figure(run_id, fig, "reward_curve.png")
    plt.close(fig)


def rtpo_depths(client: Any, run_id: str) -> None:
    """``rtpo_depths.png``: one panel per statistic, one line per depth k (RTPO runs only)."""
    keys = [k for k in client.get_run(run_id).data.metrics if DEPTH_KEY.match(k)]
    if not keys:
        return
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(DEPTH_PANELS), figsize=(11, 3.2))
    for ax, (stat, title) in zip(axes, DEPTH_PANELS, strict=True):
        depths = sorted(int(m.group(1)) for k in keys if (m := DEPTH_KEY.match(k)) and m.group(2) == stat)
        for depth in depths:
            hist = _history(client, run_id, f"rtpo/depth{depth}/{stat}")
            ax.plot([s for s, _ in hist], [v for _, v in hist], "o-", label=f"k = {depth}")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if depths:
            ax.legend(fontsize=8)
        else:  # e.g. clipfrac when no depth took an update (all advantages zero)
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    fig.tight_layout()
    client.log_figure(run_id, fig, "rtpo_depths.png")
    plt.close(fig)
