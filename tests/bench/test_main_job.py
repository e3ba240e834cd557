"""`benchmarks/main_job.py`: the figures it reads back — GNU ``time -v`` of a real process, and the held-out
evaluations and per-step metrics of a real MLflow store."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from benchmarks import main_job


def test_gnu_time_reads_wall_cpu_and_peak_rss_of_a_real_process(tmp_path: Path) -> None:
    """A process that holds 200 MiB: the peak RSS (kbytes in the report) reads back in MiB, above 200 and far
    below 2,000 (a unit slip of 1,024 either way fails)."""
    report = tmp_path / "time.txt"
    start = time.perf_counter()
    subprocess.run(["/usr/bin/time", "-v", "-o", str(report), sys.executable, "-c",
                    "import time; b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep(1.2)"],
                   check=True)
    measured = time.perf_counter() - start
    got = main_job.gnu_time(report)
    assert 200 < got["peak_rss_mib"] < 2000
    assert 1.2 <= got["wall_seconds"] <= measured + 0.05  # "m:ss.ss": the minutes, seconds order read right
    assert got["user_seconds"] >= 0 and got["system_seconds"] >= 0


def test_gnu_time_names_a_missing_line(tmp_path: Path) -> None:
    report = tmp_path / "time.txt"
    report.write_text("\tUser time (seconds): 1.0\n\tElapsed (wall clock) time (h:mm:ss or m:ss): 1:02.50\n")
    with pytest.raises(ValueError, match="System time"):
        main_job.gnu_time(report)


def test_mlflow_figures_are_the_runs_evaluations_in_step_order(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.create_run(client.create_experiment("e")).info.run_id
    for step, value in ((15, 0.5), (0, 0.094)):  # logged out of order: read back by step
        client.log_metric(run, "eval/success", value, step=step)
    for step in (1, 2):
        client.log_metric(run, "perf/step_seconds", 10.0 * step, step=step)
    client.log_param(run, "resolved/engine_weights", "copy")
    client.log_param(run, "data.steps", "15")
    got = main_job.mlflow_figures(tmp_path)
    assert got["eval"]["eval/success"] == [0.094, 0.5]
    assert got["steps"]["perf/step_seconds"] == [10.0, 20.0]
    assert got["resolved"] == {"resolved/engine_weights": "copy"}
