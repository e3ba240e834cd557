"""The tiny model of the real-vLLM tier: a 2-layer Llama that vLLM's CPU backend accepts (head size 64; 16
crashes its attention), with the byte-level ChatML tokenizer of ``tiny-random`` (320 ids, every string round-trips)
and weights drawn wide enough that greedy decoding has clear winners. Built and saved in the test session."""

from __future__ import annotations

from pathlib import Path

import torch

from agentrl.models.loading import build_tiny_tokenizer

INIT_STD = 0.1
"""Standard deviation of the random weights: Llama's default 0.02 makes every next token nearly equally likely; 0.25
made bf16 and fp32 log-probs of the same tokens differ by up to 0.65 nats; at 0.1 the gap is below 0.1 and the best
token leads the second by 0.3 nats (median)."""


def save_tiny_vllm_model(path: Path, seed: int = 0) -> Path:
    """Save the model and tokenizer to ``path`` (safetensors, fp32) and return it."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=320, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=2048, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=INIT_STD,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(str(path))
    build_tiny_tokenizer().save_pretrained(str(path))
    return path
