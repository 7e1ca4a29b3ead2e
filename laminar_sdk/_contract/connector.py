"""The connector contract: :class:`SourceConnector` and :class:`SinkConnector`.

A faithful rendering of LaminarDB's ``SourceConnector`` / ``SinkConnector`` traits. I/O
methods are coroutines; the runtime awaits them with a bounded timeout and retries the ones
that fail with a transient error (:attr:`ConnectorError.is_transient`).
"""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod

import pyarrow as pa

from laminar_sdk._contract.checkpoint import SourceCheckpoint
from laminar_sdk._contract.closing import guard_calls_after_close, require_the_contracts_kinds
from laminar_sdk._contract.config import ConnectorConfig
from laminar_sdk._contract.parallel import DistributedCommitSink, RangeReadableSource
from laminar_sdk._contract.schema import (
    SchemaEvolvable,
    SchemaInferable,
    SchemaProvider,
    SchemaRegistryAware,
)
from laminar_sdk._contract.types import (
    ConnectorMetrics,
    HealthStatus,
    SinkConnectorCapabilities,
    SourceBatch,
    WriteResult,
)


class SourceConnector(ABC):
    """Reads records from an external system as Arrow batches.

    Lifecycle: the factory builds an unopened instance → :meth:`open` → optionally
    :meth:`restore` → :meth:`poll_batch` in a loop, with :meth:`checkpoint` between polls →
    :meth:`close`. After a crash the runtime builds a *new* instance, opens it and restores the
    last durable checkpoint, so nothing a source needs to resume may live only in memory.

    After :meth:`close`, :meth:`open`, :meth:`poll_batch`, :meth:`checkpoint` and
    :meth:`restore` raise :class:`Closed`, and a second :meth:`close` does nothing: this base
    class enforces both for every subclass, so a source needs no check of its own. A subclass
    overrides a coroutine (``async def``) of the contract with a coroutine, and a plain method
    with a plain one: defining the class raises :class:`PluginError` otherwise.
    """

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        require_the_contracts_kinds(cls, SourceConnector)
        guard_calls_after_close(cls, ("open", "poll_batch", "checkpoint", "restore"))

    @abstractmethod
    async def open(self, config: ConnectorConfig) -> None:
        """Connect and prepare to read.

        Raise :class:`ConfigurationError` naming the key for bad configuration and
        :class:`ConnectionFailed` when the system cannot be reached.
        """

    @abstractmethod
    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        """Return the next records, at most ``max_records`` of them.

        Return ``None`` when nothing is available right now (the runtime waits and asks
        again): never wait for data to arrive — on Spark, the planning of every micro-batch
        waits for this call. Every batch must match :meth:`schema` exactly, as a
        ``pyarrow.RecordBatch``.
        """

    @abstractmethod
    def schema(self) -> pa.Schema:
        """The Arrow schema of every batch this source returns.

        Known as soon as the source is opened, before any record is read, and the same on
        every instance: Spark fixes a stream's columns when it is loaded, from an instance
        opened then, and refuses batches of any other schema. Use types Spark gives back
        unchanged (``laminar_sdk.spark.spark_round_trip_schema``): timestamps in
        microseconds, ``string`` rather than ``large_string``, no dictionaries, no unsigned
        integers; a column declared non-nullable holds no nulls.
        """

    @abstractmethod
    def checkpoint(self) -> SourceCheckpoint:
        """Where this source stands now.

        Restoring the result on a new instance must resume *after* the last record returned
        by :meth:`poll_batch` — not at it (that duplicates one record) and not past it (that
        loses records): mind the off-by-one. It never runs ahead of what was returned, even if
        the source has read further internally.
        """

    @abstractmethod
    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        """Seek to ``checkpoint``, a value an earlier :meth:`checkpoint` returned.

        The checkpoint may come from another instance, in another process. Partitions missing
        from it are read from their start; each partition present is restored independently
        of the others.
        """

    @abstractmethod
    async def close(self) -> None:
        """Release every resource. The instance is not used afterwards (see the class).

        Records the instance took from the system and has not returned are not lost by
        closing it: on Spark, a source that is not range-readable is opened, restored and
        closed again for every micro-batch, so what it held is read again by the next
        instance after :meth:`restore` — or, for a source that cannot replay, never taken
        from the system before :meth:`poll_batch` returns it.
        """

    async def health_check(self) -> HealthStatus:
        """How the source is doing. Default: unknown."""
        return HealthStatus.unknown()

    def metrics(self) -> ConnectorMetrics:
        """Counters for monitoring. Default: all zero."""
        return ConnectorMetrics()

    def data_ready_notify(self) -> asyncio.Event | None:
        """An event the source sets when new data has arrived, or ``None``.

        When given, the runtime awaits it instead of polling on a timer, so an idle pipeline
        uses no CPU. The runtime clears it before each poll. Default: ``None`` (timer polling).
        """
        return None

    def as_schema_provider(self) -> SchemaProvider | None:
        """This source as a :class:`SchemaProvider`, if it is one. Default: ``None``."""
        return None

    def as_schema_inferable(self) -> SchemaInferable | None:
        """This source as a :class:`SchemaInferable`, if it is one. Default: ``None``."""
        return None

    def as_schema_registry_aware(self) -> SchemaRegistryAware | None:
        """This source as a :class:`SchemaRegistryAware`, if it is one. Default: ``None``."""
        return None

    def as_schema_evolvable(self) -> SchemaEvolvable | None:
        """This source as a :class:`SchemaEvolvable`, if it is one. Default: ``None``."""
        return None

    def as_range_readable(self) -> RangeReadableSource | None:
        """This source as a :class:`RangeReadableSource`, if it is one. Default: ``None``.

        Offer it to be read in parallel by Spark's executors, each partition of a micro-batch
        in its own task (see :class:`RangeReadableSource`). Answer from the class, not the
        configuration: the Spark bridge asks an unopened instance to choose its reader.
        """
        return None

    def supports_replay(self) -> bool:
        """Whether :meth:`restore` can go back and return the same records again.

        Exactly-once pipelines require it. Answer from the class: the runtime asks an
        unopened instance. Default: ``True``.
        """
        return True

    def checkpoint_requested(self) -> threading.Event | None:
        """A flag the source sets to ask for a checkpoint now (e.g. on a Kafka rebalance).

        The runtime checks it between polls and clears it after checkpointing. It is a
        ``threading.Event`` because a client library may set it from its own thread.
        Default: ``None`` (the source never asks).
        """
        return None


class SinkConnector(ABC):
    """Writes Arrow batches to an external system, epoch by epoch.

    For each epoch the runtime calls :meth:`begin_epoch` → :meth:`write_batch` (any number of
    times) → :meth:`pre_commit` → *it makes its own record of the epoch durable* →
    :meth:`commit_epoch`. If anything fails before its record is durable it calls
    :meth:`rollback_epoch` instead of :meth:`commit_epoch`.

    An exactly-once sink must also survive being restarted at any point: after a crash a new
    instance may be handed an epoch it already committed (skip it: the committed data must be
    recognisable in the external system itself, written atomically with the data), and an
    epoch it pre-committed but never committed (the runtime either commits it, when its
    record says the decision was taken, or rolls it back and replays it).

    After :meth:`close`, every protocol call (:meth:`open`, :meth:`write_batch`,
    :meth:`begin_epoch`, :meth:`pre_commit`, :meth:`commit_epoch`, :meth:`rollback_epoch`,
    :meth:`flush`) raises :class:`Closed`, and a second :meth:`close` does nothing: this base
    class enforces both for every subclass, so a sink needs no check of its own.
    """

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        require_the_contracts_kinds(cls, SinkConnector)
        guard_calls_after_close(cls, _SINK_CALLS)

    @abstractmethod
    async def open(self, config: ConnectorConfig) -> None:
        """Connect and prepare to write.

        Raise :class:`ConfigurationError` naming the key for bad configuration and
        :class:`ConnectionFailed` when the system cannot be reached.
        """

    @abstractmethod
    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        """Write ``batch`` within the current epoch.

        A sink declaring ``two_phase_commit`` makes nothing written visible to a reader before
        :meth:`commit_epoch`; one declaring ``exactly_once`` must in the end show every record
        of a committed epoch once and nothing of a rolled-back one. Raise
        :class:`SchemaMismatch` when ``batch`` does not match :meth:`schema`.
        """

    @abstractmethod
    def schema(self) -> pa.Schema:
        """The Arrow schema every batch written to this sink must have.

        On Spark the batches come in Spark's types: declare types Spark gives back unchanged
        (``laminar_sdk.spark.spark_round_trip_schema``) — timestamps in microseconds,
        ``string`` rather than ``large_string``, no unsigned integers.
        """

    @abstractmethod
    async def close(self) -> None:
        """Release every resource. An open, uncommitted epoch is abandoned, not committed."""

    async def begin_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (e.g. begin a transaction). Default: nothing."""

    async def pre_commit(self, epoch: int) -> None:
        """Phase one of two: make everything written in ``epoch`` durable but *not visible*.

        A sink may flush buffers, stage files or prepare a transaction here. It must not
        publish the epoch: the runtime may still roll it back. It must not lose any buffered
        record either, the last batch included: when it returns, the epoch survives the
        process being killed (``kill -9``) right then — nothing of it left in a Python
        buffer, an unflushed file or a writer thread's queue — for a new instance to commit.
        Default: :meth:`flush`.
        """
        await self.flush()

    async def commit_epoch(self, epoch: int) -> None:
        """Phase two of two: publish ``epoch`` atomically.

        Called only after :meth:`pre_commit` succeeded and the runtime's record of the epoch
        is durable — possibly on a new instance, after the one that pre-committed died. Must
        be idempotent: committing an epoch that is already committed does nothing. When it
        returns, the epoch is published for good (the process may be killed right then). If
        it does several things (publish rows, record the epoch), mark the points between
        them with :func:`laminar_sdk.crash_point`. Default: nothing.
        """

    async def rollback_epoch(self, epoch: int) -> None:
        """Discard everything written in ``epoch`` so that no trace is visible.

        Must be idempotent: the runtime may call it again after a crash, for an epoch that
        was already rolled back or never begun on this instance. Default: nothing.
        """

    async def flush(self) -> None:
        """Push buffered records to the external system. Default: nothing."""

    async def last_committed_epoch(self) -> int | None:
        """The newest epoch the destination records as committed by this sink; ``None``: no record.

        A sink that recognises a committed epoch by a record in the destination (an epoch
        marker beside the rows, a transaction marker in a topic, a file named by the epoch)
        must return the newest one kept for the identity its configuration gives it (a sink
        id), or ``-1`` when there is none. Epochs are numbered per query from 0: the runtime
        asks when a query starts on a checkpoint location that holds no checkpoint (a new
        query, or one started over after its checkpoint locations were deleted) and refuses
        to run it when the destination is ahead — the sink would skip the new query's epochs
        as committed, and their records would be lost without a word. Called on an open
        instance, before any epoch. Default: ``None``, for a sink that keeps no such record.
        """
        return None

    async def health_check(self) -> HealthStatus:
        """How the sink is doing. Default: unknown."""
        return HealthStatus.unknown()

    def metrics(self) -> ConnectorMetrics:
        """Counters for monitoring. Default: all zero."""
        return ConnectorMetrics()

    def capabilities(self) -> SinkConnectorCapabilities:
        """What this sink promises. Default: nothing beyond at-least-once.

        Answer from the class, not the configuration: the runtime checks a pipeline's
        delivery guarantee before it opens the sink.
        """
        return SinkConnectorCapabilities()

    def as_distributed_commit(self) -> DistributedCommitSink | None:
        """This sink as a :class:`DistributedCommitSink`, if it is one. Default: ``None``.

        Offer it to be written by Spark's executors in parallel, each task staging its share
        of an epoch and one commit publishing them together (see
        :class:`DistributedCommitSink`). Answer from the class: the Spark bridge chooses the
        commit path before the sink is opened.
        """
        return None

    def as_schema_registry_aware(self) -> SchemaRegistryAware | None:
        """This sink as a :class:`SchemaRegistryAware`, if it is one. Default: ``None``."""
        return None

    def as_schema_evolvable(self) -> SchemaEvolvable | None:
        """This sink as a :class:`SchemaEvolvable`, if it is one. Default: ``None``."""
        return None


_SINK_CALLS = (
    "open",
    "write_batch",
    "begin_epoch",
    "pre_commit",
    "commit_epoch",
    "rollback_epoch",
    "flush",
)
# The provided defaults (begin_epoch, flush, ...) refuse calls after close() too.
guard_calls_after_close(SinkConnector, _SINK_CALLS)
