"""Layer `training`: the Lightning system. `AgentRLModule` (policy + critic + schedule, manual PPO over packed
turns), the schedules (GRPO, TurnPPO, TokenPPO, RTPO) that talk to it through the `Learner` protocol,
`RolloutDataModule`, settings, callbacks and the ``agentrl fit`` CLI. The top layer below `cli`."""
