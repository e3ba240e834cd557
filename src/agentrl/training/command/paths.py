"""Where the input files a config names are read from: the working directory, else beside the config file.

A config's ``data`` section names input files — a task file (``JsonlTasks`` ``path``, ``HFDatasetTasks``
``data_files`` or a local ``path``), a corpus (``corpus_path``) — and its agent module may sit beside it (found
there by `agentrl.training.command.cli.add_import_paths`). A relative input path is taken from the working directory
when it exists there (a path typed on the command line, or an older config run from its folder), else from the
folder of the config file that holds it when it exists there, so ``agentrl fit --config try/my_task.yaml`` finds
``try/arith.jsonl`` from anywhere. What a run writes (``checkpoint.dirpath``, the MLflow store) stays relative to
the working directory.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jsonargparse import Namespace

INPUT_KEYS = ("path", "data_files", "corpus_path")


def config_folders(config: Namespace) -> list[Path]:
    """The folders of the ``--config`` files of a parsed config, last first (a later file overrides)."""
    files = config.get("config") or []
    folders = []
    for entry in reversed(list(files) if isinstance(files, Sequence) else [files]):
        absolute = getattr(entry, "absolute", None) or str(entry)
        folders.append(Path(str(absolute)).parent)
    return folders


def _resolved(value: Any, folders: list[Path]) -> Any:
    """``value`` (a path, a list or a mapping of paths) with each relative path that is missing from the working
    directory but present beside a config replaced by that file's absolute path."""
    if isinstance(value, str):
        path = Path(value)
        if not value or path.is_absolute() or path.exists():
            return value
        beside = next((folder / path for folder in folders if (folder / path).exists()), None)
        return str(beside) if beside is not None else value
    if isinstance(value, list):
        return [_resolved(v, folders) for v in value]
    if isinstance(value, dict):
        return {k: _resolved(v, folders) for k, v in value.items()}
    return value


def _walk(node: Any, folders: list[Path]) -> None:
    if not isinstance(node, Namespace):
        return
    for key in list(node.keys()):
        value = node[key]
        if isinstance(value, Namespace):
            _walk(value, folders)
        elif key.rsplit(".", 1)[-1] in INPUT_KEYS:
            node[key] = _resolved(value, folders)


def resolve_input_paths(config: Namespace) -> None:
    """Resolve the input paths of ``config``'s ``data`` section as the module docstring says (in place)."""
    folders = config_folders(config)
    data = config.get("data")
    if folders and isinstance(data, Namespace):
        _walk(data, folders)
