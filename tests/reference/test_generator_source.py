"""The ``generator`` source: its rows, its checkpoints and what a parallel reader needs."""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_sdk import (
    CheckpointError,
    ConfigurationError,
    ConnectorConfig,
    PartitionRange,
    SourceCheckpoint,
)
from laminar_sdk.reference import IDS_SCHEMA, WIDE_SCHEMA, GeneratorSource

MASK = 2**64 - 1
GOLDEN = 0x9E3779B97F4A7C15


def splitmix64(state: int) -> int:
    """SplitMix64's output for ``state``, written out from its published definition."""
    z = (state + GOLDEN) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def documented_row(seed: int, partitions: int, partition: int, offset: int) -> dict[str, object]:
    """Row ``offset`` of ``partition`` as GeneratorSource's docstring defines it."""
    key = splitmix64(splitmix64(seed & MASK) ^ partition)
    h = splitmix64((key + offset * GOLDEN) & MASK)
    return {
        "id": offset * partitions + partition,
        "partition": partition,
        "value": (h >> 11) / 2**53,
        "event_time_us": 1_704_067_200_000_000 + offset * 1000,
        "key": str(h & 1023),
        "flag": bool((h >> 10) & 1),
    }


def opened(run, **properties: str) -> GeneratorSource:
    source = GeneratorSource()
    run(source.open(ConnectorConfig("generator", properties)))
    return source


def read_range(source: GeneratorSource, partition_range: PartitionRange) -> pa.Table:
    async def collect() -> list[pa.RecordBatch]:
        return [batch async for batch in source.read_range(partition_range)]

    return pa.Table.from_batches(asyncio.run(collect()), schema=source.schema()).combine_chunks()


def drain(run, source: GeneratorSource, max_records: int = 1000) -> list[pa.RecordBatch]:
    batches = []
    while (batch := run(source.poll_batch(max_records))) is not None:
        batches.append(batch.records)
    return batches


def test_the_reference_splitmix64_is_splitmix64():
    assert splitmix64(0) == 0xE220A8397B1DCDAF  # first output of SplitMix64 seeded with 0


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(-(2**63), 2**64 - 1),
    partitions=st.integers(1, 5),
    data=st.data(),
)
def test_rows_are_the_documented_function_of_seed_partition_and_offset(seed, partitions, data):
    partition = data.draw(st.integers(0, partitions - 1))
    start = data.draw(st.integers(0, 2**40))
    count = data.draw(st.integers(0, 5))
    source = GeneratorSource()
    properties = {"seed": str(seed), "partitions": str(partitions), "schema": "wide"}
    asyncio.run(source.open(ConnectorConfig("generator", properties)))
    batch = read_range(source, PartitionRange(str(partition), str(start), str(start + count)))
    assert batch.schema.equals(WIDE_SCHEMA)
    for offset, row in enumerate(batch.to_pylist(), start):
        expected = documented_row(seed, partitions, partition, offset)
        event_time_us = row.pop("event_time").timestamp() * 1_000_000
        assert round(event_time_us) == expected.pop("event_time_us")
        assert row == expected


def test_the_same_configuration_gives_the_same_rows_and_another_seed_other_values(run):
    first = drain(run, opened(run, rows="50", partitions="3", seed="7", batch_size="8"))
    again = drain(run, opened(run, rows="50", partitions="3", seed="7", batch_size="8"))
    reseeded = drain(run, opened(run, rows="50", partitions="3", seed="8", batch_size="8"))
    assert first == again
    assert [b.column("id") for b in first] == [b.column("id") for b in reseeded]
    assert [b.column("value") for b in first] != [b.column("value") for b in reseeded]
    values = pa.concat_arrays([b.column("value") for b in first]).to_pylist()
    assert len(set(values)) == len(values), "values look random, not constant"
    assert all(0.0 <= v < 1.0 for v in values)


def test_ids_are_unique_across_partitions_and_polls_rotate_over_partitions(run):
    source = opened(run, rows="4", partitions="3", batch_size="2")
    polled = []
    while (batch := run(source.poll_batch(10))) is not None:
        polled.append((batch.partition.id, batch.partition.offset, batch.records["id"].to_pylist()))
    assert polled == [
        ("0", "2", [0, 3]),
        ("1", "2", [1, 4]),
        ("2", "2", [2, 5]),
        ("0", "4", [6, 9]),
        ("1", "4", [7, 10]),
        ("2", "4", [8, 11]),
    ]


def test_a_poll_returns_at_most_max_records_and_at_most_batch_size(run):
    source = opened(run, batch_size="5")
    assert run(source.poll_batch(3)).num_rows == 3
    assert run(source.poll_batch(100)).num_rows == 5
    with pytest.raises(ValueError, match="max_records"):
        run(source.poll_batch(0))


def test_unbounded_by_default_and_bounded_partitions_end(run):
    unbounded = opened(run, batch_size="1000")
    assert sum(run(unbounded.poll_batch(1000)).num_rows for _ in range(50)) == 50_000
    assert unbounded.metrics().lag == 0, "no lag is known without a bound"

    bounded = opened(run, rows="3", partitions="2")
    assert sum(batch.num_rows for batch in drain(run, bounded)) == 6
    assert run(bounded.poll_batch(10)) is None


def test_restore_seeks_each_partition_independently(run):
    source = opened(run, rows="6", partitions="3", batch_size="100")
    run(source.restore(SourceCheckpoint({"1": "4", "2": "6"})))
    ids = sorted(i for batch in drain(run, source) for i in batch["id"].to_pylist())
    partition_0 = [0, 3, 6, 9, 12, 15]  # omitted: read from its start
    partition_1 = [13, 16]  # offsets 4 and 5
    assert ids == sorted(partition_0 + partition_1)  # partition 2 was at its end
    assert source.checkpoint().offsets == {"0": "6", "1": "6", "2": "6"}


def test_checkpoint_survives_json_and_restores_on_a_new_instance(run):
    source = opened(run, rows="10", partitions="2", batch_size="3")
    run(source.poll_batch(10))
    run(source.poll_batch(10))
    checkpoint = SourceCheckpoint.from_json(source.checkpoint().to_json())
    rest = drain(run, source)

    resumed = opened(run, rows="10", partitions="2", batch_size="3")
    run(resumed.restore(checkpoint))
    assert drain(run, resumed) == rest


@pytest.mark.parametrize(
    ("checkpoint", "message"),
    [
        (SourceCheckpoint({"2": "0"}), "partition 2"),
        (SourceCheckpoint({"0": "11"}), "past the 10 rows"),
        (SourceCheckpoint({"0": "-1"}), "decimal"),
        (SourceCheckpoint({"zero": "1"}), "decimal"),
    ],
)
def test_a_checkpoint_the_generator_cannot_have_written_is_refused(run, checkpoint, message):
    source = opened(run, rows="10", partitions="2")
    with pytest.raises(CheckpointError, match=message):
        run(source.restore(checkpoint))


@pytest.mark.parametrize(("key", "value"), [("partitions", "3"), ("seed", "1")])
def test_a_checkpoint_of_another_id_space_is_refused_naming_the_key(run, key, value):
    checkpoint = opened(run, partitions="2", seed="0").checkpoint()
    source = opened(run, **{"partitions": "2", "seed": "0", key: value})
    with pytest.raises(ConfigurationError, match=key) as error:
        run(source.restore(checkpoint))
    assert error.value.key == key


@pytest.mark.parametrize(
    ("properties", "key"),
    [
        ({"rows": "-2"}, "rows"),
        ({"rows": "many"}, "rows"),
        ({"partitions": "0"}, "partitions"),
        ({"partitions": str(2**31 + 1)}, "partitions"),
        ({"batch_size": "0"}, "batch_size"),
        ({"rate": "-1"}, "rate"),
        ({"rate": "nan"}, "rate"),
        ({"rate": "inf"}, "rate"),
        ({"schema": "narrow"}, "schema"),
        ({"seed": "0x10"}, "seed"),
        ({"rowz": "10"}, "rowz"),
    ],
)
def test_configuration_errors_name_the_key(run, properties, key):
    with pytest.raises(ConfigurationError) as error:
        run(GeneratorSource().open(ConnectorConfig("generator", properties)))
    assert error.value.key == key
    assert repr(key) in str(error.value)


def test_schema_follows_the_configuration(run):
    assert opened(run).schema().equals(IDS_SCHEMA)
    wide = opened(run, schema="wide", rows="3")
    assert wide.schema().equals(WIDE_SCHEMA)
    assert all(batch.schema.equals(WIDE_SCHEMA) for batch in drain(run, wide))


def test_rate_paces_each_partition(run, generator_clock):
    source = opened(run, rate="200", partitions="2", batch_size="1000", rows="100000")
    assert drain(run, source) == [], "no row is due at the start"
    generator_clock.advance(0.25)
    returned = sum(batch.num_rows for batch in drain(run, source))
    assert returned == 2 * 50, "200 rows a second in each partition"


def test_metrics_count_rows_bytes_and_lag(run):
    source = opened(run, rows="10", partitions="2", batch_size="4")
    assert source.metrics().lag == 20
    batch = run(source.poll_batch(10))
    metrics = source.metrics()
    assert (metrics.records_total, metrics.bytes_total) == (4, batch.records.nbytes)
    assert metrics.lag == 16
    drain(run, source)
    assert source.metrics().records_total == 20
    assert source.metrics().lag == 0
    assert source.supports_replay()
