"""How much memory oneDNN's kernel caches keep, and what capping them costs (issue 31: where the main job's resident
set grows).

PyTorch runs CPU bf16 matmuls through oneDNN, which keeps each kernel it builds (one per matrix shape, with its
scratch memory) in two caches of 1,024 entries by default: oneDNN's own (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``) and
ideep's (``LRU_CACHE_CAPACITY``). Each setting runs in a fresh process (the sizes are read once, at the first
kernel), one thread:

* **varying shapes** (the update and the prefills): a bf16-autocast ``linear`` of SmolLM2's MLP shape (576 -> 1536)
  and back, forward and backward, at 200 row counts (100, 105, ..., 1,095); the resident set after it, over the one
  before (freed pages returned with ``malloc_trim`` first), and the seconds it took;
* **repeating shapes** (decoding): bf16 weights, the same two projections at 8, 12 and 16 rows, 300 rounds; ms per
  round (a cache too small to hold them rebuilds a kernel at every call).

The settings: the default (1,024), the cap the ``agentrl`` command sets (64, `agentrl.models.memory`), and 4 (too
small: decoding rebuilds its kernels).

    python benchmarks/kernel_cache.py               # writes benchmarks/results/kernel_cache.json
    python benchmarks/kernel_cache.py --smoke --out /tmp/kernel_cache.json   # seconds: does it run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SETTINGS = {"default (1,024)": None, "agentrl's cap (64)": "64", "too small (4)": "4"}
NAMES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def probe(smoke: bool = False) -> dict[str, float]:
    """The two workloads in this process (see the module docstring); ``smoke``: 10 shapes and 10 rounds."""
    import torch
    from torch.nn.functional import linear

    from agentrl.models.memory import release_memory, resident_mib

    torch.set_num_threads(1)
    torch.manual_seed(0)
    w = torch.randn(1536, 576)
    rows = torch.randn(1100, 576)
    release_memory()
    before = (resident_mib() or (0.0, 0.0))[0]
    start = time.perf_counter()
    for m in range(100, 1100, 100 if smoke else 5):
        x = rows[:m].clone().requires_grad_()
        weight = w.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = linear(x, weight) @ weight
        y.float().sum().backward()
    varying_s = time.perf_counter() - start
    release_memory()
    growth = (resident_mib() or (0.0, 0.0))[0] - before
    up = torch.randn(1536, 576, dtype=torch.bfloat16)
    down = torch.randn(576, 1536, dtype=torch.bfloat16)
    xs = [torch.randn(b, 576, dtype=torch.bfloat16) for b in (8, 12, 16)]
    with torch.no_grad():
        for x in xs:  # warm-up: build the kernels once
            linear(linear(x, up), down)
        start = time.perf_counter()
        rounds = 10 if smoke else 300
        for _ in range(rounds):
            for x in xs:
                linear(linear(x, up), down)
        repeating_ms = (time.perf_counter() - start) * 1e3 / rounds
    return {"varying_shapes_growth_mib": growth, "varying_shapes_s": varying_s, "repeating_shapes_ms": repeating_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/kernel_cache.json"))
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)  # the child process
    parser.add_argument("--smoke", action="store_true", help="10 shapes and 10 rounds: checks the script runs")
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe(args.smoke)))
        return
    from agentrl.models.precision import cpu_identity

    out: dict[str, Any] = {"machine": f"{platform.machine()}, 1 thread, {os.cpu_count()} cpus", "cpu": cpu_identity(),
                           "load_average_start": list(os.getloadavg()), "smoke": args.smoke, "runs": {}}
    for label, cap in SETTINGS.items():
        env = {k: v for k, v in os.environ.items() if k not in NAMES}
        if cap is not None:
            env.update(dict.fromkeys(NAMES, cap))
        smoke = ["--smoke"] if args.smoke else []
        done = subprocess.run([sys.executable, __file__, "--probe", *smoke], env=dict(env, OMP_NUM_THREADS="1"),
                              check=True, capture_output=True, text=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        out["runs"][label] = result
        print(f"{label:20s} varying shapes: +{result['varying_shapes_growth_mib']:5.0f} MiB resident, "
              f"{result['varying_shapes_s']:5.2f} s; repeating shapes: {result['repeating_shapes_ms']:.3f} ms a round",
              flush=True)
    out["load_average_end"] = list(os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
