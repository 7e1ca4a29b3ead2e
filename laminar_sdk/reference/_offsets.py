"""The positions the reference sources keep in a :class:`~laminar_sdk.SourceCheckpoint`.

``offsets`` maps a partition number to the offset of the next record to return in it (a count
of the records before it), both in decimal. The metadata key :data:`NEXT_PARTITION` says which
partition the next poll tries first, so that a restored source polls in the order the original
would have, and returns the same batches.
"""

from __future__ import annotations

from laminar_sdk import CheckpointError, SourceCheckpoint

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
