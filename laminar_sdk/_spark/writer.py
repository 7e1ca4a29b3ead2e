"""The sink side: a sink connector written to by a Spark ``DataSourceStreamArrowWriter``.

One epoch is one micro-batch; its number is Spark's ``batchId``. Spark runs ``write`` on the
executors, without the batch id, and then ``commit(messages, batchId)`` in a Python worker
started for the call, on a new writer instance: nothing but the commit messages survives from
``write``. The sink's epoch protocol therefore runs whole inside ``commit``:

- ``write`` conforms each Arrow batch to the sink's schema and ships the task's batches, as one
  Arrow IPC stream, to the driver in its commit message;
- ``commit`` opens the sink and the checkpoint store, lets the
  :class:`~laminar_sdk._coordinator.EpochCoordinator` recover (finish an epoch whose commit
  was decided, roll back one that was not), skips the micro-batch when its epoch is already
  committed (Spark re-runs the last micro-batch after a crash, with the same batch id), and
  otherwise runs the epoch: ``begin_epoch`` → ``write_batch``… → ``pre_commit`` → manifest
  (the decision) → ``commit_epoch`` → manifest marked committed;
- ``abort`` lets the coordinator recover, which rolls back an undecided epoch and never one
  whose commit was decided.

Every batch of a micro-batch passes through the driver, so a micro-batch must fit in its
memory: bound it with the source's ``laminar.max.records.per.batch`` (or Spark's
``maxOffsetsPerTrigger`` and the like). Writing on the executors would need sinks that can
pre-commit in several tasks and commit the tasks' work together, which the contract does not
offer yet.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from laminar_sdk._checkpointing.registry import open_checkpointer
from laminar_sdk._connector import SinkConnector
from laminar_sdk._coordinator import EpochCoordinator
from laminar_sdk._errors import InvalidState
from laminar_sdk._spark.arrow import conform
from laminar_sdk._spark.connectors import opened_sink
from laminar_sdk._spark.faults import crash_observer, kill_writer_once
from laminar_sdk._spark.options import BridgeOptions

logger = logging.getLogger("laminar_sdk.spark")


@dataclass(frozen=True)
class ArrowBatchesMessage(WriterCommitMessage):
    """What one write task hands to the commit: its batches as an Arrow IPC stream."""

    payload: bytes
    rows: int

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The task's batches, in the order it wrote them."""
        yield from pa.ipc.open_stream(pa.py_buffer(self.payload))


class LaminarStreamWriter(DataSourceStreamArrowWriter):
    """Writes micro-batches to a sink connector, each as one epoch, exactly once.

    :param options: the validated options of the write side.
    :param schema: the sink's Arrow schema; batches are conformed to it.
    """

    def __init__(self, options: BridgeOptions, schema: pa.Schema) -> None:
        self._options = options
        self._schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ArrowBatchesMessage:
        """Conform the task's batches to the sink's schema and return them, serialized."""
        what = f"sink {self._options.connector!r}"
        sink = pa.BufferOutputStream()
        rows = 0
        with pa.ipc.new_stream(sink, self._schema) as stream:
            for batch in iterator:
                stream.write_batch(conform(batch, self._schema, what))
                rows += batch.num_rows
                kill_writer_once()
        return ArrowBatchesMessage(sink.getvalue().to_pybytes(), rows)

    def commit(
        self,
        messages: Sequence[WriterCommitMessage | None],
        batchId: int,  # noqa: N803 - Spark passes it by this name
    ) -> None:
        """Write and commit micro-batch ``batchId`` as an epoch, or skip it if it was."""
        asyncio.run(self._commit(_arrow_messages(messages, batchId), batchId))

    def abort(
        self,
        messages: Sequence[WriterCommitMessage | None],
        batchId: int,  # noqa: N803 - Spark passes it by this name
    ) -> None:
        """Roll back micro-batch ``batchId`` unless its commit was decided (then finish it)."""
        asyncio.run(self._recover())

    async def _commit(self, messages: Sequence[ArrowBatchesMessage], epoch: int) -> None:
        async with opened_sink(self._options) as sink:
            coordinator = self._coordinator(sink)
            await coordinator.recover()
            if coordinator.is_committed(epoch):
                logger.info(
                    "sink %r: micro-batch %d was committed before; skipping its re-delivery",
                    self._options.connector,
                    epoch,
                )
                return
            batches = (batch for message in messages for batch in message.batches())
            result = await coordinator.run_epoch(epoch, batches, {})
            logger.info(
                "sink %r: committed micro-batch %d (%d rows)",
                self._options.connector,
                epoch,
                result.rows,
            )

    async def _recover(self) -> None:
        async with opened_sink(self._options) as sink:
            await self._coordinator(sink).recover()

    def _coordinator(self, sink: SinkConnector) -> EpochCoordinator:
        location = self._options.checkpoint_location
        assert location is not None, "parse_options sets it for sinks"
        checkpointer = open_checkpointer(
            location, store=self._options.checkpoint_store, options=self._options.checkpoint_options
        )
        return EpochCoordinator(
            checkpointer, {self._options.connector: sink}, observer=crash_observer()
        )


def _arrow_messages(
    messages: Sequence[WriterCommitMessage | None], batch_id: int
) -> list[ArrowBatchesMessage]:
    arrow = [message for message in messages if isinstance(message, ArrowBatchesMessage)]
    if len(arrow) != len(messages):
        raise InvalidState(
            f"a commit message from every write task of micro-batch {batch_id}",
            f"{len(messages) - len(arrow)} of {len(messages)} missing",
        )
    return arrow
