"""Layer `collect`: many episodes at once. The `Collector` runs agents concurrently on one asyncio loop
(`RolloutRuntime`), builds groups (GRPO/PPO), trunks and replayed siblings (RTPO), and contains failures to
their episode. Imports agents and engines; never serve or training."""
