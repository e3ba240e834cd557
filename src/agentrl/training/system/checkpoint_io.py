"""`AtomicCheckpointIO`: a checkpoint file is either the complete new one or the complete old one, never half.

Lightning's `TorchCheckpointIO` writes a local checkpoint to a temporary file in the system temp folder and then
moves it into place. When the temp folder is on another file system than the checkpoint folder (a tmpfs ``/tmp``,
a mounted volume), the move is a copy, not a rename: a full disk or a kill during that copy leaves a truncated,
unloadable ``last.ckpt`` where a good one was. Here the temporary file is written in the target folder itself,
flushed to disk (``fsync``), and renamed over the target with ``os.replace``, which is atomic on one file system.
A failed write removes its temporary file and leaves the previous checkpoint untouched. Remote paths
(``s3://``...) keep Lightning's writer.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO

PARTIAL_SUFFIX = ".partial"  # not ``.ckpt``: an unfinished file is never taken for a checkpoint (``--ckpt_path last``)


class CheckpointError(ValueError):
    """A checkpoint file that cannot be loaded; the one-line message names it and the newest loadable
    ``step-*.ckpt`` beside it."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """`TorchCheckpointIO` whose local writes are atomic: temp file beside the target, fsync, ``os.replace``; a
    local file that cannot be loaded raises `CheckpointError` instead of torch's traceback."""

    def load_checkpoint(self, path: _PATH, map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        try:
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        except FileNotFoundError:
            raise
        except Exception:
            if not _is_local_file_protocol(path):
                raise
            check_checkpoint(Path(path))
            raise

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        if storage_options is not None or not _is_local_file_protocol(path) or str(path).startswith("file:"):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        # streamed into the temporary file, not serialised into memory first: an in-memory copy of the
        # checkpoint (weights + optimizer state, ~2 GB for SmolLM2) was the run's second-largest RSS peak
        write_atomically(Path(path), lambda f: _save_reporting_os_errors(checkpoint, f))


def _save_reporting_os_errors(checkpoint: dict[str, Any], f: BinaryIO) -> None:
    """`torch.save` into ``f``; a failed write (a full disk) is raised as the `OSError` it was: torch's zip writer
    otherwise replaces it with an opaque ``RuntimeError: unexpected pos``."""
    failures: list[OSError] = []

    class Recording:
        def write(self, data: Any) -> int:
            try:
                return f.write(data)
            except OSError as e:
                failures.append(e)
                raise

        def flush(self) -> None:
            f.flush()

    try:
        torch.save(checkpoint, Recording())  # type: ignore[arg-type]
    except Exception as e:
        if failures and failures[0] is not e:
            raise failures[0] from e
        raise


def write_atomically(target: Path, data: bytes | memoryview | Callable[[BinaryIO], object]) -> None:
    """Write ``data`` (bytes, or a function that writes into the open file) to ``target`` so that ``target`` is
    always a complete file (the old one or the new one). A writer that fails leaves no temporary file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=PARTIAL_SUFFIX, dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        with open(tmp, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_folder(target.parent)


def unreadable_reason(path: Path) -> str | None:
    """Why ``path`` cannot be loaded with ``torch.load(weights_only=True)`` (None when it can). Never quotes torch's
    message: for a planted pickle it suggests ``weights_only=False``, which would run the planted code."""
    try:
        if path.stat().st_size == 0:
            return "is empty"
        if not zipfile.is_zipfile(path):
            return "is not a torch checkpoint (no zip archive: truncated, zeroed or overwritten)"
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or type(exc).__name__})"
    except pickle.UnpicklingError:
        return ("holds pickled objects that safe loading refuses: agentrl never writes those, so the file was "
                "replaced or tampered with; do not load it")
    except Exception as exc:  # a damaged archive: torch's own message adds nothing a user can act on
        return f"is damaged and cannot be loaded ({type(exc).__name__})"
    return None


def newest_loadable(folder: Path, skip: Path | None = None) -> Path | None:
    """The ``step-*.ckpt`` in ``folder`` with the highest step that loads (``skip`` aside)."""
    for candidate in sorted(folder.glob("step-*.ckpt"), reverse=True):  # zero-padded: names sort by step
        if (skip is None or candidate.resolve() != skip.resolve()) and unreadable_reason(candidate) is None:
            return candidate
    return None


def check_checkpoint(path: Path) -> None:
    """Raise `CheckpointError` (one line: the file, why, and the newest loadable step checkpoint beside it) when
    ``path`` cannot be loaded."""
    reason = unreadable_reason(path)
    if reason is None:
        return
    best = newest_loadable(path.parent, skip=path)
    hint = (f"the newest loadable checkpoint beside it is {best} (resume with --ckpt_path {best})" if best else
            "no loadable step-*.ckpt beside it (checkpoint.keep_steps: true keeps them)")
    raise CheckpointError(f"checkpoint {path} {reason}; {hint}")


def remove_stale_partials(folder: Path) -> list[Path]:
    """Delete the temporary files `write_atomically` leaves when its process is killed mid-write (a ``kill -9``,
    an OOM kill: no ``except`` runs) — up to a whole checkpoint of garbage each. Called when a run starts, before
    it writes anything; returns the files removed."""
    if not folder.is_dir():
        return []
    removed = []
    for path in sorted(folder.glob(f".*{PARTIAL_SUFFIX}")):
        with contextlib.suppress(OSError):
            path.unlink()
            removed.append(path)
    return removed


def _fsync_folder(folder: Path) -> None:
    """Persist the rename itself (the folder entry); best effort where folders cannot be opened."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
