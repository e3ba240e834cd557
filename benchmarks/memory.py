"""Where the main job's memory goes: peak RSS per phase of ``agentrl fit --config configs/rtpo.yaml``.

Each variant runs the real command in its own process (``agentrl.cli.main`` in process, so its phases can be
timed and measured), one training step, no evaluation. A thread samples the resident set size (``VmRSS``)
every 10 ms; each phase (model load, rollouts, scoring, update, weight push, checkpoint, final model save)
records the RSS when it starts and ends and the peak while it runs. A held-out evaluation (``--data.eval_episodes``
set after ``--``) is a phase of its own, holding the rollouts it runs. After the run: the bytes of the weights,
gradients and optimizer state, and the process's peak RSS (``VmHWM``, what ``/usr/bin/time -v`` reports as
"Maximum resident set size").

Usage::

    python benchmarks/memory.py [-- EXTRA_FIT_ARGS...]      # one run of this checkout, breakdown printed
    python benchmarks/memory.py --compare [--before REV]     # this checkout and REV's code (default: main), one
                                                             # after the other -> benchmarks/results/memory.json
    python benchmarks/memory.py --smoke --out /tmp/mem       # one step of configs/smoke/rtpo.yaml: does it run

The "before" run uses the ``src/`` of git revision REV (extracted with ``git archive``) with the same config file.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.models.memory import resident_mib

CONFIG = "configs/rtpo.yaml"
BASE_ARGS = ["--trainer.max_steps=1", "--data.eval_episodes", "0"]


def rss_mb(peak: bool = False) -> float:
    """The resident set now (or the process's peak), MiB (`agentrl.models.memory.resident_mib`; 0 without procfs)."""
    memory = resident_mib()
    return 0.0 if memory is None else memory[1 if peak else 0]


class Recorder:
    """Samples RSS in a thread; phases record start/end RSS and their peak."""

    def __init__(self) -> None:
        self.phases: list[dict[str, Any]] = []
        self._open: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            now = rss_mb()
            for phase in list(self._open):
                phase["peak_mb"] = max(phase["peak_mb"], now)
            time.sleep(0.01)

    def wrap(self, owner: Any, attr: str, label: str) -> None:
        fn: Callable[..., Any] = getattr(owner, attr)

        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            start = rss_mb()
            phase: dict[str, Any] = {"phase": label, "start_mb": start, "peak_mb": start}
            self._open.append(phase)
            try:
                return fn(*args, **kwargs)
            finally:
                self._open.remove(phase)
                phase["end_mb"] = rss_mb()
                phase["peak_mb"] = max(phase["peak_mb"], phase["end_mb"])
                self.phases.append(phase)
                print(f"[memory] {label:28s} start {start:7.0f} MB  peak {phase['peak_mb']:7.0f} MB  end "
                      f"{phase['end_mb']:7.0f} MB", flush=True)

        setattr(owner, attr, wrapped)

    def stop(self) -> None:
        self._stop.set()


def tensor_bytes(module: Any) -> dict[str, float]:
    """MB of the module's weights, gradients and optimizer state (live tensors, not RSS)."""
    import torch

    params = list(module.parameters())
    weights = sum(p.numel() * p.element_size() for p in params)
    grads = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    state = 0
    for opt in getattr(module, "_memory_optimizers", []):
        for s in opt.state.values():
            state += sum(t.numel() * t.element_size() for t in s.values() if isinstance(t, torch.Tensor))
    return {"weights_mb": weights / 2**20, "grads_mb": grads / 2**20, "optimizer_state_mb": state / 2**20}


def run_one(config: str, extra: list[str]) -> dict[str, Any]:
    """Run one step of the main job in this process and return the phase breakdown."""
    from lightning.pytorch import Trainer

    from agentrl import cli
    from agentrl.models import policy as policy_mod
    from agentrl.models.policy import Policy
    from agentrl.training.system.module import AgentRLModule

    baseline = rss_mb()
    rec = Recorder()
    rec.wrap(policy_mod, "load_model", "load model (GGUF)")
    rec.wrap(AgentRLModule, "evaluate", "held-out evaluation")
    rec.wrap(AgentRLModule, "collect", "rollouts (engine)")
    rec.wrap(AgentRLModule, "logprobs", "score old log-probs")
    rec.wrap(AgentRLModule, "update", "update (PPO epochs)")
    rec.wrap(AgentRLModule, "push_weights", "push weights")
    rec.wrap(Trainer, "save_checkpoint", "checkpoint")
    rec.wrap(Policy, "save", "final model save")
    modules: list[Any] = []
    original_setup = AgentRLModule.setup

    def setup(self: Any, stage: str) -> None:
        modules.append(self)
        original_setup(self, stage)

    AgentRLModule.setup = setup  # type: ignore[method-assign]
    start = time.perf_counter()
    cli.main(["fit", "--config", config, *BASE_ARGS, *extra])
    rec.stop()
    out: dict[str, Any] = {"args": extra, "baseline_after_imports_mb": baseline, "phases": rec.phases,
                           "peak_rss_mb": rss_mb(peak=True), "seconds": time.perf_counter() - start}
    if modules:
        module = modules[0]
        module._memory_optimizers = module.optimizers(use_pl_optimizer=False)
        if not isinstance(module._memory_optimizers, list):
            module._memory_optimizers = [module._memory_optimizers]
        out["tensors"] = tensor_bytes(module)
    print(f"[memory] peak RSS {out['peak_rss_mb']:.0f} MB; tensors {out.get('tensors')}", flush=True)
    return out


def child(out: Path, cwd: Path, src: Path, extra: list[str]) -> dict[str, Any]:
    """Run one measured fit in a fresh process with ``src`` first on the path."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--json", str(out), "--config", str(Path(CONFIG).resolve()),
           "--", *extra]
    path = os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])
    subprocess.run(cmd, check=True, cwd=cwd, env=dict(os.environ, PYTHONPATH=path))
    return dict(json.loads(out.read_text()))


def compare(out_dir: Path, before: str, extra: list[str]) -> None:
    from agentrl.models.precision import cpu_identity  # lazily, as the rest of agentrl here

    rev = subprocess.run(["git", "rev-parse", "--short", before], check=True, capture_output=True,
                         text=True).stdout.strip()
    here = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    results: dict[str, Any] = {"machine": f"{platform.machine()}, {os.cpu_count()} cpus", "cpu": cpu_identity(),
                               "config": CONFIG,
                               "command": f"agentrl fit --config {CONFIG} {' '.join(BASE_ARGS + extra)}",
                               "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        old_src = Path(tmp) / "before"
        old_src.mkdir()
        archive = subprocess.run(["git", "archive", rev, "src"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old_src)], input=archive, check=True)
        for name, src in ((f"before ({rev})", old_src / "src"), (f"after ({here} + working tree)", Path("src"))):
            work = Path(tmp) / ("run-" + name.split()[0])
            work.mkdir()
            print(f"=== {name}", flush=True)
            results["runs"][name] = child(work / "result.json", work, src.resolve(), extra)
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "memory.json").write_text(json.dumps(results, indent=2))  # each run as it ends
    for name, r in results["runs"].items():
        print(f"{name:40s} peak RSS {r['peak_rss_mb'] / 1024:5.2f} GiB")
    print(f"wrote {out_dir / 'memory.json'}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compare", action="store_true", help="run before and after, write memory.json")
    parser.add_argument("--before", default="main", help="git revision of the before run (with --compare)")
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--json", type=Path, default=None, help="write this run's breakdown here")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("extra", nargs="*", help="extra agentrl fit arguments (after --)")
    parser.add_argument("--smoke", action="store_true",
                        help="one step of configs/smoke/rtpo.yaml (tiny random model) in the current folder, its "
                             "breakdown to --json (default: --out/memory_smoke.json): checks the script runs")
    args = parser.parse_args()
    if args.smoke:
        args.config = str(Path(__file__).resolve().parent.parent / "configs" / "smoke" / "rtpo.yaml")
        args.json = args.json or args.out / "memory_smoke.json"
        args.json.parent.mkdir(parents=True, exist_ok=True)
    if args.compare:
        compare(args.out, args.before, args.extra)
        return
    result = run_one(args.config, args.extra)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
