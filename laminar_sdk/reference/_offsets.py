"""The positions the reference sources keep in a :class:`~laminar_sdk.SourceCheckpoint`.

``offsets`` maps a partition number to the offset of the next record to return in it (a count
of the records before it), both in decimal. The metadata key :data:`NEXT_PARTITION` says which
partition the next poll tries first, so that a restored source polls in the order the original
would have, and returns the same batches.

Both sources are range-readable (:class:`~laminar_sdk.RangeReadableSource`): a
:class:`~laminar_sdk.PartitionRange` holds a partition number and two such offsets, and
:func:`planned_ends` shares a micro-batch's records among the partitions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Mapping
from typing import TYPE_CHECKING

from laminar_sdk import CheckpointError, PartitionRange, SourceCheckpoint

if TYPE_CHECKING:
    import pyarrow as pa

NEXT_PARTITION = "next_partition"


def parse_count(connector: str, text: str, what: str) -> int:
    """``text`` as a count (a non-negative decimal integer).

    :raises CheckpointError: naming ``what`` when it is not one.
    """
    if not (text.isascii() and text.isdecimal()):
        raise CheckpointError(
            f"{connector}: checkpoint {what} must be a decimal count, got {text!r}"
        )
    return int(text)


def single_offset(connector: str, checkpoint: SourceCheckpoint, partition: str) -> str | None:
    """The offset ``checkpoint`` holds for ``partition``, the one partition of a source.

    :returns: ``None`` when it holds none (the source starts from its beginning).
    :raises CheckpointError: when it names another partition.
    """
    unknown = sorted(set(checkpoint.offsets) - {partition})
    if unknown:
        raise CheckpointError(
            f"{connector}: checkpoint names partition(s) {', '.join(unknown)}; this source "
            f"has only {partition!r}: was the checkpoint taken by another connector?"
        )
    return checkpoint.get_offset(partition)


def first_rows(
    batches: Generator[pa.RecordBatch, None, None], wanted: int | None
) -> Generator[pa.RecordBatch, None, None]:
    """``batches`` up to ``wanted`` rows in all: the last one cut, empty ones left out.

    ``wanted`` ``None``: all of them. ``batches`` is closed when this ends, read to its end or
    not (a file it reads is closed then).
    """
    read = 0
    with contextlib.closing(batches):
        for batch in batches:
            taken = batch if wanted is None else batch.slice(0, wanted - read)
            read += taken.num_rows
            if taken.num_rows:
                yield taken
            if read == wanted:
                return


def offsets_in(connector: str, checkpoint: SourceCheckpoint) -> dict[int, int]:
    """The next offset of each partition ``checkpoint`` records, by partition number."""
    return {
        parse_count(connector, partition, "partition id"): parse_count(
            connector, offset, f"offset of partition {partition}"
        )
        for partition, offset in checkpoint.offsets.items()
    }


def next_partition_in(connector: str, checkpoint: SourceCheckpoint) -> int:
    """The partition ``checkpoint`` says to poll first (0 when it does not say)."""
    return parse_count(connector, checkpoint.metadata.get(NEXT_PARTITION, "0"), NEXT_PARTITION)


def planned_ends(
    starts: Mapping[int, int], available: Mapping[int, int], max_records: int | None
) -> dict[int, int]:
    """Where each partition ends in a micro-batch of at most ``max_records`` records.

    The partitions with records between their start and their available end share the budget
    fairly: each gets an equal share, and what a partition cannot use goes to the others, so
    the batch is as large as the budget allows. Deterministic: the same arguments give the
    same ends.

    :param starts: the next offset of each partition (0 where absent).
    :param available: the offset after the last record available now, of each partition.
    :param max_records: the budget; ``None`` for no bound.
    :returns: the end of each partition that moves, and only those.
    """
    pending = {
        partition: end - starts.get(partition, 0)
        for partition, end in available.items()
        if end > starts.get(partition, 0)
    }
    if max_records is None:
        taken = pending
    else:
        taken, budget = {}, max_records
        order = sorted(pending, key=lambda partition: (pending[partition], partition))
        for index, partition in enumerate(order):
            share = -(-budget // (len(order) - index))  # ceil: the budget is used up
            taken[partition] = min(pending[partition], share)
            budget -= taken[partition]
    return {p: starts.get(p, 0) + count for p, count in sorted(taken.items()) if count}


def range_bounds(connector: str, partition_range: PartitionRange) -> tuple[int, int, int]:
    """``(partition, first, stop)``: the partition number and the offsets a range spans.

    :raises CheckpointError: when the range's partition or offsets are not counts, or it
        ends before it starts.
    """
    partition = parse_count(connector, partition_range.partition, "partition id")
    start = partition_range.start
    first = 0 if start is None else parse_count(connector, start, f"offset of {partition}")
    stop = parse_count(connector, partition_range.end, f"offset of partition {partition}")
    if stop < first:
        raise CheckpointError(
            f"{connector}: the range of partition {partition} ends at offset {stop}, before "
            f"its start {first}"
        )
    return partition, first, stop
