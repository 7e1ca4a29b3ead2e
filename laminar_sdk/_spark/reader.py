"""The source side: a connector read as a Spark ``SimpleDataSourceStreamReader``.

Spark's offsets are the source's :class:`SourceCheckpoint` (``to_dict()``), kept in Spark's
offset log. Every call opens the source, restores the checkpoint it is given and closes the
source again, so nothing depends on the Python process it runs in: Spark calls ``read`` in a
long-lived process of its own and ``readBetweenOffsets`` (the replay of a micro-batch after a
restart) on an executor.

The records of a micro-batch are read in the process that plans it and travel to Spark as
Arrow batches (``read`` may yield ``pyarrow.RecordBatch`` — Spark's ``records_to_arrow_batches``
passes them through unconverted). That suits moderate rates: reading partitions in parallel on
the executors needs sources that can say where a micro-batch ends without reading it, which the
contract does not offer yet.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import SimpleDataSourceStreamReader
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from laminar_sdk._checkpoint import SourceCheckpoint
from laminar_sdk._connector import SourceConnector
from laminar_sdk._errors import ReadError, SchemaMismatch
from laminar_sdk._spark.arrow import conform
from laminar_sdk._spark.connectors import opened_source
from laminar_sdk._spark.options import BridgeOptions

logger = logging.getLogger("laminar_sdk.spark")

Offset = dict[str, Any]
"""A Spark offset: a :class:`SourceCheckpoint` as :meth:`SourceCheckpoint.to_dict` gives it."""


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
        until its checkpoint is ``end``.

        :raises ReadError: when the source does not arrive at ``end`` (it is not
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
            if end is not None and not source.supports_replay():
                logger.warning(
                    "source %r cannot replay: the records of the micro-batch Spark re-runs "
                    "are lost (at-least-once delivery with a non-replayable source)",
                    self._options.connector,
                )
                return [], end
            await source.restore(start)
            batches = await self._poll(source, end)
            reached = source.checkpoint()
        if end is not None and reached != end:
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
            batches.append(self._conform(polled.records, source))
            remaining -= polled.num_rows
            if requested is not None and requested.is_set():
                requested.clear()
                break
        return batches

    def _conform(self, records: pa.RecordBatch, source: SourceConnector) -> pa.RecordBatch:
        if not records.schema.equals(source.schema()):
            raise SchemaMismatch(
                f"source {self._options.connector!r} returned a batch whose schema "
                f"({records.schema.to_string(show_schema_metadata=False)}) differs from the "
                "schema it declares; the source is broken: report it to its authors"
            )
        return conform(records, self._schema, f"source {self._options.connector!r}")
