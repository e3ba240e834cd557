"""Agents that only speak the OpenAI API, trained by agentrl through its training gateway
(`agentrl.agents.http_agent.HTTPAgent`): an OpenAI Agents SDK agent (`openai_agents_search`) and a plain ``openai``
client loop (`openai_client_loop`), both answering the shipped SearchQA questions with a search tool."""
