"""The loss of one micro-batch: PPO's clipped surrogate, the entropy bonus, the k3 KL to the frozen base, and the
critic's clipped value loss — each scaled by the micro-batch's share of the minibatch's units, so that summing
micro-batch gradients gives the minibatch's gradient exactly (the micro-batch budget is a memory knob).

**Units.** An aggregation divides by its units: turns (``turn_mean``) or tokens (``token_mean``). A turn may count
for less than one unit (`TurnTargets.unit`, e.g. GRPO's trajectory weighting gives each of a trajectory's T turns
1/T), so the minibatch's units are ``Σ unit`` (turns) or ``Σ unit · tokens`` (tokens), while a micro-batch's
aggregation divides by its plain count (`aggregation_divisor`); the micro-batch's share is count / units. Summed
over micro-batches — and over ranks, with the units summed over ranks too — this is exactly one process's update.
The entropy bonus and the KL penalty are weighted by the same units (``TurnBatch.units``), so they act at their
configured strength whatever the turns per trajectory.

**Statistics** come back as shares that sum to the minibatch's value: the policy loss, entropy and KL to the
reference by the unit share (unit-weighted means, the loss's own scale); ``approx_kl`` and ``clipfrac``, which are
token means, by the micro-batch's share of the minibatch's response tokens.

**Signal** (`fold_identical`, `MinibatchCounts`): identical turns (same context, same reply) are one sample to the
gradient, so each takes its fold's mean advantage (over the whole update) before anyone asks whether a minibatch has
a signal (an optimizer step on cancelled advantages would be momentum and weight decay only). The policy's optimizer
steps only with a non-cancelled advantage (or an entropy/KL term), the critic's only with value targets.

Pure of Lightning: the update (`agentrl.training.update.ppo`) calls `ppo_objective` for each micro-batch and does the
backward itself.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple

import torch
from torch import Tensor

from agentrl.algorithms.losses import clipped_value_loss, kl_k3, ppo_policy_loss
from agentrl.models.critic import TurnCritic
from agentrl.models.policy import Policy
from agentrl.training.update.batching import Row
from agentrl.training.update.settings import PPOSettings
from agentrl.types import Turn, TurnBatch

CANCELLED = 1e-9  # a folded advantage this small against the largest folded into it counts as cancelled


class Shares(NamedTuple):
    """A micro-batch's part of its minibatch: of the loss's units, of the response tokens, and the minibatch's
    value targets (the value loss is a mean over them)."""

    units: float
    tokens: float
    value_units: float


def ppo_objective(
    policy: Policy, critic: TurnCritic | None, batch: TurnBatch, ppo: PPOSettings, *, temperature: float,
    vf_coef: float, shares: Shares, lockstep: bool = False, policy_terms: bool = True,
) -> tuple[Tensor, dict[str, float]]:
    """Loss of ``batch`` (to backpropagate) and its statistics (``train/*``, as shares: see the module docstring).

    Args:
        shares: This micro-batch's part of the minibatch (`Shares`).
        lockstep: Run the critic even without value targets here (sharded weights: every rank runs the same
            forwards and backwards, see `agentrl.training.update.sharding`).
        policy_terms: False when the policy has no signal in the whole minibatch (a critic-only update such as
            the value warm-up): with a critic of its own backbone, the policy's forward is skipped altogether.
    """
    if not policy_terms and critic is not None and critic.backbone is not None and not lockstep:
        return _value_objective(critic, batch, ppo, vf_coef, shares, critic.hidden_states(
            batch.input_ids, batch.attention_mask, batch.branch))
    hidden = policy.hidden_states(batch.input_ids, batch.attention_mask, batch.branch)
    lp = policy.logprobs_from_hidden(hidden, batch.input_ids, batch.response_mask, temperature=temperature,
                                     with_entropy=True, entropy_grad=ppo.entropy_coef > 0,
                                     attention_mask=batch.attention_mask, branch=batch.branch)
    pl_out = ppo_policy_loss(
        lp.logprobs, batch.old_logprobs, batch.advantages, batch.response_mask, clip_low=ppo.clip_low,
        clip_high=ppo.clip_high, turn_ids=batch.turn_ids, ratio=ppo.ratio, aggregate=ppo.aggregator,
        log_ratio_clamp=ppo.log_ratio_clamp, weights=batch.weights,
    )
    assert lp.entropy is not None
    share = shares.units
    entropy = ppo.aggregator(lp.entropy * batch.units, batch.response_mask, batch.turn_ids)
    loss = (pl_out.loss - ppo.entropy_coef * entropy) * share
    stats = {"train/policy_loss": pl_out.loss.item() * share, "train/entropy": entropy.item() * share,
             "train/approx_kl": pl_out.approx_kl.item() * shares.tokens,
             "train/clipfrac": pl_out.clipfrac.item() * shares.tokens}
    if ppo.kl_coef > 0:
        with torch.no_grad(), policy.adapter_disabled():
            ref = policy.logprobs_from_hidden(
                policy.hidden_states(batch.input_ids, batch.attention_mask, batch.branch), batch.input_ids,
                batch.response_mask, temperature=temperature, attention_mask=batch.attention_mask,
                branch=batch.branch).logprobs
        kl = ppo.aggregator(kl_k3(lp.logprobs, ref) * batch.units, batch.response_mask, batch.turn_ids)
        loss = loss + ppo.kl_coef * kl * share
        stats["train/kl_ref"] = kl.item() * share
    if critic is not None and (lockstep or bool(batch.value_mask.any())):
        critic_hidden = hidden if critic.backbone is None else critic.hidden_states(
            batch.input_ids, batch.attention_mask, batch.branch)
        value_loss, value_stats = _value_objective(critic, batch, ppo, vf_coef, shares, critic_hidden)
        loss = loss + value_loss
        stats |= value_stats
    return loss, stats


def _value_objective(critic: TurnCritic, batch: TurnBatch, ppo: PPOSettings, vf_coef: float, shares: Shares,
                     hidden: Tensor) -> tuple[Tensor, dict[str, float]]:
    """The critic's clipped value loss of ``batch`` from its hidden states, scaled by the micro-batch's share of
    the minibatch's value targets, and its statistics."""
    values = critic.values_from_hidden(hidden, batch.attention_mask, batch.branch)
    vl = clipped_value_loss(values, batch.old_values, batch.returns, batch.value_mask, clip=ppo.value_clip)
    v_share = float(batch.value_mask.sum()) / max(shares.value_units, 1)
    stats = {}
    if v_share > 0:
        stats = {"train/value_loss": vl.loss.item() * v_share, "train/value_clipfrac": float(vl.clipfrac) * v_share}
    return vf_coef * vl.loss * v_share, stats


def minibatch_units(rows: Sequence[Row], ppo: PPOSettings) -> float:
    """What the minibatch's loss is a mean over: ``Σ unit`` over trained turns, or ``Σ unit · tokens``."""
    if ppo.units == "turn":
        return sum(tgt.unit for r in rows for _, t, tgt in r.turns if t.response_ids)
    return sum(tgt.unit * len(t.response_ids) for r in rows for _, t, tgt in r.turns)


def aggregation_divisor(rows: Sequence[Row], ppo: PPOSettings) -> float:
    """What ``ppo.aggregate`` divides a micro-batch's loss by: its trained turns or tokens."""
    if ppo.units == "turn":
        return float(sum(1 for r in rows for _, t, _ in r.turns if t.response_ids))
    return float(sum(len(t.response_ids) for r in rows for _, t, _ in r.turns))


def value_units(rows: Sequence[Row]) -> float:
    """Value targets in ``rows``: one per turn (turn critic) or one per response token (token critic)."""
    return float(sum(len(t.response_ids) if tgt.per_token_values else 1
                     for r in rows for _, t, tgt in r.turns if tgt.returns is not None and t.response_ids))


def response_tokens(rows: Sequence[Row]) -> float:
    """Trained response tokens in ``rows``."""
    return float(sum(len(t.response_ids) for r in rows for _, t, _ in r.turns))


def _fold_key(turn: Turn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return tuple(turn.prompt_ids), tuple(turn.response_ids)


def fold_identical(rows: Sequence[Row]) -> list[Row]:
    """``rows`` with every trained turn's advantage replaced by the mean over its *fold*: the turns with the same
    context and the same reply, weighted by ``unit · weight`` (per token for per-token advantages). At ratio 1 the
    gradient is unchanged — the fold's terms sum to the same — but a fold whose advantages cancel (below
    `CANCELLED` × its largest term) gets exactly 0, whichever minibatches its members fall into, so no minibatch
    steps on half of a cancelled pair."""
    sums: dict[tuple[tuple[int, ...], tuple[int, ...]], list[float]] = {}
    mass: defaultdict[tuple[tuple[int, ...], tuple[int, ...]], float] = defaultdict(float)
    largest: defaultdict[tuple[tuple[int, ...], tuple[int, ...]], float] = defaultdict(float)
    for r in rows:
        for _, t, tgt in r.turns:
            if not t.response_ids:
                continue
            key, w = _fold_key(t), tgt.unit * tgt.weight
            adv = tgt.advantage if isinstance(tgt.advantage, list) else [tgt.advantage] * len(t.response_ids)
            acc = sums.setdefault(key, [0.0] * len(adv))
            sums[key] = [x + a * w for x, a in zip(acc, adv, strict=True)]
            mass[key] += w
            largest[key] = max(largest[key], *(abs(a * w) for a in adv))
    means: dict[tuple[tuple[int, ...], tuple[int, ...]], list[float]] = {}
    for key, acc in sums.items():
        cancelled = largest[key] == 0 or max(abs(x) for x in acc) <= CANCELLED * largest[key]
        means[key] = [0.0] * len(acc) if cancelled or mass[key] == 0 else [x / mass[key] for x in acc]
    out = []
    for r in rows:
        turns = []
        for k, t, tgt in r.turns:
            folded = tgt
            if t.response_ids:
                mean = means[_fold_key(t)]
                folded = replace(tgt, advantage=mean if isinstance(tgt.advantage, list) else mean[0])
            turns.append((k, t, folded))
        out.append(Row(r.ids, turns))
    return out


def informative_samples(rows: Sequence[Row]) -> int:
    """Distinct trained samples (context and reply) with a non-zero advantage; after `fold_identical`, a
    cancelled fold counts as none."""
    keys = set()
    for r in rows:
        for _, t, tgt in r.turns:
            adv = tgt.advantage if isinstance(tgt.advantage, list) else [tgt.advantage]
            if t.response_ids and any(a != 0.0 for a in adv):
                keys.add(_fold_key(t))
    return len(keys)


class MinibatchCounts(NamedTuple):
    """A minibatch's counts, summed over the ranks before the update uses them (`as_tensor`, `of`)."""

    units: float
    value_units: float
    tokens: float
    informative: float

    @classmethod
    def local(cls, rows: Sequence[Row], ppo: PPOSettings) -> MinibatchCounts:
        return cls(minibatch_units(rows, ppo), value_units(rows), response_tokens(rows),
                   float(informative_samples(rows)))

    def as_tensor(self) -> Tensor:
        return torch.tensor(list(self), dtype=torch.float64)

    @classmethod
    def of(cls, summed: Tensor) -> MinibatchCounts:
        return cls(*summed.tolist())

    def policy_signal(self, ppo: PPOSettings) -> bool:
        """Whether the policy has a gradient: a non-cancelled advantage, or an entropy/KL term on some token."""
        return self.informative > 0 or ((ppo.entropy_coef > 0 or ppo.kl_coef > 0) and self.tokens > 0)

    def shares(self, micro: Sequence[Row], ppo: PPOSettings) -> Shares:
        """``micro``'s `Shares` of this minibatch."""
        return Shares(aggregation_divisor(micro, ppo) / max(self.units, 1e-12),
                      response_tokens(micro) / max(self.tokens, 1.0), self.value_units)
