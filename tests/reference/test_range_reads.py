"""Both reference sources as range-readable sources: plan_end, read_range and replays."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_sdk import (
    CheckpointError,
    ConnectorConfig,
    PartitionRange,
    ReadError,
    SourceCheckpoint,
    SourceConnector,
    share_records,
)
from laminar_sdk.reference import GeneratorSource, MemorySource
from laminar_sdk.reference._offsets import planned_ends


def opened(run, source_type: Callable[[], SourceConnector], config: ConnectorConfig):
    source = source_type()
    run(source.open(config))
    return source


async def collect(source: SourceConnector, partition_range: PartitionRange) -> list[pa.RecordBatch]:
    ranges = source.as_range_readable()
    assert ranges is not None
    return [batch async for batch in ranges.read_range(partition_range)]


def ranges_between(start: SourceCheckpoint, end: SourceCheckpoint) -> list[PartitionRange]:
    """What the Spark bridge makes of a micro-batch: the partitions whose offset moved."""
    return [
        PartitionRange(partition, start.offsets.get(partition), offset)
        for partition, offset in sorted(end.offsets.items())
        if start.offsets.get(partition) != offset
    ]


async def read_between(
    source: SourceConnector, start: SourceCheckpoint, end: SourceCheckpoint
) -> list[int]:
    ids: list[int] = []
    for partition_range in ranges_between(start, end):
        for batch in await collect(source, partition_range):
            assert batch.schema.equals(source.schema())
            ids += batch.column("id").to_pylist()
    return ids


async def polled_per_partition(
    source: SourceConnector, start: SourceCheckpoint, end: SourceCheckpoint
) -> dict[str, list[int]]:
    """What polling a source restored to ``start`` returns in each partition up to ``end``."""
    await source.restore(start)
    wanted = {p: int(offset) - int(start.offsets.get(p, "0")) for p, offset in end.offsets.items()}
    polled: dict[str, list[int]] = {p: [] for p in wanted}
    while (batch := await source.poll_batch(7)) is not None:
        assert batch.partition is not None
        polled.setdefault(batch.partition.id, []).extend(batch.records.column("id").to_pylist())
    return {p: polled[p][:count] for p, count in wanted.items() if count}


# planned_ends -----------------------------------------------------------------------------


@given(
    starts=st.dictionaries(st.integers(0, 5), st.integers(0, 50), max_size=6),
    extra=st.dictionaries(st.integers(0, 5), st.integers(0, 50), max_size=6),
    max_records=st.none() | st.integers(0, 200),
)
def test_planned_ends_use_the_budget_fairly_and_never_exceed_it(starts, extra, max_records):
    available = {p: starts.get(p, 0) + count for p, count in extra.items()}
    ends = planned_ends(starts, available, max_records)
    taken = {p: end - starts.get(p, 0) for p, end in ends.items()}
    pending = {p: count for p, count in extra.items() if count}
    assert all(0 < taken[p] <= pending[p] for p in taken), "only moved partitions, within reach"
    if max_records is None:
        assert taken == pending
    else:
        assert sum(taken.values()) == min(max_records, sum(pending.values()))
        # Fair: a partition gets less than another only when it has nothing more.
        for p, count in taken.items():
            for q in pending:
                assert count >= taken.get(q, 0) - 1 or count == pending[p]


# The generator ----------------------------------------------------------------------------


def test_generator_ranges_rebuild_the_rows_polled_between_two_checkpoints(run):
    config = ConnectorConfig(
        "generator", {"rows": "20", "partitions": "3", "batch_size": "4", "schema": "wide"}
    )
    source = opened(run, GeneratorSource, config)
    run(source.poll_batch(10))
    start = source.checkpoint()
    between = [run(source.poll_batch(10)).records for _ in range(4)]
    end = source.checkpoint()

    reader = opened(run, GeneratorSource, config)
    ranges = ranges_between(start, end)
    assert ranges == [
        PartitionRange("0", "4", "8"),
        PartitionRange("1", "0", "8"),
        PartitionRange("2", "0", "4"),
    ]
    rebuilt = [batch for r in ranges for batch in run(collect(reader, r))]
    assert all(batch.num_rows <= 4 for batch in rebuilt), "batches of at most batch_size rows"
    assert (
        pa.Table.from_batches(rebuilt)
        .sort_by("id")
        .equals(pa.Table.from_batches(between).sort_by("id"))
    )
    assert reader.metrics().records_total == 0, "reading ranges does not move the source"
    assert reader.checkpoint().offsets == {"0": "0", "1": "0", "2": "0"}


def test_generator_plan_end_shares_the_budget_and_ends_where_the_rows_end(run):
    config = ConnectorConfig("generator", {"rows": "10", "partitions": "2", "batch_size": "3"})
    source = opened(run, GeneratorSource, config)
    start = source.checkpoint()

    first = run(source.plan_end(start, 7))
    assert first.offsets == {"0": "4", "1": "3"}
    assert first.metadata == start.metadata, "the next poll's partition and the id space"
    everything = run(source.plan_end(first, None))
    assert everything.offsets == {"0": "10", "1": "10"}
    assert run(source.plan_end(everything, 5)) is everything, "nothing new: start itself"
    assert source.checkpoint() == start, "plan_end does not move the source"
    assert sorted(run(read_between(source, start, everything))) == list(range(20))


def test_an_unbounded_generator_offers_the_budget_or_one_batch_per_partition(run):
    config = ConnectorConfig("generator", {"partitions": "2", "batch_size": "5"})
    source = opened(run, GeneratorSource, config)
    start = source.checkpoint()
    assert run(source.plan_end(start, 1000)).offsets == {"0": "500", "1": "500"}
    assert run(source.plan_end(start, None)).offsets == {"0": "5", "1": "5"}


@pytest.mark.parametrize(
    ("partition_range", "error", "message"),
    [
        (PartitionRange("0", "15", "21"), CheckpointError, "past the 20 rows"),
        (PartitionRange("3", None, "1"), CheckpointError, "partition 3 is not in"),
        (PartitionRange("0", "8", "4"), CheckpointError, "before its start"),
        (PartitionRange("zero", None, "1"), CheckpointError, "decimal"),
    ],
)
def test_generator_refuses_a_range_it_cannot_have(run, partition_range, error, message):
    config = ConnectorConfig("generator", {"rows": "20", "partitions": "3"})
    source = opened(run, GeneratorSource, config)
    with pytest.raises(error, match=message):
        run(collect(source, partition_range))


def test_a_paced_generator_plans_only_rows_whose_time_has_come(run, generator_clock):
    config = ConnectorConfig("generator", {"partitions": "2", "rate": "40"})
    source = opened(run, GeneratorSource, config)
    start = source.checkpoint()
    assert "started_at_ms" in start.metadata
    assert run(source.plan_end(start, 1000)) is start, "no row is due at the start"

    generator_clock.advance(0.25)
    planned = run(source.plan_end(start, 1000))
    assert planned.offsets == {"0": "10", "1": "10"}, "40 rows a second in each partition"

    # Another instance, opened later (another process), plans from the same start time.
    generator_clock.advance(0.25)
    later = opened(run, GeneratorSource, config)
    assert run(later.plan_end(start, 1000)).offsets == {"0": "20", "1": "20"}


def test_replaying_a_paced_micro_batch_later_reads_the_same_rows(run):
    # Polling again (the simple reader's replay) would return whatever is due by then; the
    # ranges of the planned micro-batch return what it held.
    config = ConnectorConfig("generator", {"partitions": "2", "rate": "50"})
    source = opened(run, GeneratorSource, config)
    start = source.checkpoint()
    time.sleep(0.2)
    end = run(source.plan_end(start, None))
    first = run(read_between(source, start, end))
    time.sleep(0.2)
    replay = opened(run, GeneratorSource, config)
    assert run(read_between(replay, start, end)) == first
    assert int(run(replay.plan_end(start, None)).offsets["0"]) > int(end.offsets["0"])


def test_a_restored_paced_generator_finds_the_rows_due_while_it_was_down(run):
    config = ConnectorConfig("generator", {"partitions": "1", "rate": "100", "batch_size": "1000"})
    source = opened(run, GeneratorSource, config)
    checkpoint = SourceCheckpoint.from_json(source.checkpoint().to_json())
    time.sleep(0.2)
    restored = opened(run, GeneratorSource, config)
    run(restored.restore(checkpoint))
    batch = run(restored.poll_batch(1000))
    assert batch is not None
    assert batch.num_rows >= 15, "the rows due since the checkpoint's start time"


# The memory source ------------------------------------------------------------------------


def test_memory_source_replays_a_micro_batch_exactly_after_more_was_appended(run, tmp_path):
    MemorySource.append(tmp_path, range(6), partition=0)
    MemorySource.append(tmp_path, range(100, 103), partition=2)
    config = ConnectorConfig("memory", {"path": str(tmp_path)})
    planner = opened(run, MemorySource, config)
    start = SourceCheckpoint()
    end = run(planner.plan_end(start, 7))
    assert end.offsets == {"0": "4", "2": "3"}
    first = run(read_between(planner, start, end))

    # More records, in the partitions read and in a new one; then the micro-batch is replayed
    # by another instance (Spark re-runs it after a crash).
    MemorySource.append(tmp_path, range(6, 9), partition=0)
    MemorySource.append(tmp_path, range(200, 202), partition=1)
    replay = opened(run, MemorySource, config)
    assert run(read_between(replay, start, end)) == first == [0, 1, 2, 3, 100, 101, 102]

    after = run(replay.plan_end(end, None))
    assert after.offsets == {"0": "9", "1": "2", "2": "3"}
    assert sorted(run(read_between(replay, end, after))) == [4, 5, 6, 7, 8, 200, 201]
    assert run(replay.plan_end(after, None)) is after


def test_memory_source_ranges_span_appended_files(run, tmp_path):
    for first in range(0, 12, 3):
        MemorySource.append(tmp_path, range(first, first + 3))
    source = opened(run, MemorySource, ConnectorConfig("memory", {"path": str(tmp_path)}))
    batches = run(collect(source, PartitionRange("0", "2", "10")))
    assert [batch.column("id").to_pylist() for batch in batches] == [
        [2],
        [3, 4, 5],
        [6, 7, 8],
        [9],
    ]


def test_memory_source_range_past_the_appended_records_is_a_read_error(run, tmp_path):
    MemorySource.append(tmp_path, range(3))
    source = opened(run, MemorySource, ConnectorConfig("memory", {"path": str(tmp_path)}))
    with pytest.raises(ReadError, match="holds 3 record"):
        run(collect(source, PartitionRange("0", None, "5")))
    with pytest.raises(CheckpointError, match="past the 3 record"):
        run(source.plan_end(SourceCheckpoint({"0": "4"}), None))


# Both: ranges agree with polling ----------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    partitions=st.integers(1, 4),
    rows=st.integers(0, 30),
    batch_size=st.integers(1, 6),
    polls=st.integers(0, 8),
    budgets=st.lists(st.none() | st.integers(1, 25), min_size=1, max_size=4),
)
def test_generator_ranges_agree_with_polling(partitions, rows, batch_size, polls, budgets):
    config = ConnectorConfig(
        "generator",
        {"partitions": str(partitions), "rows": str(rows), "batch_size": str(batch_size)},
    )
    asyncio.run(_ranges_agree_with_polling(GeneratorSource, config, polls, budgets))


@settings(max_examples=40, deadline=None)
@given(
    appends=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 6)), max_size=8),
    polls=st.integers(0, 8),
    budgets=st.lists(st.none() | st.integers(1, 25), min_size=1, max_size=4),
)
def test_memory_source_ranges_agree_with_polling(appends, polls, budgets):
    with tempfile.TemporaryDirectory() as directory:
        next_id = 0
        for partition, count in appends:
            MemorySource.append(directory, range(next_id, next_id + count), partition=partition)
            next_id += count
        config = ConnectorConfig("memory", {"path": directory})
        asyncio.run(_ranges_agree_with_polling(MemorySource, config, polls, budgets))


async def _ranges_agree_with_polling(
    source_type: Callable[[], SourceConnector],
    config: ConnectorConfig,
    polls: int,
    budgets: list[int | None],
) -> None:
    """Micro-batches planned one after another read what polling returns, partition by partition."""
    poller = source_type()
    await poller.open(config)
    for _ in range(polls):
        await poller.poll_batch(3)
    start = SourceCheckpoint.from_json(poller.checkpoint().to_json())
    planner, reader, restored = source_type(), source_type(), source_type()
    for instance in (planner, reader, restored):
        await instance.open(config)
    ranges = planner.as_range_readable()
    assert ranges is not None
    for budget in budgets:
        end = await ranges.plan_end(start, budget)
        read = {
            r.partition: [i for batch in await collect(reader, r) for i in batch["id"].to_pylist()]
            for r in ranges_between(start, end)
        }
        if budget is not None:
            assert sum(len(ids) for ids in read.values()) <= budget
        assert read == await polled_per_partition(restored, start, end)
        start = end


@given(
    available=st.dictionaries(st.integers(0, 7), st.integers(0, 50), max_size=6),
    limit=st.one_of(st.none(), st.integers(0, 400)),
)
def test_share_records_takes_the_limit_fairly_and_never_more_than_a_partition_has(available, limit):
    share = share_records(available, limit)
    assert share.keys() == available.keys()
    assert all(0 <= share[key] <= available[key] for key in available)
    total = sum(available.values())
    assert sum(share.values()) == (total if limit is None else min(limit, total))
    # Fair: a partition gets less than another only when it has nothing more to give.
    most = max(share.values(), default=0)
    for key, taken in share.items():
        assert taken + 1 >= most or taken == available[key], (share, available)
