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
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from laminar_sdk._checkpoint import SourceCheckpoint
from laminar_sdk._connector import SourceConnector
from laminar_sdk._errors import InvalidState, ReadError
from laminar_sdk._parallel import PartitionRange, RangeReadableSource
from laminar_sdk._spark.arrow import conform_source_batch
from laminar_sdk._spark.connectors import KeptSource, iterate, opened_source
from laminar_sdk._spark.options import BridgeOptions, checkpointer_of
from laminar_sdk._spark.read_log import READ_LOG_DIRECTORY, LoggedSlice, ReadLog, ReadLogEntry

logger = logging.getLogger("laminar_sdk.spark")

Offset = dict[str, Any]
"""A Spark offset: a :class:`SourceCheckpoint` as :meth:`SourceCheckpoint.to_dict` gives it,
and for a polled source the micro-batch's read-log entry under :data:`READ_LOG_OFFSET_KEY`."""

READ_LOG_OFFSET_KEY = "read_log"
"""The key of a polled micro-batch's read-log entry in its end offset."""


@dataclass(frozen=True)
class RangeInputPartition(InputPartition):
    """One Spark task's share of a micro-batch: the records of one source partition.

    The reader that reads it holds the options to open the source with (Spark ships the
    reader to the executors), so the partition carries the range only.
    """

    range: PartitionRange


class LaminarRangeReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reads a range-readable source in parallel: one task per partition that moved.

    A micro-batch ends where the source's ``plan_end`` says, at most
    ``laminar.max.records.per.batch`` records after its start (Spark's default read limit;
    Spark may lift it, e.g. for ``trigger(once=True)``). The source that plans is opened once,
    in Spark's planning process, and closed in :meth:`stop`; each task opens its own.

    :param options: the validated options of the read side.
    :param schema: the Arrow schema Spark expects the batches in.
    """

    def __init__(self, options: BridgeOptions, schema: pa.Schema) -> None:
        self._options = options
        self._schema = schema
        self._planner: KeptSource | None = None

    def __getstate__(self) -> dict[str, object]:
        # Spark ships the reader to the executors for read(): never an opened source.
        return {"_options": self._options, "_schema": self._schema, "_planner": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def initialOffset(self) -> Offset:  # noqa: N802 - Spark's name
        """The checkpoint of the freshly opened source: where a new query starts."""
        return self._planning().source.checkpoint().to_dict()

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 - Spark's name
        """At most ``laminar.max.records.per.batch`` records per micro-batch."""
        return ReadMaxRows(self._options.max_records_per_batch)

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:  # noqa: N802 - Spark's name
        """Where the micro-batch after ``start`` ends: the source's ``plan_end``.

        ``start`` itself when the source has nothing new (Spark then runs no micro-batch).

        :raises InvalidState: for a read limit other than a row count or none.
        """
        planner = self._planning()
        checkpoint = SourceCheckpoint.from_dict(start)
        ranges = _range_readable(planner.source, self._options)
        end = planner.run(ranges.plan_end(checkpoint, _max_records(limit)))
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


def _max_records(limit: ReadLimit) -> int | None:
    if isinstance(limit, ReadAllAvailable):
        return None
    if isinstance(limit, ReadMaxRows):
        return limit.max_rows
    raise InvalidState("a read limit of rows (ReadMaxRows) or none (ReadAllAvailable)", repr(limit))


@dataclass(frozen=True)
class LoggedInputPartition(InputPartition):
    """One Spark task's share of a polled micro-batch: one slice of its read-log entry."""

    slice: LoggedSlice


class LaminarPolledReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reads a source that is not range-readable: polled once per micro-batch, then logged.

    Spark's planning process plans each micro-batch (:meth:`latestOffset`): it opens the source,
    restores the start checkpoint, polls up to the read limit until the source has nothing more
    (``poll_batch`` returns ``None``) or asks for a checkpoint, writes the records to the read
    log (:mod:`~laminar_sdk._spark.read_log`) and closes the source. The end offset is the
    source's checkpoint after the last record, with the log entry; the next micro-batch resumes
    *after* it. The micro-batch's tasks — and a re-run after a crash, which never polls — read
    the logged slices, in parallel; :meth:`commit` deletes the entry once Spark committed it.

    :param options: the validated options of the read side, with a checkpoint location.
    :param schema: the Arrow schema Spark expects the batches in.
    """

    def __init__(self, options: BridgeOptions, schema: pa.Schema) -> None:
        if options.checkpoint_location is None:
            raise InvalidState("a checkpoint location to keep the read log in", "none")
        self._options = options
        self._schema = schema

    def initialOffset(self) -> Offset:  # noqa: N802 - Spark's name
        """The checkpoint of the freshly opened source: where a new query starts."""
        return asyncio.run(self._initial()).to_dict()

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 - Spark's name
        """At most ``laminar.max.records.per.batch`` records per micro-batch."""
        return ReadMaxRows(self._options.max_records_per_batch)

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:  # noqa: N802 - Spark's name
        """Poll the micro-batch after ``start`` and log it; its end offset names the entry.

        ``start`` itself when the source has nothing new (Spark then runs no micro-batch).

        :raises InvalidState: for a read limit other than a row count or none.
        :raises CheckpointError: when the read log cannot be written.
        """
        checkpoint, _ = split_offset(start)
        limit_rows = _max_records(limit)
        most = self._options.max_records_per_batch
        planned = asyncio.run(self._plan(checkpoint, most if limit_rows is None else limit_rows))
        return start if planned is None else planned

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        """One partition per slice of the micro-batch's read-log entry."""
        _, entry = split_offset(end)
        if entry is None:
            raise ReadError(
                f"source {self._options.connector!r}: the end offset of this micro-batch names "
                "no read-log entry. It was planned by an older laminar SDK, which did not log "
                "what a polled source read: finish the query with that version, or start it over"
            )
        return [LoggedInputPartition(logged) for logged in entry.slices]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The records of one slice, as the micro-batch's first run logged them.

        :raises ReadError: when the slice is gone or corrupted, naming it.
        """
        if not isinstance(partition, LoggedInputPartition):
            raise InvalidState("a LoggedInputPartition", repr(partition))
        return iter(asyncio.run(self._read_log().read(partition.slice)))

    def commit(self, end: Offset) -> None:
        """Delete the read-log entry of a micro-batch Spark committed (and older orphans)."""
        _, entry = split_offset(end)
        if entry is not None:
            asyncio.run(self._read_log().discard(entry))

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's name
        """Nothing to record: a source cannot be asked where its data ends today.

        So with ``trigger(availableNow=True)`` the query ends at the first micro-batch the
        source has no records for — for a source that keeps receiving data, possibly later
        than the data present when the query started.
        """

    def _read_log(self) -> ReadLog:
        return ReadLog(checkpointer_of(self._options, READ_LOG_DIRECTORY), self._options.connector)

    async def _initial(self) -> SourceCheckpoint:
        async with opened_source(self._options) as source:
            return source.checkpoint()

    async def _plan(self, start: SourceCheckpoint, max_records: int) -> Offset | None:
        # The source stays open while its records are logged: a crash hook watching its reads
        # (source-read) fires at its close at the latest, after the entry is durable.
        async with opened_source(self._options) as source:
            await source.restore(start)
            batches = await _poll(source, min(max_records, self._options.max_records_per_batch))
            if not batches:
                return None
            reached = source.checkpoint()
            conformed = [
                conform_source_batch(b, source.schema(), self._schema, self._options.connector)
                for b in batches
            ]
            entry = await self._read_log().append(conformed, self._schema)
        return logged_offset(reached, entry)


async def _poll(source: SourceConnector, max_records: int) -> list[pa.RecordBatch]:
    """Poll ``source`` for up to ``max_records`` records, until it has none or asks to stop."""
    requested = source.checkpoint_requested()
    batches: list[pa.RecordBatch] = []
    remaining = max_records
    while remaining > 0:
        ready = source.data_ready_notify()
        if ready is not None:
            ready.clear()
        polled = await source.poll_batch(remaining)
        if polled is None or not polled.num_rows:
            break
        batches.append(polled.records)
        remaining -= polled.num_rows
        if requested is not None and requested.is_set():
            requested.clear()
            break
    return batches


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
