"""Both reference sources, driven through any schedule of polls, checkpoints and crashes.

A downstream that keeps what it received up to each durable checkpoint, and forgets what came
after it when the source crashes and is restored, must end with every id exactly once: a
checkpoint ahead of the records returned loses ids, one behind duplicates them.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar_sdk import ConnectorConfig, SourceCheckpoint, SourceConnector
from laminar_sdk.reference import GeneratorSource, MemorySource

# One step of a schedule: ("poll", max_records), ("checkpoint", 0) or ("crash", 0).
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("poll"), st.integers(1, 9)),
        st.tuples(st.sampled_from(["checkpoint", "crash"]), st.just(0)),
    ),
    max_size=40,
)


async def drive(
    new_source: Callable[[], SourceConnector],
    config: ConnectorConfig,
    steps: list[tuple[str, int]],
) -> list[int]:
    """Run ``steps`` against fresh instances; return the ids the downstream kept, in order."""
    source = new_source()
    await source.open(config)
    kept: list[int] = []
    durable, kept_at_durable = SourceCheckpoint(), 0
    positions: dict[str, int] = {}  # what the records returned so far say the offsets are
    for action, max_records in [*steps, *[("poll", 9)] * 200]:
        if action == "poll":
            batch = await source.poll_batch(max_records)
            if batch is None:
                continue
            assert 0 < batch.num_rows <= max_records
            assert batch.records.schema.equals(source.schema())
            assert batch.partition is not None
            kept += batch.records.column("id").to_pylist()
            previous = positions.get(batch.partition.id, 0)
            assert int(batch.partition.offset) == previous + batch.num_rows
            positions[batch.partition.id] = int(batch.partition.offset)
        elif action == "checkpoint":
            checkpoint = source.checkpoint()
            assert {p: int(o) for p, o in checkpoint.offsets.items() if int(o)} == {
                p: o for p, o in positions.items() if o
            }, "the checkpoint must sit exactly after the last record returned"
            durable = SourceCheckpoint.from_json(checkpoint.to_json())
            kept_at_durable = len(kept)
        else:
            source = new_source()  # the old instance dies without close()
            await source.open(config)
            await source.restore(durable)
            del kept[kept_at_durable:]
            positions = {p: int(o) for p, o in durable.offsets.items()}
    assert await source.poll_batch(9) is None, "drained"
    await source.close()
    return kept


@settings(max_examples=150, deadline=None)
@given(
    partitions=st.integers(1, 4),
    rows=st.integers(0, 25),
    batch_size=st.integers(1, 6),
    steps=STEPS,
)
def test_generator_delivers_every_id_once_across_crashes(partitions, rows, batch_size, steps):
    config = ConnectorConfig(
        "generator",
        {"partitions": str(partitions), "rows": str(rows), "batch_size": str(batch_size)},
    )
    kept = asyncio.run(drive(GeneratorSource, config, steps))
    assert sorted(kept) == list(range(rows * partitions))


@settings(max_examples=75, deadline=None)
@given(
    appends=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 7)), max_size=8),
    steps=STEPS,
)
def test_memory_source_delivers_every_id_once_across_crashes(appends, steps):
    with tempfile.TemporaryDirectory() as directory:
        next_id = 0
        for partition, count in appends:
            MemorySource.append(directory, range(next_id, next_id + count), partition=partition)
            next_id += count
        config = ConnectorConfig("memory", {"path": directory})
        kept = asyncio.run(drive(MemorySource, config, steps))
    assert sorted(kept) == list(range(next_id))


@pytest.mark.parametrize("source_type", [GeneratorSource, MemorySource])
def test_a_source_keeps_per_partition_order(run, tmp_path: Path, source_type):
    """Within a partition ids come in offset order; the drive above only checks the multiset."""
    if source_type is MemorySource:
        MemorySource.append(tmp_path, [5, 3, 9], partition=1)
        MemorySource.append(tmp_path, [1, 7], partition=1)
        MemorySource.append(tmp_path, [4], partition=0)
        config = ConnectorConfig("memory", {"path": str(tmp_path)})
        expected = {"0": [4], "1": [5, 3, 9, 1, 7]}
    else:
        config = ConnectorConfig("generator", {"partitions": "2", "rows": "4", "batch_size": "3"})
        expected = {"0": [0, 2, 4, 6], "1": [1, 3, 5, 7]}
    source = source_type()
    run(source.open(config))
    seen: dict[str, list[int]] = {}
    while (batch := run(source.poll_batch(2))) is not None:
        seen.setdefault(batch.partition.id, []).extend(batch.records.column("id").to_pylist())
    assert seen == expected


@pytest.mark.parametrize("source_type", [GeneratorSource, MemorySource])
def test_a_restored_source_returns_the_same_batches_as_the_original(run, tmp_path, source_type):
    """Spark re-runs a micro-batch by restoring its start and polling again: same batches."""
    if source_type is MemorySource:
        for partition, count in [(0, 5), (1, 2), (2, 7), (0, 3), (1, 4)]:
            MemorySource.append(
                tmp_path, range(100 * partition, 100 * partition + count), partition=partition
            )
        config = ConnectorConfig("memory", {"path": str(tmp_path)})
    else:
        config = ConnectorConfig("generator", {"partitions": "3", "rows": "9", "batch_size": "2"})
    original = source_type()
    run(original.open(config))
    run(original.poll_batch(3))
    start = SourceCheckpoint.from_json(original.checkpoint().to_json())
    sizes = [1, 3, 2, 3, 1, 2]
    first = [run(original.poll_batch(size)) for size in sizes]
    replay = source_type()
    run(replay.open(config))
    run(replay.restore(start))
    assert [run(replay.poll_batch(size)) for size in sizes] == first
    assert replay.checkpoint() == original.checkpoint()
