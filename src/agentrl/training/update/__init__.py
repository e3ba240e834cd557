"""The PPO update: settings, turn batching and row plans, the objective, behaviour correction, credit records,
sharding and the collectives across ranks. Imports no other part of `agentrl.training`."""
