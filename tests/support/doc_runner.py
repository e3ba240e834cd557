"""Run documentation snippets in order, in one process and the current working directory, and record how each ended.

Usage: ``python doc_runner.py SNIPPETS.json OUT.json``; SNIPPETS is a list of ``{"where", "kind", "text"}``
(`tests.support.doc_snippets.Snippet`). One process for all of them, so the libraries load once and the whole set
runs in seconds. The rewrite rule that makes a documented training run a smoke run, the same for every snippet:

* ``agentrl fit|validate ...`` (a shell snippet) runs as ``agentrl.cli.main([... , *FAST])``: `FAST` appended, so
  it overrides the documented model and step count (the tiny random model, one step of one task, one held-out episode);
* a Python snippet runs as a script (``runpy``) with ``agentrl.fit`` wrapped to append `FAST` to its ``args``
  (keyword overrides such as ``data={"steps": 2}`` still win, as they come last on the command line).

Each result is ``{"where", "code", "output"}``: ``code`` 0 on success, the exit code of a ``SystemExit``, or
``"exception"`` with the traceback in ``output``.
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import shlex
import sys
import traceback
from pathlib import Path
from typing import Any

FAST = ["--model.policy.init_args.model=tiny-random", "--data.steps=1", "--data.batch_size=1", "--data.eval_episodes=1"]


def _shell(text: str) -> Any:
    from agentrl.cli import main as agentrl_main

    argv = shlex.split(text)
    if argv[0] != "agentrl":
        raise ValueError(f"only agentrl commands run in-process here, got {text!r}")
    return agentrl_main([*argv[1:], *FAST])


def _python(text: str, where: str) -> Any:
    import agentrl

    script = Path(f"snippet_{abs(hash(where))}.py")
    script.write_text(text, encoding="utf-8")
    original = agentrl.fit

    def fast_fit(*configs: Any, args: Any = (), **overrides: Any) -> Any:
        return original(*configs, args=[*args, *FAST], **overrides)

    agentrl.fit = fast_fit
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        agentrl.fit = original
    return 0


def main(snippets_file: str, out_file: str) -> None:
    results = []
    for snippet in json.loads(Path(snippets_file).read_text()):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                code: Any = (_shell(snippet["text"]) if snippet["kind"] == "shell"
                             else _python(snippet["text"], snippet["where"]))
                code = code or 0
            except SystemExit as exc:
                code = exc.code or 0
            except BaseException:  # a failing snippet is a result: its traceback is what the test shows
                code = "exception"
                traceback.print_exc()
        results.append({"where": snippet["where"], "code": code, "output": out.getvalue()[-4000:]})
        Path(out_file).write_text(json.dumps(results))  # what ran so far survives a timeout


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
