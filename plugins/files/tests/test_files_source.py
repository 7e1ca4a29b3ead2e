"""The ``files`` source: name order, schema, errors, and restoring at every row position."""

from __future__ import annotations

import asyncio
import json
import re
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from files_testing import FORMATS, drain, open_source, write_source_file
from hypothesis import given, settings
from hypothesis import strategies as st
from laminar_sdk import (
    CheckpointError,
    PartitionInfo,
    PartitionRange,
    ReadError,
    SchemaMismatch,
    SerdeError,
    SourceCheckpoint,
)

from laminar_plugin_files import FilesSource


def poll(source: FilesSource, max_records: int = 1000):
    return asyncio.run(source.poll_batch(max_records))


@pytest.mark.parametrize("file_format", FORMATS)
def test_files_are_read_whole_in_name_order_in_batches_of_the_schema(tmp_path, file_format):
    write_source_file(tmp_path / f"b.{file_format}", [3, 4, 5], file_format)
    write_source_file(tmp_path / f"a.{file_format}", [0, 1, 2], file_format)
    write_source_file(tmp_path / f"c.{file_format}", [6], file_format)
    source = open_source(tmp_path, format=file_format, batch_size="2")
    batches = []
    while (batch := poll(source, 5)) is not None:
        assert batch.records.schema.equals(source.schema())
        batches.append((batch.records.column("id").to_pylist(), batch.partition))
    assert batches == [
        ([0, 1], PartitionInfo("files", f"2:a.{file_format}")),
        ([2], PartitionInfo("files", f"end:a.{file_format}")),
        ([3, 4], PartitionInfo("files", f"2:b.{file_format}")),
        ([5], PartitionInfo("files", f"end:b.{file_format}")),
        ([6], PartitionInfo("files", f"end:c.{file_format}")),
    ]
    assert source.checkpoint() == SourceCheckpoint({"files": f"end:c.{file_format}"})
    assert source.metrics().records_total == 7
    assert source.metrics().custom["files_finished"] == 3


def test_hidden_and_underscore_files_and_directories_are_ignored(tmp_path):
    write_source_file(tmp_path / "a.parquet", [1], "parquet")
    write_source_file(tmp_path / ".b.parquet", [2], "parquet")
    write_source_file(tmp_path / "_c.parquet", [3], "parquet")
    write_source_file(tmp_path / "_staging" / "d.parquet", [4], "parquet")
    write_source_file(tmp_path / ".tmp" / "e.parquet", [5], "parquet")
    write_source_file(tmp_path / "day=2" / "f.parquet", [6], "parquet")
    write_source_file(tmp_path / "day=1" / "g.parquet", [7], "parquet")
    write_source_file(tmp_path / "day=1" / "_h.parquet", [8], "parquet")
    (tmp_path / "notes.txt").write_text("not data")
    ids, _ = drain(open_source(tmp_path))
    assert ids == [1, 7, 6], "a.parquet, then day=1/g.parquet, then day=2/f.parquet"


def test_linked_files_are_read_but_linked_directories_are_not_descended_into(tmp_path):
    source_dir = tmp_path / "in"
    write_source_file(source_dir / "a.parquet", [1], "parquet")
    write_source_file(tmp_path / "elsewhere" / "x.parquet", [2], "parquet")
    (source_dir / "b.parquet").symlink_to(tmp_path / "elsewhere" / "x.parquet")
    (source_dir / "sub").mkdir()
    (source_dir / "sub" / "loop").symlink_to(source_dir)  # would never end if followed
    (source_dir / "other").symlink_to(tmp_path / "elsewhere")
    ids, _ = drain(open_source(source_dir))
    assert ids == [1, 2]


def test_the_pattern_selects_files_by_their_relative_path(tmp_path):
    write_source_file(tmp_path / "2024" / "a.parquet", [1], "parquet")
    write_source_file(tmp_path / "2025" / "b.parquet", [2], "parquet")
    write_source_file(tmp_path / "2025" / "c.other", [3], "parquet")
    ids, _ = drain(open_source(tmp_path, pattern="2025/*"))
    assert ids == [2, 3]


def test_files_that_appear_later_are_read_and_one_sorting_before_the_position_is_not(
    tmp_path,
):
    write_source_file(tmp_path / "0001.parquet", [1], "parquet")
    source = open_source(tmp_path)
    assert drain(source)[0] == [1]
    assert poll(source) is None
    write_source_file(tmp_path / "0002.parquet", [2, 3], "parquet")
    write_source_file(tmp_path / "0000.parquet", [99], "parquet")  # too late: sorts first
    assert drain(source)[0] == [2, 3]
    assert poll(source) is None


def test_columns_are_picked_by_name_and_cast_to_the_schema(tmp_path):
    table = pa.table(
        {
            "extra": pa.array(["x", "y"]),
            "value": pa.array([1.5, 2.5], pa.float32()),
            "partition": pa.array([7, 8], pa.int64()),
            "id": pa.array([1, 2], pa.int32()),
        }
    )
    pq.write_table(table, tmp_path / "a.parquet")
    source = open_source(tmp_path)
    batch = poll(source).records
    assert batch.schema.equals(source.schema())
    assert batch.to_pydict() == {"id": [1, 2], "partition": [7, 8], "value": [1.5, 2.5]}


def test_a_jsonl_file_reads_absent_keys_as_null_and_ignores_unknown_ones(tmp_path):
    (tmp_path / "a.jsonl").write_text(
        '{"id": 1, "partition": 0, "value": 1.0, "other": "x"}\n{"id": 2}\n'
    )
    batch = poll(open_source(tmp_path, format="jsonl")).records
    assert batch.to_pydict() == {"id": [1, 2], "partition": [0, None], "value": [1.0, None]}


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        ("a.parquet", None, "has no column(s) partition, value"),
        ("a.csv", "id\n1\n", "does not fit the declared schema"),
        ("a.csv", "id,partition,value\nabc,0,1.0\n", "does not fit the declared schema"),
        ("a.jsonl", '{"id": "abc"}\n', "does not fit the declared schema"),
    ],
)
def test_a_file_whose_columns_do_not_fit_is_a_schema_mismatch_naming_it(
    tmp_path, name, content, problem
):
    path = tmp_path / name
    if content is None:
        pq.write_table(pa.table({"id": [1]}), path)
    else:
        path.write_text(content)
    source = open_source(tmp_path, format=path.suffix[1:])
    with pytest.raises(SchemaMismatch, match=re.escape(problem)) as caught:
        poll(source)
    assert str(path) in str(caught.value)


def test_nulls_in_a_non_nullable_column_are_a_schema_mismatch(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"id": 1}\n{"id": null}\n')
    schema = json.dumps([{"name": "id", "type": "int64", "nullable": False}])
    source = open_source(tmp_path, format="jsonl", schema=schema)
    with pytest.raises(SchemaMismatch, match="holds 1 null"):
        poll(source)


def test_a_value_that_does_not_cast_is_a_schema_mismatch_naming_the_column(tmp_path):
    pq.write_table(
        pa.table({"id": [1.5], "partition": [0], "value": [1.0]}), tmp_path / "a.parquet"
    )
    with pytest.raises(SchemaMismatch, match="column 'id'.*does not convert to the declared int64"):
        poll(open_source(tmp_path))


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("a.parquet", b"not a parquet file at all"),
        ("a.csv", b"id,partition,value\n1,0\n"),
        ("a.jsonl", b'{"id": 1}\n{broken\n'),
    ],
)
def test_a_corrupt_file_is_a_serde_error_naming_it_and_what_to_do(tmp_path, name, content):
    (tmp_path / name).write_bytes(content)
    source = open_source(tmp_path, format=name.split(".")[1])
    with pytest.raises(SerdeError, match="replace it with a complete, valid file") as caught:
        poll(source)
    assert str(tmp_path / name) in str(caught.value)


def test_a_truncated_parquet_file_is_a_serde_error(tmp_path):
    path = write_source_file(tmp_path / "a.parquet", list(range(100)), "parquet")
    data = path.read_bytes()
    path.write_bytes(data[:100] + b"\0" * (len(data) - 200) + data[-100:])
    with pytest.raises(SerdeError, match="is not a readable parquet file"):
        drain(open_source(tmp_path))


@pytest.mark.parametrize("file_format", FORMATS)
def test_empty_files_hold_no_rows(tmp_path, file_format):
    (tmp_path / f"a.{file_format}").write_bytes(b"")
    write_source_file(tmp_path / f"b.{file_format}", [], file_format)
    write_source_file(tmp_path / f"c.{file_format}", [1], file_format)
    source = open_source(tmp_path, format=file_format)
    assert drain(source)[0] == [1]


def test_a_checkpoint_stays_small_however_many_files_were_read(tmp_path):
    for number in range(300):
        write_source_file(tmp_path / f"{number:06d}.parquet", [number], "parquet")
    source = open_source(tmp_path)
    ids, _ = drain(source)
    assert ids == list(range(300))
    assert (
        source.checkpoint().to_json()
        == '{"epoch":0,"metadata":{},"offsets":{"files":"end:000299.parquet"}}'
    )


def test_restoring_into_a_file_that_is_gone_or_shorter_is_a_checkpoint_error(tmp_path):
    write_source_file(tmp_path / "a.parquet", [1, 2, 3], "parquet")
    write_source_file(tmp_path / "b.csv", [1, 2, 3], "csv")
    gone = open_source(tmp_path)
    asyncio.run(gone.restore(SourceCheckpoint({"files": "1:zzz.parquet"})))
    with pytest.raises(CheckpointError, match="zzz.parquet, which is gone"):
        poll(gone)
    for file_format, name in (("parquet", "a.parquet"), ("csv", "b.csv")):
        shorter = open_source(tmp_path, format=file_format)
        asyncio.run(shorter.restore(SourceCheckpoint({"files": f"5:{name}"})))
        with pytest.raises(CheckpointError, match="5 rows into .* the file has only 3"):
            poll(shorter)


@pytest.mark.parametrize(
    "offsets",
    [{"files": "a.parquet"}, {"files": "x:a.parquet"}, {"files": "-1:a.parquet"}, {"0": "end:a"}],
)
def test_a_checkpoint_of_another_kind_is_refused(tmp_path, offsets):
    source = open_source(tmp_path)
    with pytest.raises(CheckpointError):
        asyncio.run(source.restore(SourceCheckpoint(offsets)))


def test_a_source_directory_removed_while_running_is_a_read_error_saying_what_to_do(tmp_path):
    directory = tmp_path / "in"
    write_source_file(directory / "a.parquet", [1], "parquet")
    source = open_source(directory)
    assert drain(source)[0] == [1]
    shutil.rmtree(directory)
    with pytest.raises(ReadError, match="is gone; restore it") as caught:
        poll(source)
    assert str(directory) in str(caught.value)


# Restoring at every position ------------------------------------------------------------

FILES = st.lists(st.integers(0, 7), min_size=1, max_size=4)


def fill(directory, sizes: list[int], file_format: str, row_group_size: int) -> list[int]:
    """Files of the given sizes holding consecutive ids; every id, in reading order."""
    ids = list(range(sum(sizes)))
    start = 0
    for number, size in enumerate(sizes):
        write_source_file(
            directory / f"{number:04d}.{file_format}",
            ids[start : start + size],
            file_format,
            row_group_size=row_group_size,
        )
        start += size
    return ids


@pytest.mark.parametrize("file_format", FORMATS)
@settings(max_examples=40, deadline=None)
@given(sizes=FILES, row_group_size=st.integers(1, 4), batch_size=st.integers(1, 5))
def test_restoring_the_checkpoint_after_any_row_resumes_right_after_it(
    tmp_path_factory, file_format, sizes, row_group_size, batch_size
):
    directory = tmp_path_factory.mktemp(file_format)
    ids = fill(directory, sizes, file_format, row_group_size)
    options = {"format": file_format, "batch_size": str(batch_size)}
    one_by_one, checkpoints = drain(open_source(directory, **options), max_records=1)
    assert one_by_one == ids
    for returned, checkpoint in enumerate([SourceCheckpoint(), *checkpoints]):
        restored = open_source(directory, **options)
        asyncio.run(restored.restore(SourceCheckpoint.from_json(checkpoint.to_json())))
        rest, _ = drain(restored, max_records=3)
        assert rest == ids[returned:], f"restored {checkpoint} after {returned} rows"


@pytest.mark.parametrize("file_format", FORMATS)
@settings(max_examples=40, deadline=None)
@given(
    sizes=FILES,
    row_group_size=st.integers(1, 4),
    polls=st.lists(st.integers(1, 6), min_size=1, max_size=12),
)
def test_polling_again_from_a_checkpoint_returns_the_same_batches(
    tmp_path_factory, file_format, sizes, row_group_size, polls
):
    """What Spark relies on to replay a micro-batch: same start, same polls, same batches."""
    directory = tmp_path_factory.mktemp(file_format)
    fill(directory, sizes, file_format, row_group_size)
    options = {"format": file_format, "batch_size": "4"}
    first = open_source(directory, **options)
    steps = []
    for max_records in polls:
        before = first.checkpoint()
        batch = poll(first, max_records)
        returned = None if batch is None else batch.records.column("id").to_pylist()
        steps.append((before, max_records, returned, first.checkpoint()))
    for before, max_records, returned, after in steps:
        again = open_source(directory, **options)
        asyncio.run(again.restore(before))
        batch = poll(again, max_records)
        assert (None if batch is None else batch.records.column("id").to_pylist()) == returned
        assert again.checkpoint() == after


# Range reads -----------------------------------------------------------------------------


def read_range(source: FilesSource, start: SourceCheckpoint, end: SourceCheckpoint) -> list[int]:
    async def read() -> list[int]:
        partition_range = PartitionRange("files", start.get_offset("files"), end.offsets["files"])
        ids: list[int] = []
        async for batch in source.as_range_readable().read_range(partition_range):
            assert batch.schema.equals(source.schema())
            ids += batch.column("id").to_pylist()
        return ids

    return asyncio.run(read())


@pytest.mark.parametrize("file_format", FORMATS)
@settings(max_examples=30, deadline=None)
@given(sizes=FILES, row_group_size=st.integers(1, 4), chunk=st.integers(1, 6))
def test_micro_batches_planned_by_position_read_every_row_once_in_order(
    tmp_path_factory, file_format, sizes, row_group_size, chunk
):
    directory = tmp_path_factory.mktemp(file_format)
    ids = fill(directory, sizes, file_format, row_group_size)
    options = {"format": file_format, "batch_size": "3"}
    polling = open_source(directory, **options)
    steps = []  # (checkpoint before, ids returned, checkpoint after) of every poll
    while (batch := poll(polling, 2)) is not None:
        steps.append((steps[-1][2] if steps else SourceCheckpoint(), batch, polling.checkpoint()))
    planner, reader = open_source(directory, **options), open_source(directory, **options)
    ranges = planner.as_range_readable()
    cursor, read = SourceCheckpoint(), []
    while (end := asyncio.run(ranges.plan_end(cursor, chunk))) != cursor:
        rows = read_range(reader, cursor, end)
        assert len(rows) <= chunk
        read += rows
        cursor = end
    assert read == ids
    assert cursor.offsets == polling.checkpoint().offsets, "planning ends where polling ends"
    unbounded = asyncio.run(ranges.plan_end(SourceCheckpoint(), None))
    assert unbounded.offsets == polling.checkpoint().offsets
    for before, batch, after in steps:
        assert read_range(reader, before, after) == batch.records.column("id").to_pylist()


def test_a_range_whose_files_are_gone_or_shorter_is_a_read_error(tmp_path):
    write_source_file(tmp_path / "a.csv", [1, 2, 3], "csv")
    source = open_source(tmp_path, format="csv")
    start, end = SourceCheckpoint(), SourceCheckpoint({"files": "2:b.csv"})
    with pytest.raises(ReadError, match="b.csv, which is gone"):
        read_range(source, start, end)
    with pytest.raises(ReadError, match="5 rows into .*a.csv, but the file has only 3"):
        read_range(source, start, SourceCheckpoint({"files": "5:a.csv"}))
    with pytest.raises(CheckpointError, match="this source has only 'files'"):
        asyncio.run(anext(source.read_range(PartitionRange("0", None, "end:a.csv"))))
