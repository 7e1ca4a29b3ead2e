"""The ``kafka`` sink: epochs written to a topic exactly once (transactions) or at least once.

Exactly-once, and why ``pre_commit`` stages the epoch on disk
-------------------------------------------------------------
Each epoch is one Kafka transaction: ``begin_transaction`` at ``begin_epoch``, records produced
by ``write_batch``, an *epoch marker* (key: the transactional id, value: the epoch) produced to
the compacted topic ``epochs.topic`` in the same transaction, ``flush`` at ``pre_commit`` and
``commit_transaction`` at ``commit_epoch``. A reader with ``isolation.level=read_committed``
sees an epoch's records all at once, or not at all; the marker, committed atomically with
them, tells a restarted sink which epochs it committed, so a re-delivered one is skipped.

The runtime's commit decision (its manifest) is taken *between* ``pre_commit`` and
``commit_epoch``. If the process dies there, the new instance must commit the epoch — but a
Kafka transaction cannot be resumed by another producer: ``init_transactions`` with the same
transactional id fences the dead producer and *aborts* its open transaction (resuming a
prepared transaction needs KIP-939, which neither the brokers' stable releases nor
librdkafka offer; Flink's KafkaSink resumes one by setting the producer id and epoch through
reflection on the Java client). So ``pre_commit`` also writes the epoch's batches, as an Arrow
IPC stream, durably to its staging (:mod:`laminar_plugin_kafka._staging`: the laminar
checkpoint location by default, or ``staging.dir``); ``commit_epoch`` on an instance that did
not write the epoch produces them again in a new transaction, with the marker, and commits
that. The staged copy is removed once the epoch is committed or rolled back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Coroutine
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, BinaryIO, ClassVar

import pyarrow as pa
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic
from laminar_sdk import (
    ConfigKeySpec,
    ConfigurationError,
    ConnectorConfig,
    ConnectorError,
    ConnectorMetrics,
    EpochPhase,
    EpochTracker,
    HealthStatus,
    LaminarError,
    OpenEpoch,
    SinkConnector,
    SinkConnectorCapabilities,
    Timeout,
    TransactionError,
    WriteError,
    WriteResult,
    crash_point,
)
from laminar_sdk.reference import Lifecycle

from laminar_plugin_kafka._client import (
    client_config,
    client_error,
    describe,
    fatal_errors_unwrapped,
    is_unreachable,
    kafka_error,
    know_leaders,
    latest_offsets,
    new_admin,
    new_consumer,
    new_producer,
    read_until,
    require_topic,
    unreachable,
)
from laminar_plugin_kafka._config import (
    EPOCHS_TOPIC_CONFIG,
    SINK_KEYS,
    SINK_NAME,
    SinkSettings,
    sink_settings,
)
from laminar_plugin_kafka._records import OutgoingRecords, outgoing_records
from laminar_plugin_kafka._staging import (
    STAGING_ERRORS,
    DirectoryStaging,
    EpochStaging,
    StoreStaging,
)

logger = logging.getLogger("laminar_plugin_kafka")

_PRODUCER_DEFAULTS = {"linger.ms": 5, "queue.buffering.max.messages": 1_000_000}
"""Producer settings ``kafka.*`` keys override. An epoch is produced in one go and flushed at
``pre_commit``, so the queue holds up to an epoch's records: with librdkafka's default bound
(100000 records) producing a large epoch kept waiting for the brokers to acknowledge the
first records before it could queue the rest (250000 records of 100 bytes: ~0.25 s of
``produce`` calls, ~0.13 s with room for all of them). Memory stays bounded by
``queue.buffering.max.kbytes`` (librdkafka: 1 GiB)."""
_QUEUE_FULL_WAIT_S = 0.05
_STABLE_WAIT_S = 0.1
_LEADER_WAIT_S = 0.01  # a created epochs.topic has a leader within milliseconds
_VISIBLE_WAIT_S = 0.005
# init_transactions is called in slices, first this long, then each twice the last, up to
# librdkafka's own retry interval: each call that finds the coordinator busy (aborting an older
# instance's transaction) makes librdkafka ask again at once.
_INIT_FIRST_SLICE_S = 0.01
_INIT_LAST_SLICE_S = 0.5


class _RetriableTransactionError(TransactionError):
    """A transaction call failed in a way that calling it again may fix."""

    transient = True


class _StagedCopy:
    """An epoch's batches as one Arrow IPC stream, spooled to a file as they are produced.

    Written batch by batch, beside the producing thread, so that ``pre_commit`` only saves the
    file (serializing the whole epoch there kept every batch until then and copied them all on
    the critical path). Spooled to a temporary file, not kept in memory: an epoch costs its
    size on disk, in Python's temporary directory (``TMPDIR``), and no memory. Kept in memory,
    an epoch of 255 MB took the committing process to 1.35 GiB: a buffer grown by doubling,
    then a copy of it in ``bytes`` for the staging. The file has no name: it is gone once
    closed, or once the process dies.
    """

    def __init__(self, epoch: int, schema: pa.Schema) -> None:
        """:raises WriteError: when the temporary directory has no room (naming it)."""
        self._epoch = epoch
        try:
            # Closed by close(), or by the finalizer when the copy is dropped mid-epoch.
            self._file = tempfile.TemporaryFile(prefix="laminar-kafka-staged-")  # noqa: SIM115
        except OSError as error:
            raise self._spool_error(error) from error
        self._close = weakref.finalize(self, self._file.close)
        self._stream = pa.ipc.new_stream(pa.PythonFile(self._file, mode="w"), schema)

    def write(self, batch: pa.RecordBatch) -> None:
        """Append ``batch``.

        :raises WriteError: when the temporary directory has no room (naming it).
        """
        try:
            self._stream.write_batch(batch)
        except OSError as error:
            raise self._spool_error(error) from error

    def _spool_error(self, error: OSError) -> WriteError:
        return WriteError(
            f"{SINK_NAME}: cannot spool epoch {self._epoch}'s staged copy to the temporary "
            f"directory {tempfile.gettempdir()}: {error}. The epoch needs its size there "
            "until pre_commit: free space, or point TMPDIR at a disk with room"
        )

    def finish(self) -> BinaryIO:
        """The whole stream, to be read from its start; nothing may be written after."""
        self._stream.close()
        self._file.seek(0)
        return self._file

    def close(self) -> None:
        """Free the file (also done when this copy is dropped)."""
        self._close()


@dataclass(slots=True)
class _Transaction:
    """What an open epoch holds: whether its transaction is open, and its staged copy."""

    in_transaction: bool = False
    staged: _StagedCopy | None = None


def _holds_a_transaction(epoch: OpenEpoch[_Transaction] | None) -> bool:
    """Whether ``epoch`` was open here with its transaction still open in the producer."""
    return epoch is not None and epoch.held is not None and epoch.held.in_transaction


@dataclass(slots=True)
class _Deliveries:
    """What the brokers reported about the records produced since :meth:`clear`.

    Filled by the producer's delivery callback, on the thread that flushes.
    """

    failures: list[KafkaError] = field(default_factory=list)
    last_offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    def report(self, error: KafkaError | None, message: Message) -> None:
        """The delivery callback: note a failure, or how far a partition was written.

        Called once per record: kept to the fewest calls (no ``max()``, one dict lookup).
        """
        if error is not None:
            self.failures.append(error)
            return
        key = (message.topic() or "", message.partition() or 0)
        offset = message.offset() or 0
        if offset > self.last_offsets.get(key, -1):
            self.last_offsets[key] = offset

    def clear(self) -> None:
        """Forget everything reported so far."""
        self.failures.clear()
        self.last_offsets.clear()


@dataclass(slots=True)
class _Writer:
    """What an open sink holds."""

    settings: SinkSettings
    producer: Producer
    deliveries: _Deliveries
    staging: EpochStaging | None = None
    admin: AdminClient | None = None
    last_committed: int = -1
    epochs: EpochTracker[_Transaction] = field(default_factory=lambda: EpochTracker(SINK_NAME))

    def staged(self) -> EpochStaging:
        """Where this sink's pre-committed epochs are kept (exactly-once sinks have one)."""
        assert self.staging is not None, "exactly-once sinks have a staging"
        return self.staging


class KafkaSink(SinkConnector):
    """Writes batches to a Kafka topic, each epoch in one transaction, exactly once.

    Each row becomes one record: its value from ``value.column`` (binary or string), or the
    whole row as a JSON object with ``value.format=json``; its key from ``key.column``; its
    partition from ``partition.column`` (else librdkafka's partitioner, by key).

    ``delivery=exactly-once`` (the default) uses a transactional producer whose
    transactional id is ``laminar-TOPIC-SINK.ID``: opening a new instance fences an older one
    still running with the same id (a zombie), and aborts its open transaction. Each epoch is
    one transaction, committed with an epoch marker in ``epochs.topic``; a pre-committed
    epoch is also staged — in the laminar checkpoint location, or ``staging.dir`` — so that a
    new instance can commit it after a crash (see the module documentation for why). Readers
    must use ``isolation.level=read_committed``.

    ``delivery=at-least-once`` uses an idempotent producer and flushes at ``pre_commit``: an
    epoch replayed after a crash is written again.
    """

    CONFIG_KEYS: ClassVar[tuple[ConfigKeySpec, ...]] = SINK_KEYS
    DESCRIPTION: ClassVar[str] = (
        "Writes to a Kafka topic, exactly once (a transaction per epoch) or at least once"
    )

    def __init__(self) -> None:
        self._lifecycle: Lifecycle[_Writer] = Lifecycle(SINK_NAME)
        self._exactly_once = True  # the default delivery, until open() reads the config
        self._records_total = 0
        self._bytes_total = 0
        self._errors_total = 0
        self._epochs_committed = 0
        self._epochs_skipped = 0
        self._unclosed: weakref.finalize[Any, KafkaSink] | None = None

    # Lifecycle ------------------------------------------------------------------------------

    async def open(self, config: ConnectorConfig) -> None:
        """Connect; with exactly-once, fence older instances and learn the committed epochs.

        :raises ConfigurationError: for bad configuration or a topic that does not exist.
        :raises ConnectionFailed: when the brokers do not answer within ``timeout.ms``.
        :raises TransactionError: when the transactional producer cannot be initialised.
        """
        settings = sink_settings(config)
        deliveries = _Deliveries()
        producer = new_producer(settings.client, _producer_config(settings, deliveries))
        writer = _Writer(settings, producer, deliveries, _staging(settings, config))
        try:
            await asyncio.to_thread(self._prepare, writer)
            if writer.staging is not None:
                # Copies of epochs committed before, which a crash left behind.
                await writer.staging.discard_through(writer.last_committed)
        except BaseException:
            writer.producer.purge()
            raise
        self._exactly_once = settings.exactly_once
        self._lifecycle.open(writer)
        self._unclosed = weakref.finalize(
            self, _settle_then_release, producer, settings.flush_timeout_s
        )
        self._unclosed.atexit = False  # at exit the process takes the producer with it

    def _prepare(self, writer: _Writer) -> None:
        """Check the topics; with exactly-once, fence, and read the last committed epoch.

        With exactly-once, the admin client and the consumer of the epoch markers connect
        (a round trip or two each) while the producer reads the metadata and fences: the
        Spark bridge opens the sink for every epoch it commits.
        """
        settings = writer.settings
        if not settings.exactly_once:
            _check_topic(writer)
            return
        with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="laminar-open") as pool:
            admin_connecting = pool.submit(new_admin, settings.client, {settings.epochs_topic})
            connecting = pool.submit(_epochs_consumer, settings)
            try:
                metadata = _check_topic(writer)
                admin = writer.admin = admin_connecting.result()
                partitions = _epochs_partitions(settings, admin, metadata)
                _init_transactions(writer)
                writer.last_committed = _read_last_committed_epoch(
                    settings, admin, partitions, connecting
                )
            finally:
                with contextlib.suppress(Exception):  # its failure to open was raised above
                    connecting.result().close()

    async def last_committed_epoch(self) -> int | None:
        """The newest epoch marker of ``sink.id`` in ``epochs.topic`` (``-1``: none).

        Read when the sink opened, and kept up to date as it commits. ``None`` with
        ``delivery=at-least-once``, which keeps no markers.
        """
        writer = self._lifecycle.require("last_committed_epoch")
        return writer.last_committed if writer.settings.exactly_once else None

    async def close(self) -> None:
        """Abandon an open epoch (its transaction is aborted) and release the producer."""
        writer = self._lifecycle.state
        self._lifecycle.close()
        if writer is None:
            return
        if self._unclosed is not None:
            self._unclosed.detach()
        abandoned = writer.epochs.abandon()
        if abandoned is not None and _holds_a_transaction(abandoned):
            with contextlib.suppress(ConnectorError):  # _abort logs what it cannot do
                await asyncio.to_thread(_abort, writer, abandoned.number)
        await asyncio.to_thread(writer.producer.purge)

    # The epoch protocol ---------------------------------------------------------------------

    def schema(self) -> pa.Schema:
        """The configured schema (``schema`` key)."""
        return self._lifecycle.require("schema").settings.schema

    async def begin_epoch(self, epoch: int) -> None:
        """Begin the epoch's transaction, or skip the epoch if it was committed before.

        :raises InvalidState: when another epoch is still open.
        """
        writer = self._lifecycle.require("begin_epoch")
        writer.epochs.check_can_begin(epoch)
        if not writer.settings.exactly_once:
            writer.epochs.begin(epoch, _Transaction())
            return
        if epoch <= writer.last_committed:
            logger.info(
                "%s: epoch %d was committed before (last committed: %d); skipping its re-delivery",
                SINK_NAME,
                epoch,
                writer.last_committed,
            )
            writer.epochs.skip(epoch)
            return
        staged = _StagedCopy(epoch, writer.settings.schema)  # no transaction left open if it fails
        writer.deliveries.clear()
        try:
            await asyncio.to_thread(writer.producer.begin_transaction)
        except KafkaException as error:
            staged.close()
            raise _transaction_error(writer.settings, f"begin epoch {epoch}", error) from error
        writer.epochs.begin(epoch, _Transaction(in_transaction=True, staged=staged))

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        """Produce one record per row, in the epoch's transaction.

        :raises SchemaMismatch: when ``batch`` is not in the configured schema.
        :raises InvalidState: outside an epoch being written.
        :raises WriteError: when the client refuses a record.
        """
        writer = self._lifecycle.require("write_batch")
        records = outgoing_records(SINK_NAME, batch, writer.settings)
        transaction = writer.epochs.writing()
        if transaction is None:  # skipped
            return WriteResult(batch.num_rows, 0)
        if transaction.staged is None:
            await asyncio.to_thread(_produce, writer, records)
        else:  # the staged copy is written beside the producing thread
            staged = transaction.staged
            await _all_of(
                asyncio.to_thread(_produce, writer, records),
                asyncio.to_thread(staged.write, batch),
            )
        self._records_total += batch.num_rows
        self._bytes_total += records.size
        return WriteResult(batch.num_rows, records.size)

    async def pre_commit(self, epoch: int) -> None:
        """Flush the epoch and stage it durably; nothing becomes visible.

        With exactly-once the epoch marker is produced in the transaction, every record is
        acknowledged, and the batches are staged durably (see :class:`KafkaSink`). With
        at-least-once the records are flushed (and so visible).

        :raises WriteError: when records are not acknowledged within ``flush.timeout.ms``, or
            the brokers refused some.
        """
        writer = self._lifecycle.require("pre_commit")
        transaction = writer.epochs.pre_committing(epoch)
        if transaction is None:  # skipped, or pre-committed already
            return
        if not writer.settings.exactly_once:
            await asyncio.to_thread(_flush, writer)
            writer.epochs.pre_committed(epoch)
            return
        await asyncio.to_thread(_produce_marker, writer, epoch)
        assert transaction.staged is not None, "begin_epoch starts the staged copy"
        # Flush and stage at once: one waits on the brokers, the other on the disk. A failed
        # flush leaves a staged copy behind, which rolling the epoch back discards.
        await _all_of(asyncio.to_thread(_flush, writer), _stage(writer, epoch, transaction.staged))
        crash_point("epoch-staged")  # acknowledged and staged; the transaction still open
        transaction.staged = None
        writer.epochs.pre_committed(epoch)

    async def commit_epoch(self, epoch: int) -> None:
        """Commit the epoch's transaction; on a new instance, commit the staged copy.

        Does nothing for an epoch committed before (its marker is in ``epochs.topic``).

        :raises TransactionError: when the commit fails (transient when retrying may help);
            or, for an epoch pre-committed by an instance that crashed, when its staged copy
            is missing.
        :raises InvalidState: when the epoch was not pre-committed.
        """
        writer = self._lifecycle.require("commit_epoch")
        current = writer.epochs.committing(epoch)
        if not writer.settings.exactly_once:
            if writer.epochs.finish(epoch) is not None:
                self._epochs_committed += 1
            return
        if epoch <= writer.last_committed:
            self._epochs_skipped += current is not None and current.phase is EpochPhase.SKIPPED
            writer.epochs.finish(epoch)
            await writer.staged().discard(epoch)
            return
        transaction = None if current is None else current.held
        if transaction is None or not transaction.in_transaction:
            # Pre-committed by an instance that stopped (its transaction was aborted when this
            # one opened), or aborted here: produce the staged copy in a new transaction.
            with await _staged_copy(writer, epoch) as staged:
                await asyncio.to_thread(_produce_staged, writer, epoch, staged)
            crash_point("staged-copy-produced")
            writer.epochs.hold_pre_committed(epoch, _Transaction(in_transaction=True))
        try:
            committed = await asyncio.to_thread(_commit_transaction, writer, epoch)
        except TransactionError:
            self._errors_total += 1
            raise
        writer.epochs.finish(epoch)
        if not committed:
            self._errors_total += 1
            raise _RetriableTransactionError(
                f"{SINK_NAME}: the brokers aborted epoch {epoch}'s transaction at commit; "
                "committing again produces its staged copy in a new transaction"
            )
        crash_point("transaction-committed")  # the staged copy not yet discarded
        writer.last_committed = epoch
        self._epochs_committed += 1
        await writer.staged().discard(epoch)

    async def rollback_epoch(self, epoch: int) -> None:
        """Abort the epoch's transaction and discard its staged copy; idempotent.

        A committed epoch is never touched. With at-least-once, records already flushed stay.
        """
        writer = self._lifecycle.require("rollback_epoch")
        rolled_back = writer.epochs.finish(epoch)
        if _holds_a_transaction(rolled_back):
            await asyncio.to_thread(_abort, writer, epoch)
        if writer.staging is not None and epoch > writer.last_committed:
            await writer.staging.discard(epoch)

    async def flush(self) -> None:
        """Wait until every record produced so far is acknowledged (see :meth:`pre_commit`)."""
        writer = self._lifecycle.require("flush")
        await asyncio.to_thread(_flush, writer)

    # What the sink says about itself --------------------------------------------------------

    def capabilities(self) -> SinkConnectorCapabilities:
        """``exactly_once`` and ``two_phase_commit`` with exactly-once delivery, else none.

        Before :meth:`open` (when the runtime checks a pipeline's guarantee) the configured
        delivery is not known yet: the default's capabilities (exactly-once) are returned.
        """
        if not self._exactly_once:
            return SinkConnectorCapabilities()
        return SinkConnectorCapabilities().with_exactly_once().with_two_phase_commit()

    async def health_check(self) -> HealthStatus:
        """Healthy when the brokers answer a metadata request for the topic within the timeout."""
        writer = self._lifecycle.require("health_check")
        try:
            await asyncio.to_thread(
                writer.producer.list_topics, writer.settings.topic, writer.settings.client.timeout_s
            )
        except KafkaException as error:
            return HealthStatus.unhealthy(describe(writer.settings.client, error))
        return HealthStatus.healthy()

    def metrics(self) -> ConnectorMetrics:
        """Records and key/value bytes produced, failures, and epochs committed and skipped."""
        return ConnectorMetrics(
            records_total=self._records_total,
            bytes_total=self._bytes_total,
            errors_total=self._errors_total,
            custom={
                "epochs_committed": float(self._epochs_committed),
                "epochs_skipped": float(self._epochs_skipped),
            },
        )


# Blocking helpers, run in worker threads ----------------------------------------------------


def _producer_config(settings: SinkSettings, deliveries: _Deliveries) -> dict[str, object]:
    """The producer's settings; the brokers' delivery reports go to ``deliveries``."""
    managed: dict[str, object] = {
        "enable.idempotence": True,
        "on_delivery": deliveries.report,
    }
    if settings.exactly_once:
        managed["transactional.id"] = settings.transactional_id
    return client_config(settings.client, _PRODUCER_DEFAULTS, managed)


def _check_topic(writer: _Writer) -> ClusterMetadata:
    """The cluster's metadata, once the sink's topic is known to exist there.

    :raises ConfigurationError: when the topic does not exist or cannot be written.
    :raises ConnectionFailed: when the brokers do not answer within the timeout.
    """
    settings = writer.settings
    try:
        metadata: ClusterMetadata = writer.producer.list_topics(timeout=settings.client.timeout_s)
    except KafkaException as error:
        raise client_error(
            settings.client, "read the cluster's metadata", error, WriteError
        ) from error
    require_topic(settings.client, metadata, settings.topic, action="write to", key="topic")
    return metadata


def _init_transactions(writer: _Writer) -> None:
    """Fence older instances and abort their open transaction; get a producer id.

    When an older instance left a transaction open, the coordinator answers
    ``CONCURRENT_TRANSACTIONS`` while it aborts that transaction (milliseconds), and
    librdkafka asks again only after a fixed 500 ms. A call to ``init_transactions`` that
    timed out may be made again to resume, and asks again at once (librdkafka's documented
    resume path; it never has two requests out). So the call is made in slices growing from
    10 ms, again after each retriable error (a busy or moving coordinator, no answer yet),
    until the producer id comes or the timeout runs out: a busy coordinator costs a few
    milliseconds, not half a second, and a distant one is not asked every 10 ms.

    :raises ConnectionFailed: when the brokers do not answer within the timeout.
    :raises TransactionError: when the coordinator refuses.
    """
    settings = writer.settings
    deadline = time.monotonic() + settings.client.timeout_s
    wait_s = _INIT_FIRST_SLICE_S
    while True:
        remaining = max(0.0, deadline - time.monotonic())
        try:
            with fatal_errors_unwrapped():
                writer.producer.init_transactions(min(wait_s, remaining))
        except KafkaException as error:
            found = kafka_error(error)
            again = found is not None and found.retriable() and not found.fatal()
            if deadline <= time.monotonic() or not again:
                raise _transaction_error(
                    settings, "initialise the transactional producer", error
                ) from error
            wait_s = min(wait_s * 2, _INIT_LAST_SLICE_S)
            continue
        return


def _sink_error(settings: SinkSettings, what: str, error: BaseException) -> ConnectorError:
    """A client error while writing: a transaction error with exactly-once, else a write error."""
    if settings.exactly_once or is_unreachable(error):
        return _transaction_error(settings, what, error)
    return client_error(settings.client, what, error, WriteError)


def _transaction_error(settings: SinkSettings, what: str, error: BaseException) -> ConnectorError:
    if is_unreachable(error):
        return unreachable(settings.client, what, error)
    found = kafka_error(error)
    text = f"{SINK_NAME}: cannot {what}: {describe(settings.client, error)}"
    if found is not None and found.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED):
        return TransactionError(
            f"{text}. Another instance opened with transactional.id "
            f"{settings.transactional_id!r} and fenced this one; it now owns the sink"
        )
    if found is not None and found.code() == KafkaError._FATAL:
        return TransactionError(
            f"{text}. The producer failed for good: most often another instance opened with "
            f"transactional.id {settings.transactional_id!r} and fenced this one"
        )
    if found is not None and found.retriable() and not found.fatal():
        return _RetriableTransactionError(text)
    return TransactionError(text)


def _produce(writer: _Writer, records: OutgoingRecords) -> None:
    """Produce ``records`` to the topic, waiting for room when the client's queue is full."""
    producer = writer.producer
    produce = producer.produce
    topic = writer.settings.topic
    keys = repeat(None) if records.keys is None else records.keys
    partitions = repeat(-1) if records.partitions is None else records.partitions
    try:
        # One call per record and nothing else in the common case: a full queue is rare.
        # (strict=False: keys and partitions may be endless repeats.)
        for value, key, partition in zip(records.values, keys, partitions, strict=False):
            try:
                produce(topic, value, key, partition)
            except BufferError:
                _produce_when_room(producer, topic, value, key, partition)
    except KafkaException as error:
        raise _sink_error(writer.settings, f"produce to {topic!r}", error) from error


def _produce_when_room(
    producer: Producer, topic: str, value: bytes | None, key: bytes | None, partition: int
) -> None:
    """Produce one record, serving delivery reports until the client's queue has room."""
    while True:
        with fatal_errors_unwrapped():
            producer.poll(_QUEUE_FULL_WAIT_S)
        try:
            producer.produce(topic, value, key, partition)
        except BufferError:
            continue
        return


def _produce_marker(writer: _Writer, epoch: int) -> None:
    settings = writer.settings
    value = json.dumps({"epoch": epoch, "topic": settings.topic}).encode()
    try:
        while True:
            try:
                writer.producer.produce(
                    settings.epochs_topic, value, settings.transactional_id.encode(), -1
                )
                break
            except BufferError:
                with fatal_errors_unwrapped():
                    writer.producer.poll(_QUEUE_FULL_WAIT_S)
    except KafkaException as error:
        # The marker belongs to the epoch's transaction: a producer fenced while it queues the
        # marker fails it as the commit would (librdkafka may report the fencing here first).
        raise _sink_error(
            settings, f"record epoch {epoch} in {settings.epochs_topic!r}", error
        ) from error


def _flush(writer: _Writer) -> None:
    settings = writer.settings
    try:
        with fatal_errors_unwrapped():
            remaining = writer.producer.flush(settings.flush_timeout_s)
    except KafkaException as error:
        writer.deliveries.clear()
        raise _sink_error(settings, f"flush the records to {settings.topic!r}", error) from error
    if remaining:
        raise WriteError(
            f"{SINK_NAME}: {remaining} record(s) to {settings.topic!r} were not acknowledged "
            f"within flush.timeout.ms ({settings.flush_timeout_s:g}s); the brokers may be "
            f"unreachable at bootstrap.servers={settings.client.bootstrap_servers}"
        )
    failures = writer.deliveries.failures
    if failures:
        first, count = failures[0], len(failures)
        failures.clear()
        raise WriteError(
            f"{SINK_NAME}: {count} record(s) to {settings.topic!r} failed: "
            f"{describe(settings.client, first)}"
        )


def _abort(writer: _Writer, epoch: int) -> None:
    """Abort the open transaction; a fenced or failed producer's transaction is aborted anyway."""
    settings = writer.settings
    try:
        with fatal_errors_unwrapped():
            writer.producer.abort_transaction(settings.client.timeout_s)
    except KafkaException as error:
        if is_unreachable(error):
            raise unreachable(settings.client, f"abort epoch {epoch}", error) from error
        logger.warning(
            "%s: aborting epoch %d failed (%s); the brokers abort it when it times out or a new "
            "instance opens",
            SINK_NAME,
            epoch,
            describe(settings.client, error),
        )
    writer.deliveries.clear()


def _settle_then_release(producer: Producer, timeout_s: float) -> None:
    """Release the producer of a sink dropped without ``close()``, once its requests settle.

    A sink an exception or a simulated crash left unclosed is collected with its producer in
    the middle of a transaction. Destroyed then, librdkafka could abort the whole process (an
    assertion in its broker thread, ``txn_req_cnt > 0`` in AddPartitionsToTxn, seen in the
    kit's fault runs): its requests registering partitions with the transaction were still
    in flight. So the producer is flushed first, in a thread of its own (the collector may run
    anywhere, and must not wait on the brokers), and destroyed there. The open transaction is
    left to the brokers: the next instance with the same transactional id fences and aborts it.
    """
    threading.Thread(
        target=_flush_quietly,
        args=(producer, timeout_s),
        name="laminar-kafka-unclosed",
        daemon=True,
    ).start()


def _flush_quietly(producer: Producer, timeout_s: float) -> None:
    # Whatever the flush of a dropped instance raises concerns no one: a successor fencing
    # it, say, comes out of the delivery callback as a SystemError wrapping a KafkaException.
    with contextlib.suppress(Exception):
        producer.flush(timeout_s)


def _staging(settings: SinkSettings, config: ConnectorConfig) -> EpochStaging | None:
    """Where pre-committed epochs go: ``staging.dir``, else the runtime's state store."""
    if not settings.exactly_once:
        return None
    if settings.staging_dir is not None:
        return DirectoryStaging(settings.staging_dir, settings.transactional_id)
    assert config.state_store is not None, "sink_settings requires one or the other"
    return StoreStaging(config.state_store, settings.transactional_id)


async def _all_of(*steps: Coroutine[Any, Any, object]) -> None:
    """Run ``steps`` at once, each to its end; then raise the first one's failure, if any."""
    outcomes = await asyncio.gather(*steps, return_exceptions=True)
    for outcome in outcomes:  # the first step's failure first, as when they ran in turn
        if isinstance(outcome, BaseException):
            raise outcome


async def _stage(writer: _Writer, epoch: int, staged: _StagedCopy) -> None:
    """Keep the epoch's batches, as one Arrow IPC stream, complete and durable."""
    staging = writer.staged()
    try:
        await staging.save(epoch, await asyncio.to_thread(staged.finish))
    except STAGING_ERRORS as error:
        raise WriteError(
            f"{SINK_NAME}: cannot stage epoch {epoch} in {staging.where(epoch)}: {error}; "
            "check that the laminar checkpoint location (or staging.dir) is writable"
        ) from error
    finally:
        staged.close()


async def _staged_copy(writer: _Writer, epoch: int) -> BinaryIO:
    """The staged copy of an epoch an instance that stopped pre-committed, to read (close it).

    :raises TransactionError: when it is missing (not transient).
    """
    staging = writer.staged()
    staged = await staging.open(epoch)
    if staged is None:
        raise TransactionError(
            f"{SINK_NAME}: epoch {epoch} was pre-committed by an instance that stopped, and "
            f"must be committed, but its staged copy {staging.where(epoch)} is missing: was the "
            "laminar checkpoint location (or staging.dir) changed or cleaned? The epoch's "
            "records cannot be recovered by this sink"
        )
    return staged


def _produce_staged(writer: _Writer, epoch: int, staged: BinaryIO) -> None:
    """Begin a transaction holding the epoch's staged copy and marker, flushed, not committed.

    The copy is read a batch at a time, as it is produced.

    :raises TransactionError: transient: producing it failed (the transaction was aborted, and
        trying again may succeed).
    """
    settings = writer.settings
    logger.info("%s: committing epoch %d from its staged copy", SINK_NAME, epoch)
    writer.deliveries.clear()
    try:
        writer.producer.begin_transaction()
    except KafkaException as error:
        raise _transaction_error(settings, f"begin epoch {epoch} again", error) from error
    try:
        for batch in pa.ipc.open_stream(staged):
            _produce(writer, outgoing_records(SINK_NAME, batch, settings))
        _produce_marker(writer, epoch)
        _flush(writer)
    except LaminarError as error:
        _abort(writer, epoch)
        raise _RetriableTransactionError(
            f"{SINK_NAME}: cannot produce epoch {epoch} from its staged copy: {error}"
        ) from error
    except (pa.ArrowInvalid, OSError) as error:
        _abort(writer, epoch)
        raise TransactionError(
            f"{SINK_NAME}: epoch {epoch} was pre-committed by an instance that stopped, and "
            f"must be committed, but its staged copy {writer.staged().where(epoch)} cannot be "
            f"read ({error}): it is damaged, and the epoch's records cannot be recovered by "
            "this sink"
        ) from error


def _commit_transaction(writer: _Writer, epoch: int) -> bool:
    """Commit the open transaction of ``epoch``; ``False`` when it had to be aborted instead.

    :raises TransactionError: transient when committing may be tried again (the transaction
        stays open); not transient when the producer was fenced or failed for good — a new
        instance then learns from ``epochs.topic`` whether the epoch was committed.
    """
    settings = writer.settings
    try:
        with fatal_errors_unwrapped():
            writer.producer.commit_transaction(settings.client.timeout_s)
    except KafkaException as error:
        found = kafka_error(error)
        if found is not None and found.txn_requires_abort():
            _abort(writer, epoch)
            return False
        raise _transaction_error(settings, f"commit epoch {epoch}", error) from error
    _wait_until_visible(writer, epoch)
    return True


def _wait_until_visible(writer: _Writer, epoch: int) -> None:
    """Wait until ``read_committed`` readers see the epoch (bounded by the timeout).

    ``commit_transaction`` returns once the commit is decided; the brokers then write the
    commit markers into each partition, and until they have, readers do not see the records.
    Waiting here makes a committed epoch visible as soon as ``commit_epoch`` returns.
    """
    written, settings = dict(writer.deliveries.last_offsets), writer.settings
    writer.deliveries.clear()
    if not written or writer.admin is None:
        return
    deadline = time.monotonic() + settings.client.timeout_s
    try:
        while True:
            stable = latest_offsets(
                settings.client,
                writer.admin,
                sorted(written),
                IsolationLevel.READ_COMMITTED,
                WriteError,
            )
            if all(stable[key] > last for key, last in written.items()):
                return
            if time.monotonic() > deadline:
                break
            time.sleep(_VISIBLE_WAIT_S)
    except LaminarError as error:
        logger.warning(
            "%s: epoch %d is committed, but checking that readers see it failed: %s",
            SINK_NAME,
            epoch,
            error,
        )
        return
    logger.warning(
        "%s: epoch %d is committed, but read_committed readers did not see it within %gs (an "
        "older open transaction on the same partitions holds it back)",
        SINK_NAME,
        epoch,
        settings.client.timeout_s,
    )


def _epochs_partitions(
    settings: SinkSettings, admin: AdminClient, metadata: ClusterMetadata
) -> list[int]:
    """The partitions of ``epochs.topic``, created (compacted) when missing and allowed."""
    found = metadata.topics.get(settings.epochs_topic)
    if found is not None and found.error is None:
        return sorted(found.partitions)
    if not settings.create_epochs_topic:
        raise ConfigurationError(
            f"{SINK_NAME}: epochs.topic {settings.epochs_topic!r} does not exist; create it "
            "(one partition, cleanup.policy=compact) or set epochs.topic.create=true",
            key="epochs.topic",
        )
    new = NewTopic(settings.epochs_topic, num_partitions=1, config=dict(EPOCHS_TOPIC_CONFIG))
    future = admin.create_topics([new], request_timeout=settings.client.timeout_s)[
        settings.epochs_topic
    ]
    try:
        future.result(timeout=settings.client.timeout_s)
    except KafkaException as error:
        found_error = kafka_error(error)
        if found_error is None or found_error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise client_error(
                settings.client, f"create epochs.topic {settings.epochs_topic!r}", error, WriteError
            ) from error
    # A new topic's partitions take a moment to get a leader; until then nothing can be read.
    deadline = time.monotonic() + settings.client.timeout_s
    while True:
        topic = admin.list_topics(settings.epochs_topic, timeout=settings.client.timeout_s)
        created = topic.topics.get(settings.epochs_topic)
        partitions = {} if created is None or created.error is not None else created.partitions
        if partitions and all(partition.leader >= 0 for partition in partitions.values()):
            return sorted(partitions)
        if time.monotonic() > deadline:
            raise WriteError(
                f"{SINK_NAME}: epochs.topic {settings.epochs_topic!r} was created, but has no "
                f"leader after {settings.client.timeout_s:g}s"
            )
        time.sleep(_LEADER_WAIT_S)


def _latest_offsets(
    settings: SinkSettings, admin: AdminClient, partitions: list[int], level: IsolationLevel
) -> dict[int, int]:
    keys = [(settings.epochs_topic, p) for p in partitions]
    found = latest_offsets(settings.client, admin, keys, level, WriteError)
    return {partition: offset for (_, partition), offset in found.items()}


def _epochs_consumer(settings: SinkSettings) -> Consumer:
    """A consumer of ``epochs.topic``, read committed, that knows the partitions' leaders."""
    consumer = new_consumer(
        settings.client,
        client_config(
            settings.client,
            # Reading ends at an end-of-partition event, which comes with an empty fetch.
            {"fetch.wait.max.ms": 1},
            {
                "group.id": f"laminar-epochs-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
            },
        ),
    )
    know_leaders(settings.client, consumer, {settings.epochs_topic})
    return consumer


def _read_last_committed_epoch(
    settings: SinkSettings,
    admin: AdminClient,
    partitions: list[int],
    connecting: concurrent.futures.Future[Consumer],
) -> int:
    """The newest epoch this sink committed, from its markers (``-1`` when none).

    Read committed, up to the high watermark taken now, after waiting until no transaction
    begun earlier is still open there: a committed marker behind another producer's open
    transaction is not visible yet, and missing it would commit that epoch twice. Call it
    after fencing older instances, with ``connecting`` the reading consumer being made.
    """
    ends = _latest_offsets(settings, admin, partitions, IsolationLevel.READ_UNCOMMITTED)
    if not any(ends.values()):
        return -1  # nothing was ever written there: no sink committed an epoch yet
    deadline = time.monotonic() + settings.client.timeout_s
    while True:
        stable = _latest_offsets(settings, admin, partitions, IsolationLevel.READ_COMMITTED)
        if all(stable[p] >= ends[p] for p in partitions):
            break
        if time.monotonic() > deadline:
            raise Timeout(
                f"{SINK_NAME}: a transaction on epochs.topic {settings.epochs_topic!r} stayed "
                f"open for over {settings.client.timeout_s:g}s, so the epochs this sink "
                "committed cannot be read yet; retry, or give each sink its own epochs.topic",
                timeout_s=settings.client.timeout_s,
            )
        time.sleep(_STABLE_WAIT_S)
    consumer = connecting.result()
    key = settings.transactional_id.encode()
    last = -1
    consumer.assign(
        [TopicPartition(settings.epochs_topic, p, OFFSET_BEGINNING) for p in partitions]
    )
    starts = {(settings.epochs_topic, p): 0 for p in partitions}
    targets = {(settings.epochs_topic, p): ends[p] for p in partitions}
    for chunk in read_until(settings.client, consumer, starts, targets, batch_size=10_000):
        for message in chunk:
            if message.key() == key:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    last = max(last, int(json.loads(message.value() or b"")["epoch"]))
    return last
