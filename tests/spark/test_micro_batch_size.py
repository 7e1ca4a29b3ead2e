"""How much one micro-batch reads: everything available, up to a byte budget (and a record cap).

The planning logic is driven directly, as Spark's planning process drives it; no Spark session.
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncIterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.datasource_internal import _streamReader
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
)

from laminar_sdk import (
    ConnectorConfig,
    ConnectorRole,
    InvalidState,
    PartitionRange,
    SourceCheckpoint,
    open_checkpointer,
)
from laminar_sdk._spark import read_log
from laminar_sdk._spark.arrow import spark_round_trip_schema, spark_schema
from laminar_sdk._spark.reader import (
    FIRST_POLL_RECORDS,
    LaminarPolledReader,
    MicroBatchBounds,
    RecordSize,
    default_read_limit,
    fixed_record_bytes,
    micro_batch_bounds,
    poll_micro_batch,
)
from laminar_sdk.reference import IDS_SCHEMA, GeneratorSource
from laminar_sdk.spark import BridgeOptions, LaminarDataSource, parse_options

pytestmark = pytest.mark.spark

RECORD_BYTES = 20  # id int64 + partition int32 + value double, no nulls: what nbytes counts


def source_options(**extra: str) -> BridgeOptions:
    return parse_options({"connector": "generator", **extra}, ConnectorRole.SOURCE)


def test_spark_is_told_the_byte_budget_or_the_record_cap() -> None:
    assert default_read_limit(source_options()) == ReadMaxBytes(256 * 2**20)
    capped = source_options(**{"laminar.max.records.per.batch": "500"})
    assert default_read_limit(capped) == ReadMaxRows(500)


def test_the_tighter_of_sparks_limit_and_the_options_bounds_a_micro_batch() -> None:
    options = source_options(
        **{"laminar.max.bytes.per.batch": "1m", "laminar.max.records.per.batch": "500"}
    )
    assert micro_batch_bounds(ReadMaxRows(500), options) == MicroBatchBounds(500, 2**20)
    assert micro_batch_bounds(ReadMaxRows(20), options) == MicroBatchBounds(20, 2**20)
    assert micro_batch_bounds(ReadMaxBytes(1024), options) == MicroBatchBounds(500, 1024)
    assert micro_batch_bounds(ReadAllAvailable(), options) == MicroBatchBounds(None, None), (
        "trigger(once=True) reads everything"
    )
    with pytest.raises(InvalidState, match="ReadMaxBytes"):
        micro_batch_bounds(ReadMinRows(5), options)


async def opened_generator(rows: int, batch_size: int) -> GeneratorSource:
    source = GeneratorSource()
    config = {"rows": str(rows), "partitions": "2", "batch_size": str(batch_size)}
    await source.open(ConnectorConfig("generator", config))
    return source


class AskedFor(GeneratorSource):
    """A generator recording what each poll asked for."""

    asked: list[int]

    async def poll_batch(self, max_records: int):  # type: ignore[no-untyped-def]
        self.asked = [*getattr(self, "asked", []), max_records]
        return await super().poll_batch(max_records)


def polled(
    bounds: MicroBatchBounds, *, batch_size: int, record_size: float | None = None
) -> tuple[list[pa.RecordBatch], list[int]]:
    async def run() -> tuple[list[pa.RecordBatch], list[int]]:
        source = AskedFor()
        config = {"rows": "1000000", "partitions": "2", "batch_size": str(batch_size)}
        await source.open(ConnectorConfig("generator", config))
        batches = [batch async for batch in poll_micro_batch(source, bounds, record_size)]
        return batches, source.asked

    return asyncio.run(run())


def test_a_polled_source_is_polled_until_the_byte_budget_is_reached() -> None:
    budget, schema_size = (
        300_000,
        fixed_record_bytes(spark_round_trip_schema(IDS_SCHEMA, "generator")),
    )
    assert schema_size == 20 + 3 / 8, "the columns' widths and their validity bits"
    # A source that returns every record asked for: the budget is met to within one record.
    batches, asked = polled(
        MicroBatchBounds(None, budget), batch_size=10**9, record_size=schema_size
    )
    size = sum(batch.nbytes for batch in batches)
    assert budget - RECORD_BYTES < size <= budget
    assert asked[0] == int(budget / schema_size), "sized by the schema before any record"
    assert len(asked) == 2, "then the rest, by the size of the records seen"

    # Records of a size the schema does not tell: the first poll asks for a fixed number.
    batches, asked = polled(MicroBatchBounds(None, 10**7), batch_size=10**9)
    size = sum(batch.nbytes for batch in batches)
    assert asked[0] == FIRST_POLL_RECORDS
    assert 10**7 - RECORD_BYTES < size <= 10**7

    # A source with batches of its own size: polled until the budget is reached.
    batches, asked = polled(MicroBatchBounds(None, budget), batch_size=1000)
    size = sum(batch.nbytes for batch in batches)
    assert budget - 1000 * RECORD_BYTES < size <= budget
    assert all(batch.num_rows <= 1000 for batch in batches)


def test_a_record_cap_bounds_a_polled_micro_batch_too() -> None:
    batches, asked = polled(MicroBatchBounds(2500, 10**9), batch_size=10**9)
    assert sum(batch.num_rows for batch in batches) == 2500
    assert asked == [2500]
    budget = MicroBatchBounds(2500, 1000 * RECORD_BYTES)
    batches, _ = polled(budget, batch_size=10**9, record_size=RECORD_BYTES)
    assert sum(batch.num_rows for batch in batches) == 1000, "the budget is the tighter"


def test_a_polled_source_is_read_in_byte_bounded_micro_batches_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(GeneratorSource, "as_range_readable", lambda self: None)
    monkeypatch.setattr(read_log, "SLICE_BYTES", 8 * 1024)
    options = CaseInsensitiveDict(
        connector="generator",
        rows="5000",
        partitions="2",
        batch_size="700",
        checkpointLocation=str(tmp_path),
        **{"laminar.max.bytes.per.batch": "40k"},
    )
    reader = _streamReader(LaminarDataSource(options), spark_schema(IDS_SCHEMA, "generator"))
    assert isinstance(reader, LaminarPolledReader)
    shipped = pickle.loads(pickle.dumps(reader))
    start, ids, sizes = reader.initialOffset(), [], []
    while (end := reader.latestOffset(start, reader.getDefaultReadLimit())) != start:
        size = 0
        partitions = reader.partitions(start, end)
        for partition in partitions:
            for batch in shipped.read(pickle.loads(pickle.dumps(partition))):
                ids += batch.column("id").to_pylist()
                size += batch.nbytes
        assert len(partitions) >= size // (8 * 1024), "a task per slice of the read log"
        sizes.append(size)
        reader.commit(end)
        start = end

    assert sorted(ids) == list(range(10_000))
    assert all(size <= 40 * 1024 for size in sizes)
    assert len(sizes) == -(-10_000 * RECORD_BYTES // (40 * 1024)), "each micro-batch fills it"


class Sampled(GeneratorSource):
    """A range-readable generator counting its range reads."""

    reads = 0

    async def read_range(self, partition_range: PartitionRange) -> AsyncIterator[pa.RecordBatch]:
        type(self).reads += 1
        async for batch in super().read_range(partition_range):
            yield batch


def test_a_range_readable_source_is_asked_for_the_records_the_budget_holds() -> None:
    fixed = RecordSize(spark_round_trip_schema(IDS_SCHEMA, "generator"))

    async def most(size: RecordSize, bounds: MicroBatchBounds) -> int | None:
        source = await opened_generator(100_000, 1000)
        return await size.most_records(bounds, source, SourceCheckpoint())

    assert asyncio.run(most(fixed, MicroBatchBounds(None, 2048))) == 100
    assert asyncio.run(most(fixed, MicroBatchBounds(40, 2048))) == 40
    assert asyncio.run(most(fixed, MicroBatchBounds(None, None))) is None


def test_variable_width_records_are_sized_by_a_sample_read_once() -> None:
    async def run() -> tuple[list[int | None], float | None, int]:
        source = Sampled()
        config = {"rows": "100000", "partitions": "2", "schema": "wide", "batch_size": "500"}
        await source.open(ConnectorConfig("generator", config))
        size = RecordSize(spark_round_trip_schema(source.schema(), "generator"))
        assert size.fixed is None, "the key column is a string"
        bounds = MicroBatchBounds(None, 1 << 20)
        found = [await size.most_records(bounds, source, SourceCheckpoint()) for _ in range(3)]
        sample = [
            batch
            for partition in ("0", "1")
            async for batch in source.read_range(PartitionRange(partition, None, "500"))
        ]
        per_record = sum(b.nbytes for b in sample) / sum(b.num_rows for b in sample)
        return found, per_record, Sampled.reads - 2

    found, per_record, reads = asyncio.run(run())
    assert per_record is not None
    assert found == [int((1 << 20) / per_record)] * 3
    assert reads == 2, "one sample, of the first records of both partitions, for the query"


def test_a_batch_bigger_than_a_slice_is_cut_into_slices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (That slices are stored while the source is still polled: tests/spark/test_read_log.py.)
    monkeypatch.setattr(read_log, "SLICE_BYTES", 10_000)
    log = read_log.ReadLog(open_checkpointer(str(tmp_path)), "generator")
    schema = pa.schema([("id", pa.int64())])
    batches = [
        pa.RecordBatch.from_arrays([pa.array(range(first, first + 2000))], schema=schema)
        for first in range(0, 4000, 2000)
    ]

    entry = asyncio.run(log.append(batches, schema))

    assert [s.rows for s in entry.slices] == [1250, 750, 1250, 750], "big batches are cut"
    assert len(list(tmp_path.rglob("*.snap"))) == 4
