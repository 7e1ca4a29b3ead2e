"""The sink side: a sink connector written to by a Spark ``DataSourceStreamArrowWriter``.

One epoch is one micro-batch; its number is Spark's ``batchId``. Spark runs ``write`` on the
executors, one task per partition of the micro-batch, and then ``commit(messages, batchId)``
in a Python worker started for the call, on a new writer instance: nothing but the commit
messages survives from ``write``. Two ways to run the sink's epoch protocol follow.

A distributed-commit sink (:meth:`SinkConnector.as_distributed_commit`) is written by the
tasks, in parallel:

- ``write`` opens the sink in the task and stages the task's batches
  (:func:`~laminar_sdk._runtime.coordinator.stage_task`): the epoch is the micro-batch's batch id,
  which the task reads from its ``TaskContext``, and the task's name is unique per attempt
  and per run. Its commit message holds the commit descriptor, never data;
- ``commit`` opens the sink and the checkpoint store; the
  :class:`~laminar_sdk._runtime.coordinator.EpochCoordinator` finishes an epoch whose commit was
  decided (with its recorded descriptors), skips the micro-batch when its epoch is committed
  already (Spark re-runs the last micro-batch after a crash, with the same batch id), and
  otherwise records the descriptors in the epoch's manifest (the decision) and publishes them
  with ``commit_aggregated``. It does *not* roll back the epoch it commits: the tasks staged
  it before the commit ran, and ``commit_aggregated`` discards whatever staging of the epoch
  no descriptor names (failed attempts, crashed runs).

Any other sink is written in ``commit``, by one instance:

- ``write`` conforms each Arrow batch to the sink's schema and hands the task's batches, as
  one Arrow IPC stream, to the commit: in a file of the driver's hand-off directory when the
  task can reach it (on the driver's machine: every task in ``local`` mode; see
  :mod:`~laminar_sdk._spark.handoff`), its name in the commit message; else LZ4-compressed
  in the commit message itself. A commit message is copied several times on its way through
  the JVM to the committing Python worker: two tasks' 12 MB each took 0.15 to 0.25 s to
  arrive, while compressing 12 MB takes 5 to 10 ms (JSON records shrink to a quarter; data
  that does not compress costs those milliseconds);
- each task on the driver's machine also tells the *epoch writer*
  (:mod:`~laminar_sdk._spark.epoch_writer`) of each batch it wrote to its file, which the
  writer reads from there: a process that keeps the sink open across micro-batches and
  writes the epoch while the tasks run. ``commit`` first asks it
  to finish the epoch; it does so only when it took exactly the tasks the messages name, each
  whole. When it declines, fails, dies or is off (``laminar.epoch.writer=false``), ``commit``
  runs the epoch itself, from the hand-off files, as follows;
- ``commit`` lets the coordinator recover (finish an epoch whose commit was decided, roll back
  one that was not), skips an epoch committed already, and otherwise runs the epoch:
  ``begin_epoch`` → ``write_batch``… → ``pre_commit`` → manifest (the decision) →
  ``commit_epoch`` → manifest marked committed. Every batch passes through the committing
  process, one at a time: batches handed over in files are read one after the other as the
  sink takes them, so its memory holds a batch, not the micro-batch. Batches that came in
  commit messages are all in memory, compressed, since Spark hands the commit every message
  at once. The micro-batch's hand-off files are removed when the commit ends, however it
  ends.

In both, ``abort`` lets the coordinator recover, which rolls back the undecided epoch — every
task's staging of it — and never one whose commit was decided. Rolling back at the start of a
query is left to that and to ``commit_aggregated``: Spark calls the data source's
``streamWriter`` for every commit too, after the tasks staged, where a rollback would discard
the epoch being committed.

Each task also reports Spark's query id (``sql.streaming.queryId``); the coordinator records it
in every manifest and refuses checkpoints of another query: when Spark's checkpoint was deleted
but not the laminar checkpoint location, batch ids restart at 0 and would be skipped as
committed.

Every recovery is also given the batch id, which is a proof: Spark runs micro-batch ``N`` only
once its commit log holds every batch before it, and writes that log only after ``commit``
returned. When the newest manifests are unreadable or missing (a torn write, a bad disk block),
that proof tells what they held and the query goes on; when the manifests and Spark's batch
ids disagree without such an explanation (one location deleted, or restored from an older
backup), recovery stops with an error naming the ``laminar checkpoints`` command that repairs
it (:meth:`EpochCoordinator.recover`).
"""

from __future__ import annotations

import functools
import logging
import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from laminar_sdk._contract.connector import SinkConnector
from laminar_sdk._contract.errors import InvalidState, WriteError
from laminar_sdk._runtime.coordinator import EpochCoordinator, EpochResult, stage_task
from laminar_sdk._spark import fault_seam
from laminar_sdk._spark.arrow import conform
from laminar_sdk._spark.connectors import opened_sink, run
from laminar_sdk._spark.epoch_writer import (
    TaskStream,
    WriterAddress,
    WriterStart,
    drop_epoch,
    finished_by_writer,
)
from laminar_sdk._spark.handoff import HandoffDirectory
from laminar_sdk._spark.ipc import COMPRESSED_IPC_OPTIONS
from laminar_sdk._spark.options import BridgeOptions, checkpointer_of
from laminar_sdk._spark.processes import spark_jvm

logger = logging.getLogger("laminar_sdk.spark")

BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""The task-local property in which Spark gives a task its micro-batch's id."""

QUERY_ID_PROPERTY = "sql.streaming.queryId"
"""The task-local property holding the streaming query's id (kept in Spark's checkpoint)."""


class BatchesMessage(WriterCommitMessage, ABC):
    """What one write task hands to a one-instance commit: its batches, one way or another.

    ``task`` names the task attempt, as its stream to the epoch writer does
    (:mod:`~laminar_sdk._spark.epoch_writer`).
    """

    rows: int
    query_id: str | None
    task: str

    @abstractmethod
    def batches(self) -> Iterator[pa.RecordBatch]:
        """The task's batches, in the order it wrote them."""


@dataclass(frozen=True)
class ArrowBatchesMessage(BatchesMessage):
    """A task's batches in the message itself, as a compressed Arrow IPC stream."""

    payload: bytes
    rows: int
    query_id: str | None = None
    task: str = ""

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The task's batches, in the order it wrote them."""
        yield from pa.ipc.open_stream(pa.py_buffer(self.payload))


@dataclass(frozen=True)
class HandedOffBatchesMessage(BatchesMessage):
    """A task's batches in a file of the driver's hand-off directory: its path."""

    path: str
    rows: int
    query_id: str | None = None
    task: str = ""

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The task's batches, in the order it wrote them, read from the file one at a time.

        Read, not memory-mapped: the pages of a mapped file count in the committing process's
        resident memory until the kernel reclaims them, so a micro-batch of gigabytes would
        look (and, to a container's memory limit, be) that large. A batch read is freed once
        the sink has it written.

        :raises InvalidState: when the file is gone (removed while the commit ran).
        """
        try:
            file = pa.OSFile(self.path)
        except FileNotFoundError:
            raise InvalidState(
                f"the hand-off file {self.path} of a write task, until its micro-batch commits",
                "the file is gone; was the temporary directory cleaned while the query ran?",
            ) from None
        with file:
            yield from pa.ipc.open_stream(file)


@dataclass(frozen=True)
class StagedTaskMessage(WriterCommitMessage):
    """What one write task hands to a distributed commit: what it staged, and no data."""

    descriptor: str
    rows: int
    query_id: str | None = None


MessageT = TypeVar("MessageT", BatchesMessage, StagedTaskMessage)


class LaminarStreamWriter(DataSourceStreamArrowWriter):
    """Writes micro-batches to a sink connector, each as one epoch, exactly once.

    :param options: the validated options of the write side.
    :param schema: the sink's Arrow schema; batches are conformed to it. ``None`` in a writer
        made only to commit (see :meth:`for_commit`).
    :param distributed: whether the sink is a distributed-commit sink, staged by the tasks;
        ``None`` in a writer made only to commit.
    :param handoff: the driver's hand-off directory, for a one-instance commit; ``None`` to
        send every task's batches in its commit message.
    """

    def __init__(
        self,
        options: BridgeOptions,
        schema: pa.Schema | None,
        *,
        distributed: bool | None,
        handoff: HandoffDirectory | None = None,
    ) -> None:
        self._options = options
        self._schema = schema
        self._distributed = distributed
        self._handoff = handoff

    @classmethod
    def for_commit(cls, options: BridgeOptions) -> LaminarStreamWriter:
        """A writer for Spark's commit runner, which calls only ``commit`` or ``abort``.

        The sink is not opened to check it (the query's start did): another instance of the
        sink is open in the epoch writer, and opening one here (a Kafka producer with the
        same transactional id) would fence it in the middle of its epoch. What kind of
        commit a micro-batch takes is told by its tasks' messages.
        """
        return cls(options, None, distributed=None, handoff=HandoffDirectory.of_driver())

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """Stage the task's batches (distributed), or hand them to the commit (otherwise).

        :raises InvalidState: for a distributed-commit sink, when not run in a Spark
            streaming write task (there is no batch id to stage for).
        :raises WriteError: when the task's hand-off file cannot be written (a full disk).
        """
        if self._schema is None or self._distributed is None:
            raise InvalidState("a writer Spark made for write tasks", "one made to commit")
        context = TaskContext.get()
        query_id = None if context is None else context.getLocalProperty(QUERY_ID_PROPERTY)
        if self._distributed:
            return self._stage(iterator, context, query_id)
        batch_id = None if context is None else context.getLocalProperty(BATCH_ID_PROPERTY)
        if (
            self._handoff is not None
            and context is not None
            and query_id is not None
            and batch_id is not None
            and self._handoff.reachable()
        ):
            return self._hand_off(iterator, self._handoff, context, query_id, int(batch_id))
        sink = pa.BufferOutputStream()
        task = "" if context is None else _task_name(context)
        rows = self._serialize(iterator, sink, COMPRESSED_IPC_OPTIONS)
        return ArrowBatchesMessage(sink.getvalue().to_pybytes(), rows, query_id, task)

    def commit(
        self,
        messages: Sequence[WriterCommitMessage | None],
        batchId: int,  # noqa: N803 - Spark passes it by this name
    ) -> None:
        """Commit micro-batch ``batchId`` as an epoch, or skip it if it was."""
        if self._commits_distributed(messages):
            staged = _messages(messages, batchId, StagedTaskMessage)
            run(self._commit_staged(staged, batchId))
            return
        # An abstract class is a fine isinstance() target (mypy's check is for instantiation).
        received = _messages(messages, batchId, BatchesMessage)  # type: ignore[type-abstract]
        try:
            address = self._writer_address(self._handoff, _query_id(received))
            tasks = {message.task: message.rows for message in received}
            written = None if address is None else finished_by_writer(address, batchId, tasks)
            if written is not None:
                self._log(written)
            else:
                run(self._commit(received, batchId))
        finally:
            self._discard_handoff(messages, batchId)

    def _commits_distributed(self, messages: Sequence[WriterCommitMessage | None]) -> bool:
        """Whether the micro-batch was staged by its tasks: known, told by a message, or asked."""
        if self._distributed is not None:
            return self._distributed
        for message in messages:
            if isinstance(message, StagedTaskMessage | BatchesMessage):
                return isinstance(message, StagedTaskMessage)
        return run(_distributed_commit_sink(self._options))

    def abort(
        self,
        messages: Sequence[WriterCommitMessage | None],
        batchId: int,  # noqa: N803 - Spark passes it by this name
    ) -> None:
        """Roll back micro-batch ``batchId`` unless its commit was decided (then finish it)."""
        received = [m for m in messages if isinstance(m, BatchesMessage | StagedTaskMessage)]
        try:
            address = self._writer_address(self._handoff, _query_id(received))
            if address is not None:
                drop_epoch(address, batchId)
            run(self._recover(_query_id(received), batchId))
        finally:
            self._discard_handoff(messages, batchId)

    def _hand_off(
        self,
        iterator: Iterator[pa.RecordBatch],
        handoff: HandoffDirectory,
        context: TaskContext,
        query_id: str,
        batch_id: int,
    ) -> HandedOffBatchesMessage:
        task = _task_name(context)
        stream: TaskStream | None = None
        try:
            path = handoff.task_file(query_id, batch_id, task)
            stream = self._epoch_stream(handoff, query_id, batch_id, task, path)
            with pa.OSFile(str(path), "wb") as file:
                # Not compressed: the commit reads it locally, and would decompress alone.
                options = pa.ipc.IpcWriteOptions()
                written = None if stream is None else functools.partial(stream.written, file)
                rows = self._serialize(iterator, file, options, after_each=written)
        except BaseException as error:
            if stream is not None:
                stream.abandon()
            if isinstance(error, OSError):
                raise WriteError(
                    f"sink {self._options.connector!r}: cannot hand micro-batch {batch_id}'s "
                    f"records to the commit in {handoff.root}: {error}. Free space there, or "
                    "point TMPDIR of Spark's Python workers at a directory with room"
                ) from error
            raise
        if stream is not None:
            stream.close(rows)
        return HandedOffBatchesMessage(str(path), rows, query_id, task)

    def _epoch_stream(
        self, handoff: HandoffDirectory, query_id: str, batch_id: int, task: str, path: Path
    ) -> TaskStream | None:
        """A stream telling the epoch writer of the task's file, when it is on and reachable."""
        address = self._writer_address(handoff, query_id)
        if address is None:
            return None
        assert self._schema is not None, "a writer made for tasks"
        start = WriterStart(self._options, self._schema, query_id, address.socket, spark_jvm())
        return TaskStream.open(address, start, batch_id, task, path)

    def _writer_address(
        self, handoff: HandoffDirectory | None, query_id: str | None
    ) -> WriterAddress | None:
        """Where the epoch writer listens; ``None`` when it is off or cannot be reached."""
        if not self._options.epoch_writer or handoff is None or query_id is None:
            return None
        return WriterAddress.of(handoff.root, query_id, self._options)

    def _serialize(
        self,
        iterator: Iterator[pa.RecordBatch],
        sink: pa.NativeFile,
        ipc_options: pa.ipc.IpcWriteOptions,
        after_each: Callable[[], None] | None = None,
    ) -> int:
        """Write the task's conformed batches to ``sink`` as one IPC stream; the rows written.

        :param after_each: called once each batch is written (the epoch writer is told).
        """
        rows = 0
        with pa.ipc.new_stream(sink, self._schema, options=ipc_options) as stream:
            for batch in self._conformed(iterator):
                stream.write_batch(batch)
                if after_each is not None:
                    after_each()
                rows += batch.num_rows
        return rows

    def _discard_handoff(
        self, messages: Sequence[WriterCommitMessage | None], batch_id: int
    ) -> None:
        """Remove the micro-batch's hand-off files (and older ones), once its commit ended."""
        query_id = _query_id([m for m in messages if isinstance(m, BatchesMessage)])
        if self._handoff is not None and query_id is not None:
            self._handoff.discard(query_id, batch_id)

    def _conformed(self, iterator: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        what = f"sink {self._options.connector!r}"
        after_each_batch = fault_seam.after_each_batch()
        for batch in iterator:
            yield conform(batch, self._schema, what)
            if after_each_batch is not None:
                after_each_batch()

    def _stage(
        self,
        iterator: Iterator[pa.RecordBatch],
        context: TaskContext | None,
        query_id: str | None,
    ) -> StagedTaskMessage:
        batch_id = None if context is None else context.getLocalProperty(BATCH_ID_PROPERTY)
        if context is None or batch_id is None:
            raise InvalidState(
                "write() in a task of a Spark streaming query (its batch id is the epoch)",
                "no streaming batch id in the task's context",
            )
        task = _task_name(context)
        rows = 0

        def counted() -> Iterator[pa.RecordBatch]:
            nonlocal rows
            for batch in self._conformed(iterator):
                rows += batch.num_rows
                yield batch

        descriptor = run(self._stage_task(int(batch_id), task, counted()))
        return StagedTaskMessage(descriptor, rows, query_id)

    async def _stage_task(self, epoch: int, task: str, batches: Iterator[pa.RecordBatch]) -> str:
        async with opened_sink(self._options) as sink:
            name = self._options.connector
            observer = fault_seam.coordinator_observer()
            return await stage_task(name, sink, epoch, task, batches, observer=observer)

    async def _commit(self, messages: Sequence[BatchesMessage], epoch: int) -> None:
        async with opened_sink(self._options) as sink:
            coordinator = self._coordinator(sink, _query_id(messages))
            await coordinator.recover(engine_epoch=epoch)
            batches = (batch for message in messages for batch in message.batches())
            self._log(await coordinator.run_epoch(epoch, batches, {}))

    async def _commit_staged(self, messages: Sequence[StagedTaskMessage], epoch: int) -> None:
        async with opened_sink(self._options) as sink:
            coordinator = self._coordinator(sink, _query_id(messages))
            await coordinator.recover(roll_back_next=False, engine_epoch=epoch)
            descriptors = {self._options.connector: [m.descriptor for m in messages]}
            rows = sum(message.rows for message in messages)
            self._log(await coordinator.commit_staged(epoch, descriptors, rows=rows))

    async def _recover(self, query_id: str | None, epoch: int) -> None:
        async with opened_sink(self._options) as sink:
            await self._coordinator(sink, query_id).recover(engine_epoch=epoch)

    def _coordinator(self, sink: SinkConnector, query_id: str | None) -> EpochCoordinator:
        return EpochCoordinator(
            checkpointer_of(self._options),
            {self._options.connector: sink},
            observer=fault_seam.coordinator_observer(),
            query_id=query_id,
        )

    def _log(self, result: EpochResult) -> None:
        if result.skipped:
            logger.info(
                "sink %r: micro-batch %d was committed before; skipping its re-delivery",
                self._options.connector,
                result.epoch,
            )
        else:
            logger.info(
                "sink %r: committed micro-batch %d (%d rows)",
                self._options.connector,
                result.epoch,
                result.rows,
            )


async def _distributed_commit_sink(options: BridgeOptions) -> bool:
    async with opened_sink(options) as sink:
        return sink.as_distributed_commit() is not None


def _messages(
    messages: Sequence[WriterCommitMessage | None], batch_id: int, kind: type[MessageT]
) -> list[MessageT]:
    received = [message for message in messages if isinstance(message, kind)]
    if len(received) != len(messages):
        raise InvalidState(
            f"a {kind.__name__} from every write task of micro-batch {batch_id}",
            f"{len(messages) - len(received)} of {len(messages)} missing or of another kind",
        )
    return received


def _query_id(messages: Sequence[BatchesMessage | StagedTaskMessage]) -> str | None:
    return next((m.query_id for m in messages if m.query_id is not None), None)


def _task_name(context: TaskContext) -> str:
    """Unique per attempt (partition, attempt number) and per run (a random token).

    What an attempt that failed, or a run that crashed, left behind is never taken for this.
    """
    return f"{context.partitionId()}-{context.attemptNumber()}-{secrets.token_hex(8)}"
