"""Where one decode step of the embedded engine goes (issue 31): wall ms per step from the engine's own counters,
and the operators' time per step from ``torch.profiler``, for the old default engine (the trainer's fp32 modules)
and the new one (its own weight copy in the decode dtype), each through transformers' modules and through the lean
decode step (`agentrl.engines.lean`), each against the floors measured beside them.

Workload: B requests of the rollout benchmark's prompts decoding 48 tokens each (no stop tokens), so one batched
prefill is diluted over 47 decode steps at batch B. Each engine: one warm-up, ``--repeats`` timed runs (wall ms per
decode step = the engine's decode seconds / decode steps), then one profiled run. The generation runs as training
runs it: on a `RolloutRuntime` loop, with the model steps on the thread that waits
(`agentrl.engines.worker.lend_until`), which the profiler records. The op table's totals include the prefill's
operators (divided by the decode steps); the wall figures do not.

Each engine runs in a process of its own, as in a run, ``--rounds`` times, interleaved with the others (the best
round is kept). The floors (`roofline`'s: the step's projection matmuls at B rows, and weight bytes over read
bandwidth) are measured in this process before and after the engines, so that a machine whose speed drifts (this
one's did by a quarter between runs) is held against its own kernels of the same minutes.

Usage::

    python benchmarks/decode_step.py --smoke --out /tmp/decode_step.json   # tiny random model: does it run
    python benchmarks/decode_step.py [--batch 16 --tokens 48 --repeats 3 --rounds 2] [--out OUT.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import roofline
import torch
from rollout_throughput import conversation

from agentrl.collect.runtime import RolloutRuntime
from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.engines.lean import pack_weight, packed_linear, packs
from agentrl.models.policy import Policy
from agentrl.models.precision import cpu_identity


def measure(policy: Policy, weights: str, lean: bool, pack: bool, batch: int, tokens: int,
            repeats: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    engine = HFEngine(policy, max_batch_size=max(32, batch), prefix_cache_tokens=0, weights=weights,  # type: ignore[arg-type]
                      lean_decode=lean, pack_weights=pack)
    prompts = [conversation(policy.tokenizer, e) for e in range(batch)]

    async def generate(n: int) -> None:
        await asyncio.gather(*(engine.generate(p, SamplingParams(max_tokens=n, seed=i, stop_token_ids=()))
                               for i, p in enumerate(prompts)))

    with RolloutRuntime() as runtime:  # as training runs it: model steps on this (waiting) thread
        runtime.run(generate(4))  # warm-up
        walls = []
        for _ in range(repeats):
            engine.reset_stats()
            runtime.run(generate(tokens))
            walls.append(1000 * engine.stats.decode_seconds / engine.stats.decode_steps)
        engine.reset_stats()
        with profile(activities=[ProfilerActivity.CPU]) as prof:  # records this thread, where the steps run
            runtime.run(generate(tokens))
        runtime.run(engine.shutdown())
    steps = engine.stats.decode_steps
    ops = {e.key: e.self_cpu_time_total / 1e3 / steps for e in prof.key_averages()}
    dtype = str(next(engine.weights.model.parameters()).dtype).removeprefix("torch.")
    assert engine._worker.worker_steps == 0, "a model step ran on the engine's own thread"
    decoder = engine._lean._for[1] if engine._lean._for else None
    packed = decoder is not None and decoder.packed is not None
    return {"weights": weights, "dtype": dtype, "lean_decode": lean, "packed_weights": packed, "batch": batch,
            "decode_steps": steps,
            "wall_ms_per_step": walls, "best_wall_ms_per_step": min(walls),
            "op_ms_per_step": sum(ops.values()),
            "top_ops_ms_per_step": dict(sorted(ops.items(), key=lambda kv: -kv[1])[:12])}


def floors_now(batch: int, repeats: int = 7, min_seconds: float = 0.01, mib: int = 512,
               cold_mib: int = 256) -> dict[str, dict[str, float]]:
    """The decode floors measured now, in this process at its thread count (`roofline`'s shapes and method):
    per dtype, the sum of one step's projection matmuls at ``batch`` rows and weight bytes / read bandwidth; for
    bf16 also the same matmuls with the weights packed in oneDNN's layout (`agentrl.engines.lean.packs`), the
    kernel the packed lean step calls."""
    threads = torch.get_num_threads()
    read = max(r["gb_per_s"] for r in roofline.bandwidth(threads, mib, repeats, min_seconds)
               if r["op"] == "sum (read)")
    rows = [roofline.matmul(threads, batch, roofline.weights(n, k, dtype, cold_mib), repeats, min_seconds,
                            kind="decode", name=name)
            for dtype in (torch.float32, torch.bfloat16) for name, (k, n) in roofline.PROJECTIONS.items()]
    params = roofline.smollm2_parameters()
    floors = {dtype: {"matmul_floor_ms": roofline.step_matmul_ms(rows, threads, dtype, batch),
                      "bandwidth_floor_ms": params * size / (read * 1e9) * 1e3}
              for dtype, size in (("float32", 4), ("bfloat16", 2))}
    if packs(torch.zeros(1, dtype=torch.bfloat16)) is None:
        packed = [roofline.matmul(threads, batch,
                                  [pack_weight(w) for w in roofline.weights(n, k, torch.bfloat16, cold_mib)],
                                  repeats, min_seconds, op=packed_linear, kind="decode", name=name)
                  for name, (k, n) in roofline.PROJECTIONS.items()]
        floors["bfloat16"]["packed_matmul_floor_ms"] = roofline.step_matmul_ms(packed, threads, "bfloat16", batch)
    return floors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="rounds over the five engines (best of all kept)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/decode_step.json"))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # "weights:lean" — one engine, its result on stdout
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny random model, batch 2, 4 tokens, one round, small floors: checks the script runs")
    args = parser.parse_args()
    floor_args: dict[str, int] = {}
    if args.smoke:
        args.model, args.batch, args.tokens, args.repeats, args.rounds = "tiny-random", 2, 4, 1, 1
        floor_args = {"repeats": 1, "mib": 1, "cold_mib": 0}
    if args.one:
        weights, kind = args.one.split(":")
        policy = Policy(args.model, dtype="float32", compute_dtype="float32")
        policy.model.eval()
        one = measure(policy, weights, kind != "hf", kind == "lean-packed", args.batch, args.tokens, args.repeats)
        print("RESULT " + json.dumps(one))
        return
    threads = torch.get_num_threads()
    result: dict[str, Any] = {"machine": f"{platform.machine()}, {threads} threads, torch {torch.__version__}",
                              "cpu": cpu_identity(), "load_average_start": os.getloadavg(),
                              "workload": {"batch": args.batch, "tokens": args.tokens, "repeats": args.repeats,
                                           "rounds": args.rounds, "model": args.model}}
    before = floors_now(args.batch, **floor_args)
    # decode path: transformers' modules, the lean step (the default), the lean step with the copy held packed
    # (`engine.pack_weights: true`, where the CPU's oneDNN packs bf16)
    configs = (("shared", "hf"), ("shared", "lean"), ("copy", "hf"), ("copy", "lean"), ("copy", "lean-packed"))
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {c: [] for c in configs}
    for _ in range(args.rounds):
        for weights, kind in configs:  # each engine in a process of its own, as in a run
            out = subprocess.run([sys.executable, __file__, "--one", f"{weights}:{kind}",
                                  "--batch", str(args.batch), "--tokens", str(args.tokens),
                                  "--repeats", str(args.repeats), "--model", args.model],
                                 capture_output=True, text=True, check=True)
            line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
            runs[weights, kind].append(json.loads(line.removeprefix("RESULT ")))
    after = floors_now(args.batch, **floor_args)
    result["floors"] = {"before": before, "after": after,
                        "used": "the lower of before and after (the fastest kernels seen: the strictest floor)"}
    result["engines"] = []
    for weights, kind in configs:
        r = min(runs[weights, kind], key=lambda x: x["best_wall_ms_per_step"])  # its profile and op table
        r["decode_path"] = kind
        r["wall_ms_per_step"] = [w for x in runs[weights, kind] for w in x["wall_ms_per_step"]]
        r["best_wall_ms_per_step"] = min(r["wall_ms_per_step"])
        shares = []
        for floor in ("matmul_floor_ms", "packed_matmul_floor_ms", "bandwidth_floor_ms"):
            if floor not in before[r["dtype"]]:
                continue
            r[floor] = min(before[r["dtype"]][floor], after[r["dtype"]][floor])
            r["fraction_of_" + floor.removesuffix("_ms")] = r[floor] / r["best_wall_ms_per_step"]
            shares.append(f"{floor.removesuffix('_ms').replace('_', ' ')} {r[floor]:.1f} ms "
                        f"({100 * r[floor] / r['best_wall_ms_per_step']:.0f} %)")
        result["engines"].append(r)
        walls = ", ".join(f"{w:.1f}" for w in r["wall_ms_per_step"])
        ops = r["top_ops_ms_per_step"]
        mm = ops.get("aten::mm", 0.0) + ops.get("mkldnn::_linear_pointwise", 0.0)
        print(f"{weights:6s} ({r['dtype']}, {kind}{', packed' if r['packed_weights'] else ''}): wall {walls} ms/step "
              f"at batch {args.batch}; ops {r['op_ms_per_step']:.1f} ms/step, of which {mm:.1f} matmul; "
              + "; ".join(shares), flush=True)
    result["load_average_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
