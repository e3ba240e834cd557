"""Typed settings shared by the trainer and the schedules (CONVENTIONS rule 6: config is typed dataclasses,
validated in ``__post_init__`` with a message that names the field and the allowed range)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from agentrl.algorithms.correction import CorrectionFn, truncated_is
from agentrl.algorithms.losses import Aggregator, RatioFn, token_log_ratio, token_mean, turn_mean

# Aggregations the trainer can split exactly over micro-batches: the unit each one averages over.
AGGREGATION_UNITS: dict[Aggregator, str] = {turn_mean: "turn", token_mean: "token"}


def _check(cond: bool, field: str, expected: str, value: object) -> None:
    if not cond:
        raise ValueError(f"{field} must be {expected}, got {value!r}")


def _check_numbers(settings: object, prefix: str) -> None:
    """Every ``float``/``int`` field holds a number (a config can hand a dataclass the string 'inf' or 'fast'):
    the value checks then compare numbers, and a wrong type is named like a wrong value."""
    for f in fields(settings):  # type: ignore[arg-type]
        kind = str(f.type).replace(" | None", "")
        value = getattr(settings, f.name)
        if kind in ("float", "int") and value is not None:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            _check(ok and (kind == "float" or isinstance(value, int)), f"{prefix}.{f.name}",
                   "a number" if kind == "float" else "an integer", value)


@dataclass
class OptimSettings:
    """AdamW for the policy and the critic.

    Attributes:
        lr: Policy learning rate.
        critic_lr: Critic learning rate (Turn-PPO: 5–10× the policy's).
        weight_decay: Decoupled weight decay of both optimizers.
        beta1: Adam β1.
        beta2: Adam β2.
        max_grad_norm: Gradient-norm clip of the policy (0 disables).
        critic_max_grad_norm: Gradient-norm clip of the critic (0 disables).
        max_bad_updates: Stop with an error after this many non-finite updates in a row (each is skipped).
        fused: Run AdamW's fused kernel (one pass over each parameter, no temporaries) where PyTorch has one for
            the parameters (floating-point tensors on the CPU or a GPU, not sharded ``DTensor``s); ``false`` keeps
            PyTorch's default (a Python loop over the parameters on the CPU). On a CPU the fused step is several
            times faster and allocates nothing beyond AdamW's two moments (docs/algorithms/update.md).
    """

    lr: float = 1e-6
    critic_lr: float = 1e-5
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    max_grad_norm: float = 1.0
    critic_max_grad_norm: float = 1.0
    max_bad_updates: int = 3
    fused: bool = True

    def __post_init__(self) -> None:
        _check_numbers(self, "optim")
        _check(math.isfinite(self.lr) and self.lr > 0, "optim.lr", "a positive number", self.lr)
        _check(math.isfinite(self.critic_lr) and self.critic_lr > 0, "optim.critic_lr", "a positive number",
               self.critic_lr)
        _check(self.weight_decay >= 0, "optim.weight_decay", ">= 0", self.weight_decay)
        _check(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "optim.beta1/beta2", "in [0, 1)", (self.beta1, self.beta2))
        _check(math.isfinite(self.max_grad_norm) and self.max_grad_norm >= 0, "optim.max_grad_norm",
               "a finite number >= 0", self.max_grad_norm)
        _check(math.isfinite(self.critic_max_grad_norm) and self.critic_max_grad_norm >= 0,
               "optim.critic_max_grad_norm", "a finite number >= 0", self.critic_max_grad_norm)
        _check(self.max_bad_updates >= 1, "optim.max_bad_updates", ">= 1", self.max_bad_updates)


@dataclass
class PPOSettings:
    """The clipped-surrogate update.

    Attributes:
        clip_low: ε_low (ratio clipped below at 1 − ε_low).
        clip_high: ε_high (ratio clipped above at 1 + ε_high; > ε_low is "clip-higher").
        epochs: Passes over each rollout batch.
        minibatch_size: Rows (packed sequences) per optimizer step; None takes the whole batch in one step. A row
            is a whole episode where each turn's prompt extends the last (the full history) and one turn where it
            does not (``EnvAgent(history=1)``, a summary context), so the same size gives more optimizer steps per
            update on longer episodes there: ``minibatches`` fixes the count instead.
        minibatches: Split each update into this many minibatches of about equal rows (fewer if there are fewer
            rows), whatever a row is; exclusive with ``minibatch_size``. None: ``minibatch_size`` decides.
        log_ratio_clamp: Log-ratios are clamped to ± this before ``exp`` (RTPO: ±10).
        entropy_coef: Entropy bonus coefficient (0 disables; entropy is still logged).
        kl_coef: k3 KL penalty to the reference policy (needs LoRA: the frozen base is the reference).
        value_clip: Value-loss clip range around the rollout-time value; None disables.
        ratio: `agentrl.algorithms.token_log_ratio` (RTPO Eq. 5) or `agentrl.algorithms.turn_log_ratio`.
        aggregate: `agentrl.algorithms.turn_mean` (RTPO Eq. 6) or `agentrl.algorithms.token_mean`; null (the
            default) takes the schedule's own default (token-PPO: token mean; the others: turn mean), so setting
            another ``ppo`` key never changes the aggregation.
        recompute_old_logprobs: Recompute π_old with the trainer (one no-grad forward per row) before the first
            epoch of each update, instead of taking the engine's recorded log-probs. None (the default) turns it on
            whenever the engine is not the trainer's own fp32 code: a vLLM / ``agentrl serve`` engine, or bf16
            compute (see `agentrl.training.update.mismatch`).
        correction: How the gap between the engine's log-probs (behaviour) and the recomputed π_old is corrected
            per token: `agentrl.algorithms.truncated_is` (TIS, the default), `agentrl.algorithms.masked_is`
            (token MIS), `agentrl.algorithms.turn_masked_is` (turn MIS), or null (no correction). Applies only when
            π_old is recomputed.
        correction_cap: C of the correction: TIS weights are min(π_old/π_b, C); MIS keeps ratios in [1/C, C].
        target_kl: Stop the update (remaining minibatches and epochs) at the first minibatch whose approx_kl
            (current weights against π_old, over every rank) exceeds this, before its step; null never stops. The
            first minibatch of an update starts at ratio 1, so at least one step is always taken.
        lr_reference_samples: Scale the policy's learning rate for each optimizer step by ``min(1, n / this)``, n
            the informative samples of that step's minibatch (distinct trained turns whose advantage does not
            cancel, over every rank): the linear scaling rule below a reference batch, so a step resting on 3
            samples moves the weights 3/16 as far as one resting on 16, however the update is split into
            minibatches. Null: no scaling.
    """

    clip_low: float = 0.2
    clip_high: float = 0.28
    epochs: int = 1
    minibatch_size: int | None = None
    log_ratio_clamp: float = 10.0
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
    value_clip: float | None = 0.2
    ratio: RatioFn = token_log_ratio
    aggregate: Aggregator | None = None
    recompute_old_logprobs: bool | None = None
    correction: CorrectionFn | None = truncated_is
    correction_cap: float = 2.0
    target_kl: float | None = None
    lr_reference_samples: int | None = None
    minibatches: int | None = None

    def __post_init__(self) -> None:
        _check_numbers(self, "ppo")
        _check(0 <= self.clip_low < 1, "ppo.clip_low", "in [0, 1)", self.clip_low)
        _check(self.clip_high >= 0, "ppo.clip_high", ">= 0", self.clip_high)
        _check(self.epochs >= 1, "ppo.epochs", ">= 1", self.epochs)
        _check(self.minibatch_size is None or self.minibatch_size >= 1, "ppo.minibatch_size", ">= 1 or null",
               self.minibatch_size)
        _check(self.minibatches is None or self.minibatches >= 1, "ppo.minibatches", ">= 1 or null", self.minibatches)
        _check(self.minibatches is None or self.minibatch_size is None, "ppo.minibatches",
               "null when ppo.minibatch_size is set (set one of the two)", self.minibatches)
        _check(self.log_ratio_clamp > 0, "ppo.log_ratio_clamp", "> 0", self.log_ratio_clamp)
        _check(self.entropy_coef >= 0, "ppo.entropy_coef", ">= 0", self.entropy_coef)
        _check(self.kl_coef >= 0, "ppo.kl_coef", ">= 0", self.kl_coef)
        _check(self.value_clip is None or self.value_clip > 0, "ppo.value_clip", "> 0 or null", self.value_clip)
        _check(self.aggregate is None or self.aggregate in AGGREGATION_UNITS, "ppo.aggregate",
               "agentrl.algorithms.turn_mean, agentrl.algorithms.token_mean or null", self.aggregate)
        _check(math.isfinite(self.correction_cap) and self.correction_cap >= 1, "ppo.correction_cap",
               "a finite number >= 1", self.correction_cap)
        _check(self.target_kl is None or (math.isfinite(self.target_kl) and self.target_kl > 0), "ppo.target_kl",
               "a finite number > 0 or null", self.target_kl)
        _check(self.lr_reference_samples is None or self.lr_reference_samples >= 1, "ppo.lr_reference_samples",
               ">= 1 or null", self.lr_reference_samples)

    def with_default_aggregate(self, aggregate: Aggregator) -> PPOSettings:
        """These settings with ``aggregate`` filled in when it was left null (an explicit value wins)."""
        return self if self.aggregate is not None else replace(self, aggregate=aggregate)

    @property
    def aggregator(self) -> Aggregator:
        """The aggregation in use (turn mean when none was resolved)."""
        return self.aggregate or turn_mean

    @property
    def units(self) -> str:
        return AGGREGATION_UNITS[self.aggregator]


@dataclass
class CriticSettings:
    """The turn-level critic.

    Attributes:
        shared_backbone: Put the value head on the policy's backbone instead of a copy of it.
        vf_coef: Weight of the value loss in the joint backward pass.
    """

    shared_backbone: bool = False
    vf_coef: float = 1.0

    def __post_init__(self) -> None:
        _check_numbers(self, "critic")
        _check(self.vf_coef > 0, "critic.vf_coef", "> 0", self.vf_coef)
