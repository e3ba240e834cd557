"""Layer `serve`: ``agentrl serve``, the embedded engine behind vLLM's OpenAI-compatible HTTP API (completions,
chat completions with tools, LoRA hot-load), and the OpenAI protocol models it speaks. Imports engines, models
and chat; never training."""
