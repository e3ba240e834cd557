"""Rollout throughput: the embedded HFEngine vs the loop a user would write with ``model.generate``.

Workload: E episodes of T turns with a growing context (each turn's prompt is the conversation so far: system
prompt, question, every earlier reply and a fixed observation), sampling at temperature 1.0 with SmolLM2-135M.

* ``naive``: one ``model.generate`` call per turn, episode after episode (re-reads the whole conversation).
* ``engine``: the same episodes run concurrently through `HFEngine` (continuous batching + prefix KV reuse).
* ``collector``: real `EnvAgent` episodes through the `Collector` at several concurrency levels (issue 4).

All figures come from one run, side by side. Usage::

    python benchmarks/rollout_throughput.py [--episodes 16 --turns 4 --max-tokens 48] [--dtypes float32 bfloat16]
        [--concurrency 1 8 32] [--out benchmarks/results]
    python benchmarks/rollout_throughput.py --old-vs-default [--rounds 4 --naive-episodes 4]
    python benchmarks/rollout_throughput.py --smoke --out /tmp/rt   # tiny random model, seconds: does it run

``--smoke`` runs every part on the tiny random model at a few tokens (the figures mean nothing; it checks that
the script runs to its JSON).

``--old-vs-default`` (issue 31): the engine's old default (the trainer's fp32 modules) against its new default (its
own weight copy in ``decode_dtype: auto``), alternating on one policy under the same load, each against the naive
loop in its dtype; ``speedup`` is then the default engine's figure, and decode ms/step is held against
``roofline.json``'s bandwidth floor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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


def run_naive(policy: Policy, episodes: int, turns: int, max_tokens: int, model: Any = None) -> dict[str, Any]:
    """``model.generate`` turn after turn (``model``: the policy's, or another copy of it, e.g. in bf16), with its
    KV cache within each call (``use_cache=True``: `Policy` turns the model config's cache off for training, and
    generate follows the config: without it the loop ran at 1.2 tok/s, every token re-reading the context)."""
    tok, model = policy.tokenizer, policy.model if model is None else model
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
                                     pad_token_id=tok.pad_token_id or 0, use_cache=True)
            new = out[0, x.shape[1]:].tolist()
            tokens.append(new)
            generated += len(new)
            ids = ids + new + obs
    seconds = time.perf_counter() - start
    return {"tokens": generated, "seconds": seconds, "tokens_per_s": generated / seconds, "turn_tokens": tokens}


def run_engine(policy: Policy, episodes: int, turns: int, max_tokens: int, prefix_cache: bool,
               engine: HFEngine | None = None) -> dict[str, Any]:
    """The episodes concurrently through ``engine`` (default: a new shared-weights engine), from an empty prefix
    store and zeroed counters."""
    if engine is None:
        engine = HFEngine(policy, max_batch_size=32, prefix_cache_tokens=65536 if prefix_cache else 0)
    engine.drop_prefix_cache()
    engine.reset_stats()
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
            "decode_ms_per_step": 1000 * s.decode_seconds / max(s.decode_steps, 1), "turn_tokens": tokens}


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


def old_vs_default(args: argparse.Namespace) -> dict[str, Any]:
    """The old default engine (the trainer's fp32 modules, ``weights: shared``) against the new one (its own weight
    copy in ``decode_dtype: auto``, bf16 with native bf16) on one fp32 policy, alternating round by round under the
    same load; each against the naive loop in its own dtype (the naive bf16 loop runs on the engine's bf16 copy)."""
    policy = Policy(args.model, dtype="float32", compute_dtype="float32")
    policy.model.eval()
    engines = {"old": HFEngine(policy, max_batch_size=32, prefix_cache_tokens=65536, weights="shared"),
               "new": HFEngine(policy, max_batch_size=32, prefix_cache_tokens=65536, weights="copy")}
    new_weights = engines["new"].weights
    dtype = {"old": "float32", "new": str(next(new_weights.model.parameters()).dtype).removeprefix("torch.")}
    pushes = []
    for _ in range(3):
        asyncio.run(engines["new"].update_weights(policy))
        pushes.append(engines["new"].stats.push_seconds)
        engines["new"].reset_stats()
    for engine in engines.values():  # warm-up: the first forward of each pays one-off allocations
        run_engine(policy, 2, 1, 4, True, engine)
    rounds: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    for r in range(args.rounds):
        for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
            run = run_engine(policy, args.episodes, args.turns, args.max_tokens, True, engines[name])
            run.pop("turn_tokens")
            rounds[name].append(run)
            print(f"round {r} {name} ({dtype[name]}): {run['tokens_per_s']:6.1f} tok/s, decode "
                  f"{run['decode_ms_per_step']:6.1f} ms/step at mean batch {run['mean_decode_batch']:.1f}", flush=True)
    naive = {}
    for name, model in (("old", policy.model), ("new", new_weights.model)):
        run_naive(policy, 1, 1, 4, model)  # warm-up
        naive[name] = run_naive(policy, args.naive_episodes, args.turns, args.max_tokens, model)
        naive[name].pop("turn_tokens")
        print(f"naive loop ({dtype[name]}): {naive[name]['tokens_per_s']:6.1f} tok/s", flush=True)
    out: dict[str, Any] = {"push_seconds": pushes, "copy_mib": new_weights.nbytes / 2**20}
    for name in ("old", "new"):
        best = max(rounds[name], key=lambda x: x["tokens_per_s"])
        out[f"{name}_default"] = {"weights": "shared" if name == "old" else "copy", "dtype": dtype[name],
                                  "rounds": rounds[name], "naive": naive[name],
                                  "best_tokens_per_s": best["tokens_per_s"],
                                  "best_decode_ms_per_step": min(x["decode_ms_per_step"] for x in rounds[name]),
                                  "speedup": best["tokens_per_s"] / naive[name]["tokens_per_s"]}
    ratios = [n["tokens_per_s"] / o["tokens_per_s"] for o, n in zip(rounds["old"], rounds["new"], strict=True)]
    steps = [o["decode_ms_per_step"] / n["decode_ms_per_step"] for o, n in zip(rounds["old"], rounds["new"],
                                                                              strict=True)]
    out["new_over_old_tokens_per_s_by_round"], out["old_over_new_decode_ms_by_round"] = ratios, steps
    out["roofline"] = _against_roofline(args.roofline, out, dtype["new"])
    return out


def _against_roofline(path: Path, out: dict[str, Any], new_dtype: str) -> dict[str, Any] | None:
    """The best decode ms/step of each engine against the bandwidth floor of its dtype (roofline.json)."""
    if not path.is_file():
        return None
    threads = torch.get_num_threads()
    floors = {f["threads"]: f for f in json.loads(path.read_text()).get("decode_floor", [])}
    floor = floors.get(threads) or floors.get(1)
    if floor is None:
        return None
    result: dict[str, Any] = {"floor_threads": floor["threads"], "read_gb_per_s": floor["read_gb_per_s"]}
    for name, dtype in (("old", "float32"), ("new", new_dtype)):
        ms = out[f"{name}_default"]["best_decode_ms_per_step"]
        result[name] = {"floor_ms": floor[dtype]["bandwidth_floor_ms"], "decode_ms": ms,
                        "fraction_of_roofline": floor[dtype]["bandwidth_floor_ms"] / ms}
    return result


def smoke_args(args: argparse.Namespace) -> None:
    """``--smoke``: every part on the tiny random model at a few tokens; without it nothing changes."""
    if args.smoke:
        args.model, args.episodes, args.turns, args.max_tokens, args.dtypes = "tiny-random", 2, 2, 4, ["float32"]
        args.concurrency, args.collector_episodes, args.no_profile = [1], 2, True
        args.rounds, args.naive_episodes = 1, 1


def workload(args: argparse.Namespace) -> dict[str, Any]:
    """The arguments as JSON values (every path as a string), for the result file."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


def main_old_vs_default(args: argparse.Namespace) -> None:
    machine = f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    results: dict[str, Any] = {"machine": machine, "cpu": cpu_identity(), "load_average_start": os.getloadavg(),
                               "workload": workload(args)}
    start = time.perf_counter()
    comparison = old_vs_default(args)
    results.update(comparison)
    results["speedup"] = comparison["new_default"]["speedup"]  # the default engine's figure (issue 31)
    results["load_average_end"] = os.getloadavg()
    results["wall_seconds"] = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "rollout_throughput.json"
    earlier = json.loads(path.read_text()) if path.is_file() else None
    if earlier is not None and "old_default" not in earlier:  # keep the earlier fp32/bf16 run beside, marked
        (args.out / "rollout_throughput_earlier_run.json").write_text(json.dumps(earlier, indent=2))
    path.write_text(json.dumps(results, indent=2))
    print(json.dumps({k: results[k] for k in ("speedup", "new_over_old_tokens_per_s_by_round", "roofline",
                                              "push_seconds", "copy_mib")}, indent=1))
    print(f"wrote {path}")


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
    parser.add_argument("--old-vs-default", action="store_true",
                        help="the old default engine (shared fp32) against the new (bf16 weight copy), alternating")
    parser.add_argument("--rounds", type=int, default=4, help="--old-vs-default: engine rounds of each")
    parser.add_argument("--naive-episodes", type=int, default=4, help="--old-vs-default: naive loop episodes")
    parser.add_argument("--roofline", type=Path, default=Path("benchmarks/results/roofline.json"))
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (1 on a loaded machine: with 2, a batch-1 loop waits on OpenMP barriers "
                             "for a descheduled thread, measured 1.2 tok/s naive against 16 on an idle machine)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--smoke", action="store_true", help="tiny random model, a few tokens: checks the script runs")
    args = parser.parse_args()
    smoke_args(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.old_vs_default:
        main_old_vs_default(args)
        return
    if args.only_profile:
        path = args.out / "rollout_throughput.json"
        saved = json.loads(path.read_text())
        saved["profile_top_ops"] = profile_decode(Policy(args.model, compute_dtype="float32"))
        print(saved["profile_top_ops"])
        path.write_text(json.dumps(saved, indent=2))
        return

    machine = f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    results: dict[str, Any] = {"machine": machine, "cpu": cpu_identity(), "workload": workload(args)}
    print(f"workload: {args.episodes} episodes x {args.turns} turns, <= {args.max_tokens} new tokens per turn")
    for i, dtype in enumerate(args.dtypes):
        torch.manual_seed(0)
        # equal dtype on both sides: the weights' dtype is also the compute dtype (no `auto` bf16 autocast in
        # the engine while the naive `model.generate` loop runs in the weights' dtype)
        policy = Policy(args.model, dtype=dtype, compute_dtype=dtype)
        policy.model.eval()
        section = compare(policy, args, with_no_reuse=i == 0)
        results[dtype] = section
        if i == 0:  # the first dtype's figures also at the top level (earlier result files have only these)
            results.update({k: section[k] for k in ("naive", "engine", "speedup")})
            if "engine_no_prefix_reuse" in section:
                results["engine_no_prefix_reuse"] = section["engine_no_prefix_reuse"]
    if args.concurrency or not args.no_profile:
        policy = Policy(args.model, dtype=args.dtypes[0], compute_dtype=args.dtypes[0])
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
