"""The loss of one micro-batch: PPO's clipped surrogate, the entropy bonus, the k3 KL to the frozen base, and the
critic's clipped value loss — each scaled by the micro-batch's share of the minibatch's units, so that summing
micro-batch gradients gives the minibatch's gradient exactly (the micro-batch budget is a memory knob).

**Units.** An aggregation divides by its units: turns (``turn_mean``) or tokens (``token_mean``). A turn may count
for less than one unit (`TurnTargets.unit`, e.g. GRPO's trajectory weighting gives each of a trajectory's T turns
1/T), so the minibatch's units are ``Σ unit`` (turns) or ``Σ unit · tokens`` (tokens), while a micro-batch's
aggregation divides by its plain count (`aggregation_divisor`); the micro-batch's share is count / units. Summed
over micro-batches — and over ranks, with the units summed over ranks too — this is exactly one process's update.

Pure of Lightning: the update (`agentrl.training.update`) calls `ppo_objective` for each micro-batch and does the
backward itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from agentrl.algorithms.losses import clipped_value_loss, kl_k3, ppo_policy_loss
from agentrl.models.critic import TurnCritic
from agentrl.models.policy import Policy
from agentrl.training.batching import Row
from agentrl.training.settings import PPOSettings
from agentrl.types import TurnBatch


def ppo_objective(
    policy: Policy, critic: TurnCritic | None, batch: TurnBatch, ppo: PPOSettings, *, temperature: float,
    vf_coef: float, share: float, value_units: float, lockstep: bool = False,
) -> tuple[Tensor, dict[str, float]]:
    """Loss of ``batch`` (to backpropagate) and its statistics (``train/*``, unscaled).

    Args:
        share: This micro-batch's units (turns or tokens, per ``ppo.aggregate``) over the minibatch's.
        value_units: Value targets in the whole minibatch (the value loss is a mean over them).
        lockstep: Run the critic even without value targets here (sharded weights: every rank runs the same
            forwards and backwards, see `agentrl.training.sharding`).
    """
    hidden = policy.hidden_states(batch.input_ids, batch.attention_mask)
    lp = policy.logprobs_from_hidden(hidden, batch.input_ids, batch.response_mask, temperature=temperature,
                                     with_entropy=True, entropy_grad=ppo.entropy_coef > 0)
    pl_out = ppo_policy_loss(
        lp.logprobs, batch.old_logprobs, batch.advantages, batch.response_mask, clip_low=ppo.clip_low,
        clip_high=ppo.clip_high, turn_ids=batch.turn_ids, ratio=ppo.ratio, aggregate=ppo.aggregator,
        log_ratio_clamp=ppo.log_ratio_clamp, weights=batch.weights,
    )
    assert lp.entropy is not None
    entropy = ppo.aggregator(lp.entropy, batch.response_mask, batch.turn_ids)
    loss = (pl_out.loss - ppo.entropy_coef * entropy) * share
    stats = {"train/policy_loss": pl_out.loss.item(), "train/approx_kl": pl_out.approx_kl.item(),
             "train/clipfrac": pl_out.clipfrac.item(), "train/entropy": entropy.item()}
    if ppo.kl_coef > 0:
        with torch.no_grad(), policy.adapter_disabled():
            ref = policy.logprobs_from_hidden(policy.hidden_states(batch.input_ids, batch.attention_mask),
                                              batch.input_ids, batch.response_mask, temperature=temperature).logprobs
        kl = ppo.aggregator(kl_k3(lp.logprobs, ref), batch.response_mask, batch.turn_ids)
        loss = loss + ppo.kl_coef * kl * share
        stats["train/kl_ref"] = kl.item()
    if critic is not None and (lockstep or bool(batch.value_mask.any())):
        critic_hidden = hidden if critic.backbone is None else critic.hidden_states(batch.input_ids,
                                                                                    batch.attention_mask)
        values = critic.values_from_hidden(critic_hidden)
        vl = clipped_value_loss(values, batch.old_values, batch.returns, batch.value_mask, clip=ppo.value_clip)
        v_share = float(batch.value_mask.sum()) / max(value_units, 1)
        loss = loss + vf_coef * vl.loss * v_share
        if v_share > 0:
            stats["train/value_loss"] = vl.loss.item() * v_share / share
            stats["train/value_clipfrac"] = float(vl.clipfrac) * v_share / share
    return loss, stats


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


def has_signal(rows: Sequence[Row], ppo: PPOSettings) -> bool:
    """Whether ``rows`` give any gradient: a non-zero advantage, a value target, or an entropy/KL term."""
    if ppo.entropy_coef > 0 or ppo.kl_coef > 0:
        return any(t.response_ids for r in rows for _, t, _ in r.turns)
    for r in rows:
        for _, t, tgt in r.turns:
            if not t.response_ids:
                continue
            if tgt.returns is not None:
                return True
            adv = tgt.advantage if isinstance(tgt.advantage, list) else [tgt.advantage]
            if any(a != 0.0 for a in adv):
                return True
    return False
