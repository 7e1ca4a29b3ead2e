"""The source side: a connector read as a Spark ``DataSourceStreamReader``, one of two ways.

Spark's offsets are the source's :class:`SourceCheckpoint` (``to_dict()``), kept in Spark's
offset log. A micro-batch Spark runs again after a crash — with the offsets it logged for it —
holds exactly the records of its first run, whichever way the source is read:

- a range-readable source (:meth:`SourceConnector.as_range_readable`) is read by
  :class:`LaminarRangeReader`: Spark's planning process asks the source where a micro-batch
  ends (``plan_end``), and each partition whose offset moved is read by a task of its own, on
  the executors, with ``read_range`` — a re-run reads the same ranges again;
- any other source is read by :class:`LaminarPolledReader`: the planning process polls it once
  per micro-batch and keeps the records in the read log (:mod:`~laminar_sdk._spark.read_log`),
  whose entry the end offset names; the tasks of the micro-batch, and of any re-run, read the
  entry's slices in parallel, and the entry is deleted once Spark committed the micro-batch.

Readers open the sources they need and close them again, so nothing depends on the Python
process Spark calls them in; readers may yield ``pyarrow.RecordBatch`` (Spark passes them on
unconverted).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from laminar_sdk._checkpointing.ids import CheckpointId
from laminar_sdk._contract.checkpoint import SourceCheckpoint
from laminar_sdk._contract.connector import SourceConnector
from laminar_sdk._contract.errors import InvalidState, ReadError
from laminar_sdk._contract.parallel import PartitionRange, RangeReadableSource
from laminar_sdk._spark.arrow import conform_source_batch
from laminar_sdk._spark.connectors import KeptSource, iterate, opened_source, run
from laminar_sdk._spark.options import BridgeOptions, checkpointer_of
from laminar_sdk._spark.read_log import (
    READ_LOG_DIRECTORY,
    READ_LOG_OFFSET_KEY,
    SLICE_BYTES,
    LoggedSlice,
    ReadLog,
    ReadLogEntry,
)

logger = logging.getLogger("laminar_sdk.spark")

Offset = dict[str, Any]
"""A Spark offset: a :class:`SourceCheckpoint` as :meth:`SourceCheckpoint.to_dict` gives it,
and for a polled source the micro-batch's read-log entry under :data:`READ_LOG_OFFSET_KEY`."""


@dataclass(frozen=True)
class RangeInputPartition(InputPartition):
    """One Spark task's share of a micro-batch: the records of one source partition.

    The reader that reads it holds the options to open the source with (Spark ships the
    reader to the executors), so the partition carries the range only.
    """

    range: PartitionRange


class LaminarRangeReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reads a range-readable source in parallel: one task per partition that moved.

    A micro-batch ends where the source's ``plan_end`` says, asked for everything available up
    to the read limit (:func:`micro_batch_bounds`): ``laminar.max.bytes.per.batch`` as a number
    of records (:class:`RecordSize`), and ``laminar.max.records.per.batch`` when set. Spark may
    lift the limit (``trigger(once=True)``). The source that plans is opened once, in Spark's
    planning process, and closed in :meth:`stop`; each task opens its own.

    :param options: the validated options of the read side.
    :param schema: the Arrow schema Spark expects the batches in.
    """

    def __init__(self, options: BridgeOptions, schema: pa.Schema) -> None:
        self._options = options
        self._schema = schema
        self._planner: KeptSource | None = None
        self._record_size = RecordSize(schema)

    def __getstate__(self) -> dict[str, object]:
        # Spark ships the reader to the executors for read(): never an opened source.
        return {
            "_options": self._options,
            "_schema": self._schema,
            "_planner": None,
            "_record_size": RecordSize(self._schema),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def initialOffset(self) -> Offset:  # noqa: N802 - Spark's name
        """The checkpoint of the freshly opened source: where a new query starts."""
        return self._planning().source.checkpoint().to_dict()

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 - Spark's name
        """The options' read limit (:func:`default_read_limit`)."""
        return default_read_limit(self._options)

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:  # noqa: N802 - Spark's name
        """Where the micro-batch after ``start`` ends: the source's ``plan_end``.

        ``start`` itself when the source has nothing new (Spark then runs no micro-batch).

        :raises InvalidState: for a read limit other than rows, bytes or none.
        """
        planner = self._planning()
        checkpoint = SourceCheckpoint.from_dict(start)
        ranges = _range_readable(planner.source, self._options)
        bounds = micro_batch_bounds(limit, self._options)
        most = planner.run(self._record_size.most_records(bounds, ranges, checkpoint))
        end = planner.run(ranges.plan_end(checkpoint, most))
        if dict(end.offsets) == dict(checkpoint.offsets):
            return start
        return end.to_dict()

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        """One partition per source partition whose offset moved from ``start`` to ``end``."""
        before = SourceCheckpoint.from_dict(start).offsets
        return [
            RangeInputPartition(PartitionRange(partition, before.get(partition), offset))
            for partition, offset in sorted(SourceCheckpoint.from_dict(end).offsets.items())
            if before.get(partition) != offset
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The records of one partition's range, read by a source opened for the task.

        :raises ReadError: when the source cannot return them (they are gone).
        """
        if not isinstance(partition, RangeInputPartition):
            raise InvalidState("a RangeInputPartition", repr(partition))
        return iterate(self._read_range(partition.range))

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's name
        """Nothing to record: ``plan_end`` always names the records available now.

        So with ``trigger(availableNow=True)`` the query ends at the first micro-batch the
        source has no records for — for a source that keeps receiving data, possibly later
        than the data present when the query started (as with a polled source).
        """

    def stop(self) -> None:
        """Close the source that planned the micro-batches."""
        if self._planner is not None:
            planner, self._planner = self._planner, None
            planner.close()

    def _planning(self) -> KeptSource:
        if self._planner is None:
            self._planner = KeptSource(self._options)
        return self._planner

    async def _read_range(self, partition_range: PartitionRange) -> AsyncIterator[pa.RecordBatch]:
        async with opened_source(self._options) as source:
            declared = source.schema()
            batches = _range_readable(source, self._options).read_range(partition_range)
            async for batch in batches:
                yield conform_source_batch(batch, declared, self._schema, self._options.connector)


def _range_readable(source: SourceConnector, options: BridgeOptions) -> RangeReadableSource:
    ranges = source.as_range_readable()
    if ranges is None:
        raise InvalidState(
            f"source {options.connector!r} to stay range-readable once opened",
            "as_range_readable() returned None",
        )
    return ranges


def default_read_limit(options: BridgeOptions) -> ReadLimit:
    """Spark's default read limit for a laminar source: how much one micro-batch reads.

    The record cap when ``laminar.max.records.per.batch`` is set (the byte budget applies
    too), else the byte budget, ``laminar.max.bytes.per.batch``.
    """
    if options.max_records_per_batch is not None:
        return ReadMaxRows(options.max_records_per_batch)
    return ReadMaxBytes(options.max_bytes_per_batch)


@dataclass(frozen=True, slots=True)
class MicroBatchBounds:
    """How much one micro-batch may read: records and bytes of Arrow data (``None``: no bound)."""

    records: int | None
    bytes: int | None


def micro_batch_bounds(limit: ReadLimit, options: BridgeOptions) -> MicroBatchBounds:
    """The bounds of a micro-batch Spark plans with ``limit``, and the options' own.

    ``ReadAllAvailable`` (``trigger(once=True)``) lifts both; otherwise each of Spark's limit
    and the options bounds what it names, whichever is tighter.

    :raises InvalidState: for a read limit other than rows, bytes or none.
    """
    records, most_bytes = options.max_records_per_batch, options.max_bytes_per_batch
    if isinstance(limit, ReadAllAvailable):
        return MicroBatchBounds(None, None)
    if isinstance(limit, ReadMaxRows):
        records = limit.max_rows if records is None else min(records, limit.max_rows)
        return MicroBatchBounds(records, most_bytes)
    if isinstance(limit, ReadMaxBytes):
        return MicroBatchBounds(records, min(most_bytes, limit.max_bytes))
    raise InvalidState(
        "a read limit of rows (ReadMaxRows), bytes (ReadMaxBytes) or none (ReadAllAvailable)",
        repr(limit),
    )


SAMPLE_RECORDS = 1000
"""How many records a range-readable source with variable-width columns is sampled for."""


class RecordSize:
    """How many bytes of Arrow data a record of a range-readable source takes, on average.

    ``plan_end`` takes a number of records, not bytes, so the byte budget becomes records:

    - when every column of ``schema`` has a fixed width, the size is exact: the columns'
      widths and their validity bits;
    - otherwise (strings, binary, nested types) the planning process reads a sample once — the
      first :data:`SAMPLE_RECORDS` records after the micro-batch's start, through
      ``read_range`` — and keeps the average for the query. A source helps by making its first
      records representative; the records a micro-batch reads may cross the budget by as much
      as they are larger than the sample.

    :param schema: the Arrow schema of the source's batches.
    """

    def __init__(self, schema: pa.Schema) -> None:
        self.fixed = fixed_record_bytes(schema)
        self.sampled: float | None = None

    async def most_records(
        self, bounds: MicroBatchBounds, ranges: RangeReadableSource, start: SourceCheckpoint
    ) -> int | None:
        """The records ``plan_end`` may plan after ``start`` within ``bounds``.

        :raises ReadError: when the sample cannot be read.
        """
        if bounds.bytes is None:
            return bounds.records
        size = self.fixed or self.sampled
        if size is None:
            size = self.sampled = await _sampled_record_bytes(ranges, start)
        if size is None:  # nothing to sample: nothing available, or only empty records
            return bounds.records if bounds.records is not None else SAMPLE_RECORDS
        by_bytes = max(1, int(bounds.bytes / size))
        return by_bytes if bounds.records is None else min(bounds.records, by_bytes)


def fixed_record_bytes(schema: pa.Schema) -> float | None:
    """The Arrow bytes of a record of ``schema``: its columns' widths and validity bits.

    ``None`` when a column has no fixed width (strings, binary, nested types).
    """
    size = 0.0
    for field in schema:
        try:
            width = field.type.bit_width
        except ValueError:  # variable width: strings, binary, lists, structs, ...
            return None
        size += (width + (1 if field.nullable else 0)) / 8
    return size or None


async def _sampled_record_bytes(
    ranges: RangeReadableSource, start: SourceCheckpoint
) -> float | None:
    end = await ranges.plan_end(start, SAMPLE_RECORDS)
    rows = size = 0
    for partition, offset in sorted(end.offsets.items()):
        first = start.offsets.get(partition)
        if first == offset:
            continue
        async for batch in ranges.read_range(PartitionRange(partition, first, offset)):
            rows += batch.num_rows
            size += batch.nbytes
    return size / rows if rows and size else None


@dataclass(frozen=True)
class LoggedInputPartition(InputPartition):
    """One Spark task's share of a polled micro-batch: one slice of its read-log entry."""

    slice: LoggedSlice


@dataclass(frozen=True)
class ReplayedInputPartition(InputPartition):
    """A polled micro-batch whose read-log entry is gone, read again from the source whole.

    :param start: the micro-batch's start offset.
    :param end: its end offset, which names the entry (and so its number of records).
    """

    start: Offset
    end: Offset


class LaminarPolledReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reads a source that is not range-readable: polled once per micro-batch, then logged.

    Spark's planning process plans each micro-batch (:meth:`latestOffset`): it opens the source,
    restores the start checkpoint, polls up to the read limit (:func:`micro_batch_bounds`)
    until the source has nothing more (``poll_batch`` returns ``None``) or asks for a
    checkpoint, writes the records to the read log (:mod:`~laminar_sdk._spark.read_log`) slice
    by slice as they come, and closes the source. The end offset is the
    source's checkpoint after the last record, with the log entry; the next micro-batch resumes
    *after* it. The micro-batch's tasks — and a re-run after a crash, which never polls — read
    the logged slices, in parallel; :meth:`commit` deletes the entry once Spark committed it.

    A micro-batch this reader did not plan (Spark runs it again after a restart) whose entry
    is gone — set aside because a slice was damaged, or lost — is read again from a source
    that can replay, by one task (:class:`ReplayedInputPartition`): restored to the start
    offset, the source is polled for the entry's number of records, and they are delivered
    only if it then stands at the end offset (the same records, for a source whose offsets
    name its records). Otherwise the task fails, saying which check the source did not pass;
    a source that interleaves several partitions as data arrives may not pass it.

    :param options: the validated options of the read side, with a checkpoint location.
    :param schema: the Arrow schema Spark expects the batches in.
    :param replayable: whether the source can replay (its ``supports_replay()``).
    """

    def __init__(self, options: BridgeOptions, schema: pa.Schema, *, replayable: bool) -> None:
        if options.checkpoint_location is None:
            raise InvalidState("a checkpoint location to keep the read log in", "none")
        self._options = options
        self._schema = schema
        self._replayable = replayable
        self._record_size = fixed_record_bytes(schema)
        self._planned: set[CheckpointId] = set()

    def initialOffset(self) -> Offset:  # noqa: N802 - Spark's name
        """The checkpoint of the freshly opened source: where a new query starts."""
        return run(self._initial()).to_dict()

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 - Spark's name
        """The options' read limit (:func:`default_read_limit`)."""
        return default_read_limit(self._options)

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:  # noqa: N802 - Spark's name
        """Poll the micro-batch after ``start`` and log it; its end offset names the entry.

        ``start`` itself when the source has nothing new (Spark then runs no micro-batch).

        :raises InvalidState: for a read limit other than rows, bytes or none.
        :raises CheckpointError: when the read log cannot be written.
        """
        checkpoint, _ = split_offset(start)
        planned = run(self._plan(checkpoint, micro_batch_bounds(limit, self._options)))
        return start if planned is None else planned

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        """One partition per slice of the micro-batch's read-log entry.

        For a micro-batch this reader did not plan whose entry is gone: one partition that
        reads it again from the source (:class:`ReplayedInputPartition`).

        :raises ReadError: when the entry is gone and the source cannot replay.
        """
        _, entry = self._end_of(end)
        if entry.checkpoint_id in self._planned or run(self._read_log().holds(entry)):
            return [LoggedInputPartition(logged) for logged in entry.slices]
        if not self._replayable:
            raise ReadError(
                f"source {self._options.connector!r}: the records of this micro-batch (read-log "
                f"entry {entry.checkpoint_id}) are gone from the read log at "
                f"{self._read_log().location}: set aside, or the laminar checkpoint location "
                "was deleted or restored from an older backup while Spark's checkpoint was "
                f"kept. {self._read_log().way_back(entry.checkpoint_id, gone=True)}"
            )
        logger.warning(
            "source %r: read-log entry %s is not in %s; reading its %d record(s) again from "
            "the source",
            self._options.connector,
            entry.checkpoint_id,
            self._read_log().location,
            entry.rows,
        )
        return [ReplayedInputPartition(start, end)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The records of one slice, as the micro-batch's first run logged them.

        Or, for a :class:`ReplayedInputPartition`, the micro-batch's records read again from
        the source.

        :raises ReadError: when the slice is gone or corrupted, naming it; when the source
            does not replay the micro-batch it read, saying how it differs.
        """
        if isinstance(partition, ReplayedInputPartition):
            return iterate(self._replayed(partition))
        if not isinstance(partition, LoggedInputPartition):
            raise InvalidState("a LoggedInputPartition", repr(partition))
        return iter(run(self._read_log().read(partition.slice)))

    def commit(self, end: Offset) -> None:
        """Delete the read-log entry of a micro-batch Spark committed (and older orphans)."""
        _, entry = split_offset(end)
        if entry is not None:
            self._planned.discard(entry.checkpoint_id)
            run(self._read_log().discard(entry))

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's name
        """Nothing to record: a source cannot be asked where its data ends today.

        So with ``trigger(availableNow=True)`` the query ends at the first micro-batch the
        source has no records for — for a source that keeps receiving data, possibly later
        than the data present when the query started.
        """

    def _read_log(self) -> ReadLog:
        store = checkpointer_of(self._options, READ_LOG_DIRECTORY)
        return ReadLog(store, self._options.connector, replayable=self._replayable)

    def _end_of(self, end: Offset) -> tuple[SourceCheckpoint, ReadLogEntry]:
        checkpoint, entry = split_offset(end)
        if entry is None:
            raise ReadError(
                f"source {self._options.connector!r}: the end offset of this micro-batch names "
                "no read-log entry. It was planned by an older laminar SDK, which did not log "
                "what a polled source read: finish the query with that version, or start it over"
            )
        return checkpoint, entry

    async def _replayed(self, partition: ReplayedInputPartition) -> AsyncIterator[pa.RecordBatch]:
        start, _ = split_offset(partition.start)
        end, entry = self._end_of(partition.end)
        connector = self._options.connector
        replayed = 0
        async with opened_source(self._options) as source:
            await source.restore(start)
            declared = source.schema()
            async for batch in replay_micro_batch(source, entry.rows, self._record_size):
                replayed += batch.num_rows
                yield conform_source_batch(batch, declared, self._schema, connector)
            reached = source.checkpoint()
        if replayed != entry.rows or reached.to_dict() != end.to_dict():
            raise ReadError(
                f"source {connector!r}: read again from the start offset of a micro-batch whose "
                f"read-log entry ({entry.checkpoint_id}) is gone, the source returned "
                f"{replayed} of the {entry.rows} record(s) its first run read and stands at "
                f"{reached.to_dict()}, not at the end offset Spark logged ({end.to_dict()}): it "
                "did not replay the same records, so they are not delivered. Restore the "
                "laminar checkpoint location from a backup taken with Spark's checkpoint, or "
                "delete both to start the query over"
            )

    async def _initial(self) -> SourceCheckpoint:
        async with opened_source(self._options) as source:
            return source.checkpoint()

    async def _plan(self, start: SourceCheckpoint, bounds: MicroBatchBounds) -> Offset | None:
        # The source stays open while its records are logged: a crash hook watching its reads
        # (source-read) fires at its close at the latest, after the entry is durable.
        async with opened_source(self._options) as source:
            await source.restore(start)
            declared, connector = source.schema(), self._options.connector
            conformed = (
                conform_source_batch(batch, declared, self._schema, connector)
                async for batch in poll_micro_batch(source, bounds, self._record_size)
            )
            entry = await self._read_log().append(conformed, self._schema)
            if not entry.slices:
                return None
            reached = source.checkpoint()
        self._planned.add(entry.checkpoint_id)
        return logged_offset(reached, entry)


FIRST_POLL_RECORDS = 65_536
"""The most records the first poll of a micro-batch asks for, before a record's size is known."""


async def poll_micro_batch(
    source: SourceConnector, bounds: MicroBatchBounds, record_size: float | None = None
) -> AsyncIterator[pa.RecordBatch]:
    """Poll ``source`` within ``bounds``, until it has nothing more or asks for a checkpoint.

    Each poll asks for about a read-log slice's worth of records, and never for more than the
    rest of the record bound or of the byte budget, by the average size of the records polled
    so far — before the first, by ``record_size`` (exact for a schema of fixed-width columns,
    :func:`fixed_record_bytes`); without it, the first poll asks for
    :data:`FIRST_POLL_RECORDS`. So a micro-batch crosses the budget only by what its last
    records are larger than the ones before (or the first ones, larger than it).
    """
    requested = source.checkpoint_requested()
    records = size = 0
    while (asked := _records_to_ask(bounds, records, size, record_size)) > 0:
        ready = source.data_ready_notify()
        if ready is not None:
            ready.clear()
        polled = await source.poll_batch(asked)
        if polled is None or not polled.num_rows:
            return
        records += polled.num_rows
        size += polled.records.nbytes
        yield polled.records
        if requested is not None and requested.is_set():
            requested.clear()
            return


REPLAY_PATIENCE_S = 30.0
"""How long a source read again may go without returning a record before the replay ends."""


async def replay_micro_batch(
    source: SourceConnector, rows: int, record_size: float | None = None
) -> AsyncIterator[pa.RecordBatch]:
    """Poll a restored ``source`` for ``rows`` records, never asking for more than are left.

    A poll that returns nothing is repeated (the records may still be on their way: a client
    that fetches in the background) until :data:`REPLAY_PATIENCE_S` pass without a record.
    The source's requests for a checkpoint are cleared: a replay ends at ``rows`` only.
    """
    requested = source.checkpoint_requested()
    bounds = MicroBatchBounds(rows, None)
    records = size = 0
    idle_since = time.monotonic()
    while (asked := _records_to_ask(bounds, records, size, record_size)) > 0:
        if requested is not None:
            requested.clear()
        polled = await source.poll_batch(asked)
        if polled is None or not polled.num_rows:
            if time.monotonic() - idle_since > REPLAY_PATIENCE_S:
                return
            await asyncio.sleep(0.05)
            continue
        idle_since = time.monotonic()
        records += polled.num_rows
        size += polled.records.nbytes
        yield polled.records


def _records_to_ask(
    bounds: MicroBatchBounds, records: int, size: int, record_size: float | None
) -> int:
    """How many records the next poll asks for, ``records`` of ``size`` bytes polled so far."""
    if records and size:
        record_size = size / records
    if record_size is None:
        asked = FIRST_POLL_RECORDS
    else:
        asked = max(1, int(SLICE_BYTES / record_size))
        if bounds.bytes is not None:
            if size >= bounds.bytes:
                return 0
            asked = min(asked, max(1, int((bounds.bytes - size) / record_size)))
    if bounds.records is not None:
        asked = min(asked, bounds.records - records)
    return asked


def split_offset(offset: Offset) -> tuple[SourceCheckpoint, ReadLogEntry | None]:
    """A Spark offset's source checkpoint, and the read-log entry it names (if any).

    :raises CheckpointError: when either part is malformed.
    """
    fields = dict(offset)
    logged = fields.pop(READ_LOG_OFFSET_KEY, None)
    entry = None if logged is None else ReadLogEntry.from_dict(logged)
    return SourceCheckpoint.from_dict(fields), entry


def logged_offset(checkpoint: SourceCheckpoint, entry: ReadLogEntry) -> Offset:
    """The Spark offset of a polled micro-batch: where the source stands, and its log entry."""
    return {**checkpoint.to_dict(), READ_LOG_OFFSET_KEY: entry.to_dict()}
