"""Layer `engines`: token ids in, token ids and log-probs out. The `RolloutEngine` protocol, the embedded
`HFEngine` (continuous batching, prefix KV reuse, shares the trainer's weights), its KV-cache pieces, and
`VLLMEngine`, the HTTP client of vLLM's OpenAI-compatible server. Imports models (to run them); never agents."""
