"""`PPOUpdate`: PPO epochs × minibatches over selected turns, from targets to optimizer steps.

One call (`PPOUpdate.run`) is one update of a schedule's turns:

1. the turns become rows (`RowPlan.rows`); if no rank has any, nothing happens (counted as a skipped update);
2. π_old is recomputed and the behaviour correction attached when the caller passes a scorer
   (`agentrl.training.update.mismatch.with_old_logprobs`);
3. for each epoch, a fresh minibatch order (seeded by the step and the tag); for each minibatch, the unit counts
   (summed over ranks: see `agentrl.training.update.objective`), then the micro-batches' losses, each backpropagated
   through the caller's ``backward`` (Lightning's ``manual_backward``), then one optimizer step
   (`_step_optimizers`): gradients summed over ranks, clipped, checked for non-finite values, stepped.

It takes what it needs as values and functions — the policy and critic, the plan, the optimizers, the backward and
the π_old scorer — and knows nothing of Lightning modules, engines or schedules.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from agentrl.credit import StepRecord
from agentrl.models.critic import TurnCritic
from agentrl.models.policy import Policy
from agentrl.runview import StepProgress
from agentrl.seeding import derive_seed
from agentrl.training.update import distributed, sharding
from agentrl.training.update.batching import Row, TurnKey, TurnTargets, token_counts
from agentrl.training.update.credit import record_update
from agentrl.training.update.mismatch import Scorer, with_old_logprobs
from agentrl.training.update.objective import MinibatchCounts, fold_identical, informative_samples, ppo_objective
from agentrl.training.update.rowplan import RowPlan
from agentrl.training.update.settings import CriticSettings, OptimSettings, PPOSettings
from agentrl.types import Trajectory

log = logging.getLogger(__name__)


class NonFiniteUpdateError(RuntimeError):
    """Too many consecutive updates had a non-finite loss or gradient."""


class PPOUpdate:
    """The update machinery of one trainer (see the module docstring).

    Args:
        policy: The policy being trained.
        critic: The turn critic, or None.
        optim: Optimizer settings (gradient clips, the non-finite guard).
        critic_settings: The value-loss coefficient.
        seed: Seed of the minibatch orders.
        progress: The run's progress channel: each minibatch is told there.
    """

    def __init__(self, policy: Policy, critic: TurnCritic | None, optim: OptimSettings,
                 critic_settings: CriticSettings, seed: int, progress: StepProgress | None = None) -> None:
        self.policy = policy
        self.critic = critic
        self.optim = optim
        self.critic_settings = critic_settings
        self.seed = seed
        self.bad_updates = 0  # non-finite updates in a row
        self.progress = progress or StepProgress()
        self._costs: defaultdict[str, float] = defaultdict(float)

    def build_optimizers(self) -> list[torch.optim.Optimizer]:
        """AdamW for the policy's trainable parameters and, with a critic, a second one at the critic's rate."""
        o = self.optim
        opts: list[torch.optim.Optimizer] = [adamw(list(self.policy.trainable_parameters()), o.lr, o)]
        if self.critic is not None:
            opts.append(adamw(list(self.critic.trainable_parameters()), o.critic_lr, o))
        return opts

    def take_costs(self) -> dict[str, float]:
        """Token and time counters of the updates since the last call (and reset them)."""
        costs, self._costs = dict(self._costs), defaultdict(float)
        return costs

    def run(self, trajectories: Sequence[Trajectory], targets: dict[TurnKey, TurnTargets], ppo: PPOSettings, *,
            plan: RowPlan, optimizers: list[Any], backward: Callable[[Tensor], None], score_old: Scorer | None,
            temperature: float, step: int, tag: str = "", record: StepRecord | None = None) -> dict[str, float]:
        """One update; returns the ``train/*`` metrics averaged over the minibatches whose losses were computed
        (counts, summed: ``train/minibatches``, ``train/optimizer_steps`` of the policy, ``train/skipped_updates``,
        ``train/early_stopped``), ``train/informative_samples``, ``train/lr_scale`` and the behaviour-correction
        metrics. Every rank must call it, with or without turns. With a ``record``, each turn's credit (the
        schedule's target and what the loss uses of it) goes into it (`agentrl.training.update.credit`)."""
        rows = plan.rows(trajectories, targets)
        most_rows = distributed.sync_max(len(rows), plan.device)
        if most_rows == 0:
            return {"train/skipped_updates": 1.0, "train/optimizer_steps": 0.0}
        planned = rows
        rows = fold_identical(rows)  # identical turns take their fold's mean advantage (cancelled pairs: 0)
        rows, behaviour_stats = with_old_logprobs(trajectories, rows, ppo, score_old)
        if record is not None:
            record_update(record, trajectories, planned, rows, tag)
        packed, unpacked = token_counts(rows)
        self._costs["packed_tokens"] += packed
        self._costs["unpacked_tokens"] += unpacked
        informative = float(distributed.sum_tensor(torch.tensor([float(informative_samples(rows))],
                                                                dtype=torch.float64), plan.device)[0])
        gen = torch.Generator().manual_seed(derive_seed(self.seed, step, "minibatches", tag))
        size, n_minibatches = minibatch_split(len(rows), most_rows, ppo)
        totals: dict[str, float] = defaultdict(float)
        start = time.perf_counter()
        for epoch in range(ppo.epochs):
            order = torch.randperm(len(rows), generator=gen).tolist()
            for m in range(n_minibatches):
                self.progress.minibatch(epoch + 1, ppo.epochs, m + 1, n_minibatches)
                minibatch = [rows[i] for i in order[m * size : (m + 1) * size]]
                stats = self._minibatch(minibatch, ppo, plan, optimizers, backward, temperature)
                for k, v in stats.items():
                    totals[k] += v
                if stats.get("train/early_stopped"):
                    break
            if totals.get("train/early_stopped"):
                break
        self._costs["train_seconds"] += time.perf_counter() - start
        counts = ("train/optimizer_steps", "train/skipped_updates", "train/early_stopped", "train/minibatches")
        measured = max(totals.get("train/minibatches", 0.0), 1.0)  # the minibatches whose losses were computed
        out = {k: (v if k in counts else v / measured) for k, v in totals.items()}
        out["train/optimizer_steps"] = totals.get("train/optimizer_steps", 0.0)
        out["train/skipped_updates"] = totals.get("train/skipped_updates", 0.0)
        out["train/informative_samples"] = informative
        if "train/lr_scale" in totals:  # the mean factor over the optimizer steps taken (the skipped ones have none)
            out["train/lr_scale"] = totals["train/lr_scale"] / max(totals.get("train/optimizer_steps", 0.0), 1.0)
        return out | behaviour_stats

    def _minibatch(self, rows: list[Row], ppo: PPOSettings, plan: RowPlan, opts: list[Any],
                   backward: Callable[[Tensor], None], temperature: float) -> dict[str, float]:
        counts = MinibatchCounts.of(distributed.sum_tensor(MinibatchCounts.local(rows, ppo).as_tensor(),
                                                           plan.device))
        policy_signal = counts.policy_signal(ppo)
        if not policy_signal and counts.value_units == 0:  # an optimizer step would be momentum and decay only
            return {"train/skipped_updates": 1.0}
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        stats: dict[str, float] = defaultdict(float)
        for micro in plan.micro_batches(rows):
            batch = plan.batch(micro)
            loss, micro_stats = ppo_objective(self.policy, self.critic, batch, ppo, temperature=temperature,
                                              vf_coef=self.critic_settings.vf_coef, shares=counts.shares(micro, ppo),
                                              lockstep=plan.lockstep, policy_terms=policy_signal)
            backward(loss)
            for k, v in micro_stats.items():
                stats[k] += v
            self._costs["train_tokens"] += float(batch.attention_mask.sum())
            self._costs["scored_tokens"] += float(batch.response_mask.sum())
        stats["train/minibatches"] = 1.0
        if ppo.target_kl is not None:  # the KL of the weights this step would start from, over every rank
            kl = float(distributed.sum_tensor(torch.tensor([stats.get("train/approx_kl", 0.0)],
                                                           dtype=torch.float64), plan.device)[0])
            if kl > ppo.target_kl:
                for opt in opts:
                    opt.zero_grad(set_to_none=True)
                return {"train/early_stopped": 1.0}
        # the step sized by the evidence behind it: this minibatch's informative samples (over every rank), so an
        # update split into minibatches moves the weights as far in all as one step on all its samples would
        lr_scale = lr_scale_for(counts.informative, ppo.lr_reference_samples)
        with scaled_lr(opts[0], lr_scale):
            out = self._step_optimizers(opts, stats, plan, policy_signal, counts.value_units > 0)
        if out.get("train/optimizer_steps"):
            out["train/lr_scale"] = lr_scale
        return out

    def _step_optimizers(self, opts: list[Any], stats: dict[str, float], plan: RowPlan, policy_signal: bool,
                         value_signal: bool) -> dict[str, float]:
        """Sum gradients over the ranks, clip them, guard against non-finite updates, and step each optimizer
        that has a gradient behind it: the policy's with a non-cancelled advantage (and a non-zero gradient), the
        critic's with value targets."""
        o = self.optim
        params = self.policy.trainable_parameters()
        critic_params = self.critic.trainable_parameters() if self.critic is not None else []
        if plan.lockstep:
            sharding.sum_gradients(params + critic_params)  # FSDP shards: reduce-scattered (averaged) already
        else:
            distributed.sum_gradients(params + critic_params)  # one all-reduce for both
        norm = clip_gradients(params, o.max_grad_norm)
        stats["train/grad_norm"] = norm
        finite = math.isfinite(norm) and all(math.isfinite(v) for v in stats.values())
        if self.critic is not None:
            c_norm = clip_gradients(critic_params, o.critic_max_grad_norm)
            stats["train/critic_grad_norm"] = c_norm
            finite = finite and math.isfinite(c_norm)
        finite = distributed.sync_all(finite, plan.device)  # every rank skips, or none does
        if not finite:
            self.bad_updates += 1
            stats["train/skipped_updates"] = 1.0
            log.warning("non-finite loss or gradient: update skipped (%d in a row)", self.bad_updates)
            for opt in opts:
                opt.zero_grad(set_to_none=True)
            if self.bad_updates >= o.max_bad_updates:
                raise NonFiniteUpdateError(
                    f"{self.bad_updates} non-finite updates in a row (optim.max_bad_updates="
                    f"{o.max_bad_updates}); lower optim.lr or check the rewards")
            return {k: (0.0 if not math.isfinite(v) else v) for k, v in stats.items()}
        self.bad_updates = 0
        step_policy = policy_signal and norm > 0.0  # an exactly zero gradient (all ranks: it is summed) too
        if step_policy:
            opts[0].step()
        if value_signal and len(opts) > 1:
            opts[1].step()
        stats["train/optimizer_steps"] = 1.0 if step_policy else 0.0
        stats["train/skipped_updates"] = 0.0 if step_policy else 1.0
        return dict(stats)


def adamw(params: list[torch.nn.Parameter], lr: float, o: OptimSettings) -> torch.optim.AdamW:
    """AdamW over ``params`` at ``lr``, fused where ``o.fused`` and PyTorch has a fused kernel for them: plain
    floating-point tensors on the CPU or CUDA (a sharded ``DTensor`` keeps the default implementation)."""
    fusable = bool(params) and all(
        type(p.data) is torch.Tensor and p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(params, lr=lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay,
                             fused=True if o.fused and fusable else None)


def minibatch_split(local_rows: int, most_rows: int, ppo: PPOSettings) -> tuple[int, int]:
    """(rows per minibatch on this rank, minibatches per epoch). The count is the same on every rank (each runs the
    same optimizer steps): from ``most_rows``, the largest rank's rows. ``ppo.minibatches``: that many (fewer if there
    are fewer rows), each rank splitting its own rows evenly; ``ppo.minibatch_size``: that many rows per minibatch;
    neither: one minibatch of every row."""
    if ppo.minibatches is not None:
        count = max(1, min(ppo.minibatches, most_rows))
        return max(1, -(-local_rows // count)), count
    if ppo.minibatch_size is None:
        return max(local_rows, 1), 1
    return ppo.minibatch_size, -(-most_rows // ppo.minibatch_size)


def lr_scale_for(informative: float, reference: int | None) -> float:
    """The policy's learning-rate factor for an update resting on ``informative`` samples: ``min(1, n / ref)``
    (the linear scaling rule below a reference batch; 1 without a reference)."""
    if reference is None:
        return 1.0
    return min(1.0, informative / reference)


@contextlib.contextmanager
def scaled_lr(optimizer: Any, scale: float) -> Iterator[None]:
    """``optimizer``'s learning rates multiplied by ``scale`` for the block, restored after."""
    groups = optimizer.param_groups  # a LightningOptimizer shares its optimizer's groups
    saved = [g["lr"] for g in groups]
    for g in groups:
        g["lr"] = g["lr"] * scale
    try:
        yield
    finally:
        for g, lr in zip(groups, saved, strict=True):
            g["lr"] = lr


def clip_gradients(params: Sequence[torch.nn.Parameter], max_norm: float) -> float:
    """Clip the gradients of ``params`` to ``max_norm`` (0: no clipping); returns the norm before clipping.
    Sharded (DTensor) gradients count with their full norm."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    if any(hasattr(g, "full_tensor") for g in grads):
        return _clip_mixed(grads, max_norm)
    if max_norm > 0:
        return float(torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_norm))
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))


def _clip_mixed(grads: list[Tensor], max_norm: float) -> float:
    """`clip_grad_norm_` for a mix of sharded and replicated gradients (same rule: scale by
    ``min(1, max_norm / (norm + 1e-6))``)."""
    squares = []
    for g in grads:
        n = torch.linalg.vector_norm(g)
        full = getattr(n, "full_tensor", None)
        squares.append((full() if callable(full) else n).double() ** 2)
    norm = float(torch.stack(squares).sum().sqrt())
    if max_norm > 0:
        coef = min(1.0, max_norm / (norm + 1e-6))
        for g in grads:
            g.mul_(coef)
    return norm
