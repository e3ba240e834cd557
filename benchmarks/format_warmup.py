"""A short supervised *format* warm-up for the learning benchmark's FrozenLake and CreditChain cells.

SmolLM2-135M-Instruct wins FrozenLake 2x2 in 3-9 % of held-out games whatever the turn and token limits
(docs/benchmarks-log.md, "FrozenLake: base success"), below the 10-60 % band the learning benchmark asks for: most
of its replies are sentences without a direction word. This warm-up teaches the *format only*: it fine-tunes on
conversations played through the real environment in which every assistant reply is **one direction word drawn
uniformly at random**, independent of the board. The targets carry no information about which move is right, so
what RL then learns (which direction, at which turn) is left to RL; every schedule starts from the same warmed-up
weights.

Writes a model folder (weights and tokenizer, ``save_pretrained``) that ``--model.policy.init_args.model`` loads,
and ``warmup.json`` beside it with the settings, the loss and the valid-reply rate of sampled first replies on
held-out boards before and after. Deterministic for a given seed on one machine.

CreditChain (``--env creditchain``): SmolLM2 names a colour in 0-3 % of its replies (docs/benchmarks-log.md, "Credit
assignment"). The targets are one uniformly random option word per reply, on episodes of every grid setting
(M in {1, 3}, D in {0, 4, 8}, decisions first and last), each turn rendered as the learning cells' agent sees it
(the full context: the whole conversation so far), so one warm-up serves every cell of the grid and says nothing
about which colour is right for a cue.

Example::

    python benchmarks/format_warmup.py --out checkpoints/warmup/frozenlake-format
    python benchmarks/format_warmup.py --env creditchain --out checkpoints/warmup/creditchain-format
    python benchmarks/format_warmup.py --smoke --out /tmp/warmup   # tiny random model, seconds: does it run
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import resource
import time
from pathlib import Path
from typing import Any

import torch

from agentrl.agents.env_agent import EnvAgent
from agentrl.envs import CreditChainEnv, FrozenLakeEnv
from agentrl.models.loading import SMOLLM2, load_model
from agentrl.models.precision import cpu_identity

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("left", "down", "right", "up")


def make_env() -> FrozenLakeEnv:
    """The learning benchmark's FrozenLake (configs/learning/frozenlake.yaml)."""
    return FrozenLakeEnv(size=2, holes=0, max_turns=6, prompt_example=True)


# CreditChain settings of the learning grid (configs/learning/creditchain.yaml and the cells' overrides)
CHAIN_SETTINGS: list[dict[str, Any]] = [dict(decisions=m, distractors=d, order=o) for m in (1, 3) for d in (0, 4, 8)
                  for o in ("decisions_first", "decisions_last")]
CHAIN_BASE: dict[str, Any] = dict(options=2, cues=4, prompt_example=True, context="full")


def make_chain(setting: dict[str, Any]) -> CreditChainEnv:
    return CreditChainEnv(**CHAIN_BASE, **setting)


def chain_conversations(n: int, seed: int) -> list[list[dict[str, str]]]:
    """``n`` CreditChain episodes (settings in turn) on training seeds ``0..n-1``, one sample per turn: the prompt
    the learning cells' `EnvAgent` sends (the context policy's own history) and a uniformly random option word."""
    rng = random.Random(seed)
    out = []
    for episode in range(n):
        env = make_chain(CHAIN_SETTINGS[episode % len(CHAIN_SETTINGS)])
        agent = EnvAgent(env, history=env.agent_history)
        system = {"role": "system", "content": env.system_prompt}
        first = {"role": "user", "content": env.reset(episode)}
        exchanges: list[dict[str, str]] = []
        for _ in range(env.decisions + env.distractors):
            word = rng.choice(env.words)
            out.append([*agent._context(system, first, exchanges), {"role": "assistant", "content": word}])
            result = env.step(word)
            if result.terminated or result.truncated:
                break
            exchanges += [{"role": "assistant", "content": word}, {"role": "user", "content": result.observation}]
    return out


def conversations(n: int, seed: int) -> list[list[dict[str, str]]]:
    """``n`` episodes on training seeds ``0..n-1``, each reply a uniformly random direction word."""
    rng = random.Random(seed)
    out = []
    for episode in range(n):
        env = make_env()
        messages = [{"role": "system", "content": env.system_prompt}, {"role": "user", "content": env.reset(episode)}]
        for _ in range(env.max_turns):
            word = rng.choice(WORDS)
            result = env.step(word)
            messages.append({"role": "assistant", "content": word})
            if result.terminated or result.truncated:
                break
            messages.append({"role": "user", "content": result.observation})
        out.append(messages)
    return out


def encode(tok: Any, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """Token ids of the whole conversation and labels that keep only the assistant replies (and their end token)."""
    ids: list[int] = []
    labels: list[int] = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prefix = list(tok.apply_chat_template(messages[:i], add_generation_prompt=True, return_dict=False))
        full = list(tok.apply_chat_template(messages[: i + 1], return_dict=False))
        if full[: len(prefix)] != prefix or len(prefix) < len(ids):
            raise RuntimeError("the chat template does not render conversations as prefixes of each other")
        labels += [-100] * (len(prefix) - len(ids))
        reply = full[len(prefix) :]
        end = tok.convert_tokens_to_ids("<|im_end|>")
        keep = reply[: reply.index(end) + 1] if end in reply else reply
        labels += keep + [-100] * (len(reply) - len(keep))
        ids = full
    return ids, labels


@torch.no_grad()
def valid_rate(tok: Any, model: Any, episodes: int, max_tokens: int, seed: int, env_name: str = "frozenlake") -> float:
    """Fraction of sampled first replies (temperature 1, held-out boards) that hold a direction (option) word."""
    torch.manual_seed(seed)
    valid = 0
    for k in range(episodes):
        env = make_env() if env_name == "frozenlake" else make_chain(CHAIN_SETTINGS[k % len(CHAIN_SETTINGS)])
        messages = [{"role": "system", "content": env.system_prompt},
                    {"role": "user", "content": env.reset(1_000_000 + k)}]
        x = torch.tensor([tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)])
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=True, temperature=1.0, top_k=0,
                             top_p=1.0, max_new_tokens=max_tokens, pad_token_id=tok.eos_token_id,
                             eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
        reply = tok.decode(out[0, x.shape[1] :], skip_special_tokens=True)
        valid += not env.step(reply).info["format_error"]  # the environment's own parser decides
    return valid / episodes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", choices=("frozenlake", "creditchain"), default="frozenlake")
    p.add_argument("--out", type=Path, default=None, help="default: checkpoints/warmup/<env>-format")
    p.add_argument("--episodes", type=int, default=32, help="random-reply episodes to fine-tune on")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", type=int, default=32, help="held-out first replies sampled before and after")
    p.add_argument("--model", default=SMOLLM2, help="the model to warm up")
    p.add_argument("--smoke", action="store_true", help="tiny random model, 2 episodes, 1 epoch: checks it runs")
    args = p.parse_args(argv)
    if args.smoke:
        args.model, args.episodes, args.epochs, args.batch, args.check = "tiny-random", 2, 1, 2, 2
    args.out = args.out or ROOT / "checkpoints" / "warmup" / f"{args.env}-format"
    torch.manual_seed(args.seed)
    start, cpu0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    loaded = load_model(args.model)
    tok, model = loaded.tokenizer, loaded.model
    model.eval()
    before = valid_rate(tok, model, args.check, 12, args.seed, args.env)
    print(f"[warmup] valid first replies before: {before:.3f}", flush=True)
    made = conversations if args.env == "frozenlake" else chain_conversations
    data = [encode(tok, c) for c in made(args.episodes, args.seed)]
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    model.train()
    losses = []
    order = random.Random(args.seed)
    for epoch in range(args.epochs):
        batch_order = list(range(len(data)))
        order.shuffle(batch_order)
        for b in range(0, len(data), args.batch):
            rows = [data[i] for i in batch_order[b : b + args.batch]]
            width = max(len(ids) for ids, _ in rows)
            pad = tok.eos_token_id
            x = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows])
            y = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
            mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows])
            loss = model(input_ids=x, attention_mask=mask, labels=y).loss
            loss.backward()
            optim.step()
            optim.zero_grad(set_to_none=True)
            losses.append(loss.item())
            print(f"[warmup] epoch {epoch} batch {b // args.batch}: loss {losses[-1]:.3f}", flush=True)
    model.eval()
    after = valid_rate(tok, model, args.check, 12, args.seed, args.env)
    print(f"[warmup] valid first replies after: {after:.3f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(args.out))
    tok.save_pretrained(str(args.out))
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    environment = ("FrozenLakeEnv(size=2, holes=0, max_turns=6, prompt_example=True)" if args.env == "frozenlake"
                   else f"CreditChainEnv({CHAIN_BASE}) over {CHAIN_SETTINGS}, EnvAgent(history=None) prompts")
    report = {"base_model": args.model, "environment": environment,
              "targets": ("one uniformly random direction word per reply (no information about the right move)"
                          if args.env == "frozenlake" else
                          "one uniformly random option word per reply (no information about the right colour)"),
              "samples": len(data),
              "episodes": args.episodes, "epochs": args.epochs, "batch": args.batch, "lr": args.lr, "seed": args.seed,
              "optimizer_steps": len(losses), "losses": losses,
              "valid_first_replies": {"before": before, "after": after, "sampled": args.check, "max_tokens": 12},
              "wall_seconds": time.perf_counter() - start,
              "cpu_seconds": cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime,
              "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
              "cpu": cpu_identity()}
    if args.env == "creditchain":
        report["context"] = CHAIN_BASE["context"]  # benchmarks/learning.py `WARMUPS` remakes a folder made for another
    (args.out / "warmup.json").write_text(json.dumps(report, indent=1))
    print(f"[warmup] wrote {args.out} in {report['wall_seconds'] / 60:.1f} min", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
