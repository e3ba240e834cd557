"""`HFDatasetTasks`: tasks from a split of a Hugging Face ``datasets`` dataset.

Each row becomes one `Task` (the row is ``Task.data``, as a line of
`agentrl.training.rollout.datamodule.JsonlTasks` is);
rows are cycled, so any ``data.steps`` can be run over a split of any size. The dataset is opened the way
``datasets`` opens it — a hub id, a builder (``json``, ``parquet``, ``csv``) with ``data_files``, or a local
folder of such files — or, for a folder written by ``Dataset.save_to_disk``, with ``load_from_disk``. Rows are read
from the memory-mapped Arrow table one at a time, not copied into Python up front.

``datasets`` is an optional dependency (``pip install 'agentrl[datasets]'``), imported only when such a source is
built. A hub id is downloaded on first use and then served from the ``datasets`` cache; with ``HF_HUB_OFFLINE=1``
only the cache (or local files) is used.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl.agents.base import Task


def _saved_to_disk(path: str) -> bool:
    folder = Path(path)
    return (folder / "state.json").is_file() or (folder / "dataset_dict.json").is_file()


class HFDatasetTasks:
    """Tasks from a ``datasets`` split, one per row, cycled. Each row (columns renamed) becomes ``Task.data``.

    Args:
        path: A hub dataset id, a builder name (``json``, ``parquet``, ``csv``: with ``data_files``), a local folder
            of data files, or a folder written by ``save_to_disk``.
        split: The split, with ``datasets``' slicing if wanted (``train``, ``test[:200]``).
        name: The dataset's configuration (subset) name.
        data_files: Files of a builder (``path: json``, ``data_files: questions.jsonl``).
        rename: Column → key in ``Task.data`` (e.g. ``{problem: question, solution: answer}``: the keys the agent
            reads).
        id_field: Column holding the task id (default: ``row-<index>``).
        seed_field: Column holding the environment seed (default: the row index).
        cache_dir: The ``datasets`` cache folder (default: ``datasets``' own, ``HF_DATASETS_CACHE``).
    """

    def __init__(self, path: str, split: str = "train", *, name: str | None = None,
                 data_files: str | list[str] | dict[str, str | list[str]] | None = None,
                 rename: dict[str, str] | None = None, id_field: str | None = None, seed_field: str | None = None,
                 cache_dir: str | None = None) -> None:
        try:
            import datasets
        except ImportError as exc:
            raise ValueError("tasks: HFDatasetTasks needs the `datasets` package: pip install 'agentrl[datasets]'") \
                from exc
        self.rows = _load(datasets, path, split, name, data_files, cache_dir)
        if len(self.rows) == 0:
            raise ValueError(f"tasks.split {split!r} of {path} holds no rows")
        columns = set(self.rows.column_names)
        for key, value in (("id_field", id_field), ("seed_field", seed_field), *(("rename", c) for c in rename or {})):
            if value is not None and value not in columns:
                raise ValueError(f"tasks.{key}: no column {value!r} in {path} (columns: {sorted(columns)})")
        self.rename: Mapping[str, str] = dict(rename or {})
        self.id_field, self.seed_field = id_field, seed_field

    def __len__(self) -> int:
        return len(self.rows)

    def task(self, index: int) -> Task:
        i = index % len(self.rows)
        row: dict[str, Any] = self.rows[i]
        tid = str(row[self.id_field]) if self.id_field else f"row-{i}"
        seed = int(row[self.seed_field]) if self.seed_field else i
        return Task(id=tid, seed=seed, data={self.rename.get(k, k): v for k, v in row.items()})


def _load(datasets: Any, path: str, split: str, name: str | None, data_files: Any, cache_dir: str | None) -> Any:
    """The split as a ``datasets.Dataset`` (errors of ``datasets`` become one line naming the field)."""
    try:
        if _saved_to_disk(path):
            saved = datasets.load_from_disk(path)
            if isinstance(saved, datasets.DatasetDict):
                if split not in saved:
                    raise ValueError(f"tasks.split: no split {split!r} in {path} (splits: {sorted(saved)})")
                return saved[split]
            return saved
        return datasets.load_dataset(path, name, split=split, data_files=data_files, cache_dir=cache_dir)
    except ValueError as exc:
        if str(exc).startswith("tasks."):
            raise
        raise ValueError(f"tasks: cannot load split {split!r} of {path}: {exc}") from exc
    except (OSError, datasets.exceptions.DatasetNotFoundError) as exc:  # missing files, an unreachable hub
        raise ValueError(f"tasks.path: cannot open dataset {path} ({type(exc).__name__}: {exc})") from exc
