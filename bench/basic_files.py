"""A plugin written for the benchmarks to the *basic* contract: what a third party writes first.

- ``bench-parquet`` source: polls the Parquet files of a directory, one source partition per
  sub-directory (``p=<partition>/``), each partition's files read in name order. It is
  replayable (its checkpoint names a file and a row in it) and nothing more: no range reads,
  so the Spark bridge polls it in its planning process into the read log.
- ``bench-parquet`` sink: one instance writes an epoch into a staging Parquet file and renames
  it to ``epoch-<n>.parquet`` at ``commit_epoch`` (exactly-once, the one-instance protocol).
- ``bench-parquet-staged`` sink: the same sink, also a distributed-commit sink: each write
  task stages a file of its own, and ``commit_aggregated`` renames them into ``epoch-<n>/``.

``read_files`` and ``ParquetFileWriter`` are the file I/O itself; the benchmarks' hand-written
Spark data sources call the same functions, so both sides of a comparison do the same I/O.
Nothing is fsynced, on either side: the benchmarks compare the paths through Spark, not the
disk, and a process kill (what the SDK's crash tests inject) loses nothing the kernel holds.

Installed for a benchmark by :func:`_plugins.install_plugin` (an entry point in a temporary
site directory), as a third-party plugin would be.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import AsyncIterable, Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from laminar_sdk import (
    ConfigKeySpec,
    ConnectorConfig,
    ConnectorRegistry,
    DistributedCommitSink,
    InvalidState,
    PartitionInfo,
    SinkConnector,
    SinkConnectorCapabilities,
    SourceBatch,
    SourceCheckpoint,
    SourceConnector,
    WriteResult,
    hookimpl,
)

SCHEMA = pa.schema([("id", pa.int64()), ("partition", pa.int32()), ("value", pa.float64())])
"""The rows of every benchmark file (every column nullable, as Spark hands them over)."""

PARTITION_PREFIX = "p="
READ_BATCH_ROWS = 65_536
STAGING = "_staging"


def partition_files(directory: Path) -> dict[str, list[str]]:
    """Every source partition of ``directory`` and its files' names, in read order."""
    partitions = {}
    for child in sorted(directory.iterdir()):
        if child.is_dir() and child.name.startswith(PARTITION_PREFIX):
            partition = child.name.removeprefix(PARTITION_PREFIX)
            files = (f.name for f in child.iterdir() if f.suffix == ".parquet")
            partitions[partition] = sorted(files)
    return partitions


def read_files(paths: Sequence[Path], skip_rows: int = 0) -> Iterator[pa.RecordBatch]:
    """The batches of ``paths`` in order, the first ``skip_rows`` rows of the first left out.

    Whole row groups are skipped by their metadata, unread.
    """
    for path in paths:
        parquet = pq.ParquetFile(path)
        first = 0
        while first < parquet.num_row_groups:
            rows = parquet.metadata.row_group(first).num_rows
            if skip_rows < rows:
                break
            skip_rows -= rows
            first += 1
        groups = list(range(first, parquet.num_row_groups))
        if not groups:
            continue  # iter_batches(row_groups=[]) would read every row group
        for batch in parquet.iter_batches(batch_size=READ_BATCH_ROWS, row_groups=groups):
            if skip_rows >= batch.num_rows:
                skip_rows -= batch.num_rows
                continue
            yield batch.slice(skip_rows) if skip_rows else batch
            skip_rows = 0


class ParquetFileWriter:
    """A Parquet file written batch by batch, made only when the first batch comes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows = 0
        self._writer: pq.ParquetWriter | None = None

    def write(self, batch: pa.RecordBatch) -> None:
        """Append ``batch``."""
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(self.path, SCHEMA)
        self._writer.write_batch(batch)
        self.rows += batch.num_rows

    def close(self) -> bool:
        """Finish the file; whether there is one (no batch came: none)."""
        if self._writer is None:
            return False
        self._writer.close()
        self._writer = None
        return True


class ParquetSource(SourceConnector):
    """Polls the Parquet files of ``path``: the partitions in turn, ``batch_size`` rows a poll.

    Offsets: per partition, ``<file name>:<rows read from it>``; restoring resumes *after*
    the last row returned.
    """

    def __init__(self) -> None:
        self._root = Path()
        self._offsets: dict[str, tuple[str, int]] = {}
        self._readers: dict[str, Iterator[pa.RecordBatch]] = {}
        self._cursor = 0

    async def open(self, config: ConnectorConfig) -> None:
        self._root = Path(config.require("path"))

    def schema(self) -> pa.Schema:
        return SCHEMA

    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        partitions = sorted(partition_files(self._root).items())
        for step in range(len(partitions)):
            partition, files = partitions[(self._cursor + step) % len(partitions)]
            batch = self._next_rows(partition, files, max_records)
            if batch is not None:
                self._cursor = (self._cursor + step + 1) % len(partitions)
                name, row = self._offsets[partition]
                return SourceBatch(batch, PartitionInfo(partition, f"{name}:{row}"))
        return None

    def _next_rows(self, partition: str, files: list[str], most: int) -> pa.RecordBatch | None:
        name, row = self._offsets.get(partition, ("", 0))
        while True:
            reader = self._readers.get(partition)
            if reader is None:
                if not name:
                    if not files:
                        return None
                    name, row = files[0], 0
                path = self._root / f"{PARTITION_PREFIX}{partition}" / name
                reader = self._readers[partition] = read_files([path], row)
            batch = next(reader, None)
            if batch is None:
                del self._readers[partition]
                following = [f for f in files if f > name]
                if not following:
                    return None
                name, row = following[0], 0
                continue
            if batch.num_rows > most:
                self._readers[partition] = _chain(batch.slice(most), reader)
                batch = batch.slice(0, most)
            self._offsets[partition] = (name, row + batch.num_rows)
            return batch

    def checkpoint(self) -> SourceCheckpoint:
        return SourceCheckpoint({p: f"{name}:{row}" for p, (name, row) in self._offsets.items()})

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        self._readers.clear()
        self._offsets = {}
        for partition, offset in checkpoint.offsets.items():
            name, _, row = offset.rpartition(":")
            self._offsets[partition] = (name, int(row))

    async def close(self) -> None:
        self._readers.clear()


def _chain(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield first
    yield from rest


class ParquetSink(SinkConnector):
    """Writes each epoch to ``epoch-<n>.parquet`` in ``path``, exactly once (one instance)."""

    def __init__(self) -> None:
        self._root = Path()
        self._writer: ParquetFileWriter | None = None

    async def open(self, config: ConnectorConfig) -> None:
        self._root = Path(config.require("path"))
        (self._root / STAGING).mkdir(parents=True, exist_ok=True)

    def schema(self) -> pa.Schema:
        return SCHEMA

    def capabilities(self) -> SinkConnectorCapabilities:
        return SinkConnectorCapabilities(exactly_once=True, two_phase_commit=True)

    async def begin_epoch(self, epoch: int) -> None:
        self._writer = ParquetFileWriter(self._staged(epoch))

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        if self._writer is None:
            raise InvalidState("begin_epoch before write_batch", "no epoch begun")
        self._writer.write(batch)
        return WriteResult(batch.num_rows, batch.nbytes)

    async def pre_commit(self, epoch: int) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    async def commit_epoch(self, epoch: int) -> None:
        staged = self._staged(epoch)
        if staged.exists():
            os.replace(staged, self._root / f"epoch-{epoch}.parquet")

    async def rollback_epoch(self, epoch: int) -> None:
        self._writer = None
        self._staged(epoch).unlink(missing_ok=True)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _staged(self, epoch: int) -> Path:
        return self._root / STAGING / f"epoch-{epoch}.parquet"


class StagedParquetSink(ParquetSink, DistributedCommitSink):
    """:class:`ParquetSink`, whose write tasks also stage files in parallel (``epoch-<n>/``)."""

    def as_distributed_commit(self) -> DistributedCommitSink:
        return self

    async def stage(self, epoch: int, task: str, batches: AsyncIterable[pa.RecordBatch]) -> str:
        writer = ParquetFileWriter(self._root / STAGING / f"epoch-{epoch}" / f"{task}.parquet")
        async for batch in batches:
            writer.write(batch)
        return json.dumps(writer.path.name if writer.close() else None)

    async def commit_aggregated(self, epoch: int, descriptors: Sequence[str]) -> None:
        staging = self._root / STAGING / f"epoch-{epoch}"
        published = self._root / f"epoch-{epoch}"
        published.mkdir(exist_ok=True)
        for name in filter(None, (json.loads(d) for d in descriptors)):
            if (staging / name).exists():
                os.replace(staging / name, published / name)
        shutil.rmtree(staging, ignore_errors=True)

    async def rollback_epoch(self, epoch: int) -> None:
        await super().rollback_epoch(epoch)
        shutil.rmtree(self._root / STAGING / f"epoch-{epoch}", ignore_errors=True)


_PATH = ConfigKeySpec("path", required=True, description="the directory")


@hookimpl
def laminar_register_connectors(registry: ConnectorRegistry) -> None:
    """Register the benchmark's source and sinks."""
    registry.add_source("bench-parquet", ParquetSource, config_keys=[_PATH])
    registry.add_sink("bench-parquet", ParquetSink, config_keys=[_PATH])
    registry.add_sink("bench-parquet-staged", StagedParquetSink, config_keys=[_PATH])
