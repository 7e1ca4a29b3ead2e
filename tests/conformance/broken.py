"""Deliberately broken variants of the reference connectors, as one plugin module.

Each ``broken-*`` variant has a single bug the conformance kit must catch; two correct
connectors show what passes. The module is a pluggy plugin
(registration and context hooks) used with ``--plugin broken``; like a third-party plugin, its
test contexts do not import the kit.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from laminar_sdk import (
    ConnectorConfig,
    ConnectorRegistry,
    SchemaMismatch,
    SourceBatch,
    SourceCheckpoint,
    WriteResult,
    hookimpl,
)
from laminar_sdk.reference import IDS_SCHEMA, MemorySink, MemorySource

# Epoch numbers no runtime uses, for variants that write epochs under numbers of their own.
_FRESH_EPOCHS = itertools.count(10**9)


# Sinks -----------------------------------------------------------------------------------


class CommitsInPreCommit(MemorySink):
    """Publishes the epoch in ``pre_commit``: a rollback after it cannot take it back."""

    async def pre_commit(self, epoch: int) -> None:
        await super().pre_commit(epoch)
        await super().commit_epoch(epoch)


class _BufferingSink(MemorySink):
    """Buffers batches in memory and stages them at ``pre_commit`` (correct as written)."""

    def __init__(self) -> None:
        super().__init__()
        self._buffer: list[pa.RecordBatch] = []

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        if not batch.schema.equals(self.schema()):
            raise SchemaMismatch("batch does not match the sink's schema")
        self._buffer.append(batch)
        return WriteResult(batch.num_rows, batch.nbytes)

    def _to_stage(self) -> list[pa.RecordBatch]:
        return self._buffer

    async def pre_commit(self, epoch: int) -> None:
        for batch in self._to_stage():
            await super().write_batch(batch)
        self._buffer = []
        await super().pre_commit(epoch)

    async def rollback_epoch(self, epoch: int) -> None:
        self._buffer = []
        await super().rollback_epoch(epoch)


class RollbackKeepsBuffer(_BufferingSink):
    """Forgets to drop its buffer on rollback: the next attempt publishes the old records."""

    async def rollback_epoch(self, epoch: int) -> None:
        await MemorySink.rollback_epoch(self, epoch)


class LosesLastBatch(_BufferingSink):
    """Stages every buffered batch but the last at ``pre_commit``."""

    def _to_stage(self) -> list[pa.RecordBatch]:
        return self._buffer[:-1]


class ForgetsCommittedEpochs(MemorySink):
    """Recognises a re-delivered epoch only if this instance committed it; else writes it again."""

    def __init__(self) -> None:
        super().__init__()
        self._committed_here: set[int] = set()
        self._numbers: dict[int, int] = {}
        self._committed = Path()

    async def open(self, config: ConnectorConfig) -> None:
        await super().open(config)
        self._committed = Path(config.require("path")) / "committed"

    def _number(self, epoch: int) -> int:
        return self._numbers.get(epoch, epoch)

    async def begin_epoch(self, epoch: int) -> None:
        already = (self._committed / f"epoch-{epoch}").exists()
        if already and epoch not in self._committed_here:
            self._numbers[epoch] = next(_FRESH_EPOCHS)
        await super().begin_epoch(self._number(epoch))

    async def pre_commit(self, epoch: int) -> None:
        await super().pre_commit(self._number(epoch))

    async def commit_epoch(self, epoch: int) -> None:
        await super().commit_epoch(self._number(epoch))
        self._committed_here.add(epoch)

    async def rollback_epoch(self, epoch: int) -> None:
        await super().rollback_epoch(self._number(epoch))


class CommitStateInMemory(MemorySink):
    """Keeps what it pre-committed in memory: a new instance asked to commit it does nothing."""

    def __init__(self) -> None:
        super().__init__()
        self._prepared: set[int] = set()

    async def pre_commit(self, epoch: int) -> None:
        await super().pre_commit(epoch)
        self._prepared.add(epoch)

    async def commit_epoch(self, epoch: int) -> None:
        if epoch in self._prepared:
            await super().commit_epoch(epoch)


class WritesStraightThrough(MemorySink):
    """Claims exactly-once (as the memory sink does) but publishes every batch as it comes."""

    async def begin_epoch(self, epoch: int) -> None:
        self.schema()  # raises Closed after close(), like the memory sink

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        number = next(_FRESH_EPOCHS)
        await super().begin_epoch(number)
        result = await super().write_batch(batch)
        await super().pre_commit(number)
        await super().commit_epoch(number)
        return result

    async def pre_commit(self, epoch: int) -> None:
        pass

    async def commit_epoch(self, epoch: int) -> None:
        pass

    async def rollback_epoch(self, epoch: int) -> None:
        pass


# Sources ---------------------------------------------------------------------------------


class RestoresOffByOne(MemorySource):
    """Resumes *at* the last record returned instead of after it."""

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        offsets = {p: str(max(0, int(o) - 1)) for p, o in checkpoint.offsets.items()}
        await super().restore(SourceCheckpoint(offsets, checkpoint.epoch, checkpoint.metadata))


class CheckpointsAhead(MemorySource):
    """Reads ahead and returns half of what it read; its checkpoint counts the held half too."""

    def __init__(self) -> None:
        super().__init__()
        self._held: SourceBatch | None = None

    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        if self._held is not None:
            held = self._held
            rest = held.records.slice(max_records)
            self._held = SourceBatch(rest, held.partition) if rest.num_rows else None
            return SourceBatch(held.records.slice(0, max_records), held.partition)
        batch = await super().poll_batch(max_records)
        if batch is None or batch.num_rows < 2:
            return batch
        half = batch.num_rows // 2
        self._held = SourceBatch(batch.records.slice(half), batch.partition)
        return SourceBatch(batch.records.slice(0, half), batch.partition)


class RestoreIgnoresAPartition(MemorySource):
    """Restores every partition but partition 1, which starts over."""

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        offsets = {p: o for p, o in checkpoint.offsets.items() if p != "1"}
        await super().restore(SourceCheckpoint(offsets, checkpoint.epoch, checkpoint.metadata))


class SchemaDrifts(MemorySource):
    """Every second batch carries ``value`` as float32 instead of float64."""

    def __init__(self) -> None:
        super().__init__()
        self._polls = 0

    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        batch = await super().poll_batch(max_records)
        if batch is None:
            return None
        self._polls += 1
        if self._polls % 2:
            return batch
        index = batch.records.schema.get_field_index("value")
        value = batch.records.column(index).cast(pa.float32())
        return SourceBatch(batch.records.set_column(index, "value", value), batch.partition)


class NoReplaySource(MemorySource):
    """A correct source that does not claim replay: the replay checks must skip, saying why."""

    def supports_replay(self) -> bool:
        return False


SINKS = {
    "broken-commit-in-pre-commit": CommitsInPreCommit,
    "broken-rollback-keeps-buffer": RollbackKeepsBuffer,
    "broken-loses-last-batch": LosesLastBatch,
    "broken-forgets-committed-epochs": ForgetsCommittedEpochs,
    "broken-commit-state-in-memory": CommitStateInMemory,
    "broken-writes-straight-through": WritesStraightThrough,
    "buffering-sink": _BufferingSink,
}
SOURCES = {
    "broken-restore-off-by-one": RestoresOffByOne,
    "broken-checkpoint-ahead": CheckpointsAhead,
    "broken-restore-ignores-a-partition": RestoreIgnoresAPartition,
    "broken-schema-drift": SchemaDrifts,
    "no-replay-source": NoReplaySource,
}
"""The variants by connector name; ``buffering-sink`` and ``no-replay-source`` are correct."""


# Test contexts: structural, like any plugin's --------------------------------------------


def _ids_batch(ids: Sequence[int]) -> pa.RecordBatch:
    id_array = pa.array(list(ids), pa.int64())
    partition = pa.array([0] * len(id_array), pa.int32())
    return pa.RecordBatch.from_arrays(
        [id_array, partition, id_array.cast(pa.float64())], schema=IDS_SCHEMA
    )


class SinkContext:
    def __init__(self, connector: str, workdir: Path) -> None:
        self._connector, self._path = connector, workdir / "sink"

    def config(self) -> ConnectorConfig:
        return ConnectorConfig(self._connector, {"path": str(self._path)})

    def batch(self, ids: Sequence[int]) -> pa.RecordBatch:
        return _ids_batch(ids)

    def committed_ids(self) -> list[int]:
        return MemorySink.committed_ids(self._path)

    def close(self) -> None:
        pass


class SourceContext:
    partitions = 3

    def __init__(self, connector: str, workdir: Path) -> None:
        self._connector, self._path = connector, workdir / "source"

    def config(self) -> ConnectorConfig:
        return ConnectorConfig(self._connector, {"path": str(self._path)})

    def append(self, ids: Sequence[int], partition: int | None = None) -> None:
        MemorySource.append(self._path, ids, partition=partition or 0)

    def ids(self, records: pa.RecordBatch) -> list[int]:
        return records.column("id").to_pylist()

    def close(self) -> None:
        pass


@hookimpl
def laminar_register_connectors(registry: ConnectorRegistry) -> None:
    for name, sink in SINKS.items():
        registry.add_sink(name, sink, config_keys=MemorySink.CONFIG_KEYS)
    for name, source in SOURCES.items():
        registry.add_source(name, source, config_keys=MemorySource.CONFIG_KEYS)


@hookimpl
def laminar_conformance_context(
    connector: str, role: str, workdir: Path
) -> SinkContext | SourceContext | None:
    if role == "sink" and connector in SINKS:
        return SinkContext(connector, workdir)
    if role == "source" and connector in SOURCES:
        return SourceContext(connector, workdir)
    return None
