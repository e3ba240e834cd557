"""The main job, two ways side by side: ``agentrl fit --config configs/rtpo.yaml`` run to the end by two code trees
(or two sets of overrides) at the same time, one thread each, the same seed (issue 31: the old default against the
new one).

Each side runs in its own folder (its ``mlflow.db`` and checkpoints) under GNU ``time -v``, with
``OMP_NUM_THREADS=1`` (or ``--threads``). When both are done the script reads each side's MLflow run back and writes
one JSON: wall time, user + system CPU, peak RSS, held-out success and return before and after, and the per-step
figures (step seconds, rollout and update tokens/s, generated tokens, the behaviour-mismatch metrics), with the
CPU identity beside ``machine``. The ratio old / new wall time is the figure of the comparison (both sides share
the machine's load, so read the ratio rather than the absolute times). Each log line is stamped with the seconds
since the side started, and the JSON splits the wall time at the run's own lines (``phases``: start-up and the base
evaluation, the steps, the final evaluation, the end: the final checkpoint and model). ``--sides new`` runs one side
alone (for example the default at two threads on an idle machine).

Usage::

    python benchmarks/main_job.py --old-src /path/to/old/checkout/src --out benchmarks/results/main_job_old_vs_new.json
    python benchmarks/main_job.py --old-args --model.engine.init_args.weights shared --new-args ...  # one tree
    python benchmarks/main_job.py --sides new --threads 2 --out benchmarks/results/main_job_default_2threads.json
    python benchmarks/main_job.py --smoke --out /tmp/mj/main_job.json    # tiny random model: does it run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from agentrl.models.precision import cpu_identity

STEP_KEYS = ("perf/step_seconds", "perf/rollout_tokens_per_s", "perf/train_tokens_per_s", "perf/generated_tokens",
             "perf/engine_push_s", "perf/engine_weights_mib", "rollout/reward", "rollout/success",
             "rollout/logprob_mismatch_kl", "rollout/recomputed_tokens", "train/approx_kl", "train/entropy",
             "perf/rss_mib", "perf/peak_rss_mib", "perf/collecting_peak_rise_mib", "perf/scoring_peak_rise_mib",
             "perf/updating_peak_rise_mib", "perf/between_peak_rise_mib", "rollout/staleness_mean",
             "rollout/staleness_max", "perf/trainer_wait_frac", "perf/engine_idle_frac")
# the run's own lines that split its wall time (agentrl.training.command.progress, agentrl.training.system.evaluation)
MARKS = {"base_eval_done": re.compile(r"^\[agentrl\] base evaluation"), "first_step": re.compile(r"^step\s+1/"),
         "last_step": re.compile(r"^step\s+(\d+)/\1\b"),
         "final_eval_done": re.compile(r"^\[agentrl\] final evaluation"), "done": re.compile(r"^\[agentrl\] done:")}


def command(config: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "agentrl", "fit", "--config", str(config), *extra]


class Side:
    """One side's process, its log copied line by line with the seconds since its start, and when each of
    ``MARKS`` first appeared."""

    def __init__(self, name: str, folder: Path, cmd: list[str], src: Path | None, threads: int,
                 extra_env: dict[str, str] | None = None) -> None:
        if folder.exists():  # an earlier run's mlflow.db would hold a second run
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        env = os.environ | {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} | (extra_env or {})
        if src is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        print(f"[{name}] {' '.join(cmd)}  (in {folder}, PYTHONPATH={env.get('PYTHONPATH', '')}, "
              f"env {extra_env or {}})", flush=True)
        self.marks: dict[str, float] = {}
        self.start = time.perf_counter()
        self.proc = subprocess.Popen(["/usr/bin/time", "-v", "-o", str(folder / "time.txt"), *cmd], cwd=folder,
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self._copier = threading.Thread(target=self._copy, args=(folder / "log.txt",), daemon=True)
        self._copier.start()

    def _copy(self, path: Path) -> None:
        assert self.proc.stdout is not None
        with path.open("w") as log:
            for raw in self.proc.stdout:
                now = time.perf_counter() - self.start
                line = raw.decode(errors="replace")
                log.write(f"{now:8.1f} {line}")
                log.flush()
                for mark, pattern in MARKS.items():
                    # not stripped: the status lines ("  step 3/3 · updating ...") are indented, the step lines not
                    if mark not in self.marks and pattern.search(line.rstrip("\n")):
                        self.marks[mark] = now

    def wait(self) -> int:
        code = self.proc.wait()
        self._copier.join()
        self.marks["exit"] = time.perf_counter() - self.start
        return code


def phases(marks: dict[str, float]) -> dict[str, float]:
    """Seconds of start-up + base evaluation, the steps (from the base evaluation's line to the last step's), the
    final evaluation, and what followed it (checkpoint, final model, MLflow), from the marks found."""
    order = ["base_eval_done", "last_step", "final_eval_done", "exit"]
    names = ["start_and_base_eval", "steps", "final_eval", "end"]
    out, previous = {}, 0.0
    for mark, name in zip(order, names, strict=True):
        if mark in marks:
            out[name] = marks[mark] - previous
            previous = marks[mark]
    return out


def gnu_time(path: Path) -> dict[str, float]:
    """Wall seconds, user/system CPU seconds and peak RSS (MiB) from a ``time -v`` report."""
    text = path.read_text()

    def field(label: str) -> str:
        match = re.search(rf"{re.escape(label)}: (.+)", text)
        if match is None:
            raise ValueError(f"{path}: no '{label}' line")
        return match.group(1).strip()

    parts = [float(p) for p in field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")]
    wall = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
    return {"wall_seconds": wall, "user_seconds": float(field("User time (seconds)")),
            "system_seconds": float(field("System time (seconds)")),
            "peak_rss_mib": float(field("Maximum resident set size (kbytes)")) / 1024}


def mlflow_figures(folder: Path) -> dict[str, Any]:
    """Held-out evaluations and per-step metrics of the (only) run in ``folder/mlflow.db``."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    if len(runs) != 1:
        raise ValueError(f"{folder}: expected one MLflow run, found {len(runs)}")
    run = runs[0]
    history = {k: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)]
               for k in run.data.metrics}
    eval_keys = ("eval/success", "eval/reward", "eval/peak_rise_mib", "eval/peak_rss_mib")
    evals = {k: [v for _, v in sorted(history[k])] for k in eval_keys if k in history}
    steps = {k: [v for _, v in sorted(history[k])] for k in STEP_KEYS if k in history}
    params = run.data.params
    return {"run_id": run.info.run_id, "eval": evals, "steps": steps,
            "resolved": {k: v for k, v in params.items() if k.startswith("resolved/")},
            "engine_weights_mib": (steps.get("perf/engine_weights_mib") or [0.0])[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=Path("configs/rtpo.yaml"))
    parser.add_argument("--old-config", type=Path, default=None, help="the old side's config (default: --config)")
    parser.add_argument("--old-src", type=Path, default=None, help="the old side's src/ (on PYTHONPATH)")
    parser.add_argument("--new-src", type=Path, default=None, help="the new side's src/ (default: the installed tree)")
    parser.add_argument("--old-args", nargs="*", action="extend", default=[],
                        help="overrides of the old side (repeat the flag: --old-args=--data.seed=1 --old-args=...)")
    parser.add_argument("--new-args", nargs="*", action="extend", default=[],
                        help="overrides of the new side (likewise)")
    parser.add_argument("--old-env", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
                        help="environment variables of the old side only")
    parser.add_argument("--new-env", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
                        help="environment variables of the new side only")
    parser.add_argument("--sides", nargs="+", choices=["old", "new"], default=["old", "new"],
                        help="run these sides only (one side alone: its figures, no ratio)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/agentrl-main-job"))
    parser.add_argument("--note", default="", help="the conditions in words, kept in the JSON")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/main_job_old_vs_new.json"))
    parser.add_argument("--smoke", action="store_true",
                        help="both sides on configs/smoke/rtpo.yaml, 1 step each, in a folder beside --out: checks "
                             "the script runs")
    args = parser.parse_args()
    if args.smoke:
        args.config = Path(__file__).resolve().parent.parent / "configs" / "smoke" / "rtpo.yaml"
        args.old_args, args.new_args = ["--data.steps", "1"], ["--data.steps", "1"]
        args.workdir = args.out.parent / "main_job_smoke"
    args.workdir = args.workdir.resolve()  # each side runs in its folder: a relative one would be taken from there
    configs = {"old": (args.old_config or args.config).resolve(), "new": args.config.resolve()}
    sides = {"old": (args.old_src.resolve() if args.old_src else None, args.old_args),
             "new": (args.new_src.resolve() if args.new_src else None, args.new_args)}
    sides = {name: side for name, side in sides.items() if name in args.sides}
    load_start = os.getloadavg()
    start = time.time()
    envs = {name: dict(kv.split("=", 1) for kv in values)
            for name, values in (("old", args.old_env), ("new", args.new_env))}
    procs = {name: Side(name, args.workdir / name, command(configs[name], extra), src, args.threads, envs[name])
             for name, (src, extra) in sides.items()}
    codes = {name: p.wait() for name, p in procs.items()}
    result: dict[str, Any] = {
        "machine": f"{platform.machine()}, {args.threads} thread(s) a side, {os.cpu_count()} CPUs",
        "cpu": cpu_identity(), "configs": {k: str(v) for k, v in configs.items()}, "note": args.note,
        "load_average_start": load_start, "load_average_end": os.getloadavg(),
        "started_unix": start, "sides": {}}
    for name, (src, extra) in sides.items():
        folder = args.workdir / name
        side: dict[str, Any] = {"command": " ".join(command(configs[name], extra)), "pythonpath": str(src or ""),
                                "env": envs[name], "exit_code": codes[name]}
        side |= gnu_time(folder / "time.txt")
        side["marks_seconds"] = procs[name].marks
        side["phases_seconds"] = phases(procs[name].marks)
        if codes[name] == 0:
            side |= mlflow_figures(folder)
        result["sides"][name] = side
        ev = side.get("eval", {}).get("eval/success", [])
        print(f"[{name}] exit {codes[name]}, wall {side['wall_seconds'] / 60:.1f} min, peak RSS "
              f"{side['peak_rss_mib'] / 1024:.2f} GiB, held-out success {' -> '.join(f'{x:.3f}' for x in ev)}; "
              + ", ".join(f"{k} {v:.0f} s" for k, v in side["phases_seconds"].items()))
    if len(result["sides"]) == 2:
        old, new = result["sides"]["old"], result["sides"]["new"]
        result["wall_ratio_old_over_new"] = old["wall_seconds"] / new["wall_seconds"]
        print(f"wall time old / new: {result['wall_ratio_old_over_new']:.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
