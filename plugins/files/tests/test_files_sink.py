"""The ``files`` sink: staging, publishing by rename, rollback, re-delivery, formats."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import os

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from files_testing import drain, ids_batch, open_sink, open_source, visible_ids, write_epoch
from laminar_sdk import (
    ConfigurationError,
    ConnectorConfig,
    InvalidState,
    SchemaMismatch,
    SerdeError,
    WriteResult,
)
from laminar_sdk.reference import WIDE_SCHEMA, GeneratorSource

from laminar_plugin_files import FilesSink


def published(directory) -> list[str]:
    return sorted(entry for entry in os.listdir(directory) if not entry.startswith("_"))


def reader_visible_paths(directory) -> list[str]:
    """Every file a reader that skips ``_`` and ``.`` names would pick up."""
    found = []
    for root, directories, files in os.walk(directory):
        directories[:] = [name for name in directories if not name.startswith(("_", "."))]
        found += [
            os.path.relpath(os.path.join(root, name), directory)
            for name in files
            if not name.startswith(("_", "."))
        ]
    return sorted(found)


def test_an_epoch_is_invisible_until_commit_and_then_published_whole(tmp_path):
    sink = open_sink(tmp_path)
    asyncio.run(sink.begin_epoch(7))
    assert asyncio.run(sink.write_batch(ids_batch([1, 2]))) == WriteResult(
        2, ids_batch([1, 2]).nbytes
    )
    asyncio.run(sink.write_batch(ids_batch([3])))
    assert visible_ids(tmp_path) == []
    asyncio.run(sink.pre_commit(7))
    assert visible_ids(tmp_path) == [], "pre-committed is not visible"
    assert published(tmp_path) == []
    asyncio.run(sink.commit_epoch(7))
    assert visible_ids(tmp_path) == [1, 2, 3]
    epoch_directory = tmp_path / "epoch=00000000000000000007"
    assert published(tmp_path) == [epoch_directory.name]
    assert sorted(os.listdir(tmp_path)) == ["_LAYOUT.json", "_staging", epoch_directory.name]
    assert sorted(os.listdir(epoch_directory)) == ["_MANIFEST.json", "part-00000.parquet"]
    manifest = json.loads((epoch_directory / "_MANIFEST.json").read_text())
    assert manifest == {"epoch": 7, "files": ["part-00000.parquet"], "rows": 3}
    assert os.listdir(tmp_path / "_staging") == [], "the staging directory was renamed"
    asyncio.run(sink.commit_epoch(7))
    assert visible_ids(tmp_path) == [1, 2, 3], "committing again does nothing"
    assert sink.metrics().custom["epochs_committed"] == 1


def test_rows_per_file_splits_an_epoch_into_files(tmp_path):
    sink = open_sink(tmp_path, rows_per_file="2")
    write_epoch(sink, 0, [1, 2, 3], [4], [5, 6])
    epoch_directory = tmp_path / "epoch=00000000000000000000"
    files = sorted(name for name in os.listdir(epoch_directory) if not name.startswith("_"))
    assert files == [f"part-{n:05d}.parquet" for n in range(3)]
    rows = [ds.dataset(str(epoch_directory / name)).count_rows() for name in files]
    assert rows == [2, 2, 2]
    assert visible_ids(tmp_path) == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("file_format", ["parquet", "jsonl"])
def test_what_the_sink_writes_the_source_reads_back_in_the_same_schema(tmp_path, file_format):
    generator = GeneratorSource()
    config = ConnectorConfig("generator", {"rows": "25", "schema": "wide", "batch_size": "10"})
    asyncio.run(generator.open(config))
    written = []
    sink = open_sink(tmp_path / "out", format=file_format, schema="wide", rows_per_file="7")
    for epoch in range(3):
        batch = asyncio.run(generator.poll_batch(10))
        assert batch is not None
        written.append(batch.records)
        write_epoch(sink, epoch)  # an empty epoch between the others must not disturb anything
        asyncio.run(sink.begin_epoch(epoch + 10))
        asyncio.run(sink.write_batch(batch.records))
        asyncio.run(sink.pre_commit(epoch + 10))
        asyncio.run(sink.commit_epoch(epoch + 10))
    source = open_source(tmp_path / "out", format=file_format, schema="wide", pattern="epoch=*")
    read = []
    while (batch := asyncio.run(source.poll_batch(100))) is not None:
        read.append(batch.records)
    assert pa.Table.from_batches(read, schema=WIDE_SCHEMA).equals(
        pa.Table.from_batches(written, schema=WIDE_SCHEMA)
    )


def test_a_rolled_back_epoch_leaves_nothing_a_reader_picks_up(tmp_path):
    sink = open_sink(tmp_path, rows_per_file="1")
    write_epoch(sink, 0, [1])
    write_epoch(sink, 1, [2, 3], commit=False)
    asyncio.run(sink.rollback_epoch(1))
    asyncio.run(sink.begin_epoch(1))
    asyncio.run(sink.write_batch(ids_batch([4])))
    asyncio.run(sink.rollback_epoch(1))
    asyncio.run(sink.rollback_epoch(1))  # idempotent
    asyncio.run(sink.rollback_epoch(99))  # never begun: nothing to do
    assert visible_ids(tmp_path) == [1]
    assert reader_visible_paths(tmp_path) == ["epoch=00000000000000000000/part-00000.parquet"]
    assert os.listdir(tmp_path / "_staging") == []
    write_epoch(sink, 1, [5])
    assert visible_ids(tmp_path) == [1, 5]


def test_rollback_never_touches_a_published_epoch(tmp_path):
    sink = open_sink(tmp_path)
    write_epoch(sink, 0, [1])
    asyncio.run(sink.rollback_epoch(0))
    assert visible_ids(tmp_path) == [1]


def test_a_committed_epoch_delivered_again_to_a_new_instance_is_skipped(tmp_path):
    write_epoch(open_sink(tmp_path), 0, [1, 2])
    restarted = open_sink(tmp_path)
    asyncio.run(restarted.begin_epoch(0))
    assert asyncio.run(restarted.write_batch(ids_batch([1, 2]))) == WriteResult(0)
    asyncio.run(restarted.pre_commit(0))
    asyncio.run(restarted.commit_epoch(0))
    assert visible_ids(tmp_path) == [1, 2]
    assert restarted.metrics().custom["epochs_skipped"] == 1
    assert restarted.metrics().records_total == 0


def test_the_newest_published_epoch_is_what_the_sink_reports_as_committed(tmp_path):
    # What the runtime asks before a new query: a staged or pre-committed epoch is not one.
    sink = open_sink(tmp_path)
    assert asyncio.run(sink.last_committed_epoch()) == -1
    write_epoch(sink, 0, [1])
    write_epoch(sink, 11, [2])
    write_epoch(sink, 12, [3], commit=False)
    assert asyncio.run(open_sink(tmp_path).last_committed_epoch()) == 11


def test_a_pre_committed_epoch_is_committed_by_another_instance(tmp_path):
    write_epoch(open_sink(tmp_path), 3, [1, 2], [3], commit=False)
    other = open_sink(tmp_path)
    asyncio.run(other.commit_epoch(3))
    assert visible_ids(tmp_path) == [1, 2, 3]


def test_a_new_attempt_at_an_epoch_replaces_what_an_abandoned_one_staged(tmp_path):
    crashed = open_sink(tmp_path)
    asyncio.run(crashed.begin_epoch(0))
    asyncio.run(crashed.write_batch(ids_batch([1, 2])))  # dies without pre_commit
    restarted = open_sink(tmp_path)
    write_epoch(restarted, 0, [3])
    assert visible_ids(tmp_path) == [3]


def test_commit_before_pre_commit_or_of_an_unknown_epoch_is_invalid(tmp_path):
    sink = open_sink(tmp_path)
    asyncio.run(sink.begin_epoch(0))
    asyncio.run(sink.write_batch(ids_batch([1])))
    with pytest.raises(InvalidState, match="pre_commit"):
        asyncio.run(sink.commit_epoch(0))
    with pytest.raises(InvalidState, match="never pre-committed"):
        asyncio.run(open_sink(tmp_path).commit_epoch(5))
    with pytest.raises(InvalidState, match="while epoch 0 is being written"):
        asyncio.run(sink.begin_epoch(1))
    assert visible_ids(tmp_path) == []


def test_a_batch_of_another_schema_is_a_schema_mismatch(tmp_path):
    sink = open_sink(tmp_path)
    asyncio.run(sink.begin_epoch(0))
    with pytest.raises(SchemaMismatch, match="missing column"):
        asyncio.run(sink.write_batch(pa.record_batch({"id": pa.array([1], pa.int64())})))


def test_a_value_json_cannot_hold_is_a_serde_error_suggesting_parquet(tmp_path):
    sink = open_sink(tmp_path, format="jsonl")
    asyncio.run(sink.begin_epoch(0))
    batch = ids_batch([1]).set_column(2, "value", pa.array([math.nan]))
    with pytest.raises(SerdeError, match="write format 'parquet' instead"):
        asyncio.run(sink.write_batch(batch))


def test_close_abandons_the_open_epoch(tmp_path):
    sink = open_sink(tmp_path)
    asyncio.run(sink.begin_epoch(0))
    asyncio.run(sink.write_batch(ids_batch([1])))
    asyncio.run(sink.close())
    assert visible_ids(tmp_path) == []
    assert drain(open_source(tmp_path, pattern="*"))[0] == [], "staging is invisible to a source"


def written_by_the_sink(directory, rows_per_file: str | None = None) -> list[int]:
    """Epochs 0 to 2 published, epoch 3 pre-committed and epoch 4 half written: what a reader
    of ``directory`` may see mid-run. Returns the ids of the published epochs."""
    sink = open_sink(directory, **({"rows_per_file": rows_per_file} if rows_per_file else {}))
    write_epoch(sink, 0, [0, 1], [2])
    write_epoch(sink, 1)  # an epoch with no rows publishes no data file
    write_epoch(sink, 2, [3, 4])
    write_epoch(sink, 3, [90, 91], commit=False)
    asyncio.run(open_sink(directory).begin_epoch(4))
    other = open_sink(directory)
    asyncio.run(other.begin_epoch(4))
    asyncio.run(other.write_batch(ids_batch([92])))
    return [0, 1, 2, 3, 4]


def test_pyarrow_reads_the_sink_directory_with_its_defaults(tmp_path):
    expected = written_by_the_sink(tmp_path, rows_per_file="2")
    table = pq.read_table(tmp_path)  # Hive partitions discovered: an `epoch` column is added
    assert sorted(table.column("id").to_pylist()) == expected
    rows = sorted(zip(*table.select(["id", "epoch"]).to_pydict().values(), strict=True))
    assert rows == [(0, 0), (1, 0), (2, 0), (3, 2), (4, 2)]
    dataset = ds.dataset(tmp_path)
    assert dataset.schema.names == ["id", "partition", "value"]
    assert sorted(dataset.to_table().column("id").to_pylist()) == expected


@pytest.mark.skipif(importlib.util.find_spec("pandas") is None, reason="pandas is not installed")
def test_pandas_reads_the_sink_directory_with_its_defaults(tmp_path):
    import pandas as pd  # noqa: PLC0415 - optional: this test runs where pandas is installed

    expected = written_by_the_sink(tmp_path)
    frame = pd.read_parquet(tmp_path)
    assert sorted(frame["id"]) == expected
    assert sorted(frame["epoch"].astype(int)) == [0, 0, 0, 2, 2]


def test_a_directory_of_epochs_in_the_old_layout_is_refused_naming_it(tmp_path):
    old = tmp_path / "epoch-00000000000000000003"
    old.mkdir()
    (old / "part-00000.parquet").write_bytes(b"")
    with pytest.raises(ConfigurationError, match="epoch-00000000000000000003/") as info:
        open_sink(tmp_path)
    assert info.value.key == "path"
    message = str(info.value)
    assert str(tmp_path) in message
    assert 'mv "$d" "epoch=${d#epoch-}"' in message, "says how to migrate"
    assert not (tmp_path / "_LAYOUT.json").exists()
    # Migrated as the message says, the directory is taken, and epoch 3 is recognised.
    old.rename(tmp_path / "epoch=00000000000000000003")
    sink = open_sink(tmp_path)
    asyncio.run(sink.begin_epoch(3))
    assert asyncio.run(sink.write_batch(ids_batch([1]))) == WriteResult(0), "committed before"


def test_a_column_named_epoch_is_refused_naming_the_schema_key(tmp_path):
    schema = '[{"name": "id", "type": "int64"}, {"name": "Epoch", "type": "int64"}]'
    with pytest.raises(ConfigurationError, match="column named 'Epoch'") as info:
        asyncio.run(
            FilesSink().open(ConnectorConfig("files", {"path": str(tmp_path), "schema": schema}))
        )
    assert info.value.key == "schema"
    assert "Epoch AS event_Epoch" in str(info.value)
