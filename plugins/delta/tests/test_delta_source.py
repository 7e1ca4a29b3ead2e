"""The ``delta`` source: the rows of each version, restores, compactions, changes, errors.

Tables are written with ``deltalake`` (delta-rs) as any other writer would write them, and
read with the source. Object storage runs against moto's S3 server on loopback
(``laminar_conformance.services``).
"""

from __future__ import annotations

import asyncio
import datetime
import importlib.util
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, WriterProperties, write_deltalake
from laminar_sdk import (
    CheckpointError,
    ConfigurationError,
    ConnectorConfig,
    PartitionRange,
    ReadError,
    SourceCheckpoint,
)
from laminar_sdk.reference import IDS_SCHEMA, ids_batch

from laminar_plugin_delta import DeltaSource


def run(coroutine):
    return asyncio.run(coroutine)


def create(path: Path, **options) -> None:
    """An empty ``ids`` table, partitioned by ``partition`` (version 0)."""
    DeltaTable.create(str(path), IDS_SCHEMA, partition_by=["partition"], **options)


def append(path: Path | str, *parts: list[int], options: dict[str, str] | None = None) -> None:
    """One new version: each of ``parts`` in partition value 0, 1, ... (a data file each)."""
    batches = [ids_batch(ids, partition=number) for number, ids in enumerate(parts)]
    write_deltalake(
        str(path),
        pa.Table.from_batches(batches, schema=IDS_SCHEMA),
        mode="append",
        writer_properties=WriterProperties(max_row_group_size=2),
        storage_options=options,
    )


def opened(path: Path | str, **extra: str) -> DeltaSource:
    source = DeltaSource()
    run(source.open(ConnectorConfig("delta", {"path": str(path), **extra})))
    return source


def restored(path: Path | str, checkpoint: SourceCheckpoint, **extra: str) -> DeltaSource:
    source = opened(path, **extra)
    run(source.restore(SourceCheckpoint.from_json(checkpoint.to_json())))
    return source


def drain(source: DeltaSource, max_records: int = 1000) -> list[int]:
    ids: list[int] = []
    while (batch := run(source.poll_batch(max_records))) is not None:
        assert batch.records.schema.equals(source.schema())
        ids += batch.records.column("id").to_pylist()
    return ids


def read_range(source: DeltaSource, start: str | None, end: str) -> list[int]:
    async def read() -> list[int]:
        return [
            value
            async for batch in source.read_range(PartitionRange("delta", start, end))
            for value in batch.column("id").to_pylist()
        ]

    return run(read())


def test_the_rows_of_every_version_come_in_version_order_in_batches(tmp_path):
    create(tmp_path)
    append(tmp_path, [1, 2, 3, 4, 5])
    append(tmp_path, [6])
    append(tmp_path, [])  # a version without rows
    append(tmp_path, [7, 8, 9])
    source = opened(tmp_path, batch_size="2")
    batches = []
    while (batch := run(source.poll_batch(5))) is not None:
        batches.append((batch.records.column("id").to_pylist(), batch.partition.offset))
    assert batches == [
        ([1, 2], "1:2"),
        ([3, 4], "1:4"),
        ([5], "1:end"),
        ([6], "2:end"),
        ([7, 8], "4:2"),
        ([9], "4:end"),
    ]
    assert source.checkpoint() == SourceCheckpoint({"delta": "4:end"})
    assert source.metrics().records_total == 9
    assert source.metrics().custom == {"versions_finished": 3.0, "latest_version": 4.0}


def test_restoring_the_checkpoint_after_each_row_returns_exactly_the_rest(tmp_path):
    """Inside a row group, between row groups, between a version's files, between versions."""
    create(tmp_path)
    append(tmp_path, [1, 2, 3], [4, 5])  # two data files in one version
    append(tmp_path, [6, 7, 8, 9, 10])
    append(tmp_path, [11], [12, 13])
    reference = opened(tmp_path)
    everything = drain(reference)
    assert sorted(everything) == list(range(1, 14))
    stepping = opened(tmp_path)
    checkpoints = [stepping.checkpoint()]
    while run(stepping.poll_batch(1)) is not None:
        checkpoints.append(stepping.checkpoint())
    assert len(checkpoints) == 14
    assert any(":end" not in text for c in checkpoints[1:] for text in c.offsets.values())
    for returned, checkpoint in enumerate(checkpoints):
        rest = drain(restored(tmp_path, checkpoint), max_records=3)
        assert rest == everything[returned:], f"restoring {checkpoint}"


def test_partition_columns_come_back_typed_as_the_table_says(tmp_path):
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("region", pa.string()),
            ("day", pa.date32()),
            ("hour", pa.timestamp("us", tz="UTC")),
            ("flag", pa.bool_()),
        ]
    )
    hour = datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.UTC)
    rows = pa.table(
        {
            "id": [1, 2, 3],
            "region": ["a b/c", None, "é%"],
            "day": [datetime.date(2024, 1, 31), datetime.date(2024, 2, 1), None],
            "hour": [hour, hour, hour],
            "flag": [True, False, True],
        },
        schema=schema,
    )
    write_deltalake(str(tmp_path), rows, partition_by=["region", "day", "hour"])
    source = opened(tmp_path)
    assert source.schema().names == ["id", "region", "day", "hour", "flag"]
    got = []
    while (batch := run(source.poll_batch(10))) is not None:
        got += batch.records.to_pylist()
    assert sorted(got, key=lambda row: row["id"]) == rows.to_pylist()


def test_optimize_adds_no_duplicates_and_rows_after_it_come_once(tmp_path):
    create(tmp_path)
    for ids in ([1, 2], [3], [4, 5]):
        append(tmp_path, ids)  # three small files in partition 0
    source = opened(tmp_path)
    assert drain(source, max_records=3) == [1, 2, 3, 4, 5]
    metrics = DeltaTable(str(tmp_path)).optimize.compact()
    assert metrics["numFilesRemoved"] == 3  # the compaction rewrote the rows
    append(tmp_path, [6])
    assert drain(source) == [6]
    assert drain(opened(tmp_path)) == [1, 2, 3, 4, 5, 6]
    planner = opened(tmp_path)
    end = run(planner.plan_end(SourceCheckpoint(), None))
    assert end == SourceCheckpoint({"delta": "5:end"})
    assert read_range(planner, None, "5:end") == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize(
    ("change", "operation"),
    [
        (lambda table: table.delete("id = 2"), "DELETE"),
        (lambda table: table.update(updates={"value": "0.0"}, predicate="id = 3"), "UPDATE"),
        (
            lambda table: write_deltalake(table, pa.table(ids_batch([9])), mode="overwrite"),
            "WRITE",
        ),
    ],
    ids=["delete", "update", "overwrite"],
)
def test_a_change_of_rows_is_refused_naming_it_and_skipped_with_skip_change_commits(
    tmp_path, change, operation
):
    create(tmp_path)
    append(tmp_path, [1, 2, 3])
    change(DeltaTable(str(tmp_path)))  # version 2: removes the file, adds its rewrite
    append(tmp_path, [4])
    source = opened(tmp_path)
    first = run(source.poll_batch(10))  # what came before it comes first
    assert first is not None
    assert first.records.column("id").to_pylist() == [1, 2, 3]
    with pytest.raises(ReadError, match=f"version 2 .* is a {operation} .*") as caught:
        run(source.poll_batch(10))
    assert "skip_change_commits=true" in str(caught.value)
    assert "starting_version=3" in str(caught.value)
    assert not caught.value.is_transient
    assert source.checkpoint() == SourceCheckpoint({"delta": "1:end"})
    planner = opened(tmp_path)
    assert run(planner.plan_end(SourceCheckpoint(), None)) == SourceCheckpoint({"delta": "1:end"})
    with pytest.raises(ReadError, match=f"is a {operation}"):
        run(planner.plan_end(SourceCheckpoint({"delta": "1:end"}), None))

    skipping = opened(tmp_path, skip_change_commits="true")
    assert drain(skipping) == [1, 2, 3, 4]  # the rewritten rows are not read again
    assert run(skipping.plan_end(SourceCheckpoint(), None)) == SourceCheckpoint({"delta": "3:end"})
    assert read_range(skipping, "1:end", "3:end") == [4]


def test_starting_version_leaves_out_the_versions_before_it(tmp_path):
    create(tmp_path)
    for ids in ([1], [2, 3], [4]):
        append(tmp_path, ids)
    assert drain(opened(tmp_path, starting_version="2")) == [2, 3, 4]
    assert drain(opened(tmp_path, starting_version="3")) == [4]
    planner = opened(tmp_path, starting_version="2")
    assert read_range(planner, None, "3:end") == [2, 3, 4]
    # A checkpoint wins over starting_version: it is where the pipeline stands.
    assert drain(
        restored(tmp_path, SourceCheckpoint({"delta": "1:end"}), starting_version="3")
    ) == [
        2,
        3,
        4,
    ]


def test_versions_committed_while_the_source_runs_reach_it_and_its_plans(tmp_path):
    create(tmp_path)
    source = opened(tmp_path)
    planner = opened(tmp_path)
    assert run(source.poll_batch(10)) is None
    assert run(planner.plan_end(SourceCheckpoint(), None)) == SourceCheckpoint()
    append(tmp_path, [1, 2])
    assert drain(source) == [1, 2]
    append(tmp_path, [3])
    assert drain(source) == [3]
    end = run(planner.plan_end(SourceCheckpoint(), 2))
    assert end == SourceCheckpoint({"delta": "1:end"})
    assert run(planner.plan_end(end, None)) == SourceCheckpoint({"delta": "2:end"})
    assert planner.checkpoint() == SourceCheckpoint()  # planning does not move it


def test_a_range_read_returns_what_polling_returned_between_its_checkpoints(tmp_path):
    create(tmp_path)
    append(tmp_path, [1, 2, 3], [4])
    append(tmp_path, [5, 6, 7])
    source = opened(tmp_path, batch_size="2")
    polled, checkpoints = [], [source.checkpoint()]
    while (batch := run(source.poll_batch(3))) is not None:
        polled.append(batch.records.column("id").to_pylist())
        checkpoints.append(source.checkpoint())
    reader = opened(tmp_path)
    for first in range(len(checkpoints)):
        for last in range(first, len(checkpoints)):
            start = checkpoints[first].get_offset("delta")
            end = checkpoints[last].get_offset("delta")
            expected = [value for ids in polled[first:last] for value in ids]
            if end is not None:
                assert read_range(reader, start, end) == expected, (start, end)
    with pytest.raises(CheckpointError, match="ends before it starts"):
        read_range(reader, "2:1", "1:end")


def test_a_file_whose_add_action_has_no_statistics_is_counted_from_its_footer(tmp_path):
    create(tmp_path)
    append(tmp_path, [1, 2, 3])
    append(tmp_path, [4])
    entry = tmp_path / "_delta_log" / f"{1:020d}.json"
    actions = [json.loads(line) for line in entry.read_text().splitlines()]
    for action in actions:
        if "add" in action:
            del action["add"]["stats"]
    entry.write_text("".join(json.dumps(action) + "\n" for action in actions))
    source = opened(tmp_path)
    assert run(source.plan_end(SourceCheckpoint(), 2)) == SourceCheckpoint({"delta": "1:2"})
    assert run(source.plan_end(SourceCheckpoint(), 3)) == SourceCheckpoint({"delta": "1:end"})
    assert drain(restored(tmp_path, SourceCheckpoint({"delta": "1:2"}))) == [3, 4]


def test_a_checkpoint_older_than_the_log_retention_fails_saying_so(tmp_path):
    create(tmp_path, configuration={"delta.logRetentionDuration": "interval 0 seconds"})
    for ids in ([1], [2], [3]):
        append(tmp_path, ids)
    table = DeltaTable(str(tmp_path))
    table.create_checkpoint()
    time.sleep(0.01)
    table.cleanup_metadata()  # deletes the log entries before version 3
    assert not (tmp_path / "_delta_log" / f"{1:020d}.json").exists()
    source = restored(tmp_path, SourceCheckpoint({"delta": "1:end"}))
    with pytest.raises(ReadError, match="log entry of version 2 .* is gone") as caught:
        run(source.poll_batch(10))
    message = str(caught.value)
    assert "older than the table's log retention" in message
    assert "the oldest version whose entry is kept is 3" in message
    assert not caught.value.is_transient
    assert drain(restored(tmp_path, SourceCheckpoint({"delta": "2:end"}))) == [3]


def test_a_data_file_deleted_by_vacuum_fails_the_read_saying_so(tmp_path):
    create(tmp_path)
    append(tmp_path, [1, 2])
    (path,) = DeltaTable(str(tmp_path)).file_uris()
    os.remove(path.removeprefix("file://"))
    with pytest.raises(ReadError, match="version 1 added is gone: VACUUM deleted it"):
        drain(opened(tmp_path))


def test_a_checkpoint_of_another_connector_is_refused(tmp_path):
    create(tmp_path)
    source = opened(tmp_path)
    with pytest.raises(CheckpointError, match="has only 'delta'"):
        run(source.restore(SourceCheckpoint({"files": "end:a.parquet"})))
    with pytest.raises(CheckpointError, match="is not '<version>:<rows>'"):
        run(source.restore(SourceCheckpoint({"delta": "12"})))


def test_there_being_no_table_at_path_names_the_path_key(tmp_path):
    with pytest.raises(ConfigurationError, match="no Delta table at .*config key 'path'") as caught:
        opened(tmp_path / "nothing-here")
    assert caught.value.key == "path"


@pytest.mark.parametrize(
    ("changes", "key", "message"),
    [
        ({"batch_size": "0"}, "batch_size", "must be >= 1, got 0"),
        ({"batch_size": "many"}, "batch_size", "many"),
        ({"starting_version": "-1"}, "starting_version", "must be >= 0, got -1"),
        ({"starting_version": "9"}, "starting_version", "is 9, and the table .* at version 1"),
        ({"skip_change_commits": "perhaps"}, "skip_change_commits", "perhaps"),
        ({"startingVersion": "1"}, "startingVersion", "startingVersion"),
        ({"s3.region": "eu-west-1"}, "s3.region", "apply to s3:// paths only"),
    ],
)
def test_bad_configuration_names_the_key(tmp_path, changes, key, message):
    create(tmp_path)
    append(tmp_path, [1])
    with pytest.raises(ConfigurationError, match=message) as caught:
        opened(tmp_path, **changes)
    assert caught.value.key == key


if importlib.util.find_spec("moto") is not None:
    from laminar_conformance.services import S3Endpoint, moto_s3_server

    @pytest.fixture(scope="module")
    def s3_endpoint() -> Iterator[S3Endpoint]:
        """moto's S3 server on loopback, with one bucket; stopped at the end, pass or fail."""
        with moto_s3_server() as endpoint:
            yield endpoint

    @pytest.mark.slow
    def test_on_s3_versions_are_read_and_a_checkpoint_restored(s3_endpoint):
        path = s3_endpoint.location(f"table-{uuid.uuid4().hex[:8]}")
        options = {
            "AWS_ENDPOINT_URL": s3_endpoint.url,
            "AWS_REGION": s3_endpoint.region,
            "AWS_ACCESS_KEY_ID": s3_endpoint.access_key_id,
            "AWS_SECRET_ACCESS_KEY": s3_endpoint.secret_access_key,
            "AWS_ALLOW_HTTP": "true",
        }
        keys = {
            "s3.endpoint": s3_endpoint.url,
            "s3.region": s3_endpoint.region,
            "s3.access_key": s3_endpoint.access_key_id,
            "s3.secret_key": s3_endpoint.secret_access_key,
            "s3.allow_http": "true",
        }
        DeltaTable.create(path, IDS_SCHEMA, partition_by=["partition"], storage_options=options)
        append(path, [1, 2, 3], [4], options=options)
        source = opened(path, batch_size="2", **keys)
        first = run(source.poll_batch(10))
        assert first is not None
        assert first.records.num_rows == 2
        checkpoint = source.checkpoint()
        rest = drain(source)
        append(path, [5], options=options)
        assert drain(source) == [5]
        assert drain(restored(path, checkpoint, **keys)) == [*rest, 5]
        assert run(source.plan_end(checkpoint, None)) == SourceCheckpoint({"delta": "2:end"})
