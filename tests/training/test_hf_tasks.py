"""`HFDatasetTasks` (issue 30): tasks from a Hugging Face ``datasets`` split, built from datasets made here on disk
(nothing is downloaded: the hub is switched off for every test), from Python, from YAML, and in a real fit."""

from __future__ import annotations

from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets")

from agentrl.training.rollout.datamodule import TaskSource  # noqa: E402
from agentrl.training.rollout.hf_tasks import HFDatasetTasks  # noqa: E402

ROWS = [{"uid": f"q{i}", "problem": f"{i} + {i}", "solution": str(2 * i), "level": i + 10} for i in range(5)]


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test here may reach the hub: the path must be opened from disk."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture
def saved(tmp_path: Path) -> str:
    """A `DatasetDict` with a train and a test split, written by ``save_to_disk``."""
    folder = tmp_path / "arith"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:3]),
                          "test": datasets.Dataset.from_list(ROWS[3:])}).save_to_disk(str(folder))
    return str(folder)


def test_a_saved_split_gives_one_task_per_row_cycled_with_renamed_columns(saved: str) -> None:
    tasks = HFDatasetTasks(saved, "test", rename={"problem": "question", "solution": "answer"}, id_field="uid",
                           seed_field="level")
    assert isinstance(tasks, TaskSource) and len(tasks) == 2
    first = tasks.task(0)
    assert (first.id, first.seed) == ("q3", 13)
    assert first.data == {"uid": "q3", "question": "3 + 3", "answer": "6", "level": 13}
    assert tasks.task(3) == tasks.task(1) and tasks.task(1).id == "q4"  # cycled
    plain = HFDatasetTasks(saved, "train")
    assert [(t.id, t.seed) for t in map(plain.task, range(4))] == [("row-0", 0), ("row-1", 1), ("row-2", 2),
                                                                   ("row-0", 0)]


def test_data_files_through_a_builder_with_a_sliced_split(tmp_path: Path) -> None:
    file = tmp_path / "rows.parquet"
    datasets.Dataset.from_list(ROWS).to_parquet(str(file))
    tasks = HFDatasetTasks("parquet", "train[1:3]", data_files=str(file), id_field="uid",
                           cache_dir=str(tmp_path / "cache"))
    assert [tasks.task(i).id for i in range(3)] == ["q1", "q2", "q1"]


@pytest.mark.parametrize("kwargs,message", [
    ({"split": "validation"}, "tasks.split: no split 'validation' in "),
    ({"id_field": "id"}, "tasks.id_field: no column 'id' in "),
    ({"rename": {"question": "q"}}, "tasks.rename: no column 'question' in "),
])
def test_a_wrong_field_is_named_in_one_line(saved: str, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=r"^[^\n]*$") as info:
        HFDatasetTasks(saved, **kwargs)  # type: ignore[arg-type]
    assert str(info.value).startswith(message), info.value


def test_a_missing_dataset_is_one_line_and_never_fetched(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^tasks.path: cannot open dataset nobody/no-such-set \(") as info:
        HFDatasetTasks("nobody/no-such-set", cache_dir=str(tmp_path / "cache"))
    assert "\n" not in str(info.value)


def test_the_yaml_class_path_builds_it(saved: str) -> None:
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_argument("--tasks", type=TaskSource)
    cfg = parser.parse_string(f"tasks:\n  class_path: agentrl.training.rollout.hf_tasks.HFDatasetTasks\n"
                              f"  init_args: {{path: {saved}, split: test, id_field: uid}}\n")
    tasks = parser.instantiate(cfg).tasks
    assert isinstance(tasks, HFDatasetTasks) and tasks.task(0).id == "q3"


def test_a_fit_trains_on_the_split(saved: str) -> None:
    from agentrl.training.schedules.grpo import GRPO
    from tests.training.helpers import fit, letter_data, make_module

    module = make_module(GRPO(group_size=2))
    fit(module, letter_data(batch_size=4, steps=2, tasks=HFDatasetTasks(saved, "train", id_field="uid")))
    assert module.rl_step == 2
    assert sorted({t.task_id for t in module.last_trajectories}) == ["q0", "q2"]  # step 2: rows 2, 3 -> 2, 0
