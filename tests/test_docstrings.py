"""Docstrings and comments say what the code does and why, not when it was measured.

Every docstring (module, class, function, and attribute docstrings: any string statement) and every comment of
every module under ``src/``, ``benchmarks/`` and ``scripts/`` is scanned for a date (``2026-12-05``) or a session
counter (``stop 12``); measurement history belongs in docs/benchmarks-log.md. Module docstrings under ``src/`` are
capped at `MAX_MODULE_WORDS` words. Each test lists every offending file, not just the first, so one run shows all
that is left to clean.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
DATED = ("src", "benchmarks", "scripts")  # where docstrings and comments carry no dates
MAX_MODULE_WORDS = 300
HISTORY = re.compile(r"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b|\bstop \d+\b", re.IGNORECASE)


def history_marks(text: str) -> list[tuple[int, str]]:
    """``(line, match)`` for each date or ``stop N`` counter in a docstring or comment of Python source ``text``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found += [(node.lineno + node.value.value[:m.start()].count("\n"), m.group())
                      for m in HISTORY.finditer(node.value.value)]
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            found += [(tok.start[0], m.group()) for m in HISTORY.finditer(tok.string)]
    return sorted(found)


def module_words(text: str) -> int:
    return len((ast.get_docstring(ast.parse(text)) or "").split())


def _sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_no_dates_or_stop_counters_in_docstrings_or_comments() -> None:
    offenders = {}
    for path in sorted(p for folder in DATED for p in (ROOT / folder).rglob("*.py")):
        marks = history_marks(path.read_text())
        if marks:
            offenders[path.relative_to(ROOT)] = marks
    report = "\n".join(f"  {path}: " + ", ".join(f"line {line} {text!r}" for line, text in marks)
                       for path, marks in offenders.items())
    assert not offenders, (f"{len(offenders)} file(s) under {', '.join(DATED)} carry dates or 'stop N' counters in "
                           f"docstrings or comments (move the history to docs/benchmarks-log.md):\n{report}")


def test_module_docstrings_are_at_most_300_words() -> None:
    long = {path.relative_to(SRC.parent): words for path in _sources()
            if (words := module_words(path.read_text())) > MAX_MODULE_WORDS}
    report = "\n".join(f"  {path}: {words} words" for path, words in sorted(long.items()))
    assert not long, (f"{len(long)} module docstring(s) over {MAX_MODULE_WORDS} words (say what and why in a few "
                      f"lines; figures go to docs/benchmarks.md):\n{report}")


def test_the_scanner_finds_what_it_must() -> None:
    source = ('"""Module, measured on 2026-12-05."""\n'
              'X = 1\n"""Attribute docstring from stop 12."""\n'
              'def f():\n    """Nothing to see."""\n    return "stop 3 in a plain string is code, not a doc"\n'
              '# a comment about Stop 58\n')
    assert history_marks(source) == [(1, "2026-12-05"), (3, "stop 12"), (7, "Stop 58")]
    assert module_words('"""' + "word " * 301 + '"""\n') == 301
