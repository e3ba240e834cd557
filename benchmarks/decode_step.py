"""Where one decode step of the embedded engine goes (issue 31): wall ms per step from the engine's own counters,
and the operators' time per step from ``torch.profiler``, for the old default engine (the trainer's fp32 modules)
and the new one (its own weight copy in the decode dtype), each against ``roofline.json``'s floors.

Workload: B requests of the rollout benchmark's prompts decoding 48 tokens each (no stop tokens), so one batched
prefill is diluted over 47 decode steps at batch B. Each engine: one warm-up, ``--repeats`` timed runs (wall ms per
decode step = the engine's decode seconds / decode steps), then one profiled run with the model steps run inline
(the profiler records the calling thread, so the steps that run on the engine's worker thread are run there for it;
the sampler's exponential draws run on its own threads and so are not in the operator table).

Usage::

    python benchmarks/decode_step.py [--batch 16 --tokens 48 --repeats 3] [--out benchmarks/results/decode_step.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
from pathlib import Path
from typing import Any

import torch
from rollout_throughput import conversation

from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.models.policy import Policy
from agentrl.models.precision import cpu_identity


def measure(policy: Policy, weights: str, batch: int, tokens: int, repeats: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    engine = HFEngine(policy, max_batch_size=max(32, batch), prefix_cache_tokens=0, weights=weights)  # type: ignore[arg-type]
    prompts = [conversation(policy.tokenizer, e) for e in range(batch)]

    async def run(n: int) -> None:
        await asyncio.gather(*(engine.generate(p, SamplingParams(max_tokens=n, seed=i, stop_token_ids=()))
                               for i, p in enumerate(prompts)))

    asyncio.run(run(4))  # warm-up
    walls = []
    for _ in range(repeats):
        engine.reset_stats()
        asyncio.run(run(tokens))
        walls.append(1000 * engine.stats.decode_seconds / engine.stats.decode_steps)

    worker = engine._worker

    async def inline(model, stats, prefill, fn, *args):  # type: ignore[no-untyped-def]
        return worker._step(model, stats, prefill, fn, *args)  # on the profiled (calling) thread

    original, worker.run = worker.run, inline  # type: ignore[method-assign]
    try:
        engine.reset_stats()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            asyncio.run(run(tokens))
    finally:
        worker.run = original  # type: ignore[method-assign]
    steps = engine.stats.decode_steps
    ops = {e.key: e.self_cpu_time_total / 1e3 / steps for e in prof.key_averages()}
    dtype = str(next(engine.weights.model.parameters()).dtype).removeprefix("torch.")
    return {"weights": weights, "dtype": dtype, "batch": batch, "decode_steps": steps,
            "wall_ms_per_step": walls, "best_wall_ms_per_step": min(walls),
            "op_ms_per_step": sum(ops.values()),
            "top_ops_ms_per_step": dict(sorted(ops.items(), key=lambda kv: -kv[1])[:12])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--roofline", type=Path, default=Path("benchmarks/results/roofline.json"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/decode_step.json"))
    args = parser.parse_args()
    policy = Policy("smollm2-135m-instruct", dtype="float32", compute_dtype="float32")
    policy.model.eval()
    threads = torch.get_num_threads()
    floors = {f["threads"]: f for f in json.loads(args.roofline.read_text())["decode_floor"]} \
        if args.roofline.is_file() else {}
    result: dict[str, Any] = {"machine": f"{platform.machine()}, {threads} threads, torch {torch.__version__}",
                              "cpu": cpu_identity(), "load_average_start": os.getloadavg(),
                              "workload": {"batch": args.batch, "tokens": args.tokens, "repeats": args.repeats},
                              "engines": []}
    for weights in ("shared", "copy"):
        r = measure(policy, weights, args.batch, args.tokens, args.repeats)
        floor = floors.get(threads, {}).get(r["dtype"])
        if floor is not None:
            kernels = floor["matmul_sum_ms"].get(str(args.batch))
            r["bandwidth_floor_ms"] = floor["bandwidth_floor_ms"]
            r["fraction_of_bandwidth_floor"] = floor["bandwidth_floor_ms"] / r["best_wall_ms_per_step"]
            if kernels is not None:
                r["matmul_floor_ms"] = kernels
                r["fraction_of_matmul_floor"] = kernels / r["best_wall_ms_per_step"]
        result["engines"].append(r)
        print(f"{weights:6s} ({r['dtype']}): wall {', '.join(f'{w:.1f}' for w in r['wall_ms_per_step'])} ms/step at "
              f"batch {args.batch}; ops {r['op_ms_per_step']:.1f} ms/step, of which "
              f"{r['top_ops_ms_per_step'].get('aten::mm', 0.0):.1f} matmul"
              + (f"; bandwidth floor {r['bandwidth_floor_ms']:.1f} ms ({100 * r['fraction_of_bandwidth_floor']:.0f} %)"
                 if "bandwidth_floor_ms" in r else "")
              + (f", matmul floor {r['matmul_floor_ms']:.1f} ms ({100 * r['fraction_of_matmul_floor']:.0f} %)"
                 if "matmul_floor_ms" in r else ""), flush=True)
    result["load_average_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
