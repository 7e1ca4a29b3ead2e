"""The ``files`` sink as a distributed-commit sink: tasks stage, one commit publishes."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from files_testing import ids_batch, open_sink, visible_ids
from laminar_sdk import DistributedCommitSink, TransactionError

from laminar_plugin_files import FilesSink

EPOCH_DIRECTORY = "epoch=00000000000000000004"


class TaskFailed(Exception):
    pass


async def batches(*id_lists: Sequence[int], fail_after: int | None = None) -> AsyncIterator:
    for number, ids in enumerate(id_lists):
        if number == fail_after:
            raise TaskFailed("the executor running this task was lost")
        yield ids_batch(ids)


def stage(sink: FilesSink, epoch: int, task: str, *id_lists, fail_after=None) -> str:
    committer = sink.as_distributed_commit()
    assert isinstance(committer, DistributedCommitSink)
    return asyncio.run(committer.stage(epoch, task, batches(*id_lists, fail_after=fail_after)))


def data_files(directory) -> list[str]:
    return sorted(name for name in os.listdir(directory) if not name.startswith("_"))


def test_exactly_the_files_the_descriptors_name_are_published(tmp_path):
    # Each task stages on an instance of its own, as on Spark's executors.
    failed = open_sink(tmp_path, rows_per_file="2")
    with pytest.raises(TaskFailed):
        stage(failed, 4, "0-attempt-0", [1, 2, 3], [4], fail_after=1)
    staging = tmp_path / "_staging" / "epoch-4"
    assert data_files(staging) == [
        "task-0-attempt-0-00000.parquet",
        "task-0-attempt-0-00001.parquet",
    ]
    retried = stage(open_sink(tmp_path, rows_per_file="2"), 4, "0-attempt-1", [1, 2, 3], [4])
    other = stage(open_sink(tmp_path, rows_per_file="2"), 4, "1-attempt-0", [5])
    abandoned = stage(open_sink(tmp_path, rows_per_file="2"), 4, "2-attempt-0", [6])
    assert json.loads(retried) == {
        "epoch": 4,
        "files": ["task-0-attempt-1-00000.parquet", "task-0-attempt-1-00001.parquet"],
        "rows": 4,
    }
    assert len(retried) < 200, "a descriptor is kept in the manifest: it must stay small"
    assert visible_ids(tmp_path) == [], "staged output is invisible before the commit"

    committer = open_sink(tmp_path, rows_per_file="2")
    asyncio.run(committer.commit_aggregated(4, [retried, other]))
    assert visible_ids(tmp_path) == [1, 2, 3, 4, 5]
    assert data_files(tmp_path / EPOCH_DIRECTORY) == [
        "task-0-attempt-1-00000.parquet",
        "task-0-attempt-1-00001.parquet",
        "task-1-attempt-0-00000.parquet",
    ]
    manifest = json.loads((tmp_path / EPOCH_DIRECTORY / "_MANIFEST.json").read_text())
    assert manifest["rows"] == 5
    assert not staging.exists()
    (abandoned_file,) = json.loads(abandoned)["files"]
    assert abandoned_file not in os.listdir(tmp_path / EPOCH_DIRECTORY), "never recorded"

    asyncio.run(committer.commit_aggregated(4, [retried, other]))
    asyncio.run(open_sink(tmp_path).commit_aggregated(4, [retried, other]))
    assert visible_ids(tmp_path) == [1, 2, 3, 4, 5], "committing again does nothing"


def test_a_commit_interrupted_before_its_rename_is_finished_by_the_next_one(tmp_path, monkeypatch):
    first = stage(open_sink(tmp_path), 4, "a", [1, 2])
    second = stage(open_sink(tmp_path), 4, "b", [3])
    stage(open_sink(tmp_path), 4, "c", [99])  # a failed attempt nobody recorded
    real_rename = os.rename

    def power_cut_at_publishing(source, destination):
        if Path(destination).name == EPOCH_DIRECTORY:
            raise OSError("power cut")
        real_rename(source, destination)

    monkeypatch.setattr(os, "rename", power_cut_at_publishing)
    with pytest.raises(OSError, match="power cut"):
        asyncio.run(open_sink(tmp_path).commit_aggregated(4, [first, second]))
    monkeypatch.undo()
    assert visible_ids(tmp_path) == []
    assert data_files(tmp_path / "_staging" / "publishing-4") == [
        "task-a-00000.parquet",
        "task-b-00000.parquet",
    ]
    asyncio.run(open_sink(tmp_path).commit_aggregated(4, [first, second]))
    assert visible_ids(tmp_path) == [1, 2, 3]
    assert os.listdir(tmp_path / "_staging") == [], "what no descriptor named is deleted"


def test_a_straggling_attempt_writing_during_the_commit_is_never_published(tmp_path, monkeypatch):
    descriptor = stage(open_sink(tmp_path), 4, "a", [1, 2])
    real_rename = os.rename

    def straggler_writes_first(source, destination):
        if Path(destination).name == EPOCH_DIRECTORY:
            # A speculative attempt, not yet killed, stages a file as the commit publishes.
            late = tmp_path / "_staging" / "epoch-4" / "task-a-speculative-00000.parquet"
            pq.write_table(pa.Table.from_batches([ids_batch([1, 2])]), late)
        real_rename(source, destination)

    monkeypatch.setattr(os, "rename", straggler_writes_first)
    asyncio.run(open_sink(tmp_path).commit_aggregated(4, [descriptor]))
    monkeypatch.undo()
    assert visible_ids(tmp_path) == [1, 2]
    assert data_files(tmp_path / EPOCH_DIRECTORY) == ["task-a-00000.parquet"]


def test_rollback_discards_the_staging_of_every_task(tmp_path):
    stage(open_sink(tmp_path), 4, "a", [1])
    stage(open_sink(tmp_path), 4, "b", [2])
    asyncio.run(open_sink(tmp_path).rollback_epoch(4))
    assert not (tmp_path / "_staging" / "epoch-4").exists()
    asyncio.run(open_sink(tmp_path).rollback_epoch(4))  # idempotent
    assert visible_ids(tmp_path) == []


def test_a_micro_batch_run_again_after_its_epoch_was_published_stages_nothing(tmp_path):
    descriptor = stage(open_sink(tmp_path), 4, "a", [1])
    asyncio.run(open_sink(tmp_path).commit_aggregated(4, [descriptor]))
    again = stage(open_sink(tmp_path), 4, "a-rerun", [1])
    assert json.loads(again)["files"] == []
    assert not (tmp_path / "_staging" / "epoch-4").exists()
    asyncio.run(open_sink(tmp_path).commit_aggregated(4, [again]))
    assert visible_ids(tmp_path) == [1]


def test_an_epoch_without_any_staged_output_is_published_empty(tmp_path):
    asyncio.run(open_sink(tmp_path).commit_aggregated(4, []))
    assert data_files(tmp_path / EPOCH_DIRECTORY) == []
    empty = stage(open_sink(tmp_path), 5, "a")
    asyncio.run(open_sink(tmp_path).commit_aggregated(5, [empty]))
    assert (
        json.loads((tmp_path / "epoch=00000000000000000005" / "_MANIFEST.json").read_text())[
            "files"
        ]
        == []
    )


def test_task_names_are_escaped_so_that_no_two_attempts_share_a_file(tmp_path):
    slash = stage(open_sink(tmp_path), 4, "x/y", [1])
    escaped = stage(open_sink(tmp_path), 4, "x%2Fy", [2])
    assert json.loads(slash)["files"] != json.loads(escaped)["files"]
    asyncio.run(open_sink(tmp_path).commit_aggregated(4, [slash, escaped]))
    assert visible_ids(tmp_path) == [1, 2]


@pytest.mark.parametrize(
    ("descriptors", "problem"),
    [
        (['{"epoch": 3, "files": [], "rows": 0}'], "for epoch 3 was given for epoch 4"),
        (['{"epoch": 4, "files": ["../../etc/x"], "rows": 1}'], "not a data file name"),
        (['{"epoch": 4, "files": ["_MANIFEST.json"], "rows": 1}'], "not a data file name"),
        (["not json"], "is not a record of staged files"),
        (['{"epoch": 4, "files": ["task-gone-00000.parquet"], "rows": 1}'], "is gone from"),
    ],
)
def test_a_descriptor_the_sink_did_not_return_is_refused(tmp_path, descriptors, problem):
    stage(open_sink(tmp_path), 4, "a", [1])
    with pytest.raises(TransactionError, match=problem):
        asyncio.run(open_sink(tmp_path).commit_aggregated(4, descriptors))
    assert visible_ids(tmp_path) == []


def test_two_descriptors_naming_one_file_are_refused(tmp_path):
    descriptor = stage(open_sink(tmp_path), 4, "a", [1])
    with pytest.raises(TransactionError, match="more than one commit descriptor"):
        asyncio.run(open_sink(tmp_path).commit_aggregated(4, [descriptor, descriptor]))
    assert visible_ids(tmp_path) == []
