"""The Lightning system: `AgentRLModule` and the parts it owns (evaluation, step accounting, run counters), the
callbacks and checkpoint I/O. Above the schedules, the update and the rollout side; below `command`."""
