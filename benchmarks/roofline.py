"""The roofline of this machine: memory read bandwidth and fp32/bf16 matmul speed at decode and update shapes.

What the engine's decode step and the trainer's update can at best reach here (issue 31):

* **Read bandwidth**: ``x.sum()`` over a large fp32 tensor (bytes read / time) and ``dst.copy_(src)`` (bytes read
  plus bytes written / time), at a few sizes (the smallest may sit partly in the L3 cache), at one thread and at
  all threads.
* **Matmuls** with the model's layout (``linear(x, W)``, ``W`` of shape out × in, as in ``nn.Linear``) in fp32 and
  in bf16 (bf16 weights and inputs, what a bf16-weight engine runs): decode shapes, 1–16 rows against each of
  SmolLM2-135M's projections (hidden 576, k/v 192, MLP 1536, vocabulary 49,152), and update shapes (2,048 rows).
* **Decode-step floors** for SmolLM2-135M: the bytes of its weights over the best read bandwidth (a decode step
  reads every weight once), in fp32 and bf16; and the sum of the measured matmul times of one step's projections at
  12 and 16 rows (the GEMMs alone, no attention, no sampling, no Python).

Every figure is the best of several repeats (a repeat is one or more calls, timed together, at least
``--min-seconds`` long), after a warm-up: on a machine shared with other jobs the best is the closest to what the
hardware does; the load average at the start and the end is recorded with the results.

    nice -n 5 python benchmarks/roofline.py            # writes benchmarks/results/roofline.json
    python benchmarks/roofline.py --smoke --out /tmp/roofline.json   # seconds: does it run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.nn.functional import linear

from agentrl.models.precision import cpu_identity

# SmolLM2-135M (HuggingFaceTB/SmolLM2-135M-Instruct config.json): tied input/output embeddings
HIDDEN, KV, MLP, VOCAB, LAYERS = 576, 192, 1536, 49152, 30
PROJECTIONS = {"q/o 576->576": (HIDDEN, HIDDEN), "k/v 576->192": (HIDDEN, KV), "gate/up 576->1536": (HIDDEN, MLP),
               "down 1536->576": (MLP, HIDDEN), "lm_head 576->49152": (HIDDEN, VOCAB)}
PER_LAYER = {"q/o 576->576": 2, "k/v 576->192": 2, "gate/up 576->1536": 2, "down 1536->576": 1}
UPDATE_SHAPES = {"mlp up 2048x576x1536": (2048, HIDDEN, MLP), "mlp down 2048x1536x576": (2048, MLP, HIDDEN),
                 "cube 512^3": (512, 512, 512)}
DECODE_ROWS = (1, 2, 4, 8, 12, 16)
FLOOR_MIB = 128  # the floors use the read bandwidth of tensors at least this large (beyond the L3 cache)
ENGINE_FP32_MS = 193.0  # issue 31: embedded engine, fp32, 49 tok/s at a mean decode batch of 12.5


def smollm2_parameters() -> int:
    """SmolLM2-135M's parameter count: 30 layers of attention (9 query heads, 3 key/value heads of 64), a SwiGLU
    MLP and two RMSNorms, the final norm and the (tied) embedding. A decode step reads each of them once."""
    attention = 2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV
    layer = attention + 3 * HIDDEN * MLP + 2 * HIDDEN
    return LAYERS * layer + HIDDEN + VOCAB * HIDDEN


def best_seconds(fn: Callable[[], Any], repeats: int, min_seconds: float) -> float:
    """Best seconds per call of ``fn`` over ``repeats`` repeats, each at least ``min_seconds`` of calls."""
    fn()  # warm-up
    start = time.perf_counter()
    fn()
    calls = max(1, int(min_seconds / max(time.perf_counter() - start, 1e-9)))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def bandwidth(threads: int, mib: int, repeats: int, min_seconds: float) -> list[dict[str, Any]]:
    """GB/s of a sum (bytes read) and a copy (bytes read + written) over an fp32 tensor of ``mib`` MiB."""
    src = torch.rand(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    size = src.numel() * 4
    rows = []
    for op, fn, moved in (("sum (read)", src.sum, size), ("copy (read+write)", lambda: dst.copy_(src), 2 * size)):
        seconds = best_seconds(fn, repeats, min_seconds)
        rows.append({"threads": threads, "op": op, "mib": mib, "gb_per_s": moved / seconds / 1e9})
    return rows


def weights(n: int, k: int, dtype: torch.dtype, cold_mib: int) -> list[torch.Tensor]:
    """An (n × k) weight in ``dtype`` and copies of it that together hold at least ``cold_mib`` MiB: a decode step
    streams 30 layers of weights from memory, and one weight reused would sit in L2 and flatter small shapes."""
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(0)).to(dtype)
    count = max(1, -(-cold_mib * 2**20 // (w.numel() * w.element_size())))
    return [w] + [w.clone() for _ in range(count - 1)]


def matmul(threads: int, m: int, ws: list[torch.Tensor], repeats: int, min_seconds: float,
           op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = linear, **labels: Any) -> dict[str, Any]:
    """``op`` (``linear``, or another kernel taking the weights as ``ws`` holds them) of (m × k) rows by the
    (n × k) weights ``ws``, one after the other: ms, GFLOP/s, weight GB/s."""
    n, k = ws[0].shape
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(ws[0].dtype)
    turn = iter(range(1 << 62))
    seconds = best_seconds(lambda: op(x, ws[next(turn) % len(ws)]), repeats, min_seconds)
    nbytes = n * k * ws[0].element_size()
    return {"threads": threads, "dtype": str(ws[0].dtype)[6:], **labels, "m": m, "k": k, "n": n,
            "ms": seconds * 1e3, "gflop_per_s": 2 * m * k * n / seconds / 1e9,
            "weight_gb_per_s": nbytes / seconds / 1e9, "weight_copies": len(ws)}


def measure(threads: int, args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    torch.set_num_threads(threads)
    rep, mins = args.repeats, args.min_seconds
    bw = [row for mib in args.mib for row in bandwidth(threads, mib, rep, mins)]
    mm = []
    for dtype in (torch.float32, torch.bfloat16):
        for name, (k, n) in PROJECTIONS.items():
            ws = weights(n, k, dtype, args.cold_mib)
            mm += [matmul(threads, m, ws, rep, mins, kind="decode", name=name) for m in DECODE_ROWS]
        for name, (m, k, n) in UPDATE_SHAPES.items():
            mm.append(matmul(threads, m, weights(n, k, dtype, 0), rep, mins, kind="update", name=name))
    return {"bandwidth": bw, "matmul": mm}


def step_matmul_ms(rows: list[dict[str, Any]], threads: int, dtype: str, m: int) -> float:
    """ms of one SmolLM2-135M decode step's projections at ``m`` rows, from the measured shapes."""
    ms = {r["name"]: r["ms"] for r in rows if r["kind"] == "decode" and r["threads"] == threads
          and r["dtype"] == dtype and r["m"] == m}
    return LAYERS * sum(count * ms[name] for name, count in PER_LAYER.items()) + ms["lm_head 576->49152"]


def floors(results: dict[str, list[dict[str, Any]]], threads: int) -> dict[str, Any]:
    """Decode-step floors of SmolLM2-135M at ``threads`` threads: weight bytes / best read bandwidth (of tensors of
    at least ``FLOOR_MIB``), and the sum of the measured projection matmuls at 12 and 16 rows."""
    sums = [r for r in results["bandwidth"] if r["threads"] == threads and r["op"] == "sum (read)"]
    large = [r for r in sums if r["mib"] >= FLOOR_MIB] or sums  # tensors beyond the caches, as the weights are
    read = max(r["gb_per_s"] for r in large)
    params = smollm2_parameters()
    out: dict[str, Any] = {"threads": threads, "parameters": params, "read_gb_per_s": read}
    for dtype, size in (("float32", 4), ("bfloat16", 2)):
        weight_ms = params * size / (read * 1e9) * 1e3
        out[dtype] = {"weight_mb": params * size / 1e6, "bandwidth_floor_ms": weight_ms,
                      "matmul_sum_ms": {m: step_matmul_ms(results["matmul"], threads, dtype, m) for m in (12, 16)},
                      "engine_fp32_ms_over_floor": ENGINE_FP32_MS / weight_ms if dtype == "float32" else None}
    return out


def print_tables(result: dict[str, Any]) -> None:
    print(f"{'threads':>7} {'op':<18} {'MiB':>5} {'GB/s':>7}")
    for r in result["bandwidth"]:
        print(f"{r['threads']:>7} {r['op']:<18} {r['mib']:>5} {r['gb_per_s']:7.2f}")
    print(f"\n{'threads':>7} {'dtype':<9} {'shape':<24} {'rows':>5} {'ms':>9} {'GFLOP/s':>8} {'weight GB/s':>11}")
    for r in result["matmul"]:
        print(f"{r['threads']:>7} {r['dtype']:<9} {r['name']:<24} {r['m']:>5} {r['ms']:9.3f} {r['gflop_per_s']:8.1f} "
              f"{r['weight_gb_per_s']:11.2f}")
    for f in result["decode_floor"]:
        for dtype in ("float32", "bfloat16"):
            d = f[dtype]
            print(f"\nSmolLM2-135M decode step, {dtype}, {f['threads']} threads: {d['weight_mb']:.0f} MB of weights / "
                  f"{f['read_gb_per_s']:.2f} GB/s = {d['bandwidth_floor_ms']:.1f} ms; projection matmuls "
                  f"{d['matmul_sum_ms'][12]:.1f} ms at 12 rows, {d['matmul_sum_ms'][16]:.1f} ms at 16 rows", end="")
    print()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=sorted({1, os.cpu_count() or 1}))
    p.add_argument("--mib", type=int, nargs="+", default=[32, 128, 512], help="tensor sizes of the bandwidth test")
    p.add_argument("--cold-mib", type=int, default=256, help="weight copies a decode shape cycles through (MiB)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--min-seconds", type=float, default=0.01, help="shortest timed repeat")
    p.add_argument("--note", default="", help="the conditions in words (e.g. other jobs running), kept in the JSON")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/roofline.json"))
    p.add_argument("--smoke", action="store_true", help="one thread, 1 MiB, one repeat: checks the script runs")
    args = p.parse_args(argv)
    if args.smoke:
        args.threads, args.mib, args.repeats, args.min_seconds, args.cold_mib = [1], [1], 1, 0.0, 0
    load_start, start = os.getloadavg(), time.perf_counter()
    result: dict[str, Any] = {"bandwidth": [], "matmul": []}
    for threads in args.threads:
        for key, rows in measure(threads, args).items():
            result[key] += rows
    result["decode_floor"] = [floors(result, t) for t in args.threads]
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}",
              "cpu": cpu_identity(),
              "conditions": {"note": args.note, "load_average_1_5_15_start": load_start,
                             "load_average_1_5_15_end": os.getloadavg(),
                             "niceness": os.nice(0), "wall_seconds": time.perf_counter() - start,
                             "method": f"best of {args.repeats} repeats of >= {args.min_seconds} s after a warm-up"},
              "engine_fp32_ms_per_step": {"value": ENGINE_FP32_MS, "source": "issue 31: 49 tok/s at batch 12.5"},
              **result}
    print_tables(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
