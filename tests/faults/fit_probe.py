"""Run ``agentrl fit`` argument lists in one process and record, for each, how it ended and what it touched.

Usage: ``python fit_probe.py CASES.json OUT.json``; CASES maps a case name to ``{"cwd": ..., "args": [...]}``.
Each case runs ``agentrl.cli.main(["fit", *args])`` in its own working directory with the model loader wrapped,
so the record says whether a model load started (``model_loads``) besides the exit code and the output; the caller
checks the directory for an MLflow store or checkpoints.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any


def main(cases_file: str, out_file: str) -> None:
    from agentrl.cli import main as agentrl_main
    from agentrl.models import loading, policy

    loads: list[str] = []
    original = loading.load_model

    def recorded_load(spec: str, *args: Any, **kwargs: Any) -> Any:
        loads.append(spec)
        return original(spec, *args, **kwargs)

    policy.load_model = recorded_load
    loading.load_model = recorded_load
    results: dict[str, dict[str, Any]] = {}
    for name, case in json.loads(Path(cases_file).read_text()).items():
        loads.clear()
        os.chdir(case["cwd"])
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code: Any = agentrl_main(["fit", *case["args"]])
            except SystemExit as exc:
                code = exc.code
            except BaseException:  # an uncaught exception is a result too (a traceback, not a message)
                code = "exception"
                traceback.print_exc()
        results[name] = {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(), "model_loads": list(loads)}
    Path(out_file).write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
