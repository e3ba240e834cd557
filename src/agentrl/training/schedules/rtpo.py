"""RTPO: reverse-turn policy optimisation over sparse reverse trees (Li, Qiao, Cao, Hu, arXiv 2608.18682).

One step (the paper's Algorithm 1):

1. **Trunks.** One full trajectory per task (``trunks_per_task`` of them) with the current policy. Trunks get no
   gradient and are not in any baseline; they only provide the boundary states S_k (the exact prompt ids c_k).
2. **Reverse sweep.** For k = K−1 down to 0:
   a. the current weights are served (pushed after the previous depth's update), θ_old ← θ;
   b. from each trunk with more than k turns, G−1 *siblings* branch at boundary k: the trunk's first k turns are
      replayed (or restored from a snapshot), turn k is sampled fresh from c_k, and the episode continues **with
      the current policy** to its end (on-policy continuation: the downstream turns already come from the
      updated θ_{>k}, so the trajectory importance weight is 1);
   c. ``A_j = R_j − mean(R of the siblings of that trunk)`` — no std normalisation (`sibling_advantages`);
   d. E epochs of PPO minibatches on the siblings' turn-k tokens only: token-level ratio (Eq. 5), token mean per
      sibling then mean over siblings (Eq. 6). Forced prefix turns, tool outputs, downstream turns and trunks
      get no gradient.

Earlier turns are thus always trained against the already-improved downstream policy.

Departures, all documented in docs/algorithms/rtpo.md: G counts the trunk as in the paper (G − 1 siblings per
boundary; G = 2 leaves a single sibling and a zero advantage, Theorem 1's (G−2)/(G−1) factor); the reward R_j is
the sibling's whole return (its replayed prefix rewards are shared by its group and cancel in A_j); the
off-policy ablation samples every depth's siblings up front with θ_0 and weights turn k by the clamped product of
the downstream turns' ratios.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from agentrl.agents.base import Task
from agentrl.algorithms.advantages import sibling_advantages
from agentrl.training.schedules.base import Schedule, rollout_metrics
from agentrl.training.schedules.learner import Learner
from agentrl.training.update.batching import TurnTargets, keys_of
from agentrl.training.update.settings import PPOSettings
from agentrl.types import Trajectory

if TYPE_CHECKING:
    from agentrl.collect.collector import Collector


class RTPO(Schedule):
    """Reverse-turn policy optimisation.

    Args:
        group_size: G, the paper's group size: G − 1 siblings per trunk and boundary (default 3: two siblings).
        trunks_per_task: Trunks per task (the paper: 4 for math, 2 for search).
        max_depth: Train only boundaries k < max_depth (the K cap); None trains every turn of the longest trunk.
        off_policy_continuation: Ablation: sample all depths' siblings up front with the step's initial weights
            and correct turn k with the clamped product of downstream ratios (the paper's drift experiment).
        is_clamp: Clamp of that importance weight to [1/is_clamp, is_clamp].
        ppo: Clipped-update settings (defaults: token-level ratio, RTPO Eq. 6 turn mean, one epoch).
    """

    def __init__(
        self,
        group_size: int = 3,
        trunks_per_task: int = 1,
        max_depth: int | None = None,
        off_policy_continuation: bool = False,
        is_clamp: float = 2.0,
        ppo: PPOSettings | None = None,
    ) -> None:
        super().__init__(ppo)
        if group_size < 2:
            raise ValueError(f"algorithm.group_size (G) must be >= 2, got {group_size}")
        if trunks_per_task < 1:
            raise ValueError(f"algorithm.trunks_per_task must be >= 1, got {trunks_per_task}")
        if max_depth is not None and max_depth < 1:
            raise ValueError(f"algorithm.max_depth must be >= 1 or null, got {max_depth}")
        if is_clamp < 1.0:
            raise ValueError(f"algorithm.is_clamp must be >= 1, got {is_clamp}")
        self.group_size = group_size
        self.trunks_per_task = trunks_per_task
        self.max_depth = max_depth
        self.off_policy_continuation = off_policy_continuation
        self.is_clamp = is_clamp

    @property
    def siblings(self) -> int:
        return self.group_size - 1

    @property
    def episodes_per_task(self) -> int:
        return self.trunks_per_task

    def batch(self, collector: Collector, tasks: list[Task], step: int) -> Coroutine[Any, Any, list[Trajectory]]:
        """The step's trunks: with max_staleness >= 1 launched while the previous step's depths update (trunks get
        no gradient; the siblings stay on-policy, collected in the depth loop)."""
        return collector.collect_trunks(tasks, step=step, per_task=self.trunks_per_task)

    def step(self, learner: Learner, tasks: list[Task]) -> dict[str, float]:
        col, step = learner.collector, learner.rl_step
        trunks = learner.collect_batch(tasks, self.batch, bounded=False)  # max_staleness >= 1: collected ahead
        ok = [t for t in trunks if not t.failed]
        depth = learner.sync_max(max((t.num_turns for t in ok), default=0))  # same on all ranks
        if self.max_depth is not None:
            depth = min(depth, self.max_depth)
        by_id = {t.id: t for t in tasks}

        def branch(k: int) -> list[Trajectory]:  # the siblings of every trunk at turn k
            return learner.collect(col.branch(ok, by_id, k, self.siblings, step=step))

        upfront, sampled_logprobs = self._collect_upfront(learner, branch, depth)
        sweep = _Sweep(rollout_metrics(trunks))
        for k in reversed(range(depth)):
            learner.step_progress.rtpo_depth(k, depth)
            siblings = upfront[k] if self.off_policy_continuation else branch(k)
            sweep.siblings(siblings, learner.policy_version)
            sweep.depth(k, *self._update_depth(learner, k, siblings, sampled_logprobs.get(k)))
            learner.push_weights()
        learner.step_progress.rtpo_depth(None)
        if depth == 0:
            learner.push_weights()
        return sweep.metrics(trunks, ok, depth)

    def _collect_upfront(self, learner: Learner, branch: Callable[[int], list[Trajectory]], depth: int) -> tuple[
            dict[int, list[Trajectory]], dict[int, dict[tuple[int, int], list[float]]]]:
        """The off-policy ablation: every depth's siblings collected before any update, and π_old of each depth's
        turn k, the weights that sampled them (θ_0), not θ_{>k}. Nothing on the default path."""
        if not self.off_policy_continuation:
            return {}, {}
        upfront = {k: branch(k) for k in range(depth)}
        sampled_logprobs = {}
        for k in range(depth):
            keys = [(b, k) for b, sib in enumerate(upfront[k]) if not sib.failed and sib.num_turns > k]
            sampled_logprobs[k] = learner.logprobs(upfront[k], keys)
        return upfront, sampled_logprobs

    def _update_depth(self, learner: Learner, k: int, siblings: list[Trajectory],
                      old_logprobs: dict[tuple[int, int], list[float]] | None = None) -> tuple[
            dict[str, float], dict[str, float]]:
        """Sibling advantages and the PPO update of depth k: (per-depth statistics, ``train/*`` metrics).
        ``old_logprobs`` (off-policy ablation): π_old of the siblings' turn k, keyed by their place in ``siblings``."""
        keep = [b for b, s in enumerate(siblings) if not s.failed and s.num_turns > k]
        ok = [siblings[b] for b in keep]
        stats: dict[str, float] = {"siblings": float(len(ok))}
        # scoring is collective under sharded weights: every rank scores, with or without siblings
        weights = self._is_weights(learner, ok, k, self.is_clamp) if self.off_policy_continuation else [1.0] * len(ok)
        if not ok:  # still take part in the update: other ranks may have siblings at this depth
            return stats, learner.update([], {}, self.ppo, tag=f"k{k}")
        rewards = torch.tensor([s.total_reward for s in ok], dtype=torch.float64)
        groups = torch.tensor([s.group for s in ok])
        adv = sibling_advantages(rewards, groups)
        fixed = [old_logprobs.get((b, k)) if old_logprobs is not None else None for b in keep]
        targets = {(i, k): TurnTargets(float(adv[i]), weight=weights[i], old_logprobs=fixed[i])
                   for i in range(len(ok))}
        stats["reward"] = float(rewards.mean())
        stats["zero_advantage_frac"] = float((adv.abs() < 1e-12).double().mean())
        stats["mean_abs_advantage"] = float(adv.abs().mean())
        if self.off_policy_continuation:
            stats["is_weight"] = sum(weights) / len(weights)
        train = learner.update(ok, targets, self.ppo, tag=f"k{k}")
        for name in ("clipfrac", "approx_kl", "policy_loss"):
            if f"train/{name}" in train:
                stats[name] = train[f"train/{name}"]
        return stats, train

    @staticmethod
    def _is_weights(learner: Learner, siblings: list[Trajectory], k: int, clamp: float) -> list[float]:
        """Clamped product of the downstream turns' token ratios π_θ/π_old (turns after k) per sibling."""
        keys = keys_of(siblings, lambda t: t.index > k)
        current = learner.logprobs(siblings, keys)
        log_w = [0.0] * len(siblings)
        for b, n in keys:
            recorded = siblings[b].turns[n].logprobs
            log_w[b] += sum(new - old for new, old in zip(current[(b, n)], recorded, strict=True))
        bound = math.log(clamp)
        return [math.exp(max(-bound, min(bound, w))) for w in log_w]


@dataclass
class _Sweep:
    """The bookkeeping of one reverse sweep: the step's metrics, each depth's update metrics, and the siblings'
    lag behind the weights their depth's update starts from and their outcomes."""

    metrics_so_far: dict[str, float]
    per_depth: list[dict[str, float]] = field(default_factory=list)
    lags: list[int] = field(default_factory=list)
    sibling_success: list[bool] = field(default_factory=list)  # every sibling episode (for rollout/generated_*)
    sibling_count: int = 0

    def siblings(self, siblings: list[Trajectory], policy_version: int) -> None:
        # versions behind the weights the depth's update starts from, of the siblings' sampled turns (0 when
        # on-policy: `collect` checks every sampled sibling turn against the trainer's version)
        self.lags += [policy_version - t.policy_version for s in siblings for t in s.turns if not t.forced]
        self.sibling_count += len(siblings)
        self.sibling_success += [s.success for s in siblings if not s.failed]

    def depth(self, k: int, stats: dict[str, float], train: dict[str, float]) -> None:
        self.per_depth.append(train)
        self.metrics_so_far.update({f"rtpo/depth{k}/{name}": v for name, v in stats.items()})

    def metrics(self, trunks: list[Trajectory], ok: list[Trajectory], depth: int) -> dict[str, float]:
        metrics = self.metrics_so_far
        metrics.update(_roll_up_depths(self.per_depth))
        metrics["rtpo/depths"] = float(depth)
        # success over every episode the step generated, trunks and siblings alike: the learning-rate sweep's score
        # (benchmarks/learning_sweep.py), which trunks alone leave blind when a step plays few of them
        generated = [t.success for t in ok] + self.sibling_success
        metrics["rollout/generated_episodes"] = float(len(trunks) + self.sibling_count)
        if generated:
            metrics["rollout/generated_success"] = sum(generated) / len(generated)
        if self.lags:
            metrics["rollout/staleness_mean"] = sum(self.lags) / len(self.lags)
            metrics["rollout/staleness_max"] = float(max(self.lags))
        return metrics


def _roll_up_depths(per_depth: list[dict[str, float]]) -> dict[str, float]:
    """One step's ``train/*`` and behaviour-correction metrics from the per-depth updates' metrics."""
    out: dict[str, float] = {}
    # mean over the depths whose update took an optimizer step (the same depths on every rank: the decision is
    # global), a trained depth without this rank's turns counting 0: these are shares of the global update
    # (summed over ranks when logged), so a rank's missing depth must not change the divisor
    trained = [s for s in per_depth if s.get("train/optimizer_steps", 0.0) > 0]
    out["rtpo/trained_depths"] = float(len(trained))
    for name in ("train/policy_loss", "train/approx_kl", "train/clipfrac", "train/entropy", "train/grad_norm",
                 "train/lr_scale"):
        if trained and any(name in s for s in trained):
            out[name] = sum(s.get(name, 0.0) for s in trained) / len(trained)
    for name in ("train/optimizer_steps", "train/skipped_updates", "train/early_stopped", "train/minibatches",
                 "train/informative_samples"):
        if any(name in s for s in per_depth):
            out[name] = sum(s.get(name, 0.0) for s in per_depth)
    # behaviour correction of the siblings' turn k, over every depth's recomputed tokens (token-weighted, as
    # one update over all of them would report it)
    counted = [s for s in per_depth if s.get("rollout/recomputed_tokens", 0.0) > 0]
    if counted:
        tokens = sum(s["rollout/recomputed_tokens"] for s in counted)
        out["rollout/recomputed_tokens"] = tokens
        for name in ("rollout/logprob_mismatch_kl", "rollout/is_corrected_frac", "rollout/is_weight_mean"):
            if any(name in s for s in counted):
                out[name] = sum(s.get(name, 0.0) * s["rollout/recomputed_tokens"] for s in counted) / tokens
    diffs = [s["rollout/logprob_max_abs_diff"] for s in per_depth if "rollout/logprob_max_abs_diff" in s]
    if diffs:
        out["rollout/logprob_max_abs_diff"] = max(diffs)
    return out
