"""Where a failed episode's exception was raised, for the one-line error a user reads first.

An episode's error used to be ``KeyError: 'solution'`` alone: no file, no line. `where_raised` names the innermost
frame of the user's own code (not the standard library, not an installed package, not agentrl) along the
exception's chain of causes, so the line reads ``KeyError: 'solution' (raised at calc_agent.py:31 in reward)``;
the episode's ``info["traceback"]`` keeps the innermost frames in full.
"""

from __future__ import annotations

import sys
import sysconfig
import traceback
from pathlib import Path

_PATHS = sysconfig.get_paths()
_LIBRARY_DIRS = tuple({str(Path(p).resolve()) for p in (_PATHS["stdlib"], _PATHS["purelib"], _PATHS["platlib"],
                                                        sys.prefix, sys.base_prefix)})
_AGENTRL_DIR = str(Path(__file__).resolve().parents[1])


def _is_user_frame(filename: str) -> bool:
    path = str(Path(filename).resolve()) if filename and not filename.startswith("<") else ""
    return bool(path) and not path.startswith(_LIBRARY_DIRS) and not path.startswith(_AGENTRL_DIR)


def where_raised(exc: BaseException) -> str:
    """`` (raised at file.py:LINE in func)`` for the innermost user frame of ``exc`` or its causes; else the
    innermost frame of all; empty when there is no traceback."""
    frames: list[traceback.FrameSummary] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:  # the exception, then what it was raised from
        seen.add(id(current))
        frames += traceback.extract_tb(current.__traceback__)
        current = current.__cause__ or current.__context__
    if not frames:
        return ""
    user = [f for f in frames if _is_user_frame(f.filename)]
    frame = (user or frames)[-1]
    return f" (raised at {Path(frame.filename).name}:{frame.lineno} in {frame.name})"


def format_innermost(exc: BaseException, frames: int = 12) -> str:
    """The traceback of ``exc`` with its innermost ``frames`` frames (where the error is), causes included."""
    return "".join(traceback.format_exception(exc, limit=-frames))
