"""`benchmarks/async.py` resumes: a run already in the result file under the same workload is not run again, and
runs of another workload are never mixed in."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # its `from serve_process import`
bench = importlib.import_module("async")  # a keyword: no `import async`

WORKLOAD = {"model": "m", "budget": 100, "lr": 1e-4, "seeds": [0], "schedules": ["grpo"], "staleness": [0, 1],
            "out": "/a.json", "fresh": False}


def run(name: str, s: int, seed: int) -> dict[str, object]:
    return {"schedule": name, "max_staleness": s, "seed": seed, "tokens_per_s": 1.0}


def test_pending_skips_finished_runs_and_keeps_each_schedules_staleness_side_by_side() -> None:
    done = [run("grpo", 0, 0), run("rtpo", 1, 0)]
    assert bench.pending(done, [0, 1], ["grpo", "rtpo"], [0, 1]) == [
        (0, "grpo", 1), (0, "rtpo", 0), (1, "grpo", 0), (1, "grpo", 1), (1, "rtpo", 0), (1, "rtpo", 1)]


def test_earlier_runs_are_read_back_only_under_the_same_workload(tmp_path: Path) -> None:
    out = tmp_path / "async.json"
    assert bench.earlier_runs(out, WORKLOAD) == []  # no file yet
    args = argparse.Namespace(out=out)
    bench.write_result(args, WORKLOAD, [run("grpo", 0, 0)])
    assert json.loads(out.read_text())["runs"] == [run("grpo", 0, 0)]
    # more seeds or staleness values, another out path: the same workload, the run is kept
    wider = WORKLOAD | {"seeds": [0, 1], "staleness": [0, 1, 2], "out": "/b.json", "fresh": True}
    kept = bench.earlier_runs(out, wider)
    assert [{k: v for k, v in r.items() if k != "cpu"} for r in kept] == [run("grpo", 0, 0)]
    # a run written without its own CPU gets the file's (the machine that wrote it); one with its own keeps it
    assert kept[0]["cpu"] == json.loads(out.read_text())["cpu"] and kept[0]["cpu"]["model"]
    bench.write_result(args, WORKLOAD, [run("grpo", 0, 0) | {"cpu": {"model": "another CPU"}}])
    assert bench.earlier_runs(out, wider)[0]["cpu"] == {"model": "another CPU"}
    # another budget: not comparable, not mixed in
    assert bench.earlier_runs(out, WORKLOAD | {"budget": 200}) == []
