"""The source side: a connector read as a Spark streaming reader, one of two kinds.

Spark's offsets are the source's :class:`SourceCheckpoint` (``to_dict()``), kept in Spark's
offset log.

A range-readable source (:meth:`SourceConnector.as_range_readable`) is read by
:class:`LaminarRangeReader`, a ``DataSourceStreamReader``: Spark's planning process asks the
source where a micro-batch ends (``plan_end``), and each partition whose offset moved is read
by a task of its own, on the executors, with ``read_range`` — the records of a micro-batch
never pass through one process, and replaying a micro-batch after a restart reads the same
ranges again.

Any other source is read by :class:`LaminarStreamReader`, a ``SimpleDataSourceStreamReader``:
every call opens the source, restores the checkpoint it is given and closes the source again,
so nothing depends on the Python process it runs in (Spark calls ``read`` in a long-lived
process of its own and ``readBetweenOffsets``, the replay of a micro-batch after a restart, on
an executor). The records of a micro-batch are read in the process that plans it and travel to
Spark as Arrow batches (``read`` may yield ``pyarrow.RecordBatch`` — Spark's
``records_to_arrow_batches`` passes them through unconverted). That suits moderate rates.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceStreamReader,
    InputPartition,
    SimpleDataSourceStreamReader,
)
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
from laminar_sdk._spark.options import BridgeOptions

logger = logging.getLogger("laminar_sdk.spark")

Offset = dict[str, Any]
"""A Spark offset: a :class:`SourceCheckpoint` as :meth:`SourceCheckpoint.to_dict` gives it."""


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
        than the data present when the query started (as with the simple reader).
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


class LaminarStreamReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reads a source connector micro-batch by micro-batch, its checkpoints as Spark offsets.

    A micro-batch is what the source returns from the start checkpoint on, up to
    ``laminar.max.records.per.batch`` records, until it has nothing more (``poll_batch``
    returns ``None``) or asks for a checkpoint. Its end offset is the source's checkpoint
    after the last record, so the next micro-batch resumes *after* it.

    :param options: the validated options of the read side.
    :param schema: the Arrow schema Spark expects the batches in.
    """

    def __init__(self, options: BridgeOptions, schema: pa.Schema) -> None:
        self._options = options
        self._schema = schema

    def initialOffset(self) -> Offset:  # noqa: N802 - Spark's name
        """The checkpoint of the freshly opened source: where a new query starts."""
        return asyncio.run(self._initial()).to_dict()

    def read(self, start: Offset) -> tuple[Iterator[pa.RecordBatch], Offset]:
        """The next micro-batch after ``start`` and its end offset (``start`` when empty)."""
        batches, end = asyncio.run(self._read(SourceCheckpoint.from_dict(start), None))
        if not batches:
            return iter(()), start
        return iter(batches), end.to_dict()

    def readBetweenOffsets(self, start: Offset, end: Offset) -> Iterator[pa.RecordBatch]:  # noqa: N802 - Spark's name
        """The records from ``start`` to ``end`` again, for a micro-batch Spark re-runs.

        The source is restored to ``start`` and polled exactly as :meth:`read` polled it,
        until its checkpoint is ``end``. A source that cannot replay (``supports_replay()``
        is false) is polled the same way, and what it returns stands in for the first run's
        records (at-least-once): a warning says so when it does not arrive at ``end``.

        :raises ReadError: when a replayable source does not arrive at ``end`` (it is not
            deterministic, or its data is gone).
        """
        batches, _ = asyncio.run(
            self._read(SourceCheckpoint.from_dict(start), SourceCheckpoint.from_dict(end))
        )
        return iter(batches)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's name
        """Nothing to record: a source cannot be asked where its data ends today.

        So with ``trigger(availableNow=True)`` the query ends at the first micro-batch the
        source has no records for — for a source that keeps receiving data, possibly later
        than the data present when the query started.
        """

    async def _initial(self) -> SourceCheckpoint:
        async with opened_source(self._options) as source:
            return source.checkpoint()

    async def _read(
        self, start: SourceCheckpoint, end: SourceCheckpoint | None
    ) -> tuple[list[pa.RecordBatch], SourceCheckpoint]:
        async with opened_source(self._options) as source:
            await source.restore(start)
            batches = await self._poll(source, end)
            reached = source.checkpoint()
            replayable = source.supports_replay()
        if end is not None and reached != end:
            if not replayable:
                # At-least-once: what the source returns now stands in for the records of
                # the re-run micro-batch, which it cannot return again.
                logger.warning(
                    "source %r cannot replay: a re-run micro-batch holds the records it "
                    "returned now (%s), not necessarily the first run's (up to %s)",
                    self._options.connector,
                    reached.to_json(),
                    end.to_json(),
                )
                return batches, reached
            raise ReadError(
                f"source {self._options.connector!r} could not replay a micro-batch: from "
                f"{start.to_json()} it reached {reached.to_json()}, not {end.to_json()}; "
                "its data may have expired, or it is not deterministic"
            )
        return batches, reached

    async def _poll(
        self, source: SourceConnector, end: SourceCheckpoint | None
    ) -> list[pa.RecordBatch]:
        # A replay polls with the same max_records sequence as the first read, so a
        # deterministic source returns the same batches; it stops at `end`, not on request.
        requested = None if end is not None else source.checkpoint_requested()
        batches: list[pa.RecordBatch] = []
        remaining = self._options.max_records_per_batch
        while remaining > 0 and (end is None or source.checkpoint() != end):
            ready = source.data_ready_notify()
            if ready is not None:
                ready.clear()
            polled = await source.poll_batch(remaining)
            if polled is None or not polled.num_rows:
                break
            batches.append(
                conform_source_batch(
                    polled.records, source.schema(), self._schema, self._options.connector
                )
            )
            remaining -= polled.num_rows
            if requested is not None and requested.is_set():
                requested.clear()
                break
        return batches
