"""Deliberately broken variants of the reference connectors, as one plugin module.

Each ``broken-*`` variant has a single bug the conformance kit must catch; the correct
connectors (no ``broken-`` prefix) show what passes. The module is a pluggy plugin
(registration and context hooks) used with ``--plugin broken``; like a third-party plugin, its
test contexts do not import the kit.

The range-readable sources and distributed-commit sinks are test doubles built on the memory
connectors' documented directory layout, so that the kit's checks of those extensions are
proven here whatever the reference connectors offer.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from pathlib import Path

import pyarrow as pa

from laminar_sdk import (
    CheckpointError,
    ConnectorConfig,
    ConnectorRegistry,
    DistributedCommitSink,
    EvolutionVerdict,
    PartitionRange,
    RangeReadableSource,
    ReadError,
    SchemaChange,
    SchemaChangeKind,
    SchemaEvolvable,
    SchemaMismatch,
    SinkConnectorCapabilities,
    SourceBatch,
    SourceCheckpoint,
    TransactionError,
    WriteResult,
    fsync_path,
    hookimpl,
    make_dirs,
    write_file_atomically,
)
from laminar_sdk.reference import IDS_SCHEMA, MemorySink, MemorySource
from laminar_sdk.reference._files import arrow_file_bytes, read_arrow_file

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


class _Evolvable(MemorySink, SchemaEvolvable):
    """The memory sink, accepting nullable columns added between epochs (correct).

    Its ``write_batch`` stores the columns the sink was configured with — all the kit reads.
    """

    def __init__(self) -> None:
        super().__init__()
        self._evolved: pa.Schema | None = None
        self._version = 1

    def capabilities(self) -> SinkConnectorCapabilities:
        return super().capabilities().with_schema_evolution()

    def as_schema_evolvable(self) -> SchemaEvolvable:
        return self

    def schema(self) -> pa.Schema:
        configured = super().schema()  # raises Closed after close()
        return configured if self._evolved is None else self._evolved

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        if self._evolved is not None:
            if not batch.schema.equals(self._evolved):
                raise SchemaMismatch("batch does not match the evolved schema")
            batch = batch.select(super().schema().names)
        return await super().write_batch(batch)

    def diff_schemas(self, old: pa.Schema, new: pa.Schema) -> list[SchemaChange]:
        changes = []
        for field in new:
            if old.get_field_index(field.name) < 0:
                changes.append(SchemaChange(SchemaChangeKind.COLUMN_ADDED, field.name, None, field))
            elif not old.field(field.name).type.equals(field.type):
                kind = SchemaChangeKind.TYPE_CHANGED
                changes.append(SchemaChange(kind, field.name, old.field(field.name), field))
            elif old.field(field.name).nullable != field.nullable:
                kind = SchemaChangeKind.NULLABILITY_CHANGED
                changes.append(SchemaChange(kind, field.name, old.field(field.name), field))
        removed = [field for field in old if new.get_field_index(field.name) < 0]
        changes += [SchemaChange(SchemaChangeKind.COLUMN_REMOVED, f.name, f) for f in removed]
        return changes

    def evaluate_evolution(self, changes: Sequence[SchemaChange]) -> EvolutionVerdict:
        additive = all(
            change.kind is SchemaChangeKind.COLUMN_ADDED and change.new and change.new.nullable
            for change in changes
        )
        return EvolutionVerdict.COMPATIBLE if additive else EvolutionVerdict.INCOMPATIBLE

    async def apply_evolution(self, old: pa.Schema, changes: Sequence[SchemaChange]) -> pa.Schema:
        if self.evaluate_evolution(changes) is not EvolutionVerdict.COMPATIBLE:
            raise SchemaMismatch("only nullable columns may be added")
        new = old
        for change in changes:
            assert change.new is not None
            new = new.append(change.new)
        self._switch_to(new)
        self._version += 1
        return new

    def _switch_to(self, schema: pa.Schema) -> None:
        self._evolved = schema

    def schema_version(self) -> int:
        return self._version


class EvolutionNotApplied(_Evolvable):
    """Evolves the schema in the external system but goes on writing the old one."""

    def _switch_to(self, schema: pa.Schema) -> None:
        pass


def _parts(descriptors: Sequence[str]) -> list[str]:
    return [part for descriptor in descriptors for part in json.loads(descriptor)]


class StagingSink(_Evolvable, DistributedCommitSink):
    """The evolvable memory sink, also staging each task's share of an epoch (correct).

    A task stages ``path/_staging/epoch-<e>/task-<hash of its name>/part-<n>.arrow``, durably;
    its descriptor is the JSON list of those files. ``commit_aggregated`` writes the epoch's
    manifest naming the described files only, then renames the epoch's staging directory to
    ``path/committed/epoch-<e>`` — the memory sink's commit record, so a committed epoch is
    recognised by any instance and a repeated commit does nothing.
    """

    def __init__(self) -> None:
        super().__init__()
        self._path = Path()

    async def open(self, config: ConnectorConfig) -> None:
        await super().open(config)
        self._path = Path(config.require("path"))

    def as_distributed_commit(self) -> DistributedCommitSink:
        return self

    def _staging(self, epoch: int) -> Path:
        return self._path / "_staging" / f"epoch-{epoch}"

    def _committed(self, epoch: int) -> Path:
        return self._path / "committed" / f"epoch-{epoch}"

    async def stage(self, epoch: int, task: str, batches: AsyncIterable[pa.RecordBatch]) -> str:
        schema = self.schema()  # raises Closed after close()
        folder = f"task-{hashlib.sha256(task.encode()).hexdigest()[:16]}"
        make_dirs(self._staging(epoch) / folder)
        parts: list[str] = []
        async for batch in batches:
            if not batch.schema.equals(schema):
                raise SchemaMismatch("batch does not match the sink's schema")
            part = f"{folder}/part-{len(parts):06d}.arrow"
            write_file_atomically(self._staging(epoch) / part, arrow_file_bytes(batch))
            parts.append(part)
        return json.dumps(parts)

    async def commit_aggregated(self, epoch: int, descriptors: Sequence[str]) -> None:
        self.schema()
        if not self._committed(epoch).exists():
            self._publish(epoch, _parts(descriptors))

    def _publish(self, epoch: int, parts: list[str]) -> None:
        staging = self._staging(epoch)
        missing = [part for part in parts if not (staging / part).exists()]
        if missing:
            raise TransactionError(f"staged parts {missing} of epoch {epoch} are gone")
        make_dirs(staging)
        manifest = json.dumps({"epoch": epoch, "parts": parts})
        write_file_atomically(staging / "_MANIFEST.json", manifest.encode())
        staging.rename(self._committed(epoch))
        fsync_path(staging.parent)
        fsync_path(self._committed(epoch).parent)

    def _publish_copies(self, epoch: int, parts: list[str]) -> None:
        """Publish copies of staged ``parts`` of ``epoch`` as an epoch of their own, now."""
        published = self._path / "committed" / f"epoch-{next(_FRESH_EPOCHS)}"
        make_dirs(published)
        names = [f"part-{number:06d}.arrow" for number in range(len(parts))]
        for part, name in zip(parts, names, strict=True):
            shutil.copyfile(self._staging(epoch) / part, published / name)
        write_file_atomically(published / "_MANIFEST.json", json.dumps({"parts": names}).encode())


class PublishesEveryAttempt(StagingSink):
    """Commits every file staged for the epoch, by any task attempt, not the described ones."""

    async def commit_aggregated(self, epoch: int, descriptors: Sequence[str]) -> None:
        self.schema()
        if not self._committed(epoch).exists():
            staging = self._staging(epoch)
            staged = staging.glob("task-*/part-*.arrow")
            self._publish(epoch, sorted(str(part.relative_to(staging)) for part in staged))


class RepublishesOnEveryCommit(StagingSink):
    """Publishes copies of the described files on every commit, a repeated one included."""

    async def commit_aggregated(self, epoch: int, descriptors: Sequence[str]) -> None:
        self.schema()
        self._publish_copies(epoch, _parts(descriptors))


class StagesIntoTheTable(StagingSink):
    """Publishes each task's files as soon as they are staged; the commit adds nothing."""

    async def stage(self, epoch: int, task: str, batches: AsyncIterable[pa.RecordBatch]) -> str:
        descriptor = await super().stage(epoch, task, batches)
        self._publish_copies(epoch, json.loads(descriptor))
        return descriptor

    async def commit_aggregated(self, epoch: int, descriptors: Sequence[str]) -> None:
        self.schema()


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

    def as_range_readable(self) -> None:
        return None  # a range read is a replay


class RangeReadableMemorySource(MemorySource, RangeReadableSource):
    """The memory source, also read range by range from its files (correct).

    Partition ``p``'s records are the files ``path/source/partition-<p>/<first offset>.arrow``;
    a checkpoint's offset of ``p`` is the number of its records returned, partitions at 0 left
    out — as the memory source's own checkpoints.
    """

    def __init__(self) -> None:
        super().__init__()
        self._records = Path()

    async def open(self, config: ConnectorConfig) -> None:
        await super().open(config)
        self._records = Path(config.require("path")) / "source"

    def as_range_readable(self) -> RangeReadableSource:
        return self

    def _files(self, partition: str) -> list[tuple[int, pa.RecordBatch]]:
        directory = self._records / f"partition-{partition}"
        return [
            (int(path.stem), read_arrow_file(path)) for path in sorted(directory.glob("*.arrow"))
        ]

    def _ends(self) -> dict[str, int]:
        ends = {}
        for directory in self._records.glob("partition-*"):
            partition = directory.name.removeprefix("partition-")
            files = self._files(partition)
            if files:
                ends[partition] = files[-1][0] + files[-1][1].num_rows
        return ends

    async def plan_end(self, start: SourceCheckpoint, max_records: int | None) -> SourceCheckpoint:
        self.schema()  # raises Closed after close()
        budget = max_records
        offsets = dict(start.offsets)
        for partition, end in sorted(self._ends().items(), key=lambda item: int(item[0])):
            first = int(start.offsets.get(partition, "0"))
            if first > end:
                raise CheckpointError(f"offset {first} of partition {partition} is past {end}")
            take = end - first if budget is None else min(end - first, budget)
            if take:
                offsets[partition] = str(first + take)
                budget = None if budget is None else budget - take
        return SourceCheckpoint(offsets, start.epoch, start.metadata)

    async def read_range(self, partition_range: PartitionRange) -> AsyncIterator[pa.RecordBatch]:
        self.schema()
        first, stop = int(partition_range.start or 0), int(partition_range.end)
        files = self._files(partition_range.partition)
        end = files[-1][0] + files[-1][1].num_rows if files else 0
        if not 0 <= first <= stop <= end:
            raise ReadError(f"{partition_range} is not within the {end} records appended")
        for offset, batch in files:
            low, high = max(first, offset), min(stop, offset + batch.num_rows)
            if low < high:
                yield batch.slice(low - offset, high - low)


class RangeReadOffByOne(RangeReadableMemorySource):
    """Reads a range from the record its start was taken after, not the one following it."""

    async def read_range(self, partition_range: PartitionRange) -> AsyncIterator[pa.RecordBatch]:
        start = partition_range.start
        if start is not None and int(start) > 0:
            start = str(int(start) - 1)
        shifted = PartitionRange(partition_range.partition, start, partition_range.end)
        async for batch in super().read_range(shifted):
            yield batch


class PlansAhead(RangeReadableMemorySource):
    """Ends a plan one record past the last one appended, in every partition that moved."""

    async def plan_end(self, start: SourceCheckpoint, max_records: int | None) -> SourceCheckpoint:
        end = await super().plan_end(start, max_records)
        offsets = {
            partition: str(int(offset) + 1) if start.offsets.get(partition) != offset else offset
            for partition, offset in end.offsets.items()
        }
        return SourceCheckpoint(offsets, end.epoch, end.metadata)


class DeclaresUpsert(MemorySink):
    """The memory sink, declaring upsert besides: a capability no check exercises in process."""

    def capabilities(self) -> SinkConnectorCapabilities:
        return super().capabilities().with_upsert()


SINKS = {
    "broken-commit-in-pre-commit": CommitsInPreCommit,
    "broken-rollback-keeps-buffer": RollbackKeepsBuffer,
    "broken-loses-last-batch": LosesLastBatch,
    "broken-forgets-committed-epochs": ForgetsCommittedEpochs,
    "broken-commit-state-in-memory": CommitStateInMemory,
    "broken-writes-straight-through": WritesStraightThrough,
    "broken-publishes-every-attempt": PublishesEveryAttempt,
    "broken-commit-aggregated-not-idempotent": RepublishesOnEveryCommit,
    "broken-staged-visible-before-commit": StagesIntoTheTable,
    "broken-evolution-not-applied": EvolutionNotApplied,
    "buffering-sink": _BufferingSink,
    "staging-sink": StagingSink,
    "upsert-declaring-sink": DeclaresUpsert,
}
SOURCES = {
    "broken-restore-off-by-one": RestoresOffByOne,
    "broken-checkpoint-ahead": CheckpointsAhead,
    "broken-restore-ignores-a-partition": RestoreIgnoresAPartition,
    "broken-schema-drift": SchemaDrifts,
    "broken-range-read-off-by-one": RangeReadOffByOne,
    "broken-plan-end-ahead": PlansAhead,
    "no-replay-source": NoReplaySource,
    "range-readable-source": RangeReadableMemorySource,
}
"""The variants by connector name; those without the ``broken-`` prefix are correct."""


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
    live_appends = True

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
