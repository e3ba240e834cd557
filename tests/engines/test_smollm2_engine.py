"""The embedded engine on the real SmolLM2-135M: engine log-probs equal the trainer's (the figure asked for)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentrl.engines.base import Completion, SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.models.policy import Policy


@pytest.mark.slow
def test_smollm2_engine_logprobs_match_trainer(smollm2_policy: Policy) -> None:
    tok = smollm2_policy.tokenizer
    prompts = [
        list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                     return_dict=False))
        for q in ("Guess a number between 1 and 10.", "Which way to the goal: up, down, left or right?",
                  "Name a river.", "Say hello in French, then explain why in two sentences.")
    ]
    engine = HFEngine(smollm2_policy)

    async def run() -> list[Completion]:
        return await asyncio.gather(*[engine.generate(p, SamplingParams(max_tokens=24, seed=i), session=f"s{i}")
                                      for i, p in enumerate(prompts)])

    outs = asyncio.run(run())
    worst = 0.0
    for prompt, out in zip(prompts, outs, strict=True):
        ids = torch.tensor([prompt + out.token_ids])
        pos = torch.zeros_like(ids, dtype=torch.bool)
        pos[0, len(prompt):] = True
        with torch.no_grad():
            lp = smollm2_policy.token_logprobs(ids, torch.ones_like(ids), pos).logprobs[pos]
        worst = max(worst, float((lp - torch.tensor(out.logprobs)).abs().max()))
    print(f"SmolLM2: max |engine − trainer| log-prob over {sum(len(o.token_ids) for o in outs)} tokens = {worst:.2e}")
    assert worst <= 1e-4
