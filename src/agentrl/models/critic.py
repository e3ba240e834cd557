"""The turn-level critic V(s_n) of Turn-PPO: a backbone and a scalar head.

V(s_n) is the *pre-action* value of turn n: it is read from the hidden state of the last prompt token of the
turn, i.e. after the model has seen the whole context c_n and before it emits any response token (as RAGEN's
bi-level GAE and the third-party Turn-PPO read values; see docs/algorithms/turn_ppo.md). Following the
`TurnBatch` alignment, ``values[:, t]`` comes from the hidden state at ``t − 1``, so a turn's value sits at its
first response token.

By default the critic has its own backbone, initialised from the policy's weights (a deep copy: RAGEN and the
Turn-PPO paper's setup); with ``shared_backbone=True`` it is only a head on the policy's hidden states. With a
LoRA policy, the copy keeps its own LoRA adapters (base frozen), so the critic costs one more frozen base.
"""

from __future__ import annotations

import copy

from torch import Tensor, nn

from agentrl.models import tree
from agentrl.models.policy import Policy


class TurnCritic(nn.Module):
    """Turn-level critic.

    Args:
        policy: The policy whose weights initialise the backbone (or whose backbone is shared).
        shared_backbone: Use the policy's backbone instead of a copy; only the head is the critic's own.
    """

    def __init__(self, policy: Policy, *, shared_backbone: bool = False) -> None:
        super().__init__()
        self.shared_backbone = shared_backbone
        self._policy = [policy]  # a list keeps the policy out of this module's parameters
        self.backbone: nn.Module | None = None
        if not shared_backbone:
            self.backbone = copy.deepcopy(policy.backbone)
        self.head = nn.Linear(policy.hidden_size, 1)
        # neutral start: V = 0 everywhere, a zero baseline instead of random values (a random head gave values in
        # −1.6 … +2.3 against returns in [−0.4, 1] and negative explained variance for whole runs); the head's
        # weights learn from the first value loss, the backbone once they are non-zero
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        dtype = next(policy.model.parameters()).dtype
        self.head.to(dtype)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The critic's own trainable parameters (the head, plus the backbone copy unless shared)."""
        return [p for p in self.parameters() if p.requires_grad]

    def hidden_states(self, input_ids: Tensor, attention_mask: Tensor, branch: Tensor | None = None) -> Tensor:
        policy = self._policy[0]
        if self.backbone is None:
            return policy.hidden_states(input_ids, attention_mask, branch)
        with policy.autocast():
            out = self.backbone(input_ids=input_ids,
                                attention_mask=tree.model_mask(self.backbone, attention_mask, branch),
                                position_ids=tree.position_ids(attention_mask, branch), use_cache=False)
        return out.last_hidden_state

    def values_from_hidden(self, hidden: Tensor, attention_mask: Tensor | None = None,
                           branch: Tensor | None = None) -> Tensor:
        """(N, L) values aligned to tokens: ``values[:, t] = head(hidden[:, t − 1])``, ``values[:, 0] = 0`` (in
        shared-prefix rows, ``branch`` with its ``attention_mask``: the hidden state of t's predecessor)."""
        v = self.head(hidden.to(self.head.weight.dtype)).squeeze(-1).float()
        return tree.shift_to_tokens(v, attention_mask, branch)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, branch: Tensor | None = None) -> Tensor:
        return self.values_from_hidden(self.hidden_states(input_ids, attention_mask, branch), attention_mask, branch)
