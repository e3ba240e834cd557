"""Record what ``agentrl fit`` shows in a terminal and put it in the README.

Runs the command in a pseudo-terminal (the program sees a TTY, as in a user's shell, so anything that draws only
on terminals is captured too), in a fresh working directory, and keeps every output line with the second it
appeared. The transcript (carriage-return redraws resolved, colour codes removed) goes to
``docs/examples/terminal_main_job.txt``: the lines of the first minute, then the last lines. The status line that
``agentrl fit`` redraws in place inside a step (``  step 1/2 · collecting: ...``) leaves no line of its own on a
terminal; the transcript keeps its last state in each phase (`status_frames`), where it stood. The README block
between ``<!-- terminal:start -->`` and ``<!-- terminal:end -->`` is replaced by that transcript and the exact
command that produced it.

    python scripts/record_terminal.py --steps 2 --eval-episodes 8      # a short run (about 3 min on 2 cores)
    python scripts/record_terminal.py --steps 15 --eval-episodes 32    # the full main job (about 20 min)
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import re
import select
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
START, END = "<!-- terminal:start -->", "<!-- terminal:end -->"


def record(cmd: list[str], cwd: Path) -> tuple[list[tuple[float, str]], int]:
    """Run ``cmd`` on a pseudo-terminal; return ``(seconds since start, line)`` for each line and the exit code."""
    master, slave = pty.openpty()
    env = dict(os.environ, COLUMNS="120", LINES="40", TERM="xterm-256color")
    proc = subprocess.Popen(cmd, cwd=cwd, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    start, pending, lines = time.monotonic(), "", []
    while True:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(master, 65536).decode("utf-8", errors="replace")
            except OSError:  # the child closed the terminal
                chunk = ""
            if not chunk and proc.poll() is not None:
                break
            pending += chunk
            *done, pending = pending.split("\n")
            now = time.monotonic() - start
            lines += [(now, text) for line in done for text in [*status_frames(line), _clean(line)]]
        elif proc.poll() is not None:
            break
    if pending.strip():
        lines.append((time.monotonic() - start, _clean(pending)))
    os.close(master)
    return lines, proc.wait()


def _phase(frame: str) -> str:
    """The phase of a status frame (``  step 1/2 · RTPO depth k=1 (1/2) · updating``): without the counts and the
    clock, which may be cut at the terminal's width."""
    where, _, what = frame.rpartition(" · ")
    return f"{where} · {re.split(r':| [(]', what.strip(), maxsplit=1)[0]}"


def status_frames(line: str) -> list[str]:
    """The status lines redrawn (and overwritten) within ``line``: the last frame of each phase, in order."""
    frames = [ANSI.sub("", f).rstrip() for f in line.rstrip("\r").split("\r")[:-1]]
    frames = [f for f in frames if f.strip()]
    return [f for i, f in enumerate(frames) if i + 1 == len(frames) or _phase(frames[i + 1]) != _phase(f)]


def _clean(line: str) -> str:
    """What the terminal shows of a line: the text after the last carriage return, without colour codes."""
    text = ANSI.sub("", line).rstrip("\r")
    return text.rsplit("\r", 1)[-1].rstrip()


def transcript(lines: list[tuple[float, str]], first_s: float, last_n: int) -> str:
    while lines and not lines[0][1]:  # blank lines before the first output (a cleared load bar, the TTY's echo)
        lines = lines[1:]
    head = [text for t, text in lines if t <= first_s]
    tail = [text for _, text in lines[len(head):]][-last_n:]
    skipped = len(lines) - len(head) - len(tail)
    middle = [f"... ({skipped} lines)"] if skipped > 0 else []
    return "\n".join([*head, *middle, *tail])


def _note(args: argparse.Namespace, lines: list[tuple[float, str]], text: str) -> str:
    """The README's line under the transcript: how it was recorded and what was left out."""
    flags = f"--steps {args.steps} --eval-episodes {args.eval_episodes}"
    if (args.first_seconds, args.last_lines) != (60.0, 12):
        flags += f" --first-seconds {args.first_seconds:g} --last-lines {args.last_lines}"
    kept = ("every line" if text == transcript(lines, float("inf"), 0) else
            f"every line of the first {args.first_seconds:.0f} s, then the last {args.last_lines}")
    return (f"Recorded by `python scripts/record_terminal.py {flags}` (a pseudo-terminal, {kept}; the temporary run "
            "directory shows as /your/run/dir; the indented `step k/N ·` and `evaluating` lines are the status "
            "line, redrawn in place during the run, kept at its last state in each phase). Step times depend on the "
            "machine and its load.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2, help="RL steps (the main job has 15)")
    parser.add_argument("--eval-episodes", type=int, default=8, help="held-out episodes (the main job has 32)")
    parser.add_argument("--config", default="configs/rtpo.yaml")
    parser.add_argument("--first-seconds", type=float, default=60.0, help="keep every line of this first span")
    parser.add_argument("--last-lines", type=int, default=12)
    parser.add_argument("--out", default="docs/examples/terminal_main_job.txt")
    parser.add_argument("--readme", default="README.md", help="file whose terminal block is replaced ('' skips)")
    parser.add_argument("--raw", default="", help="also write every (second, line) here as JSON, to cut again")
    args = parser.parse_args()
    shown = ["agentrl", "fit", "--config", args.config, "--data.steps", str(args.steps),
             "--data.eval_episodes", str(args.eval_episodes)]
    with tempfile.TemporaryDirectory() as tmp:  # a fresh directory: a new MLflow store, no checkpoint to resume
        config = str(ROOT / args.config)
        cmd = [sys.executable, "-m", "agentrl.cli", *shown[1:3], config, *shown[4:]]
        lines, code = record(cmd, Path(tmp))
        if args.raw:
            Path(args.raw).write_text(json.dumps([(t, text.replace(tmp, "/your/run/dir")) for t, text in lines]))
        text = transcript(lines, args.first_seconds, args.last_lines).replace(tmp, "/your/run/dir")
    if code != 0:
        print(text, file=sys.stderr)
        print(f"the run failed with exit code {code}", file=sys.stderr)
        return code
    command = shlex.join(shown)
    body = f"$ {command}\n{text}\n"
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(body)
    print(body)
    if args.readme:
        readme = ROOT / args.readme
        doc = readme.read_text()
        if START not in doc or END not in doc:
            print(f"{readme} has no {START} ... {END} block; transcript left in {out}", file=sys.stderr)
            return 1
        block = f"{START}\n```console\n{body}```\n<sub>{_note(args, lines, text)}</sub>\n{END}"
        head, rest = doc.split(START, 1)
        readme.write_text(head + block + rest.split(END, 1)[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
