"""The ``delta`` sink: what a Delta table holds after each call, and the errors a user meets.

Tables are read back with ``deltalake`` (its snapshot and its change data feed). Object storage
runs against moto's S3 server on loopback (``laminar_conformance.services``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake
from laminar_sdk import (
    ConfigurationError,
    ConnectionFailed,
    ConnectorConfig,
    InvalidState,
    SchemaMismatch,
    TransactionError,
)
from laminar_sdk.reference import ids_batch

from laminar_plugin_delta import APP_ID_PREFIX, DeltaSink
from laminar_plugin_delta.testing import ids_schema_text

HERE = Path(__file__).parent
IDS = ids_schema_text()


def run(coroutine):
    return asyncio.run(coroutine)


def properties(path: Path | str, **extra: str) -> dict[str, str]:
    return {
        "path": str(path),
        "sink.id": "test",
        "table.create": "true",
        "schema": IDS,
        "table.properties": "delta.enableChangeDataFeed=true",  # for inserted_ids
        **extra,
    }


async def opened(props: dict[str, str]) -> DeltaSink:
    sink = DeltaSink()
    await sink.open(ConnectorConfig("delta", props))
    return sink


async def write_epoch(sink: DeltaSink, epoch: int, *batches: Sequence[int]) -> None:
    await sink.begin_epoch(epoch)
    for ids in batches:
        await sink.write_batch(ids_batch(ids))
    await sink.pre_commit(epoch)
    await sink.commit_epoch(epoch)


async def batches_of(*batches: Sequence[int]) -> AsyncIterator[pa.RecordBatch]:
    for ids in batches:
        yield ids_batch(ids)


def snapshot_ids(path: Path | str, options: dict[str, str] | None = None) -> list[int]:
    table = DeltaTable(str(path), storage_options=options)
    return sorted(table.to_pyarrow_table(columns=["id"]).column("id").to_pylist())


def inserted_ids(path: Path | str) -> list[int]:
    changes = pa.table(DeltaTable(str(path)).load_cdf(starting_version=0))
    change_type = changes.column("_change_type").cast(pa.string())
    return sorted(pc.filter(changes.column("id"), pc.equal(change_type, "insert")).to_pylist())


def test_each_epoch_is_one_version_recording_it_and_a_redelivered_epoch_is_skipped(tmp_path):
    async def scenario():
        sink = await opened(properties(tmp_path / "t"))
        assert await sink.last_committed_epoch() == -1
        await write_epoch(sink, 0, [1, 2], [3])
        await write_epoch(sink, 1, [4])
        await write_epoch(sink, 1, [4])  # delivered again after a restart
        await write_epoch(sink, 0, [1, 2, 3])
        assert await sink.last_committed_epoch() == 1
        assert sink.metrics().custom == {"epochs_committed": 2.0, "epochs_skipped": 2.0}
        await sink.close()

    run(scenario())
    table = DeltaTable(str(tmp_path / "t"))
    assert snapshot_ids(tmp_path / "t") == [1, 2, 3, 4]
    assert table.version() == 2  # created, then one version per epoch
    assert table.transaction_version(APP_ID_PREFIX + "test") == 1
    assert [entry["operation"] for entry in table.history()] == ["WRITE", "WRITE", "CREATE TABLE"]


def test_another_instance_commits_what_one_pre_committed_and_nothing_shows_before(tmp_path):
    async def scenario():
        first = await opened(properties(tmp_path / "t"))
        await first.begin_epoch(0)
        await first.write_batch(ids_batch([7, 8]))
        await first.pre_commit(0)
        assert snapshot_ids(tmp_path / "t") == []
        second = await opened(properties(tmp_path / "t"))
        await second.commit_epoch(0)
        await second.commit_epoch(0)
        with pytest.raises(InvalidState, match="never pre-committed"):
            await second.commit_epoch(1)
        await second.close()

    run(scenario())
    assert snapshot_ids(tmp_path / "t") == [7, 8]


def test_a_rolled_back_epoch_leaves_no_file_and_cannot_be_committed_by_its_writer(tmp_path):
    async def scenario():
        stale = await opened(properties(tmp_path / "t"))
        await stale.begin_epoch(0)
        await stale.write_batch(ids_batch([1]))
        await stale.pre_commit(0)
        recovering = await opened(properties(tmp_path / "t"))
        await recovering.rollback_epoch(0)
        with pytest.raises(InvalidState, match="rolled back"):
            await stale.commit_epoch(0)

    run(scenario())
    assert snapshot_ids(tmp_path / "t") == []
    assert not list((tmp_path / "t").glob("*.parquet"))


def test_tasks_stage_in_parallel_and_one_commit_adds_them_once(tmp_path):
    async def scenario():
        tasks = [await opened(properties(tmp_path / "t")) for _ in range(2)]
        descriptors = [
            await tasks[0].stage(0, "task-0", batches_of([1, 2], [3])),
            await tasks[1].stage(0, "task-1", batches_of([4])),
            await tasks[1].stage(0, "task-1-attempt-2", batches_of([5])),  # never committed
        ]
        assert snapshot_ids(tmp_path / "t") == []
        driver = await opened(properties(tmp_path / "t"))
        await driver.commit_aggregated(0, descriptors[:2])
        await driver.commit_aggregated(0, descriptors[:2][::-1])  # recovery, after a crash
        again = await tasks[0].stage(1, "task-0", batches_of([9]))
        with pytest.raises(TransactionError, match="more than one commit descriptor"):
            await driver.commit_aggregated(1, [again, again])

    run(scenario())
    assert snapshot_ids(tmp_path / "t") == [1, 2, 3, 4]
    assert inserted_ids(tmp_path / "t") == [1, 2, 3, 4]


def test_a_partitioned_table_gets_hive_directories_and_its_partition_values_back(tmp_path):
    async def scenario():
        sink = await opened(properties(tmp_path / "t", partition_by="partition", rows_per_file="2"))
        await sink.begin_epoch(0)
        await sink.write_batch(ids_batch([1, 2, 3], partition=0))
        await sink.write_batch(ids_batch([4], partition=1))
        await sink.pre_commit(0)
        await sink.commit_epoch(0)

    run(scenario())
    table = DeltaTable(str(tmp_path / "t"))
    assert table.metadata().partition_columns == ["partition"]
    rows = table.to_pyarrow_table(columns=["id", "partition"]).sort_by("id").to_pylist()
    assert rows == [
        {"id": 1, "partition": 0},
        {"id": 2, "partition": 0},
        {"id": 3, "partition": 0},
        {"id": 4, "partition": 1},
    ]
    root = tmp_path / "t"
    directories = sorted(
        path.relative_to(root).parent.as_posix() for path in root.rglob("*.parquet")
    )
    assert directories == ["partition=0", "partition=0", "partition=1"]  # 3 rows, 2 per file


def test_an_existing_table_is_appended_to_and_a_batch_of_another_schema_is_refused(tmp_path):
    write_deltalake(str(tmp_path / "t"), pa.table(ids_batch([100])))

    async def scenario():
        sink = await opened({"path": str(tmp_path / "t"), "sink.id": "test"})
        assert sink.schema().names == ["id", "partition", "value"]
        await write_epoch(sink, 0, [1])
        await sink.begin_epoch(1)
        with pytest.raises(SchemaMismatch, match="missing column"):
            await sink.write_batch(pa.record_batch({"id": pa.array([1], pa.int64())}))

    run(scenario())
    assert snapshot_ids(tmp_path / "t") == [1, 100]


@pytest.mark.parametrize(
    ("changes", "key", "message"),
    [
        ({"table.create": "false"}, "path", "no Delta table at .*set table.create=true"),
        ({"schema": ""}, "schema", "table.create=true needs config key 'schema'"),
        ({"sink.id": "a b"}, "sink.id", "may hold only letters"),
        ({"rows_per_file": "0"}, "rows_per_file", "must be >= 1"),
        ({"partition_by": "nope"}, "partition_by", "'nope', which is not a column"),
        ({"partition_by": "value"}, "partition_by", "of type double"),
        ({"table.properties": "delta.appendOnly"}, "table.properties", "is not key=value"),
        ({"schema": "id integer"}, "schema", "unknown type 'integer'"),
        ({"s3.endpoint": "http://127.0.0.1:1"}, "s3.endpoint", "apply to s3:// paths only"),
        ({"path": "gs://bucket/t"}, "path", "on local disk and on S3"),
    ],
)
def test_bad_configuration_names_the_key(tmp_path, changes, key, message):
    with pytest.raises(ConfigurationError, match=message) as caught:
        run(opened({**properties(tmp_path / "t"), **changes}))
    assert caught.value.key == key


def test_a_schema_that_is_not_the_tables_is_refused_naming_the_column(tmp_path):
    write_deltalake(str(tmp_path / "t"), pa.table(ids_batch([1])), partition_by=["partition"])
    with pytest.raises(
        SchemaMismatch, match="column 'value' is int64 in config key 'schema' and double"
    ):
        run(opened(properties(tmp_path / "t", schema="id int64, partition int32, value int64")))
    with pytest.raises(ConfigurationError, match="partitioned by partition") as caught:
        run(opened(properties(tmp_path / "t", partition_by="id")))
    assert caught.value.key == "partition_by"


def test_two_writers_racing_on_the_same_epochs_commit_each_epoch_once(tmp_path):
    """The check of the recorded epoch and the commit are one step: the loser re-checks."""
    epochs = 12
    props = json.dumps(properties(tmp_path / "t"))
    run(opened(properties(tmp_path / "t")))  # create the table before the race
    racers = [
        subprocess.Popen(
            [sys.executable, str(HERE / "delta_racer.py"), props, str(writer), str(epochs)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for writer in (1, 2)
    ]
    for racer in racers:
        _, errors = racer.communicate(timeout=300)
        assert racer.returncode == 0, errors[-3000:]
    rows = DeltaTable(str(tmp_path / "t")).to_pyarrow_table(columns=["id", "value"]).to_pylist()
    writers_of_epoch: dict[int, set[int]] = {}
    for row in rows:
        writers_of_epoch.setdefault(int(row["value"]), set()).add(row["id"] // 100000)
    assert sorted(writers_of_epoch) == list(range(epochs))
    assert all(len(writers) == 1 for writers in writers_of_epoch.values()), writers_of_epoch
    assert len(rows) == epochs * 5
    assert len(inserted_ids(tmp_path / "t")) == epochs * 5


if importlib.util.find_spec("moto") is not None:
    from laminar_conformance.services import S3Endpoint, moto_s3_server

    SECRET = "s3cr3t-value-never-shown"

    @pytest.fixture(scope="module")
    def s3_endpoint() -> Iterator[S3Endpoint]:
        """moto's S3 server on loopback, with one bucket; stopped at the end, pass or fail."""
        with moto_s3_server() as endpoint:
            yield endpoint

    def s3_properties(endpoint: S3Endpoint, secret: str = SECRET) -> dict[str, str]:
        return {
            **properties(endpoint.location(f"table-{uuid.uuid4().hex[:8]}")),
            "s3.endpoint": endpoint.url,
            "s3.region": endpoint.region,
            "s3.access_key": endpoint.access_key_id,
            "s3.secret_key": secret,
            "s3.allow_http": "true",
        }

    def delta_options(endpoint: S3Endpoint) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": endpoint.url,
            "AWS_REGION": endpoint.region,
            "AWS_ACCESS_KEY_ID": endpoint.access_key_id,
            "AWS_SECRET_ACCESS_KEY": endpoint.secret_access_key,
            "AWS_ALLOW_HTTP": "true",
        }

    @pytest.mark.slow
    def test_on_s3_epochs_are_committed_once_and_read_back_by_deltalake(s3_endpoint):
        props = s3_properties(s3_endpoint)

        async def scenario():
            sink = await opened(props)
            await write_epoch(sink, 0, [1, 2])
            await write_epoch(sink, 0, [1, 2])
            task = await opened(props)
            descriptor = await task.stage(1, "task-0", batches_of([3]))
            await sink.commit_aggregated(1, [descriptor])
            await sink.commit_aggregated(1, [descriptor])
            assert await sink.last_committed_epoch() == 1

        run(scenario())
        assert snapshot_ids(props["path"], delta_options(s3_endpoint)) == [1, 2, 3]

    @pytest.mark.slow
    def test_on_s3_two_racing_writers_commit_each_epoch_once(s3_endpoint):
        props = s3_properties(s3_endpoint)
        run(opened(props))
        racers = [
            subprocess.Popen(
                [sys.executable, str(HERE / "delta_racer.py"), json.dumps(props), str(w), "6"],
                stderr=subprocess.PIPE,
                text=True,
            )
            for w in (1, 2)
        ]
        for racer in racers:
            _, errors = racer.communicate(timeout=300)
            assert racer.returncode == 0, errors[-3000:]
        table = DeltaTable(props["path"], storage_options=delta_options(s3_endpoint))
        rows = table.to_pyarrow_table(columns=["id", "value"]).to_pylist()
        assert len(rows) == 6 * 5
        assert len({(int(r["value"]), r["id"] // 100000) for r in rows}) == 6

    @pytest.mark.slow
    def test_an_unreachable_store_is_connection_failed_without_the_secret(s3_endpoint):
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            port = unused.getsockname()[1]
        props = {**s3_properties(s3_endpoint), "s3.endpoint": f"http://127.0.0.1:{port}"}
        props["s3.timeout_s"] = "1"
        with pytest.raises(ConnectionFailed) as caught:
            run(opened(props))
        assert "127.0.0.1" in str(caught.value)
        assert SECRET not in str(caught.value)
        assert SECRET not in repr(caught.value.__cause__)


def test_partition_values_with_any_characters_and_nulls_read_back_as_written(tmp_path):
    regions = ["a b", "x%y", "é", "c:d/e", None]
    schema = pa.schema([("id", pa.int64()), ("region", pa.string())])
    batch = pa.record_batch([pa.array(range(5), pa.int64()), pa.array(regions)], schema=schema)

    async def scenario():
        sink = await opened(
            properties(tmp_path / "t", schema="id int64, region string", partition_by="region")
        )
        await sink.begin_epoch(0)
        await sink.write_batch(batch)
        await sink.pre_commit(0)
        await sink.commit_epoch(0)

    run(scenario())
    rows = DeltaTable(str(tmp_path / "t")).to_pyarrow_table().sort_by("id").to_pylist()
    assert rows == [{"id": i, "region": region} for i, region in enumerate(regions)]
    # The directories delta-rs itself would name (its change feed reader, 1.6.6, cannot read
    # these paths back, not even in tables delta-rs wrote: the snapshot is the check here).
    directories = sorted(path.name for path in (tmp_path / "t").glob("region=*"))
    assert directories == [
        "region=%C3%A9",
        "region=__HIVE_DEFAULT_PARTITION__",
        "region=a%20b",
        "region=c%3Ad%2Fe",
        "region=x%25y",
    ]
