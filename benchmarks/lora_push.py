"""LoRA push time: one weight push from the trainer to a running ``agentrl serve``, the way training does it.

Starts ``agentrl serve`` on SmolLM2-135M-Instruct with the shipped LoRA shape (``configs/rtpo_vllm.yaml``: r = 8,
alpha = 16, q_proj and v_proj) on 127.0.0.1, builds the trainer-side policy with the same LoRA, and times
``VLLMEngine.update_weights`` (save the adapter with ``save_pretrained``, ``POST /v1/load_lora_adapter``, unload
the previous adapter) several times, with its parts timed apart. The adapter's weights change between pushes (as
after an update), and a completion after each push checks that the server serves the new version. The first push
also pays one-off costs (``/v1/models`` lookup, first imports on both sides).

Usage::

    python benchmarks/lora_push.py [--pushes 5] [--out benchmarks/results]
    python benchmarks/lora_push.py --smoke --out /tmp/lp    # tiny random model, seconds: does it run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from serve_process import start_serve

from agentrl.engines import vllm
from agentrl.engines.base import SamplingParams
from agentrl.engines.vllm import VLLMEngine
from agentrl.models.policy import LoRASettings, Policy
from agentrl.models.precision import cpu_identity

MODEL = "smollm2-135m-instruct"
LORA = LoRASettings(r=8, alpha=16, target_modules=["q_proj", "v_proj"])


def perturb(policy: Policy, step: int) -> None:
    """Change every LoRA B matrix (as an update would), so each push carries new weights."""
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.full_like(p, 1e-3 * (step + 1)))


class Timed:
    """Wraps a function and adds the seconds each call takes to ``self.seconds``."""

    def __init__(self, fn: Any, is_async: bool) -> None:
        self.fn, self.is_async, self.seconds = fn, is_async, 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.is_async:
            return self._acall(*args, **kwargs)
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start

    async def _acall(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


async def pushes(policy: Policy, url: str, root: Path, n: int) -> list[dict[str, float]]:
    engine = VLLMEngine([url], adapter_dir=str(root / "adapters"))
    prompt = list(policy.tokenizer.encode("Guess a number between 1 and 10."))
    rows = []
    for i in range(n):
        perturb(policy, i)
        save = Timed(vllm._save_adapter, is_async=False)
        load, unload = Timed(engine._load, is_async=True), Timed(engine._unload, is_async=True)
        vllm._save_adapter, engine._load, engine._unload = save, load, unload  # type: ignore[method-assign]
        start = time.perf_counter()
        await engine.update_weights(policy)
        total = time.perf_counter() - start
        vllm._save_adapter, engine._load, engine._unload = save.fn, load.fn, unload.fn  # type: ignore[method-assign]
        out = await engine.generate(prompt, SamplingParams(max_tokens=4, seed=0))
        rows.append({"push_seconds": total, "save_seconds": save.seconds, "load_http_seconds": load.seconds,
                     "unload_http_seconds": unload.seconds, "served_version": out.policy_version})
        print(f"push {i}: {total:.3f} s (save_pretrained {save.seconds:.3f} s, load over HTTP {load.seconds:.3f} s, "
              f"unload the previous {unload.seconds:.3f} s); served version {out.policy_version}")
    await engine.shutdown()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pushes", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--smoke", action="store_true", help="tiny random model, 2 pushes: checks the script runs")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.pushes = "tiny-random", 2
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        proc, url = start_serve(args.model, root, LORA, timeout=300)
        try:
            policy = Policy(args.model, lora=LORA)
            rows = asyncio.run(pushes(policy, url, root, args.pushes))
        finally:
            proc.terminate()
            proc.wait(30)
    adapter_params = sum(p.numel() for n, p in policy.model.named_parameters() if "lora_" in n)
    result: dict[str, Any] = {
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
        "cpu": cpu_identity(),
        "model": args.model, "lora": {"r": LORA.r, "alpha": LORA.alpha, "target_modules": LORA.target_modules},
        "adapter_parameters": adapter_params, "pushes": rows,
        "median_push_seconds": statistics.median(r["push_seconds"] for r in rows),
        "max_push_seconds": max(r["push_seconds"] for r in rows),
    }
    print(f"LoRA push ({adapter_params} adapter parameters): median {result['median_push_seconds']:.3f} s, "
          f"max {result['max_push_seconds']:.3f} s over {len(rows)} pushes")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lora_push.json").write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out / 'lora_push.json'}")


if __name__ == "__main__":
    main()
