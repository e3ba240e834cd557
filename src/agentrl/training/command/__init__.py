"""The ``agentrl fit`` / ``agentrl validate`` commands and `agentrl.fit`: the CLI, its error messages, preflight
checks, the progress display. The top of `agentrl.training`."""
