"""The ``kafka`` source: Kafka topics read as Arrow batches, resumable from exact offsets."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import operator
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from laminar_sdk import (
    ConfigKeySpec,
    ConnectorConfig,
    ConnectorMetrics,
    HealthStatus,
    LaminarError,
    PartitionInfo,
    PartitionRange,
    RangeReadableSource,
    ReadError,
    SourceBatch,
    SourceCheckpoint,
    SourceConnector,
    share_records,
)
from laminar_sdk.reference import Lifecycle

from laminar_plugin_kafka._client import (
    PartitionKey,
    client_config,
    client_error,
    consume_ready,
    describe,
    know_leaders,
    new_admin,
    new_consumer,
    offset_bounds,
    parse_offset,
    parse_partition_key,
    partition_key,
    raise_for_consumer_error,
    read_until,
    require_topic,
)
from laminar_plugin_kafka._config import SOURCE_KEYS, SOURCE_NAME, SourceSettings, source_settings
from laminar_plugin_kafka._records import RecordFields, records_batch, source_schema

logger = logging.getLogger("laminar_plugin_kafka")

_FETCH_WAIT_S = 0.05  # one consume() call's wait; poll_batch loops until poll.timeout.ms
_DISCOVERY_INTERVAL_S = 1.0
"""How often a source that has read every assigned partition to its end looks for new ones."""
_SLICE = 500
"""Messages taken from the client at a time: fewer than the garbage collector's young
generation holds (700 allocations), so that they die young (see :class:`RecordFields`)."""
_CONSUMER_DEFAULTS = {
    "fetch.wait.max.ms": 100,  # librdkafka's 500 ms delays every EOF
    # Once the client holds queued.min.messages (or queued.max.messages.kbytes) fetched
    # messages, it fetches again only after this wait: librdkafka's 1 s leaves a reader that
    # empties 64 MiB in well under a second idle most of the time.
    "fetch.queue.backoff.ms": 10,
}
_SUBSCRIBER_DEFAULTS = {
    **_CONSUMER_DEFAULTS,
    # The group sees a topic's new partitions at the consumer's next metadata refresh:
    # librdkafka's 5 minutes would leave them unread that long.
    "topic.metadata.refresh.interval.ms": int(_DISCOVERY_INTERVAL_S * 1000),
}


def consumer_config(settings: SourceSettings) -> dict[str, Any]:
    """Librdkafka settings of the source's consumers (reading, range reading)."""
    return client_config(
        settings.client,
        _SUBSCRIBER_DEFAULTS if settings.subscribe else _CONSUMER_DEFAULTS,
        {
            # Without group.id the consumer still needs one; it never commits to it.
            "group.id": settings.group_id or f"laminar-source-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            # Every position is explicit; one that is gone must fail, never jump silently.
            "auto.offset.reset": "error",
            "isolation.level": "read_committed" if settings.read_committed else "read_uncommitted",
        },
    )


def discover_partitions(settings: SourceSettings, consumer: Consumer) -> list[PartitionKey]:
    """The partitions of the configured topics (or of the topics the pattern matches).

    Blocking: call it in a worker thread.

    :raises ConnectionFailed: when the brokers do not answer within the timeout.
    :raises ConfigurationError: when a named topic does not exist.
    """
    try:
        metadata = consumer.list_topics(timeout=settings.client.timeout_s)
    except KafkaException as error:
        raise client_error(
            settings.client, "read the cluster's metadata", error, ReadError
        ) from error
    if settings.pattern is not None:
        names = [
            name
            for name in metadata.topics
            if not name.startswith("__") and settings.pattern.fullmatch(name)
        ]
    else:
        names = list(settings.topics)
    found: list[PartitionKey] = []
    key = "topics" if len(settings.topics) > 1 else "topic"
    for name in sorted(names):
        topic = require_topic(settings.client, metadata, name, action="read", key=key)
        found.extend((name, number) for number in sorted(topic.partitions))
    return found


@dataclass(slots=True)
class _Reader:
    """What an open source holds: its consumer, and where each partition stands.

    ``next`` holds the checkpoint: the offset after the last record returned, per partition
    (or the resolved start of a partition under ``start.offset=latest``, or the end the
    client reported past offsets that hold no records). Records fetched but not returned
    wait in ``buffers``; an end of partition reported behind them waits in ``pending_end``.

    The consumer starts (assigns ``partitions`` at their offsets, or subscribes) at the first
    fetch, so a restore right after opening positions it once, exactly.
    """

    settings: SourceSettings
    consumer: Consumer
    schema: pa.Schema
    partitions: list[PartitionKey]
    assigned: set[PartitionKey] = field(default_factory=set)
    started: bool = False
    next: dict[PartitionKey, int] = field(default_factory=dict)
    buffers: dict[PartitionKey, RecordFields] = field(default_factory=dict)
    pending_end: dict[PartitionKey, int] = field(default_factory=dict)
    at_end: set[PartitionKey] = field(default_factory=set)
    last_returned: PartitionKey | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    watcher: asyncio.Task[None] | None = None
    watching: bool = False
    failure: BaseException | None = None
    admin: AdminClient | None = None
    discovered_at: float = field(default_factory=time.monotonic)

    def offsets_client(self, topics: set[str]) -> AdminClient:
        """The client that asks for offsets (made on first use, for ``topics``).

        See ``offset_bounds`` for why not the consumer.
        """
        if self.admin is None:
            self.admin = new_admin(self.settings.client, topics)
        return self.admin

    def has_buffered(self) -> bool:
        return any(self.buffers.values())

    def forget_fetched(self) -> None:
        self.buffers.clear()
        self.pending_end.clear()
        self.at_end.clear()


class KafkaSource(SourceConnector, RangeReadableSource):
    """Reads Kafka topics as Arrow batches, resuming exactly from per-partition offsets.

    Batch columns: ``key`` (binary), ``value`` (binary, or a struct decoded from JSON with
    ``value.format=json`` and ``value.schema``), ``topic``, ``partition`` (int32), ``offset``
    (int64), ``timestamp`` (ms) and ``headers`` (list of key/value structs). Each batch holds
    records of one partition, named ``topic/partition`` in its :class:`PartitionInfo`.

    The checkpoint maps ``topic/partition`` to the next offset to read there; restoring it
    assigns every partition at exactly that offset (partitions absent from it start at their
    beginning, or their end with ``start.offset=latest``). An offset that is gone (deleted by
    retention) is a :class:`ReadError`, never a silent jump. Transactions are read committed
    by default; their markers occupy offsets, so offsets have gaps. Partitions that appear
    while the source reads (a topic's partitions increased) are found once the assigned ones
    are read to their end, and read from their beginning.

    With ``group.id``, the group's offsets are committed from checkpoints that are known to
    be durable — the ones :meth:`restore` is given — so they never run ahead of what the
    pipeline committed. With ``consumer.mode=subscribe`` the group assigns the partitions, and
    a rebalance sets :meth:`checkpoint_requested`; the consumer refreshes the topics' metadata
    every second, so the group assigns a partition added to a topic within seconds, and it is
    read from its beginning too.

    The source is range-readable (:meth:`plan_end`, :meth:`read_range`), so Spark can read
    each partition of a micro-batch in its own task.
    """

    CONFIG_KEYS: ClassVar[tuple[ConfigKeySpec, ...]] = SOURCE_KEYS
    DESCRIPTION: ClassVar[str] = (
        "Reads Kafka topics (read committed) from per-partition offsets; replayable, range-readable"
    )

    def __init__(self) -> None:
        self._lifecycle: Lifecycle[_Reader] = Lifecycle(SOURCE_NAME)
        self._ready = asyncio.Event()
        self._requested = threading.Event()
        self._records_total = 0
        self._bytes_total = 0
        self._errors_total = 0

    # Lifecycle ------------------------------------------------------------------------------

    async def open(self, config: ConnectorConfig) -> None:
        """Connect, find the partitions and assign them (or join the consumer group).

        :raises ConfigurationError: for bad configuration or a topic that does not exist.
        :raises ConnectionFailed: when the brokers do not answer within ``timeout.ms``.
        """
        settings = source_settings(config)
        consumer = new_consumer(settings.client, consumer_config(settings))
        try:
            partitions = await asyncio.to_thread(discover_partitions, settings, consumer)
            reader = _Reader(settings, consumer, source_schema(settings.value_schema), partitions)
            await asyncio.to_thread(_resolve_latest, reader)
        except BaseException:
            await asyncio.to_thread(consumer.close)
            raise
        self._lifecycle.open(reader)

    async def close(self) -> None:
        """Stop reading and leave the consumer group (if any); nothing is committed."""
        reader = self._lifecycle.state
        self._lifecycle.close()
        if reader is None:
            return
        await _stop_watching(reader)
        async with reader.lock:
            await asyncio.to_thread(reader.consumer.close)

    # Reading --------------------------------------------------------------------------------

    def schema(self) -> pa.Schema:
        """The batches' schema (see the class description)."""
        return self._lifecycle.require("schema").schema

    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        """Up to ``max_records`` records of one partition, taking partitions in turn.

        Waits up to ``poll.timeout.ms`` for records, and returns ``None`` sooner once every
        partition is read to its end. When it returns ``None``, a background task watches
        for new records and sets :meth:`data_ready_notify` when they arrive.

        :raises ReadError: when records are gone, or the client fails for good.
        :raises SerdeError: when a value does not decode as JSON of ``value.schema``.
        :raises ValueError: when ``max_records < 1``.
        """
        reader = self._lifecycle.require("poll_batch")
        if max_records < 1:
            raise ValueError(f"{SOURCE_NAME}: max_records must be >= 1, got {max_records}")
        async with reader.lock:
            if reader.failure is not None:
                failure, reader.failure = reader.failure, None
                raise failure
            if not reader.has_buffered():
                await self._fetch(reader)
            batch = self._take(reader, max_records)
        if batch is None:
            self._watch(reader)
        return batch

    async def _fetch(self, reader: _Reader) -> None:
        """Fetch until records are buffered, every partition is at its end, or time is up."""
        deadline = time.monotonic() + reader.settings.poll_timeout_s
        await self._start(reader)
        while True:
            await asyncio.to_thread(self._fetch_ready, reader)
            if not reader.has_buffered() and await self._assign_new_partitions(reader):
                continue
            done = reader.has_buffered() or reader.assigned <= reader.at_end
            if done or time.monotonic() >= deadline:
                return

    async def _assign_new_partitions(self, reader: _Reader) -> bool:
        """Assign, from their beginning, partitions that appeared since the last look.

        A topic's partitions can be increased while the source reads it (and a pattern can
        match a new topic): once every assigned partition was read to its end, the source
        looks again, at most every :data:`_DISCOVERY_INTERVAL_S`. Whether any was assigned.
        """
        if reader.settings.subscribe or not reader.assigned <= reader.at_end:
            return False
        if time.monotonic() - reader.discovered_at < _DISCOVERY_INTERVAL_S:
            return False
        reader.discovered_at = time.monotonic()
        found = await asyncio.to_thread(discover_partitions, reader.settings, reader.consumer)
        new = [key for key in found if key not in reader.assigned]
        if not new:
            return False
        # Every record of a partition that appeared after the source started is new to it,
        # under start.offset=latest too.
        assignment = [
            TopicPartition(t, p, reader.next.get((t, p), OFFSET_BEGINNING)) for t, p in new
        ]
        await asyncio.to_thread(
            know_leaders, reader.settings.client, reader.consumer, {t for t, _ in new}
        )
        await asyncio.to_thread(reader.consumer.incremental_assign, assignment)
        reader.partitions = sorted({*reader.partitions, *new})
        reader.assigned.update(new)
        return True

    def _fetch_ready(self, reader: _Reader) -> None:
        """File what the client has fetched, up to ``batch.size`` messages.

        Waits up to :data:`_FETCH_WAIT_S` for the first message; the rest come without
        waiting, :data:`_SLICE` at a time, each slice filed before the next is taken.
        Blocking: call it in a worker thread.
        """
        limit = reader.settings.batch_size
        asked = min(_SLICE, limit)
        taken = self._absorb(reader, consume_ready(reader.consumer, asked, _FETCH_WAIT_S))
        got = taken
        while got == asked and taken < limit:
            asked = min(_SLICE, limit - taken)
            got = self._absorb(reader, reader.consumer.consume(asked, 0))
            taken += got

    def _absorb(self, reader: _Reader, messages: list[Message]) -> int:
        """File fetched records by partition; note where partitions ended. How many there were.

        A fetch returns runs of records of one partition (often only one run): the records
        of a run are filed together, field by field, with no Python step per record.
        """
        count = len(messages)
        if not count:
            return 0
        topics = list(map(Message.topic, messages))
        numbers = list(map(Message.partition, messages))
        # By identity: KafkaError == None leaves a TypeError set in confluent-kafka.
        events = list(map(operator.is_not, map(Message.error, messages), itertools.repeat(None)))
        if not any(events) and count == topics.count(topics[0]) == numbers.count(numbers[0]):
            self._file(reader, (topics[0] or "", numbers[0] or 0), messages)
            return count
        start = 0
        runs = itertools.groupby(zip(topics, numbers, events, strict=True))
        for (topic, number, event), run in runs:
            stop = start + len(list(run))
            key = (topic or "", number or 0)
            if not event:
                self._file(reader, key, messages[start:stop])
            else:
                for message in messages[start:stop]:
                    self._note_event(reader, key, message)
            start = stop
        return count

    @staticmethod
    def _file(reader: _Reader, key: PartitionKey, messages: list[Message]) -> None:
        """Buffer ``messages``, records of ``key``: it is no longer at its end."""
        if key not in reader.assigned:
            return  # fetched before a rebalance took the partition away
        reader.at_end.discard(key)
        reader.pending_end.pop(key, None)
        buffered = reader.buffers.get(key)
        if buffered is None:
            buffered = reader.buffers[key] = RecordFields()
        buffered.extend(messages)

    def _note_event(self, reader: _Reader, key: PartitionKey, message: Message) -> None:
        """Note the end of ``key`` reported by ``message``, or raise for its error."""
        if key not in reader.assigned:
            return  # fetched before a rebalance took the partition away
        error = message.error()
        assert error is not None  # _absorb hands over events only
        if error.code() == KafkaError._PARTITION_EOF:
            end = message.offset() or 0
            reader.at_end.add(key)
            if reader.buffers.get(key):
                reader.pending_end[key] = end
            elif key in reader.next or end > 0:
                # Offsets before the end hold no record to return (transaction markers,
                # aborted records): resuming at the end skips nothing. (An empty partition
                # read from offset 0 stays out of the checkpoint, as plan_end leaves it.)
                reader.next[key] = max(reader.next.get(key, end), end)
        else:
            self._errors_total += 1
            raise_for_consumer_error(reader.settings.client, error, key)

    def _take(self, reader: _Reader, max_records: int) -> SourceBatch | None:
        ready = sorted(key for key, records in reader.buffers.items() if records)
        if not ready:
            return None
        last = reader.last_returned
        key = next((k for k in ready if last is None or k > last), ready[0])
        pending = reader.buffers[key]
        records = pending.first(max_records)
        batch = records_batch(
            SOURCE_NAME, records, reader.schema, reader.settings.value_schema, key
        )
        pending.drop_first(max_records)
        reader.next[key] = (records.offsets[-1] or 0) + 1
        if not pending and key in reader.pending_end:
            reader.next[key] = max(reader.next[key], reader.pending_end.pop(key))
        reader.last_returned = key
        self._records_total += batch.num_rows
        self._bytes_total += batch.nbytes
        return SourceBatch(batch, PartitionInfo(partition_key(key), str(reader.next[key])))

    def _watch(self, reader: _Reader) -> None:
        if reader.watcher is None or reader.watcher.done():
            reader.watching = True
            reader.watcher = asyncio.get_running_loop().create_task(self._wait_for_records(reader))

    async def _wait_for_records(self, reader: _Reader) -> None:
        """Fetch in the background until records arrive, then set the data-ready event."""
        while reader.watching:
            async with reader.lock:
                if not reader.has_buffered():
                    try:
                        await self._start(reader)
                        await asyncio.to_thread(self._fetch_ready, reader)
                        await self._assign_new_partitions(reader)
                    except (LaminarError, KafkaException, RuntimeError) as error:
                        reader.failure = error  # raised by the next poll_batch
                if reader.has_buffered() or reader.failure is not None:
                    self._ready.set()
                    return

    # Checkpoints ----------------------------------------------------------------------------

    def checkpoint(self) -> SourceCheckpoint:
        """Each partition's next offset: restoring resumes right after the records returned."""
        reader = self._lifecycle.require("checkpoint")
        return SourceCheckpoint(
            {partition_key(key): str(offset) for key, offset in sorted(reader.next.items())}
        )

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        """Assign every partition at its offset in ``checkpoint``, exactly.

        Partitions it does not name start at their beginning (or end, with
        ``start.offset=latest``). With ``group.id``, the checkpoint's offsets are committed
        to the group: a checkpoint the runtime restores is durable, so the group never runs
        ahead of the pipeline.

        :raises CheckpointError: when ``checkpoint`` is not one of this source's.
        """
        reader = self._lifecycle.require("restore")
        offsets = _checkpoint_offsets(checkpoint)
        await _stop_watching(reader)
        async with reader.lock:
            if reader.started:
                # A consumer that fetched may still hand out records of its old positions:
                # start over with a new one.
                await asyncio.to_thread(reader.consumer.close)
                reader.consumer = new_consumer(
                    reader.settings.client, consumer_config(reader.settings)
                )
                reader.started = False
                reader.assigned = set()
            reader.next = dict(offsets)
            reader.forget_fetched()
            reader.last_returned = None
            reader.partitions = await asyncio.to_thread(
                discover_partitions, reader.settings, reader.consumer
            )
            await asyncio.to_thread(_resolve_latest, reader)
        await self.commit_group_offsets(checkpoint)

    async def commit_group_offsets(self, checkpoint: SourceCheckpoint) -> None:
        """Commit ``checkpoint``'s offsets to the consumer group, for monitoring tools.

        Call it only with a checkpoint whose epoch is durably committed (:meth:`restore` does,
        with the checkpoint it resumes from). Does nothing without ``group.id``. A failure is
        logged, not raised: the group's offsets are informational, the pipeline's checkpoint
        is what the source resumes from.
        """
        reader = self._lifecycle.require("commit_group_offsets")
        offsets = _checkpoint_offsets(checkpoint)
        if reader.settings.group_id is None or not offsets:
            return
        partitions = [TopicPartition(t, p, offset) for (t, p), offset in sorted(offsets.items())]
        try:
            await asyncio.to_thread(reader.consumer.commit, offsets=partitions, asynchronous=False)
        except KafkaException as error:
            logger.warning(
                "%s: committing offsets to group %r failed: %s",
                SOURCE_NAME,
                reader.settings.group_id,
                describe(reader.settings.client, error),
            )

    async def _start(self, reader: _Reader) -> None:
        """Assign the partitions at their offsets, or join the group, once."""
        if reader.started:
            return
        if reader.settings.subscribe:
            await asyncio.to_thread(self._subscribe, reader)
        else:
            start = OFFSET_BEGINNING  # partitions absent from the checkpoint ("latest" resolved)
            assignment = [
                TopicPartition(t, p, reader.next.get((t, p), start)) for t, p in reader.partitions
            ]
            logical = {tp.topic for tp in assignment if tp.offset < 0}
            if logical:
                await asyncio.to_thread(
                    know_leaders, reader.settings.client, reader.consumer, logical
                )
            await asyncio.to_thread(reader.consumer.assign, assignment)
            reader.assigned = set(reader.partitions)
        reader.started = True

    def _subscribe(self, reader: _Reader) -> None:
        topics = sorted({topic for topic, _ in reader.partitions})
        reader.consumer.subscribe(
            topics,
            on_assign=lambda consumer, assigned: self._on_assign(reader, consumer, assigned),
            on_revoke=lambda consumer, revoked: self._on_revoke(reader, consumer, revoked),
            on_lost=lambda consumer, lost: self._on_revoke(reader, consumer, lost),
        )

    def _on_assign(
        self, reader: _Reader, consumer: Consumer, assigned: list[TopicPartition]
    ) -> None:
        for partition in assigned:
            # Partitions absent from ``next`` appeared after the source opened ("latest" was
            # resolved then): every record of theirs is new to it.
            key = (partition.topic, partition.partition)
            partition.offset = reader.next.get(key, OFFSET_BEGINNING)
        consumer.assign(assigned)
        reader.assigned = {(p.topic, p.partition) for p in assigned}
        self._requested.set()

    def _on_revoke(
        self, reader: _Reader, consumer: Consumer, revoked: list[TopicPartition]
    ) -> None:
        for partition in revoked:
            key = (partition.topic, partition.partition)
            reader.buffers.pop(key, None)
            reader.pending_end.pop(key, None)
            reader.at_end.discard(key)
            reader.assigned.discard(key)
        consumer.unassign()
        self._requested.set()

    # Ranges ---------------------------------------------------------------------------------

    def as_range_readable(self) -> RangeReadableSource:
        """This source: its partitions can be read range by range, in parallel."""
        return self

    async def plan_end(self, start: SourceCheckpoint, max_records: int | None) -> SourceCheckpoint:
        """The checkpoint after the committed records that follow ``start``, now.

        Each partition ends at its last stable offset (read committed) or high watermark.
        ``max_records`` is split fairly across the partitions with records (counted in
        offsets, which bound the records from above: transaction markers take offsets too).

        :raises CheckpointError: when ``start`` is not one of this source's checkpoints.
        """
        reader = self._lifecycle.require("plan_end")
        starts = _checkpoint_offsets(start)
        partitions = await asyncio.to_thread(discover_partitions, reader.settings, reader.consumer)
        bounds = await asyncio.to_thread(_bounds, reader, partitions)
        first: dict[PartitionKey, int] = {}
        offsets = dict(start.offsets)
        for key, (low, end) in bounds.items():
            if key in starts:
                first[key] = starts[key]
            elif reader.settings.start_latest:
                first[key] = end  # a new partition starts at its end: fixed here, once
                offsets[partition_key(key)] = str(end)
            else:
                first[key] = low
        available = {key: max(0, bounds[key][1] - first[key]) for key in bounds}
        for key, count in share_records(available, max_records).items():
            # A partition absent from start enters the plan where polling would put it:
            # at its first offset past any records, unless that is offset 0 (nothing there).
            if count or (key not in starts and first[key] > 0):
                offsets[partition_key(key)] = str(first[key] + count)
        return SourceCheckpoint(offsets, start.epoch, start.metadata)

    async def read_range(self, partition_range: PartitionRange) -> AsyncIterator[pa.RecordBatch]:
        """The committed records of one partition after ``start``, before offset ``end``.

        Reads with a consumer of its own (this instance's position does not move) until the
        partition's position reaches ``end`` — by offset, not by count, since transaction
        markers take offsets and are never returned.

        :raises ReadError: when records of the range are gone.
        :raises CheckpointError: when the range does not name a partition and offsets.
        """
        reader = self._lifecycle.require("read_range")
        key = parse_partition_key(SOURCE_NAME, partition_range.partition)
        name = partition_range.partition
        end = parse_offset(SOURCE_NAME, name, partition_range.end)
        if partition_range.start is not None:
            first = parse_offset(SOURCE_NAME, name, partition_range.start)
        elif reader.settings.start_latest:
            return  # a partition new to the plan starts at the end the plan fixed
        else:
            first, _ = (await asyncio.to_thread(_bounds, reader, [key]))[key]
        if first >= end:
            return
        consumer = new_consumer(reader.settings.client, consumer_config(reader.settings))
        try:
            consumer.assign([TopicPartition(key[0], key[1], first)])
            batches = _range_batches(reader, consumer, key, first, end)
            while (batch := await asyncio.to_thread(next, batches, None)) is not None:
                yield batch
        finally:
            await asyncio.to_thread(consumer.close)

    # Runtime hooks --------------------------------------------------------------------------

    def data_ready_notify(self) -> asyncio.Event:
        """Set when records arrive after :meth:`poll_batch` found none."""
        return self._ready

    def checkpoint_requested(self) -> threading.Event | None:
        """With ``consumer.mode=subscribe``: set when the group rebalances; else ``None``."""
        reader = self._lifecycle.state
        if reader is None or not reader.settings.subscribe:
            return None
        return self._requested

    async def health_check(self) -> HealthStatus:
        """Healthy when the brokers answer a metadata request within ``timeout.ms``."""
        reader = self._lifecycle.require("health_check")
        try:
            await asyncio.to_thread(discover_partitions, reader.settings, reader.consumer)
        except LaminarError as error:
            return HealthStatus.unhealthy(str(error))
        return HealthStatus.healthy()

    def metrics(self) -> ConnectorMetrics:
        """Records and Arrow bytes returned, client errors, and the lag.

        ``lag`` is the sum over the assigned partitions of the high watermark the client last
        saw minus the next offset to return (it counts transaction markers and uncommitted
        records too, so it is an upper bound).
        """
        reader = self._lifecycle.state
        lag = 0
        if reader is not None:
            for key in sorted(reader.assigned):
                with contextlib.suppress(KafkaException):
                    low, high = reader.consumer.get_watermark_offsets(
                        TopicPartition(*key), cached=True
                    )
                    if high >= 0:
                        lag += max(0, high - reader.next.get(key, max(low, 0)))
        return ConnectorMetrics(
            records_total=self._records_total,
            bytes_total=self._bytes_total,
            errors_total=self._errors_total,
            lag=lag,
        )


def _checkpoint_offsets(checkpoint: SourceCheckpoint) -> dict[PartitionKey, int]:
    return {
        parse_partition_key(SOURCE_NAME, name): parse_offset(SOURCE_NAME, name, offset)
        for name, offset in checkpoint.offsets.items()
    }


def _range_batches(
    reader: _Reader, consumer: Consumer, key: PartitionKey, first: int, end: int
) -> Iterator[pa.RecordBatch]:
    """Batches of up to ``batch.size`` records of ``key`` from ``first`` to before ``end``.

    Blocking: call it in a worker thread. The records are taken from the client
    :data:`_SLICE` at a time and held field by field (see :class:`RecordFields`); each batch
    is built from those fields at once.
    """
    settings = reader.settings
    chunks = read_until(settings.client, consumer, {key: first}, {key: end}, batch_size=_SLICE)
    pending = RecordFields()
    for chunk in chunks:
        pending.extend(chunk)
        while len(pending) >= settings.batch_size:
            records = pending.first(settings.batch_size)
            pending.drop_first(settings.batch_size)
            yield records_batch(SOURCE_NAME, records, reader.schema, settings.value_schema, key)
    if pending:
        yield records_batch(SOURCE_NAME, pending, reader.schema, settings.value_schema, key)


def _resolve_latest(reader: _Reader) -> None:
    """With ``start.offset=latest``, fix where partitions absent from ``next`` start: now.

    Resolved once, when the source is opened or restored, so that a checkpoint taken before
    the first poll already names those offsets and replays the same records.
    """
    if not reader.settings.start_latest:
        return
    missing = [key for key in reader.partitions if key not in reader.next]
    for key, (_, end) in _bounds(reader, missing).items():
        reader.next[key] = end


def _bounds(reader: _Reader, keys: list[PartitionKey]) -> dict[PartitionKey, tuple[int, int]]:
    """Each partition's first offset and its end (last stable offset when read committed)."""
    level = (
        IsolationLevel.READ_COMMITTED
        if reader.settings.read_committed
        else IsolationLevel.READ_UNCOMMITTED
    )
    admin = reader.offsets_client({topic for topic, _ in keys})
    return offset_bounds(reader.settings.client, admin, keys, level, ReadError)


async def _stop_watching(reader: _Reader) -> None:
    reader.watching = False
    watcher, reader.watcher = reader.watcher, None
    if watcher is not None and watcher.get_loop() is asyncio.get_running_loop():
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
