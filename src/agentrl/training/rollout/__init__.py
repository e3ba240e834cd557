"""The rollout side: the data module (tasks, agent, sampling), the rollout session that owns the engine and the
collector, and the batches collected ahead of the trainer. Imports no other part of `agentrl.training`."""
