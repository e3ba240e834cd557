"""Pure torch math of agentrl: advantage estimators and PPO-family losses.

This package imports only torch (CONVENTIONS rule 1): no Lightning, no HTTP client, no LangChain.
"""

from agentrl.algorithms.advantages import (
    Advantages,
    grpo_advantages,
    masked_mean,
    masked_moments,
    masked_var,
    sibling_advantages,
    token_gae,
    turn_gae,
    whiten,
)
from agentrl.algorithms.correction import (
    CorrectionFn,
    ISWeights,
    masked_is,
    mismatch_kl,
    truncated_is,
    turn_masked_is,
)
from agentrl.algorithms.losses import (
    PolicyLoss,
    ValueLoss,
    clamp_log_ratio,
    clipped_value_loss,
    explained_variance,
    kl_k3,
    ppo_policy_loss,
    token_log_ratio,
    token_mean,
    turn_log_ratio,
    turn_mean,
)

__all__ = [
    "Advantages",
    "CorrectionFn",
    "ISWeights",
    "PolicyLoss",
    "ValueLoss",
    "clamp_log_ratio",
    "clipped_value_loss",
    "explained_variance",
    "grpo_advantages",
    "kl_k3",
    "masked_is",
    "masked_mean",
    "masked_moments",
    "masked_var",
    "mismatch_kl",
    "ppo_policy_loss",
    "sibling_advantages",
    "token_gae",
    "token_log_ratio",
    "token_mean",
    "truncated_is",
    "turn_gae",
    "turn_log_ratio",
    "turn_masked_is",
    "turn_mean",
    "whiten",
]
