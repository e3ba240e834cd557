"""The behaviour policy is not the trainer: recompute π_old, correct the gap, and measure it.

PPO's ratio is π_θ / π_old, where π_old is the policy that the update starts from. The engine's recorded log-probs
are π_old only when the engine runs the trainer's own fp32 code on the same weights (the embedded `HFEngine` in
fp32: agreement about 1e-5). A vLLM server samples in bf16 with its own kernels, ``agentrl serve`` decodes with a
KV cache, and bf16 autocast changes the numbers on either side; the recorded log-probs are then those of a
*behaviour* policy π_b ≠ π_old. So, before the first epoch of an update:

1. **Recompute π_old** (`recompute_on` decides; `needs_old_logprobs` always for turns sampled by older weights,
   ``data.max_staleness`` >= 1): one no-grad forward per row, packed exactly like the update's rows
   (the trainer's scorer, `AgentRLModule.logprobs`, scores the same turns with the same packing and temperature);
   the update's ratio then starts at 1 up to the nondeterminism of the trainer's own kernels.
2. **Correct π_old ≠ π_b** per token with ``ppo.correction`` (`agentrl.algorithms.correction`: TIS by default,
   token or turn MIS), weights multiplied into the per-token policy loss.
3. **Measure** (``rollout/*``, over the trained turns' sampled tokens): ``logprob_mismatch_kl`` (k3 estimate of
   KL(π_b ‖ π_old)), ``logprob_max_abs_diff`` (max |log π_old − log π_b|), ``is_corrected_frac`` (tokens the
   correction truncated or masked), ``is_weight_mean`` and ``recomputed_tokens`` (the count these are over; on
   several ranks the means are weighted by it and the maximum is the maximum over the ranks).

Forced turns (RTPO's replayed prefixes) and context-only turns are not trained and so neither recomputed nor
corrected. RTPO's off-policy-continuation ablation keeps its own downstream weight in ``TurnTargets.weight``; the
correction multiplies it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from agentrl.algorithms.correction import mismatch_kl
from agentrl.training.update.batching import Row, TurnKey
from agentrl.training.update.settings import PPOSettings
from agentrl.types import Trajectory

if TYPE_CHECKING:
    from agentrl.engines.specs import EngineSpec
    from agentrl.models.policy import Policy

Scorer = Callable[[Sequence[Trajectory], Iterable[TurnKey]], dict[TurnKey, list[float]]]


def engine_is_trainer(engine_spec: EngineSpec, policy: Policy) -> bool:
    """Whether the engine runs the trainer's own fp32 code on its weights (the recorded log-probs are π_old):
    an engine spec that says so (``shares_trainer_code``, the embedded HF engine, on the policy's modules or an
    exact copy of them), fp32 weights, fp32 compute, and an engine decoding in fp32 (``decode_dtype_for``, where
    the spec tells: a bf16 weight copy is not the trainer's code; bf16 also rounds differently in a KV-cached
    decode than in the update's full forward)."""
    fp32_weights = all(p.dtype == torch.float32 for p in policy.model.parameters() if p.is_floating_point())
    decode_dtype = getattr(engine_spec, "decode_dtype_for", None)
    fp32_decode = decode_dtype is None or decode_dtype(policy) == torch.float32
    return (bool(getattr(engine_spec, "shares_trainer_code", False)) and fp32_weights and fp32_decode
            and policy.compute_dtype == torch.float32)


def recompute_on(ppo: PPOSettings, engine_spec: EngineSpec, policy: Policy) -> bool:
    """``ppo.recompute_old_logprobs``, or, when null, whether the engine differs from the trainer."""
    if ppo.recompute_old_logprobs is not None:
        return ppo.recompute_old_logprobs
    return not engine_is_trainer(engine_spec, policy)


def needs_old_logprobs(ppo: PPOSettings, engine_spec: EngineSpec, policy: Policy, trajectories: Sequence[Trajectory],
                       version: int) -> bool:
    """Whether an update recomputes π_old: `recompute_on`, or always when a sampled turn of ``trajectories`` was
    sampled by weights other than ``version`` (bounded-staleness collection): the engine's log-probs are then
    another policy's, even when the engine runs the trainer's own code."""
    stale = any(t.policy_version != version for tr in trajectories for t in tr.turns if not t.forced)
    return stale or recompute_on(ppo, engine_spec, policy)


def trained_keys(rows: Sequence[Row]) -> list[TurnKey]:
    """Keys of the turns of ``rows`` that have response tokens (the ones the update trains)."""
    return [key for r in rows for key, turn, _ in r.turns if turn.response_ids]


def with_old_logprobs(trajectories: Sequence[Trajectory], rows: list[Row], ppo: PPOSettings,
                      score: Scorer | None) -> tuple[list[Row], dict[str, float]]:
    """``rows`` with π_old recomputed by ``score`` (None: keep the recorded log-probs) and the correction
    weights in their targets, and the mismatch metrics. A target whose ``old_logprobs`` are already set keeps them
    as π_old (they are corrected against the behaviour log-probs all the same).

    Every rank must call it when ``score`` is given (scoring is collective under sharded weights).
    """
    preset = {key: tgt.old_logprobs for r in rows for key, _, tgt in r.turns if tgt.old_logprobs is not None}
    if score is None and not preset:
        return rows, {}
    recomputed = dict(preset)  # π_old a schedule fixed itself (RTPO's off-policy ablation: the sampling weights)
    if score is not None:
        recomputed |= score(trajectories, [key for key in trained_keys(rows) if key not in preset])
    old_all: list[float] = []
    beh_all: list[float] = []
    weights: list[float] = []
    corrected: list[bool] = []
    out: list[Row] = []
    for row in rows:
        turns = []
        for key, turn, tgt in row.turns:
            if not turn.response_ids:
                turns.append((key, turn, tgt))
                continue
            old = recomputed[key]
            old_all += old
            beh_all += turn.logprobs
            w = None
            if ppo.correction is not None:  # one turn per call: turn MIS decides per turn
                log_ratio = torch.tensor(old, dtype=torch.float64) - torch.tensor(turn.logprobs, dtype=torch.float64)
                is_w = ppo.correction(log_ratio[None], torch.ones(1, len(old), dtype=torch.bool), None,
                                      ppo.correction_cap)
                w = is_w.weights[0].tolist()
                weights += w
                corrected += is_w.corrected[0].tolist()
            turns.append((key, turn, replace(tgt, old_logprobs=old, token_weights=w)))
        out.append(Row(row.ids, turns))
    return out, _metrics(old_all, beh_all, weights, corrected)


def _metrics(old: list[float], behaviour: list[float], weights: list[float],
             corrected: list[bool]) -> dict[str, float]:
    if not old:
        return {}
    o = torch.tensor(old, dtype=torch.float64)[None]
    b = torch.tensor(behaviour, dtype=torch.float64)[None]
    metrics = {"rollout/logprob_mismatch_kl": float(mismatch_kl(o, b, torch.ones_like(o, dtype=torch.bool))),
               "rollout/logprob_max_abs_diff": float((o - b).abs().max()),
               "rollout/recomputed_tokens": float(len(old))}
    if weights:
        metrics["rollout/is_corrected_frac"] = sum(corrected) / len(corrected)
        metrics["rollout/is_weight_mean"] = sum(weights) / len(weights)
    return metrics
