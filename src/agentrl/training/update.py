"""`PPOUpdate`: PPO epochs × minibatches over selected turns, from targets to optimizer steps.

One call (`PPOUpdate.run`) is one update of a schedule's turns:

1. the turns become rows (`RowPlan.rows`); if no rank has any, nothing happens (counted as a skipped update);
2. π_old is recomputed and the behaviour correction attached when the caller passes a scorer
   (`agentrl.training.mismatch.with_old_logprobs`);
3. for each epoch, a fresh minibatch order (seeded by the step and the tag); for each minibatch, the unit counts
   (summed over ranks: see `agentrl.training.objective`), then the micro-batches' losses, each backpropagated
   through the caller's ``backward`` (Lightning's ``manual_backward``), then one optimizer step
   (`_step_optimizers`): gradients summed over ranks, clipped, checked for non-finite values, stepped.

It takes what it needs as values and functions — the policy and critic, the plan, the optimizers, the backward and
the π_old scorer — and knows nothing of Lightning modules, engines or schedules.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from agentrl.models.critic import TurnCritic
from agentrl.models.policy import Policy
from agentrl.seeding import derive_seed
from agentrl.training import distributed, sharding
from agentrl.training.batching import Row, TurnKey, TurnTargets, token_counts
from agentrl.training.mismatch import Scorer, with_old_logprobs
from agentrl.training.objective import aggregation_divisor, has_signal, minibatch_units, ppo_objective, value_units
from agentrl.training.rowplan import RowPlan
from agentrl.training.settings import CriticSettings, OptimSettings, PPOSettings
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
    """

    def __init__(self, policy: Policy, critic: TurnCritic | None, optim: OptimSettings,
                 critic_settings: CriticSettings, seed: int) -> None:
        self.policy = policy
        self.critic = critic
        self.optim = optim
        self.critic_settings = critic_settings
        self.seed = seed
        self.bad_updates = 0  # non-finite updates in a row
        self._costs: defaultdict[str, float] = defaultdict(float)

    def build_optimizers(self) -> list[torch.optim.Optimizer]:
        """AdamW for the policy's trainable parameters and, with a critic, a second one at the critic's rate."""
        o = self.optim
        opts: list[torch.optim.Optimizer] = [torch.optim.AdamW(
            self.policy.trainable_parameters(), lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay)]
        if self.critic is not None:
            opts.append(torch.optim.AdamW(self.critic.trainable_parameters(), lr=o.critic_lr,
                                          betas=(o.beta1, o.beta2), weight_decay=o.weight_decay))
        return opts

    def take_costs(self) -> dict[str, float]:
        """Token and time counters of the updates since the last call (and reset them)."""
        costs, self._costs = dict(self._costs), defaultdict(float)
        return costs

    def run(self, trajectories: Sequence[Trajectory], targets: dict[TurnKey, TurnTargets], ppo: PPOSettings, *,
            plan: RowPlan, optimizers: list[Any], backward: Callable[[Tensor], None], score_old: Scorer | None,
            temperature: float, step: int, tag: str = "") -> dict[str, float]:
        """One update; returns the ``train/*`` metrics averaged over its optimizer steps (``train/skipped_updates``
        summed) and the behaviour-correction metrics. Every rank must call it, with or without turns."""
        rows = plan.rows(trajectories, targets)
        most_rows = distributed.sync_max(len(rows), plan.device)
        if most_rows == 0:
            return {"train/skipped_updates": 1.0}
        rows, behaviour_stats = with_old_logprobs(trajectories, rows, ppo, score_old)
        packed, unpacked = token_counts(rows)
        self._costs["packed_tokens"] += packed
        self._costs["unpacked_tokens"] += unpacked
        gen = torch.Generator().manual_seed(derive_seed(self.seed, step, "minibatches", tag))
        size = ppo.minibatch_size or max(len(rows), 1)
        n_minibatches = 1 if ppo.minibatch_size is None else -(-most_rows // size)
        totals: dict[str, float] = defaultdict(float)
        start = time.perf_counter()
        for _ in range(ppo.epochs):
            order = torch.randperm(len(rows), generator=gen).tolist()
            for m in range(n_minibatches):
                minibatch = [rows[i] for i in order[m * size : (m + 1) * size]]
                stats = self._minibatch(minibatch, ppo, plan, optimizers, backward, temperature)
                for k, v in stats.items():
                    totals[k] += v
        self._costs["train_seconds"] += time.perf_counter() - start
        steps = ppo.epochs * n_minibatches
        out = {k: v / steps for k, v in totals.items()}
        out["train/skipped_updates"] = totals.get("train/skipped_updates", 0.0)
        return out | behaviour_stats

    def _minibatch(self, rows: list[Row], ppo: PPOSettings, plan: RowPlan, opts: list[Any],
                   backward: Callable[[Tensor], None], temperature: float) -> dict[str, float]:
        local = torch.tensor([minibatch_units(rows, ppo), value_units(rows), float(has_signal(rows, ppo))],
                             dtype=torch.float64)
        units, v_units, signal = distributed.sum_tensor(local, plan.device).tolist()
        if signal == 0:  # no rank has a gradient signal: an AdamW step would still move the weights
            return {"train/skipped_updates": 1.0}
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        stats: dict[str, float] = defaultdict(float)
        for micro in plan.micro_batches(rows):
            batch = plan.batch(micro)
            share = aggregation_divisor(micro, ppo) / max(units, 1e-12)
            loss, micro_stats = ppo_objective(self.policy, self.critic, batch, ppo, temperature=temperature,
                                              vf_coef=self.critic_settings.vf_coef, share=share,
                                              value_units=v_units, lockstep=plan.lockstep)
            backward(loss)
            for k, v in micro_stats.items():
                stats[k] += v * share
            self._costs["train_tokens"] += float(batch.attention_mask.sum())
            self._costs["scored_tokens"] += float(batch.response_mask.sum())
        return self._step_optimizers(opts, stats, plan)

    def _step_optimizers(self, opts: list[Any], stats: dict[str, float], plan: RowPlan) -> dict[str, float]:
        """Sum gradients over the ranks, clip them, guard against non-finite updates, step the optimizers."""
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
        for opt in opts:
            opt.step()
        return dict(stats)


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
