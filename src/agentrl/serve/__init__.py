"""Layer `serve`: ``agentrl serve``, the embedded engine behind vLLM's OpenAI-compatible HTTP API (completions,
chat completions with tools, LoRA hot-load), the OpenAI protocol models it speaks, and the training gateway
(`agentrl.serve.gateway`: episode-scoped chat completions over episodes' LLM clients, for `HTTPAgent`). Imports
engines, models, agents and chat; never training."""
