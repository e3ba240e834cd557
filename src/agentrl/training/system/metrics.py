"""Step metrics over all ranks: what is logged at a step describes every rank's episodes and turns, not rank 0's.

Each rank computes its step's metrics from its own share. Before logging, every metric is reduced across the
ranks with torchmetrics' aggregation metrics (`SumMetric`, `MeanMetric`), whose ``compute`` synchronises over
the process group Lightning set up:

* **sums** — counts (``*/episodes``, ``perf/generated_tokens``, ``rtpo/depth*/siblings``) and the ``train/*``
  loss statistics, which the trainer accumulates as each rank's share of the *global* minibatch (see
  `agentrl.training.update.objective`), so their sum over ranks is the one-process value;
* **weighted means** — per-episode means (``rollout/reward``, ``success``, …) weighted by the rank's non-failed
  episodes, per-turn means by its sampled turns, RTPO per-depth means by its siblings at that depth;
* **maxima** — ``*max_abs_diff`` (the largest behaviour/π_old log-prob gap on any rank), ``rollout/staleness_max``
  and ``rollout/trunk_lag_max`` (the bound holds globally when it holds on every rank);
* **plain means** — everything else (timings, identical-on-every-rank values such as ``train/grad_norm``).

The behaviour-correction means (``rollout/logprob_mismatch_kl``, ``is_corrected_frac``, ``is_weight_mean``) are
per-token means weighted by the rank's recomputed tokens (``rollout/recomputed_tokens``, summed).

A metric missing on some rank (no episodes there) counts with weight 0. On one process nothing changes.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from torchmetrics.aggregation import MaxMetric, MeanMetric, SumMetric

from agentrl.training.system.perf import measure_peak_flops, peak_rise_metrics, step_perf_metrics, update_mfu
from agentrl.training.update import distributed

if TYPE_CHECKING:
    from agentrl.engines.specs import EngineSpec
    from agentrl.models.critic import TurnCritic
    from agentrl.models.memory import PeakRise
    from agentrl.models.policy import Policy
    from agentrl.training.rollout.session import RolloutSession
    from agentrl.training.update.ppo import PPOUpdate

log = logging.getLogger(__name__)

_PARTIAL = ("policy_loss", "approx_kl", "clipfrac", "entropy", "value_loss", "value_clipfrac", "kl_ref")
_SUMMED = re.compile(
    r"^(?:[a-z]+/(?:episodes|ok_episodes|sampled_turns)|perf/generated_tokens|rollout/recomputed_tokens"
    r"|rtpo/depth\d+/siblings|rollout/stale_dropped_episodes"
    r"|(?:train|rtpo/depth\d+)/(?:" + "|".join(_PARTIAL) + r"))$"
)
_PER_EPISODE = ("reward", "success", "turns", "truncated")
_PER_TURN = ("tokens_per_turn", "length_finish")
_PER_RECOMPUTED_TOKEN = ("logprob_mismatch_kl", "is_corrected_frac", "is_weight_mean")


def weight_key(name: str) -> str | None:
    """The metric whose value weighs ``name`` in the mean over ranks (None: equal weights)."""
    prefix, _, leaf = name.rpartition("/")
    if prefix in ("rollout", "eval") and leaf in _PER_EPISODE:
        return f"{prefix}/ok_episodes"
    if prefix in ("rollout", "eval") and leaf in _PER_TURN:
        return f"{prefix}/sampled_turns"
    if prefix == "rollout" and leaf in _PER_RECOMPUTED_TOKEN:
        return "rollout/recomputed_tokens"
    if prefix.startswith("rtpo/depth") and leaf not in _PARTIAL and leaf != "siblings":
        return f"{prefix}/siblings"
    return None


def is_summed(name: str) -> bool:
    return bool(_SUMMED.match(name))


def is_max(name: str) -> bool:
    return name.endswith(("max_abs_diff", "staleness_max", "trunk_lag_max", "peak_rss_mib", "peak_rise_mib"))


def reduce_across_ranks(metrics: dict[str, float]) -> dict[str, float]:
    """``metrics`` of this rank → the step's metrics over all ranks (a collective: every rank calls it)."""
    if not distributed.active():
        return dict(metrics)
    gathered: list[list[str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, sorted(metrics))
    names = sorted({name for keys in gathered for name in keys or []})
    out: dict[str, float] = {}
    for name in names:  # the same names in the same order on every rank
        present = name in metrics
        value = metrics.get(name, 0.0)
        if is_summed(name):
            total = SumMetric()
            total.update(torch.tensor(value if present else 0.0, dtype=torch.float64))
            out[name] = float(total.compute())
            continue
        if is_max(name):
            top = MaxMetric(nan_strategy="ignore")
            top.update(torch.tensor(value if present else -math.inf, dtype=torch.float64))
            out[name] = float(top.compute())
            continue
        key = weight_key(name)
        weight = (metrics.get(key, 0.0) if key is not None else 1.0) if present else 0.0
        mean = MeanMetric(nan_strategy="ignore")
        finite = math.isfinite(value)
        mean.update(torch.tensor(value if finite else 0.0, dtype=torch.float64),
                    weight=torch.tensor(weight if finite else 0.0, dtype=torch.float64))
        out[name] = float(mean.compute())
    return out


def resolved_params(policy: Policy, engine_spec: EngineSpec) -> dict[str, str]:
    """The run parameters that record what ``auto`` settings chose on this machine: the policy's compute dtype and
    its reason, and where the engine spec tells (`agentrl.engines.specs.HFEngineSpec.resolved`) its weights (shared
    or a copy) and decode dtype."""
    resolved = policy.resolved_compute_dtype
    engine = getattr(engine_spec, "resolved", None)
    return {"resolved/compute_dtype": str(resolved.dtype).removeprefix("torch."),
            "resolved/compute_dtype_reason": resolved.reason,
            **{f"resolved/{k}": v for k, v in (engine(policy) if engine is not None else {}).items()}}


class StepMeter:
    """One RL step's accounting: what the step cost (the rollout session's and the update's counts, the engine's
    busy time, wall time, MFU, the peak-memory rise), reduced over the ranks and logged.

    `start` opens a step (what happened before it does not count); the step's first collection leaves its
    staleness metrics in ``batch_metrics``; `finish` adds the costs to the schedule's metrics; `publish` logs them.
    """

    def __init__(self, session: RolloutSession, update: PPOUpdate, peak_rise: PeakRise,
                 peak_flops: float | None) -> None:
        self.session, self.update, self.peak_rise = session, update, peak_rise
        self.peak_flops = peak_flops  # of one device, for ``perf/mfu`` (None: measured when the fit starts)
        self.started = 0.0
        self.batch_metrics: dict[str, float] = {}

    def fit_starts(self, trainer: pl.Trainer, policy: Policy, engine_spec: EngineSpec,
                   device: torch.device) -> None:
        """Measure the device's peak FLOP/s if not given, and record what the ``auto`` settings chose on this
        machine and why (every logger's run parameters, for review)."""
        if self.peak_flops is None:
            self.peak_flops = measure_peak_flops(device, policy.compute_dtype)
        for logger in trainer.loggers:
            logger.log_hyperparams(resolved_params(policy, engine_spec))

    def start(self) -> None:
        self.started = time.perf_counter()
        self.session.take_costs()  # nothing from outside the step counts
        self.update.take_costs()
        self.batch_metrics = {}

    def finish(self, metrics: dict[str, float], policy: Policy, critic: TurnCritic | None,
               policy_version: int) -> dict[str, float]:
        """The schedule's ``metrics`` with the step's costs, over all ranks (a collective: every rank calls it)."""
        costs = defaultdict(float, self.session.take_costs() | self.update.take_costs())
        end = time.perf_counter()
        costs["engine_busy_seconds"] = self.session.activity.busy(self.started, end)
        metrics.update(self.batch_metrics)
        metrics.update(peak_rise_metrics(self.peak_rise))
        peak = self.peak_flops
        metrics.update(step_perf_metrics(costs, end - self.started, policy_version,
                                         mfu=lambda seconds: update_mfu(policy, critic, costs, seconds, peak)))
        return reduce_across_ranks(metrics)  # every rank's episodes and turns, not rank 0's


def expose_metrics(trainer: pl.Trainer, metrics: Mapping[str, float]) -> None:
    """Put ``metrics`` (a step's ``rollout/*``, ``train/*``, ``perf/*``; an evaluation's ``eval/*``) into
    ``trainer.callback_metrics`` under their logged names, as tensors, so that callbacks and the Python API
    (``agentrl.fit(...).trainer.callback_metrics["rollout/reward"]``) read what MLflow shows."""
    trainer.callback_metrics.update({key: torch.tensor(float(value)) for key, value in metrics.items()})


def publish_step(module: pl.LightningModule, metrics: dict[str, float], rl_step: int, batch_size: int) -> None:
    """Log RL step ``rl_step``'s metrics (already reduced over the ranks) and its progress-bar values.

    To the loggers directly, exactly the step's measurements: Lightning's `log_dict` re-logs every key ever logged
    in the epoch at each later step, so a metric a step did not measure showed its old value again (at Lightning's
    step index, the batch's: RL step k is logged at k − 1, evaluations after it at k)."""
    for logger in module.trainer.loggers:
        logger.log_metrics(metrics, step=rl_step - 1)
        logger.save()  # as Lightning's logger connector does after logging (the CSV logger writes its file)
    expose_metrics(module.trainer, metrics)
    reward = metrics.get("rollout/reward", float("nan"))
    module.log("reward", reward, prog_bar=True, on_step=True, batch_size=batch_size, logger=False)
    module.log("step_s", metrics["perf/step_seconds"], prog_bar=True, on_step=True, batch_size=batch_size,
               logger=False)
    log.info("step %d: reward %.3f, success %.3f, %.1f s", rl_step, reward,
             metrics.get("rollout/success", float("nan")), metrics["perf/step_seconds"])
