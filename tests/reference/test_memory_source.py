"""The ``memory`` source: records appended to a directory, replayed by offsets."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from laminar_sdk import (
    CheckpointError,
    ConfigurationError,
    ConnectorConfig,
    PartitionRange,
    ReadError,
    SourceCheckpoint,
)
from laminar_sdk.reference import IDS_SCHEMA, MemorySource


def opened(run, path: Path) -> MemorySource:
    source = MemorySource()
    run(source.open(ConnectorConfig("memory", {"path": str(path)})))
    return source


def polled_ids(run, source: MemorySource, max_records: int = 100) -> list[int]:
    ids = []
    while (batch := run(source.poll_batch(max_records))) is not None:
        ids += batch.records["id"].to_pylist()
    return ids


def test_appended_records_reach_a_source_opened_on_the_same_directory(run, tmp_path):
    assert MemorySource.append(tmp_path, [10, 11, 12]) == 3
    assert MemorySource.append(tmp_path, [13], partition=0) == 4
    assert MemorySource.append(tmp_path, []) == 4, "appending nothing writes nothing"
    source = opened(run, tmp_path)
    batch = run(source.poll_batch(2))
    assert batch.records.schema.equals(IDS_SCHEMA)
    assert batch.records.to_pylist() == [
        {"id": 10, "partition": 0, "value": 10.0},
        {"id": 11, "partition": 0, "value": 11.0},
    ]
    assert str(batch.partition) == "0@2"
    assert polled_ids(run, source) == [12, 13]
    assert run(source.poll_batch(5)) is None, "nothing new"

    MemorySource.append(tmp_path, [14, 15])
    assert polled_ids(run, source) == [14, 15], "records appended later are found"


def test_a_directory_with_nothing_appended_yet_is_an_empty_source(run, tmp_path):
    source = opened(run, tmp_path / "not-yet")
    assert run(source.poll_batch(5)) is None
    assert source.checkpoint().is_empty


def test_restore_is_exact_per_partition(run, tmp_path):
    MemorySource.append(tmp_path, range(5), partition=0)
    MemorySource.append(tmp_path, range(100, 103), partition=2)
    MemorySource.append(tmp_path, range(5, 8), partition=0)
    source = opened(run, tmp_path)
    run(source.restore(SourceCheckpoint({"0": "6"})))
    assert sorted(polled_ids(run, source)) == [6, 7, 100, 101, 102]
    assert source.checkpoint().offsets == {"0": "8", "2": "3"}


def test_records_appended_to_a_new_partition_do_not_change_an_earlier_checkpoint(run, tmp_path):
    MemorySource.append(tmp_path, [1, 2], partition=1)
    source = opened(run, tmp_path)
    run(source.poll_batch(5))
    checkpoint = source.checkpoint()
    MemorySource.append(tmp_path, [3], partition=0)
    restored = opened(run, tmp_path)
    run(restored.restore(checkpoint))
    assert restored.checkpoint() == checkpoint, "Spark compares them to end a replay"


def test_a_removed_partition_leaves_the_others_flowing_and_its_checkpoints_restore(run, tmp_path):
    MemorySource.append(tmp_path, [1, 2], partition=0)
    MemorySource.append(tmp_path, [3], partition=1)
    source = opened(run, tmp_path)
    assert sorted(polled_ids(run, source)) == [1, 2, 3]
    before = source.checkpoint()
    assert before.offsets == {"0": "2", "1": "1"}

    assert MemorySource.remove_partition(tmp_path, 0) == 2
    assert MemorySource.remove_partition(tmp_path, 0) == 2, "removing again changes nothing"
    assert not list((tmp_path / "source" / "partition-0").glob("*.arrow")), "records gone"
    MemorySource.append(tmp_path, [4], partition=1)
    MemorySource.append(tmp_path, [5], partition=2)
    assert sorted(polled_ids(run, source)) == [4, 5], "the open instance goes on"
    assert source.checkpoint().offsets == {"1": "2", "2": "1"}, "the removed one left out"

    restored = opened(run, tmp_path)
    run(restored.restore(before))
    assert sorted(polled_ids(run, restored)) == [4, 5]
    with pytest.raises(CheckpointError, match="offset 3 of partition 0 is past the 2"):
        run(opened(run, tmp_path).restore(SourceCheckpoint({"0": "3"})))
    with pytest.raises(ValueError, match="partition 0 was removed"):
        MemorySource.append(tmp_path, [6], partition=0)


def test_a_range_of_a_removed_partition_is_refused_not_read_short(run, tmp_path):
    MemorySource.append(tmp_path, [1, 2, 3])
    source = opened(run, tmp_path)
    end = run(source.plan_end(SourceCheckpoint({}), None))
    MemorySource.remove_partition(tmp_path, 0)
    with pytest.raises(ReadError, match="partition 0 .* was removed"):
        run(collect(source.read_range(PartitionRange("0", None, end.offsets["0"]))))


async def collect(batches):
    return [batch async for batch in batches]


def test_a_checkpoint_ahead_of_the_directory_is_refused(run, tmp_path):
    MemorySource.append(tmp_path, [1, 2])
    source = opened(run, tmp_path)
    with pytest.raises(CheckpointError, match="past the 2 record"):
        run(source.restore(SourceCheckpoint({"0": "3"})))
    with pytest.raises(CheckpointError, match="past the 0 record"):
        run(source.restore(SourceCheckpoint({"7": "1"})))
    with pytest.raises(CheckpointError, match="partition id"):
        run(source.restore(SourceCheckpoint({"p0": "1"})))


def test_concurrent_appends_keep_every_record_and_each_call_together(run, tmp_path):
    calls = [list(range(start, start + 50)) for start in range(0, 2000, 50)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda ids: MemorySource.append(tmp_path, ids, partition=1), calls))
    ids = polled_ids(run, opened(run, tmp_path), max_records=1000)
    assert sorted(ids) == list(range(2000))
    runs = [ids[i : i + 50] for i in range(0, 2000, 50)]
    assert sorted(runs) == calls, "the records of one append stay together, in order"
    partition_directory = tmp_path / "source" / "partition-1"
    assert not [name for name in os.listdir(partition_directory) if name.endswith(".tmp")]


def test_metrics_report_lag_as_of_the_last_poll(run, tmp_path):
    MemorySource.append(tmp_path, range(10))
    source = opened(run, tmp_path)
    batch = run(source.poll_batch(4))
    metrics = source.metrics()
    assert (metrics.records_total, metrics.bytes_total, metrics.lag) == (
        4,
        batch.records.nbytes,
        6,
    )


def test_path_is_required_and_must_be_a_directory(run, tmp_path):
    with pytest.raises(ConfigurationError) as missing:
        run(MemorySource().open(ConnectorConfig("memory", {})))
    assert missing.value.key == "path"
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(ConfigurationError) as not_a_directory:
        run(MemorySource().open(ConnectorConfig("memory", {"path": str(a_file)})))
    assert not_a_directory.value.key == "path"


def test_append_refuses_a_partition_outside_the_int32_column(tmp_path):
    with pytest.raises(ValueError, match="partition"):
        MemorySource.append(tmp_path, [1], partition=-1)
    with pytest.raises(ValueError, match="partition"):
        MemorySource.append(tmp_path, [1], partition=2**31)
