"""The documentation is executed: every Python block and shell command in README.md and docs/ that a reader
would copy either runs here and succeeds, or is not runnable here for a stated reason.

Which snippets count, the ``<!-- not-run: reason -->`` marker and the rules by command are in
`tests.support.doc_snippets`; how they run (in order, in one scratch working directory that links the repository's
folders, with the documented model and step count rewritten to the tiny random model and one step) is in
`tests.support.doc_runner`. A reader going through the README and then docs/ in order is what the run mimics: a
``--ckpt_path last`` in a later file finds the checkpoint an earlier snippet wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.doc_snippets import ROOT, Snippet, program, snippets

RUNNER = Path(__file__).parent / "support" / "doc_runner.py"
OUTPUTS = {"mlflow.db", "mlflow.db.lock", "mlflow-fallback.db", "checkpoints", "mlruns", ".venv", ".git"}


def _scratch(folder: Path) -> Path:
    """A working directory that sees the repository's files (links) but keeps what the snippets write."""
    folder.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in OUTPUTS and not entry.name.startswith("."):
            (folder / entry.name).symlink_to(entry)
    return folder


def test_every_snippet_is_run_or_marked_with_a_reason() -> None:
    """Every shell command that this test does not run has a reason; one it runs is an ``agentrl`` command."""
    found = snippets()
    unhandled = [f"{s.where}: {s.text[:100]}" for s in found
                 if s.kind == "shell" and s.not_run is None and not program(s.text).startswith("agentrl ")]
    assert not unhandled, ("shell commands neither run by this test nor marked `<!-- not-run: reason -->` (nor "
                           "covered by a rule in tests/support/doc_snippets.py):\n" + "\n".join(unhandled))
    assert any(s.kind == "python" and s.not_run is None for s in found), "no Python snippet found to run"


def run_snippets(chosen: list[Snippet], cwd: Path, timeout: int = 900) -> list[dict[str, object]]:
    """Run ``chosen`` in order in ``cwd`` (one process); each one's result."""
    todo, seen = [], set()
    for s in chosen:
        if (s.kind, s.text) not in seen:  # a command documented twice runs once
            seen.add((s.kind, s.text))
            todo.append({"where": s.where, "kind": s.kind, "text": s.text})
    (cwd / "snippets.json").write_text(json.dumps(todo))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(RUNNER), "snippets.json", "results.json"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    results = json.loads((cwd / "results.json").read_text()) if (cwd / "results.json").exists() else []
    assert len(results) == len(todo), f"the runner stopped early:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return list(results)


@pytest.mark.timeout(1000)
def test_the_runnable_snippets_run(tmp_path: Path) -> None:
    """README first, then docs/ by path; each snippet exits 0 (a ``--print_config`` too)."""
    results = run_snippets([s for s in snippets() if s.not_run is None], _scratch(tmp_path / "reader"))
    failed = [f"--- {r['where']} (exit {r['code']}):\n{str(r['output'])[-1500:]}" for r in results if r["code"] != 0]
    assert not failed, "documented snippets that fail:\n" + "\n".join(failed)
