"""The algorithm schedules, one file each (`grpo`, `turn_ppo`, `token_ppo`, `rtpo`) over a shared `base`, and the
`Learner` protocol through which they talk to the trainer. Below `system`; above `update` and `rollout`."""
