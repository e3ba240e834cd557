"""The control-flow errors of an episode, raised by the LLM client and by agents, caught by the collector.

Kept apart from `agentrl.agents.base` (which re-exports them, the names users import) so that the client
(`agentrl.agents.llm`) can raise them without importing the module whose `Agent` protocol names the client: the
two would import each other.
"""

from __future__ import annotations


class EpisodeTruncated(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by the LLM client when an episode must stop early (turn limit, context window): the collector
    ends the episode as truncated, keeping its turns."""


class ReplayMismatchError(RuntimeError):
    """While replaying a trunk for RTPO branching, the agent produced a prompt that differs from the recorded
    one: the agent or its environment is not deterministic for a seed."""
