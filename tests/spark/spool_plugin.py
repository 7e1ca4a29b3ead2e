"""A third-party style polled source for the SDK's recovery tests: ``spool``.

Written the way an outside author writes a multi-partition polling source, to today's contract
only: no range reads, no bound on a replay. Each partition is an append-only file
``<path>/p<N>.log`` of ``id,value`` lines that another process keeps appending to; new files
are new partitions. ``restore`` seeks every partition it names (the others are read from
their start), and ``poll_batch(max_records)`` returns what is available *now*, partition after
partition in name order, up to ``max_records``. The offset of a partition is
``"<records read>:<byte position>"``.

The tests install this module as the plugin ``laminar-plugin-spool``; :func:`append` is what
they append with (whole lines, so a reader never sees half a record).
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa

from laminar_sdk import (
    ConfigKeySpec,
    ConnectorConfig,
    SourceBatch,
    SourceCheckpoint,
    SourceConnector,
    hookimpl,
)

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
    ]
)
SUFFIX = ".log"


def append(directory: Path, partition: int, ids: list[int]) -> None:
    """Append records carrying ``ids`` to partition ``p<partition>``, whole lines in one write."""
    lines = "".join(f"{i},{i / 2}\n" for i in ids).encode()
    path = directory / f"p{partition:03d}{SUFFIX}"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(descriptor, lines)
    finally:
        os.close(descriptor)


class SpoolSource(SourceConnector):
    """Reads the partitions of a spool directory from per-partition positions."""

    def __init__(self) -> None:
        self._directory = Path()
        self._positions: dict[str, tuple[int, int]] = {}

    async def open(self, config: ConnectorConfig) -> None:
        self._directory = Path(config.require("path"))

    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        ids: list[int] = []
        partitions: list[int] = []
        values: list[float] = []
        for path in sorted(self._directory.glob(f"p*{SUFFIX}")):
            partition = path.name.removesuffix(SUFFIX)
            records, position = self._positions.get(partition, (0, 0))
            with path.open("rb") as file:
                file.seek(position)
                available = file.read()
            for line in available.splitlines(keepends=True):
                if len(ids) == max_records or not line.endswith(b"\n"):
                    break
                record_id, value = line.decode().split(",")
                ids.append(int(record_id))
                partitions.append(int(partition.removeprefix("p")))
                values.append(float(value))
                records, position = records + 1, position + len(line)
            self._positions[partition] = (records, position)
        if not ids:
            return None
        batch = pa.record_batch([ids, partitions, values], schema=SCHEMA)
        return SourceBatch(batch)

    def schema(self) -> pa.Schema:
        return SCHEMA

    def checkpoint(self) -> SourceCheckpoint:
        offsets = {name: f"{records}:{byte}" for name, (records, byte) in self._positions.items()}
        return SourceCheckpoint(offsets)

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        self._positions = {}
        for partition, offset in checkpoint.offsets.items():
            records, position = offset.split(":")
            self._positions[partition] = (int(records), int(position))

    async def close(self) -> None:
        self._positions = {}


@hookimpl
def laminar_register_connectors(registry):  # type: ignore[no-untyped-def]
    """Register ``spool``."""
    registry.add_source(
        "spool",
        SpoolSource,
        description="append-only partition files, polled",
        config_keys=[ConfigKeySpec("path", required=True, description="the spool directory")],
    )
