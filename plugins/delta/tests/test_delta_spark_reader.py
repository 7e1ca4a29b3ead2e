"""Delta's own Spark connector and the ``delta`` sink's tables, both ways.

Spark with Delta's connector (``delta_spark.py``: delta-spark's jars, resolved with ``mvn``
once) reads back exactly the rows a table holds, whether ``deltalake`` wrote it or the
laminar ``delta`` sink did — epochs written by one instance, epochs staged by write tasks and
committed together, an epoch delivered twice, a failed task attempt's files left in the
directory, a partitioned table with its change data feed on — and ``deltalake`` reads a
table Spark wrote with Delta's connector, with the transaction version Delta's idempotent-write
options recorded. One Spark session for the module; under ``full`` (the jars, a JVM).
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from laminar_sdk import ConnectorConfig
from laminar_sdk.reference import IDS_SCHEMA, ids_batch

from laminar_plugin_delta import DeltaSink
from laminar_plugin_delta.testing import ids_schema_text

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.full,
    pytest.mark.skipif(
        importlib.util.find_spec("pyspark") is None, reason="needs laminar-sdk[spark]"
    ),
]

if importlib.util.find_spec("pyspark") is not None:
    from delta_spark import delta_spark_session, read_delta, read_delta_ids
    from pyspark.sql import DataFrame, SparkSession


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = delta_spark_session(**{"spark.ui.showConsoleProgress": "false"})
    yield session
    session.stop()


def ids_table(ids: Sequence[int], partition: int = 0) -> pa.Table:
    return pa.Table.from_batches([ids_batch(ids, partition)])


async def batches_of(*batches: Sequence[int]) -> AsyncIterator[pa.RecordBatch]:
    for ids in batches:
        yield ids_batch(ids, partition=ids[0] % 2 if ids else 0)


async def write_with_sink(path: Path, table_keys: dict[str, str]) -> None:
    """Epoch 0 by one instance, epoch 1 staged by write tasks, epoch 1 delivered again."""
    config = {
        "path": str(path),
        "sink.id": "spark-reader",
        "schema": ids_schema_text(),
        "table.create": "true",
        **table_keys,
    }
    sink = DeltaSink()
    await sink.open(ConnectorConfig("delta", config))
    try:
        await sink.begin_epoch(0)
        await sink.write_batch(ids_batch(range(50), partition=0))
        await sink.write_batch(ids_batch(range(50, 100), partition=1))
        await sink.pre_commit(0)
        await sink.commit_epoch(0)
        descriptors = [
            await sink.stage(1, "task-0", batches_of(range(100, 150), range(150, 160))),
            await sink.stage(1, "task-1", batches_of(range(161, 200))),
            await sink.stage(1, "task-2", batches_of()),  # a write task with no rows
        ]
        # A failed task attempt's files: in the table's directory, never in its log.
        await sink.stage(1, "task-1-attempt-2", batches_of(range(500, 510)))
        await sink.commit_aggregated(1, descriptors)
        await sink.commit_aggregated(1, descriptors)  # the driver's commit, repeated
        await sink.begin_epoch(1)  # epoch 1 run again: the table holds it, so it is skipped
        await sink.write_batch(ids_batch(range(100, 200)))
        await sink.pre_commit(1)
        await sink.commit_epoch(1)
    finally:
        await sink.close()


def test_reads_a_table_deltalake_wrote(spark, tmp_path):
    path = tmp_path / "table"
    write_deltalake(str(path), ids_table(range(10)))
    write_deltalake(str(path), ids_table(range(10, 25), partition=1), mode="append")

    assert read_delta_ids(path, spark=spark) == list(range(25))
    frame = read_delta(spark, path)
    assert frame.columns == IDS_SCHEMA.names
    expected = [(i, 0, float(i)) for i in range(10)] + [(i, 1, float(i)) for i in range(10, 25)]
    assert sorted(tuple(row) for row in frame.collect()) == expected


@pytest.mark.parametrize(
    "table_keys",
    [
        {},
        # As the Spark kill test's table (test_delta_spark.py).
        {"partition_by": "partition", "table.properties": "delta.enableChangeDataFeed=true"},
    ],
    ids=["plain", "partitioned-with-change-data-feed"],
)
def test_reads_each_row_the_delta_sink_committed_once(spark, tmp_path, table_keys):
    path = tmp_path / "table"
    asyncio.run(write_with_sink(path, table_keys))
    expected = [*range(160), *range(161, 200)]

    assert read_delta_ids(path, spark=spark) == expected
    assert sorted(DeltaTable(str(path)).to_pyarrow_table().column("id").to_pylist()) == expected
    # Each row as written: its batch's partition, its id as value (partition columns included).
    partitions = {**dict.fromkeys(range(50, 100), 1), **dict.fromkeys(range(161, 200), 1)}
    written = [(i, partitions.get(i, 0), float(i)) for i in expected]
    rows = read_delta(spark, path).select(*IDS_SCHEMA.names).collect()
    assert sorted(tuple(row) for row in rows) == written


def test_deltalake_reads_a_table_spark_wrote_with_delta(spark, tmp_path):
    path = str(tmp_path / "table")

    def rows(start: int, end: int) -> DataFrame:
        return spark.range(start, end).selectExpr("id", "cast(id % 2 as int) as partition")

    idempotent = {"txnAppId": "spark-writer", "txnVersion": "0"}
    rows(0, 30).write.format("delta").options(**idempotent).save(path)
    # A plain append: Delta's idempotent append (txnAppId on an existing table) fails on a
    # Spark newer than its build (delta_spark.py says why).
    rows(30, 40).write.format("delta").mode("append").save(path)

    table = DeltaTable(path)
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == list(range(40))
    assert table.version() == 1
    assert table.transaction_version("spark-writer") == 0
    assert read_delta_ids(path, spark=spark) == list(range(40))
