"""Wide rows for the memory benchmark: gigabytes without gigabytes of input files.

- ``bench-payload`` source: ``rows`` rows in each of ``partitions`` partitions, each row an
  ``id`` and a ``payload`` of ``payload_bytes`` bytes; range-readable, so Spark's tasks make
  the rows;
- ``bench-payload-polled`` source: the same rows, polled (not range-readable): the bridge
  polls it in its planning process into the read log;
- ``bench-payload`` sink: a one-instance sink that reads every byte it is given (a checksum,
  as a sink encoding or sending the records would) and keeps nothing but a count: each
  epoch's rows and bytes, appended to ``path`` at ``commit_epoch``.

The payload bytes are zeros (nothing on the path compresses them).
"""

from __future__ import annotations

import functools
import json
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import pyarrow as pa

from laminar_sdk import (
    ConfigKeySpec,
    ConnectorConfig,
    ConnectorRegistry,
    PartitionInfo,
    PartitionRange,
    RangeReadableSource,
    SinkConnector,
    SourceBatch,
    SourceCheckpoint,
    SourceConnector,
    WriteResult,
    hookimpl,
)

SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.binary())])
BATCH_ROWS = 8192


@functools.cache
def _payloads(rows: int, size: int) -> pa.Array:
    offsets = pa.array(range(0, (rows + 1) * size, size), pa.int32()).buffers()[1]
    return pa.Array.from_buffers(
        pa.binary(), rows, [None, offsets, pa.allocate_buffer(rows * size)]
    )


class PayloadSource(SourceConnector, RangeReadableSource):
    """Row ``i`` of partition ``p`` has ``id = i * partitions + p``; offsets: the next row."""

    def __init__(self) -> None:
        self._rows = self._partitions = self._size = 0
        self._next: dict[str, int] = {}
        self._cursor = 0

    async def open(self, config: ConnectorConfig) -> None:
        self._rows = config.get_parsed("rows", int, 1000)
        self._partitions = config.get_parsed("partitions", int, 2)
        self._size = config.get_parsed("payload_bytes", int, 1008)
        self._next = {str(p): 0 for p in range(self._partitions)}

    def schema(self) -> pa.Schema:
        return SCHEMA

    def _batch(self, partition: int, start: int, stop: int) -> pa.RecordBatch:
        width = self._partitions
        ids = pa.array(range(start * width + partition, stop * width, width), pa.int64())
        return pa.RecordBatch.from_arrays([ids, _payloads(stop - start, self._size)], schema=SCHEMA)

    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        for step in range(self._partitions):
            partition = (self._cursor + step) % self._partitions
            start = self._next[str(partition)]
            stop = min(self._rows, start + BATCH_ROWS, start + max_records)
            if stop > start:
                self._next[str(partition)] = stop
                self._cursor = partition + 1
                batch = self._batch(partition, start, stop)
                return SourceBatch(batch, PartitionInfo(str(partition), str(stop)))
        return None

    def checkpoint(self) -> SourceCheckpoint:
        return SourceCheckpoint({p: str(n) for p, n in self._next.items()})

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        for partition, offset in checkpoint.offsets.items():
            self._next[partition] = int(offset)

    async def close(self) -> None:
        pass

    def as_range_readable(self) -> RangeReadableSource | None:
        return self

    async def plan_end(self, start: SourceCheckpoint, max_records: int | None) -> SourceCheckpoint:
        firsts = {str(p): int(start.offsets.get(str(p), 0)) for p in range(self._partitions)}
        budget = max_records if max_records is not None else self._rows * self._partitions
        share = max(1, budget // self._partitions)
        return SourceCheckpoint(
            {p: str(min(self._rows, first + share)) for p, first in firsts.items()}
        )

    async def read_range(self, partition_range: PartitionRange) -> AsyncIterator[pa.RecordBatch]:
        partition = int(partition_range.partition)
        start, stop = int(partition_range.start or 0), int(partition_range.end)
        for first in range(start, stop, BATCH_ROWS):
            yield self._batch(partition, first, min(stop, first + BATCH_ROWS))


class PolledPayloadSource(PayloadSource):
    """:class:`PayloadSource`, polled: not range-readable."""

    def as_range_readable(self) -> RangeReadableSource | None:
        return None


class CountingSink(SinkConnector):
    """Reads every byte of each epoch, and appends its rows and bytes to ``path`` at commit."""

    def __init__(self) -> None:
        self._path = Path()
        self._counts = (0, 0)

    async def open(self, config: ConnectorConfig) -> None:
        self._path = Path(config.require("path"))

    def schema(self) -> pa.Schema:
        return SCHEMA

    async def begin_epoch(self, epoch: int) -> None:
        self._counts = (0, 0)

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        for column in batch.columns:
            for buffer in column.buffers():
                if buffer is not None:
                    zlib.adler32(buffer)
        rows, size = self._counts
        self._counts = (rows + batch.num_rows, size + batch.nbytes)
        return WriteResult(batch.num_rows, batch.nbytes)

    async def commit_epoch(self, epoch: int) -> None:
        rows, size = self._counts
        with self._path.open("a") as counts:
            counts.write(json.dumps({"epoch": epoch, "rows": rows, "bytes": size}) + "\n")

    async def close(self) -> None:
        pass


_KEYS = [
    ConfigKeySpec("rows", default="1000", value_type=int, description="rows per partition"),
    ConfigKeySpec("partitions", default="2", value_type=int, description="partitions"),
    ConfigKeySpec("payload_bytes", default="1008", value_type=int, description="bytes a row"),
]


@hookimpl
def laminar_register_connectors(registry: ConnectorRegistry) -> None:
    """Register the payload sources."""
    registry.add_source("bench-payload", PayloadSource, config_keys=_KEYS)
    registry.add_source("bench-payload-polled", PolledPayloadSource, config_keys=_KEYS)
    path = ConfigKeySpec("path", required=True, description="the file the counts go to")
    registry.add_sink("bench-payload", CountingSink, config_keys=[path])
