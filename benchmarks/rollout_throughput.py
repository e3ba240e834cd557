"""Rollout throughput: the embedded HFEngine vs the loop a user would write with ``model.generate``.

Workload: E episodes of T turns with a growing context (each turn's prompt is the conversation so far: system
prompt, question, every earlier reply and a fixed observation), sampling at temperature 1.0 with SmolLM2-135M.

* ``naive``: one ``model.generate`` call per turn, episode after episode (re-reads the whole conversation).
* ``engine``: the same episodes run concurrently through `HFEngine` (continuous batching + prefix KV reuse).
* ``collector``: real `EnvAgent` episodes through the `Collector` at several concurrency levels (issue 4).

All figures come from one run, side by side. Usage::

    python benchmarks/rollout_throughput.py [--episodes 16 --turns 4 --max-tokens 48] [--dtypes float32 bfloat16]
        [--concurrency 1 8 32] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import time
from pathlib import Path
from typing import Any

import torch

from agentrl.agents.base import Task
from agentrl.agents.env_agent import EnvAgent
from agentrl.collect.collector import Collector
from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.envs import FrozenLakeEnv
from agentrl.models.policy import Policy
from agentrl.models.precision import cpu_identity

SYSTEM = "You are an agent in a grid world. Think briefly, then give one move: up, down, left or right."
OBSERVATION = "You moved. The goal is still to the south-east. What is your next move?"


def conversation(tok, episode: int) -> list[int]:  # type: ignore[no-untyped-def]
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Episode {episode}: you stand at row 0, column {episode % 4}. Move?"}]
    return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def observation_ids(tok) -> list[int]:  # type: ignore[no-untyped-def]
    return list(tok.encode(f"\n<|im_start|>user\n{OBSERVATION}<|im_end|>\n<|im_start|>assistant\n",
                           add_special_tokens=False))


def run_naive(policy: Policy, episodes: int, turns: int, max_tokens: int) -> dict[str, Any]:
    tok, model = policy.tokenizer, policy.model
    obs = observation_ids(tok)
    generated = 0
    tokens: list[list[int]] = []
    start = time.perf_counter()
    for e in range(episodes):
        ids = conversation(tok, e)
        for t in range(turns):
            torch.manual_seed(1000 * e + t)
            x = torch.tensor([ids])
            with torch.no_grad():
                out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_tokens, do_sample=True,
                                     temperature=1.0, top_k=0, top_p=1.0, eos_token_id=policy.stop_token_ids,
                                     pad_token_id=tok.pad_token_id or 0)
            new = out[0, x.shape[1]:].tolist()
            tokens.append(new)
            generated += len(new)
            ids = ids + new + obs
    seconds = time.perf_counter() - start
    return {"tokens": generated, "seconds": seconds, "tokens_per_s": generated / seconds, "turn_tokens": tokens}


def run_engine(policy: Policy, episodes: int, turns: int, max_tokens: int, prefix_cache: bool) -> dict[str, Any]:
    engine = HFEngine(policy, max_batch_size=32, prefix_cache_tokens=65536 if prefix_cache else 0)
    tok = policy.tokenizer
    obs = observation_ids(tok)

    async def episode(e: int) -> list[list[int]]:
        ids, turn_tokens = conversation(tok, e), []
        for t in range(turns):
            out = await engine.generate(ids, SamplingParams(max_tokens=max_tokens, seed=1000 * e + t), session=f"e{e}")
            turn_tokens.append(out.token_ids)
            ids = ids + out.token_ids + obs
        return turn_tokens

    async def run() -> list[list[int]]:
        return [t for ep in await asyncio.gather(*(episode(e) for e in range(episodes))) for t in ep]

    start = time.perf_counter()
    tokens = asyncio.run(run())
    generated = sum(len(t) for t in tokens)
    seconds = time.perf_counter() - start
    s = engine.stats
    return {"tokens": generated, "seconds": seconds, "tokens_per_s": generated / seconds,
            "prefill_tokens": s.prefill_tokens, "cached_tokens": s.cached_tokens, "decode_steps": s.decode_steps,
            "prefill_seconds": s.prefill_seconds, "prefill_forwards": s.prefill_forwards,
            "decode_seconds": s.decode_seconds, "mean_decode_batch": s.generated_tokens / max(s.decode_steps, 1),
            "turn_tokens": tokens}


def run_collector(policy: Policy, concurrency: int, episodes: int, max_tokens: int) -> dict[str, float]:
    engine = HFEngine(policy, max_batch_size=32)
    agent = EnvAgent(FrozenLakeEnv(size=3, holes=1, max_turns=4))
    col = Collector(engine, agent, policy.tokenizer, sampling=SamplingParams(max_tokens=max_tokens),
                    concurrency=concurrency)
    tasks = [Task(f"t{i}", seed=i) for i in range(episodes)]
    start = time.perf_counter()
    trajs = asyncio.run(col.collect_groups(tasks, 1, step=0))
    seconds = time.perf_counter() - start
    tokens = sum(len(t.response_ids) for tr in trajs for t in tr.turns)
    return {"concurrency": concurrency, "episodes": episodes, "tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds}


def profile_decode(policy: Policy) -> str:
    """Where a decode step's time goes, at batch 16 (torch profiler, top operators by CPU time)."""
    from torch.profiler import ProfilerActivity, profile

    engine = HFEngine(policy, max_batch_size=16, prefix_cache_tokens=0)
    prompts = [conversation(policy.tokenizer, e) for e in range(16)]

    async def run() -> None:
        await asyncio.gather(*(engine.generate(p, SamplingParams(max_tokens=16, seed=i, stop_token_ids=()))
                               for i, p in enumerate(prompts)))

    # the engine runs model steps in a worker thread; run them inline here so the profiler (which records the
    # calling thread) sees them — the work is identical, only the thread differs
    from agentrl.engines import hf

    async def inline(fn, *args):  # type: ignore[no-untyped-def]
        return fn(*args)

    original, hf.asyncio.to_thread = hf.asyncio.to_thread, inline  # type: ignore[assignment]
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            asyncio.run(run())
    finally:
        hf.asyncio.to_thread = original
    return str(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=40))


def compare(policy: Policy, args: argparse.Namespace, *, with_no_reuse: bool) -> dict[str, Any]:
    """The naive loop and the engine on one policy, side by side; token agreement of the two."""
    dtype = str(next(policy.model.parameters()).dtype).removeprefix("torch.")
    naive = run_naive(policy, args.episodes, args.turns, args.max_tokens)
    print(f"[{dtype}] naive model.generate loop : {naive['tokens']:6d} tokens in {naive['seconds']:7.1f} s = "
          f"{naive['tokens_per_s']:7.1f} tok/s")
    out: dict[str, Any] = {"naive": naive}
    if with_no_reuse:
        no_cache = run_engine(policy, args.episodes, args.turns, args.max_tokens, prefix_cache=False)
        print(f"[{dtype}] HFEngine, no prefix reuse : {no_cache['tokens']:6d} tokens in {no_cache['seconds']:7.1f} s "
              f"= {no_cache['tokens_per_s']:7.1f} tok/s  ({no_cache['tokens_per_s'] / naive['tokens_per_s']:.2f}x)")
        out["engine_no_prefix_reuse"] = no_cache
    engine = run_engine(policy, args.episodes, args.turns, args.max_tokens, prefix_cache=True)
    print(f"[{dtype}] HFEngine                  : {engine['tokens']:6d} tokens in {engine['seconds']:7.1f} s = "
          f"{engine['tokens_per_s']:7.1f} tok/s  ({engine['tokens_per_s'] / naive['tokens_per_s']:.2f}x)")
    print(f"  engine time: prefill {engine['prefill_seconds']:.1f} s ({engine['prefill_tokens']} tokens computed in "
          f"{engine['prefill_forwards']} forwards, {engine['cached_tokens']} reused), decode "
          f"{engine['decode_seconds']:.1f} s over {engine['decode_steps']} steps (mean batch "
          f"{engine['mean_decode_batch']:.1f})")
    same = sum(a == b for a, b in zip(naive.pop("turn_tokens"), engine.pop("turn_tokens"), strict=True))
    out.get("engine_no_prefix_reuse", {}).pop("turn_tokens", None)
    print(f"  turns with identical tokens, naive vs engine: {same} of {args.episodes * args.turns}")
    out.update({"engine": engine, "speedup": engine["tokens_per_s"] / naive["tokens_per_s"],
                "identical_turns": same, "turns": args.episodes * args.turns})
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 32],
                        help="collector sweep; give none to skip it (the earlier sweep is kept, marked)")
    parser.add_argument("--collector-episodes", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--only-profile", action="store_true", help="add the profile to an existing result file")
    args = parser.parse_args()
    if args.only_profile:
        path = args.out / "rollout_throughput.json"
        saved = json.loads(path.read_text())
        saved["profile_top_ops"] = profile_decode(Policy("smollm2-135m-instruct", compute_dtype="float32"))
        print(saved["profile_top_ops"])
        path.write_text(json.dumps(saved, indent=2))
        return

    machine = f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    results: dict[str, Any] = {"machine": machine, "cpu": cpu_identity(),
                               "workload": vars(args) | {"out": str(args.out)}}
    print(f"workload: {args.episodes} episodes x {args.turns} turns, <= {args.max_tokens} new tokens per turn")
    for i, dtype in enumerate(args.dtypes):
        torch.manual_seed(0)
        # equal dtype on both sides: the weights' dtype is also the compute dtype (no `auto` bf16 autocast in
        # the engine while the naive `model.generate` loop runs in the weights' dtype)
        policy = Policy("smollm2-135m-instruct", dtype=dtype, compute_dtype=dtype)
        policy.model.eval()
        section = compare(policy, args, with_no_reuse=i == 0)
        results[dtype] = section
        if i == 0:  # the first dtype's figures also at the top level (earlier result files have only these)
            results.update({k: section[k] for k in ("naive", "engine", "speedup")})
            if "engine_no_prefix_reuse" in section:
                results["engine_no_prefix_reuse"] = section["engine_no_prefix_reuse"]
    if args.concurrency or not args.no_profile:
        policy = Policy("smollm2-135m-instruct", dtype=args.dtypes[0], compute_dtype=args.dtypes[0])
    sweep = []
    for c in args.concurrency:
        r = run_collector(policy, c, args.collector_episodes, args.max_tokens)
        sweep.append(r)
        print(f"collector, {c:2d} concurrent episodes: {r['tokens_per_s']:7.1f} tok/s ({r['tokens']} tokens, "
              f"{r['seconds']:.1f} s)")
    if sweep:
        results["collector"] = sweep
    elif (args.out / "rollout_throughput.json").is_file():  # not rerun: keep the earlier sweep, marked as such
        earlier = json.loads((args.out / "rollout_throughput.json").read_text())
        results["collector_earlier_run"] = earlier.get("collector", earlier.get("collector_earlier_run"))
    if not args.no_profile:
        table = profile_decode(policy)
        print(table)
        results["profile_top_ops"] = table
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rollout_throughput.json").write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out / 'rollout_throughput.json'}")


if __name__ == "__main__":
    main()
