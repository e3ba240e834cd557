"""Performance accounting: measured peak matmul throughput and the FLOPs of an update (for ``perf/mfu``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from agentrl.models.memory import PeakRise, resident_mib

if TYPE_CHECKING:
    from agentrl.models.critic import TurnCritic
    from agentrl.models.policy import Policy


def measure_peak_flops(device: torch.device, dtype: torch.dtype = torch.float32, n: int = 2048, reps: int = 3) -> float:
    """Best-of-``reps`` FLOP/s of an n×n×n matmul on ``device`` in ``dtype``: the denominator of MFU, measured on
    the machine the run uses."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(reps + 1):  # the first is a warm-up
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        (a @ b).sum().item()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def _params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def train_flops(policy: Policy, critic: TurnCritic | None, tokens: float, scored_tokens: float) -> float:
    """FLOPs of forward + backward over ``tokens``: 6 per non-embedding backbone parameter per token (4 when the
    weights are frozen under LoRA; the adapters themselves are negligible), plus the
    LM head, which the trainer applies only to ``scored_tokens``, plus the critic's separate backbone if any.
    Attention's sequence-quadratic term is left out (the usual 6N approximation; small at these lengths)."""
    backbone = _params(policy.backbone) - policy.backbone.get_input_embeddings().weight.numel()  # lookups: no FLOPs
    head = policy.lm_head.weight.numel()
    # frozen weights (LoRA) need no weight gradient: forward 2 + input-gradient 2 FLOPs per parameter and token
    per_param = 4.0 if getattr(policy, "uses_lora", False) else 6.0
    flops = per_param * backbone * tokens + per_param * head * scored_tokens
    if critic is not None and critic.backbone is not None:
        flops += 6.0 * (_params(critic.backbone) - critic.backbone.get_input_embeddings().weight.numel()) * tokens  # type: ignore[operator]
    return flops


def update_mfu(policy: Policy, critic: TurnCritic | None, costs: Mapping[str, float], train_seconds: float,
               peak_flops: float | None) -> float | None:
    """MFU of a step's update: its FLOPs (`train_flops`) / seconds / peak (None without a peak)."""
    if not peak_flops:
        return None
    return train_flops(policy, critic, costs["train_tokens"], costs["scored_tokens"]) / train_seconds / peak_flops


STEP_PHASES = ("collecting", "scoring", "updating", "between")  # the phases a training step charges


def peak_rise_metrics(account: PeakRise, *, evaluation: bool = False) -> dict[str, float]:
    """What each phase raised the process's peak RSS by since it was last logged (`PeakRise`), MiB:
    ``perf/<phase>_peak_rise_mib`` for a training step's phases (``between``: outside any phase — the weight push,
    the memory hand-offs around the update, a checkpoint), ``eval/peak_rise_mib`` and the peak after it
    (``eval/peak_rss_mib``) for an evaluation. Nothing without procfs."""
    memory = resident_mib()
    if memory is None:
        return {}
    if evaluation:
        return {"eval/peak_rise_mib": account.take("evaluating")["evaluating"], "eval/peak_rss_mib": memory[1]}
    return {f"perf/{phase}_peak_rise_mib": mib for phase, mib in account.take(*STEP_PHASES).items()}


def step_perf_metrics(stats: Mapping[str, float], seconds: float, policy_version: int, *,
                      mfu: Callable[[float], float | None]) -> dict[str, float]:
    """``perf/*`` (and ``rollout/failed``) of one step from its accumulated counters."""
    out = {"perf/step_seconds": seconds, "perf/generated_tokens": stats["generated_tokens"],
           "perf/policy_version": float(policy_version)}
    if seconds > 0:  # the share of the step's wall time the trainer blocked on rollouts / the engine had none
        out["perf/trainer_wait_frac"] = min(stats["trainer_wait_seconds"] / seconds, 1.0)
        out["perf/engine_idle_frac"] = max(1.0 - stats["engine_busy_seconds"] / seconds, 0.0)
    if stats["rollout_seconds"] > 0:
        out["perf/rollout_tokens_per_s"] = stats["generated_tokens"] / stats["rollout_seconds"]
    if stats["train_seconds"] > 0:
        out["perf/train_tokens_per_s"] = stats["train_tokens"] / stats["train_seconds"]
        value = mfu(stats["train_seconds"])
        if value is not None:
            out["perf/mfu"] = value
    if stats["unpacked_tokens"] > 0:
        out["perf/packing_saving"] = 1.0 - stats["packed_tokens"] / stats["unpacked_tokens"]
    if stats["episodes"] > 0:
        out["rollout/failed"] = stats["failed"] / stats["episodes"]
    if stats["engine_pushes"] > 0:
        out["perf/engine_push_s"] = stats["engine_push_seconds"] / stats["engine_pushes"]
    if "engine_weights_bytes" in stats:
        out["perf/engine_weights_mib"] = stats["engine_weights_bytes"] / 2**20
    if "engine_released_bytes" in stats:  # the copy's storage freed for the step's updates (the most), 0 if kept
        out["perf/engine_released_mib"] = stats["engine_released_bytes"] / 2**20
    memory = resident_mib()
    if memory is not None:  # where a long run's memory goes: the resident set after each step, and its peak so far
        out["perf/rss_mib"], out["perf/peak_rss_mib"] = memory
    return out
