"""The main job on one CUDA GPU in bf16 with the embedded engine (issue 31's device check).

Runs ``agentrl fit --config configs/rtpo.yaml`` unchanged except for what a GPU needs: ``trainer.accelerator gpu``,
``compute_dtype bfloat16`` (explicit, not ``auto``), the peak bf16 FLOP/s of the chip for ``perf/mfu``, a CSV logger
(the device machine has no MLflow) and a step count. A second run scales the batch (more trunks a step, larger
micro-batches) to show where the update's MFU goes when the GPU has work to do. Each run is timed from outside, the
GPU's memory is sampled with ``nvidia-smi`` every 0.2 s, and the per-step figures are read back from the run's
``metrics.csv``. One JSON with everything (and the GPU's identity and a measured 8192³ bf16 matmul, the achievable
peak beside the datasheet's) goes to ``--out``.

MFU here is ``perf/mfu``: forward + backward FLOPs of the trained tokens (6 N per token, `agentrl.training.system.perf`)
over the update's wall time and the chip's peak. It leaves out the π_old recompute forward and the attention term,
so it is a lower bound of the arithmetic the update does.

Usage (on the device machine; SmolLM2's GGUF is carried in, see docs/benchmarks.md "The main job on a GPU")::

    python benchmarks/cuda_main_job.py --model /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf --out $OUT
    python benchmarks/cuda_main_job.py --smoke --out $OUT      # tiny random model, 2 steps: does it run at all
    python benchmarks/cuda_main_job.py --cpu-check --out DIR   # the same on the CPU, no GPU needed
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from agentrl.training.system.perf import measure_peak_flops

# NVIDIA H200 SXM datasheet: 1,979 TFLOP/s bf16 Tensor Core *with sparsity*; dense is half of it
H200_BF16_DENSE = 989.5e12
PER_STEP = ("perf/step_seconds", "perf/rollout_tokens_per_s", "perf/train_tokens_per_s", "perf/mfu",
            "perf/generated_tokens", "perf/engine_push_s", "perf/engine_weights_mib", "rollout/success",
            "rollout/reward", "train/optimizer_steps", "train/skipped_updates", "rollout/logprob_mismatch_kl")


class GpuMemory:
    """Peak ``memory.used`` (MiB) of GPU 0 while the run lasts, read with nvidia-smi every 0.2 s."""

    def __init__(self, enabled: bool = True) -> None:
        self.peak = 0.0
        self.enabled = enabled
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                                 capture_output=True, text=True, check=False).stdout.strip()
            if out:
                self.peak = max(self.peak, float(out.splitlines()[0]))
            self._stop.wait(0.2)

    def __enter__(self) -> GpuMemory:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.enabled:
            self._thread.join()


def read_metrics(path: Path) -> tuple[list[dict[str, float]], dict[str, float]]:
    """Per-step rows (one per training step, keys of PER_STEP) and the evaluation rows' figures (first and last)."""
    steps: dict[int, dict[str, float]] = {}
    evals: list[dict[str, float]] = []
    with path.open() as fh:
        for row in csv.DictReader(fh):
            values = {k: float(v) for k, v in row.items() if v not in ("", None)}
            if "eval/success" in values:
                evals.append(values)
            if any(k in values for k in PER_STEP):
                merged = steps.setdefault(int(values.get("step", -1)), {})
                merged.update({k: values[k] for k in PER_STEP if k in values})
    rows = [dict(step=float(s), **v) for s, v in sorted(steps.items()) if "perf/step_seconds" in v]
    held_out = {}
    if evals:
        held_out = {"base_success": evals[0]["eval/success"], "final_success": evals[-1]["eval/success"]}
    return rows, held_out


def run_fit(name: str, model: str, steps: int, extra: list[str], out: Path, accelerator: str = "gpu") -> dict[str, Any]:
    folder = Path("/tmp/agentrl_cuda") / name
    shutil.rmtree(folder, ignore_errors=True)  # an earlier run's CSV versions would be read as this run's
    folder.mkdir(parents=True)
    config = Path(__file__).resolve().parent.parent / "configs" / "rtpo.yaml"
    cmd = [sys.executable, "-m", "agentrl", "fit", "--config", str(config),
           "--trainer.accelerator", accelerator, "--trainer.devices", "1",
           "--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir", str(folder / "csv"),
           "--checkpoint.dirpath", str(folder / "ckpt"),
           "--model.policy.init_args.model", model, "--model.policy.init_args.compute_dtype", "bfloat16",
           "--model.peak_flops", str(H200_BF16_DENSE), "--data.steps", str(steps), *extra]
    print(f"[{name}] {' '.join(cmd)}", flush=True)
    log_path = out / f"{name}.log"
    with GpuMemory(enabled=accelerator == "gpu") as memory, log_path.open("w") as log:
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=folder, stdout=log, stderr=subprocess.STDOUT, check=False)
        wall = time.perf_counter() - start
    print(log_path.read_text()[-3000:], flush=True)
    result: dict[str, Any] = {"name": name, "command": cmd, "returncode": proc.returncode, "wall_s": round(wall, 1),
                              "peak_gpu_memory_mib": memory.peak}
    metrics = sorted((folder / "csv").rglob("metrics.csv"))
    if metrics:  # back with the results even when the run failed or the call runs out of time after it
        shutil.copy(metrics[-1], out / f"{name}_metrics.csv")
    if proc.returncode == 0 and metrics:
        rows, held_out = read_metrics(metrics[-1])
        result.update(held_out=held_out, steps=rows)
        later = rows[1:] or rows  # the first step pays CUDA's warm-up (kernels, allocator)
        for key in ("perf/step_seconds", "perf/rollout_tokens_per_s", "perf/train_tokens_per_s", "perf/mfu"):
            vals = [r[key] for r in later if key in r]
            if vals:
                result[f"mean_after_first/{key}"] = sum(vals) / len(vals)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="policy model (a .gguf path on the device)")
    parser.add_argument("--steps", type=int, default=15, help="steps of the main job (its config has 15)")
    parser.add_argument("--scaled-steps", type=int, default=2, help="steps of the scaled-batch run (0: skip it)")
    parser.add_argument("--smoke", action="store_true", help="tiny random model, 2 steps, no scaled run")
    parser.add_argument("--cpu-check", action="store_true", help="run the smoke test on the CPU (checks this script)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "cuda_main_job")))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.cpu_check:
        run = run_fit("cpu_check", "tiny-random", 2, ["--data.eval_episodes", "4"], args.out, accelerator="cpu")
        (args.out / "cuda_main_job.json").write_text(json.dumps({"runs": [run]}, indent=1))
        print(json.dumps(run, indent=1)[:3000])
        return 0 if run["returncode"] == 0 and run.get("steps") else 1
    if not torch.cuda.is_available():
        print("no CUDA device: this benchmark runs on a GPU machine only", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    report: dict[str, Any] = {
        "gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
        "sm_count": props.multi_processor_count,
        "torch": torch.__version__, "cuda": torch.version.cuda, "peak_bf16_dense_flops_datasheet": H200_BF16_DENSE,
        # best of 10 back-to-back products (an earlier committed figure, 785-797, was their mean)
        "measured_bf16_matmul_8192_tflops": round(
            measure_peak_flops(torch.device("cuda"), torch.bfloat16, n=8192, reps=10) / 1e12, 1),
        "runs": []}
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}), flush=True)
    plan = [("smoke", "tiny-random", 2, ["--data.eval_episodes", "4"])] if args.smoke else [
        ("main_job", args.model, args.steps, []),
        # 8x the trunks a step and 16x the micro-batch: the main job's own batch is a few thousand tokens
        ("scaled_batch64", args.model, args.scaled_steps,
         ["--data.batch_size", "64", "--model.micro_batch_tokens", "16384", "--data.eval_episodes", "0"])]
    for name, model, steps, extra in plan:
        if steps:
            report["runs"].append(run_fit(name, model, steps, extra, args.out))
            # written after each run: a call that runs out of time keeps what finished
            (args.out / "cuda_main_job.json").write_text(json.dumps(report, indent=1))
    for run in report["runs"]:
        means = {k: round(v, 4) for k, v in run.items() if k.startswith("mean_after_first/")}
        print(run["name"], "rc", run["returncode"], "wall", run["wall_s"], "s",
              "peak GPU MiB", run["peak_gpu_memory_mib"], means, run.get("held_out"))
    return 0 if all(r["returncode"] == 0 for r in report["runs"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
