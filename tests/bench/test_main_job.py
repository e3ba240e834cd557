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


def test_a_side_stamps_its_log_and_splits_the_wall_time_at_the_runs_lines(tmp_path: Path) -> None:
    """A real process printing the run's lines with pauses between them: each mark is when its line came, the
    log keeps every line with its stamp, and the phases add up to the time until the process ended."""
    script = ("import time\n"
              "for line, pause in [('[agentrl] base evaluation on 2 held-out episodes: success 0.5', 0.3),\n"
              "                    ('step  1/2  reward 0.1', 0.0), ('  step 2/2 · collecting', 0.0),\n"
              "                    ('step  2/2  reward 0.2', 0.6),\n"
              "                    ('[agentrl] final evaluation on 2 held-out episodes: success 1.0', 0.2),\n"
              "                    ('[agentrl] done: 2 steps in 0:00:01', 0.0)]:\n"
              "    time.sleep(pause); print(line, flush=True)\n")
    side = main_job.Side("new", tmp_path, [sys.executable, "-c", script], None, threads=1)
    assert side.wait() == 0
    marks = side.marks
    assert list(marks) == ["base_eval_done", "first_step", "last_step", "final_eval_done", "done", "exit"]
    # the 0.6 s pause before step 2/2's line, not step 1/2's line or step 2's indented status line before the pause
    assert marks["last_step"] - marks["first_step"] >= 0.55
    split = main_job.phases(marks)
    assert split["steps"] >= 0.55 and split["final_eval"] >= 0.15
    assert sum(split.values()) == pytest.approx(marks["exit"])
    log = (tmp_path / "log.txt").read_text().splitlines()
    assert len(log) == 6 and log[3].split(maxsplit=1)[1] == "step  2/2  reward 0.2"
    assert (tmp_path / "time.txt").exists()
