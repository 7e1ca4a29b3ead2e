"""Test contexts for the conformance kit: a fresh topic per context, on one shared broker.

Records carry their id as decimal text, in the key and in the value. The kit's
``laminar_conformance`` package is imported only when the first context asks for a broker,
so the plugin loads without the kit installed.

Imported only by the plugin's ``laminar_conformance_context`` hook, when the conformance kit asks
for a context: never when a pipeline runs.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import functools
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import pyarrow as pa
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import NewPartitions, NewTopic, OffsetSpec
from laminar_sdk import ConnectorConfig, ReadError

from laminar_plugin_kafka._client import (
    CLIENT_DEFAULTS,
    LIBRDKAFKA_LOGGER,
    FetchRestarter,
    PartitionKey,
    consume_ready,
    know_leaders,
    latest_offsets,
    new_admin,
    raise_for_consumer_error,
)
from laminar_plugin_kafka._config import EPOCHS_TOPIC_CONFIG, ClientSettings, default_epochs_topic

if TYPE_CHECKING:
    from laminar_conformance.services import KafkaService

SINK_SCHEMA = pa.schema([pa.field("key", pa.binary()), pa.field("value", pa.binary())])
"""The ``kafka`` sink's default schema, which the sink context writes."""

_CONTEXT = "kafka conformance context"
_TIMEOUT_S = 30.0
_VISIBLE_POLL_S = 0.02
_BATCH = 8  # topics created, and deleted, per request
_SINK_PARTITIONS = 2
_EXIT_PROBE_S = 3.0
NETWORK_TIMEOUT_MS = 5000
"""The timeouts of a connector the kit puts a proxy before."""


@functools.cache
def shared_service() -> KafkaService:
    """The brokers every context of this process uses, found or started on first use.

    ``laminar_conformance.services.kafka_service()`` decides: ``LAMINAR_KAFKA_BOOTSTRAP``, a
    container, or a local broker, which is stopped when the process exits.
    """
    from laminar_conformance.services import kafka_service  # noqa: PLC0415 - the kit is optional

    stack = contextlib.ExitStack()
    service = stack.enter_context(kafka_service())
    atexit.register(stack.close)
    return service


def shared_bootstrap_servers() -> str:
    """``bootstrap.servers`` of :func:`shared_service`."""
    return shared_service().bootstrap_servers


def _settings(bootstrap: str) -> ClientSettings:
    return ClientSettings(_CONTEXT, bootstrap, {}, (), _TIMEOUT_S)


class _Topics:
    """The topics of this process's contexts on one cluster: made ahead, deleted in batches.

    A conformance run makes hundreds of contexts, each with a fresh topic. Creating topics
    :data:`_BATCH` at a time (one request, one wait for their leaders), and deleting the used
    ones :data:`_BATCH` at a time, costs a round trip per batch instead of per context. A
    topic is handed out once, never written before. A sink's topic comes with its default
    ``epochs.topic``, made as the sink would make it, so that the sink's first open in each
    case does not wait for a topic of its own to be created. Also holds one producer for
    appending.
    """

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.settings = _settings(bootstrap)
        self.admin = new_admin(self.settings, set())
        self._fresh: dict[tuple[int, bool], list[str]] = {}
        self._used: list[str] = []
        self._producer: Producer | None = None

    def take(self, partitions: int, *, with_epochs_topic: bool = False) -> str:
        """A fresh, empty topic of ``partitions`` partitions, each with a leader.

        :param with_epochs_topic: also make the topic's default ``epochs.topic`` (empty).
        """
        fresh = self._fresh.setdefault((partitions, with_epochs_topic), [])
        if not fresh:
            fresh.extend(self._create(partitions, with_epochs_topic=with_epochs_topic))
        return fresh.pop()

    def _create(self, partitions: int, *, with_epochs_topic: bool) -> list[str]:
        names = [f"laminar-conformance-{uuid.uuid4().hex[:16]}" for _ in range(_BATCH)]
        new = [NewTopic(name, num_partitions=partitions) for name in names]
        if with_epochs_topic:
            new += [
                NewTopic(default_epochs_topic(name), 1, config=dict(EPOCHS_TOPIC_CONFIG))
                for name in names
            ]
        futures = self.admin.create_topics(new, request_timeout=_TIMEOUT_S)
        for future in futures.values():
            future.result(timeout=_TIMEOUT_S)
        # The broker's metadata lags the creation: wait until clients see the topics, and a
        # leader for each partition.
        deadline = time.monotonic() + _TIMEOUT_S
        while not self._ready({topic.topic: topic.num_partitions for topic in new}):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{_CONTEXT}: topics {names} did not become ready")
            time.sleep(_VISIBLE_POLL_S)
        return names

    def _ready(self, partitions: dict[str, int]) -> bool:
        """Whether clients see each partition of ``partitions``' topics with a leader that answers.

        ``partitions``: the number of partitions of each topic, by name. The metadata names a
        leader before the broker has made the partition's log; until it has, offset queries
        fail with NOT_LEADER_FOR_PARTITION, and the connectors retry them, once with
        librdkafka's backoff of up to seconds.
        """
        topics = self.admin.list_topics(timeout=_TIMEOUT_S).topics
        for name, count in partitions.items():
            topic = topics.get(name)
            if topic is None or topic.error is not None or len(topic.partitions) != count:
                return False
            if any(partition.leader < 0 for partition in topic.partitions.values()):
                return False
        futures = self.admin.list_offsets(
            {
                TopicPartition(name, p): OffsetSpec.latest()
                for name, count in partitions.items()
                for p in range(count)
            },
            request_timeout=_TIMEOUT_S,
        )
        concurrent.futures.wait(list(futures.values()))
        return all(future.exception() is None for future in futures.values())

    def release(self, *names: str) -> None:
        """Delete ``names`` (those that exist) with the next batch."""
        self._used.extend(names)
        if len(self._used) >= _BATCH:
            self.delete_released()

    def delete_released(self, timeout_s: float = _TIMEOUT_S) -> None:
        """Delete the released topics now (those that exist).

        Waits for the answers: a callback still pending when the admin client is garbage
        collected would run in the client's own thread, and librdkafka aborts the process
        when a client is destroyed from its own thread.

        :raises KafkaException: when the brokers cannot be asked.
        """
        doomed, self._used = self._used, []
        existing = self.admin.list_topics(timeout=timeout_s).topics
        doomed = [name for name in doomed if name in existing]
        if doomed:
            futures = self.admin.delete_topics(
                doomed, operation_timeout=timeout_s, request_timeout=timeout_s
            )
            concurrent.futures.wait(list(futures.values()), timeout=timeout_s * 2)

    def close(self) -> None:
        """Delete the released topics and those made ahead but never handed out."""
        for (_, with_epochs_topic), names in self._fresh.items():
            self._used.extend(names)
            if with_epochs_topic:
                self._used.extend(default_epochs_topic(name) for name in names)
        self._fresh.clear()
        if self._producer is not None:
            self._producer.flush(_TIMEOUT_S)
            self._producer = None
        if self._used:
            # Only while the brokers answer: at exit they may be gone already.
            with contextlib.suppress(KafkaException):
                self.admin.list_topics(timeout=_EXIT_PROBE_S)
                self.delete_released()

    def producer(self) -> Producer:
        """An idempotent producer shared by the contexts of this cluster."""
        if self._producer is None:
            self._producer = Producer(
                {
                    **CLIENT_DEFAULTS,
                    "bootstrap.servers": self.bootstrap,
                    "enable.idempotence": True,
                    "linger.ms": 1,
                    "logger": LIBRDKAFKA_LOGGER,
                }
            )
            # Connected before the first append: an idempotent producer without a broker
            # connection asks for its producer id only after 500 ms.
            self._producer.list_topics(timeout=_TIMEOUT_S)
        return self._producer


_pools: dict[str, _Topics] = {}


def topics(bootstrap: str) -> _Topics:
    """The topics of the contexts on ``bootstrap``; those left are deleted at exit."""
    pool = _pools.get(bootstrap)
    if pool is None:
        pool = _pools[bootstrap] = _Topics(bootstrap)
        atexit.register(pool.close)  # runs before the broker (registered earlier) stops
    return pool


def release_topics() -> None:
    """Delete every topic the contexts of this process made; call before the brokers stop."""
    while _pools:
        _, pool = _pools.popitem()
        atexit.unregister(pool.close)
        pool.close()


class _CommittedReader:
    """Reads a topic as a ``read_committed`` consumer would, picking up where it left off."""

    def __init__(self, pool: _Topics, topic: str, partitions: int) -> None:
        self._pool = pool
        self._consumer = Consumer(
            {
                **CLIENT_DEFAULTS,
                "bootstrap.servers": pool.bootstrap,
                "group.id": f"laminar-conformance-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
                "logger": LIBRDKAFKA_LOGGER,
            }
        )
        self._keys: list[PartitionKey] = [(topic, p) for p in range(partitions)]
        know_leaders(pool.settings, self._consumer, {topic})
        self._consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in self._keys])
        self._positions = dict.fromkeys(self._keys, 0)
        self._values: list[bytes | None] = []

    def values(self) -> list[bytes | None]:
        """Every committed value so far, partition by partition in the order read.

        Reads until each partition's position reaches its last stable offset as asked now,
        keeping whatever else the consumer returns (all committed): the consumer lives on
        from call to call, so a record it returned is never dropped.

        :raises ReadError: when no progress is made within the timeout.
        """
        # Asked of the admin client: the consumer's connection is busy with its fetches,
        # which the broker answers first (up to fetch.wait.max.ms each).
        ends = latest_offsets(
            self._pool.settings,
            self._pool.admin,
            self._keys,
            IsolationLevel.READ_COMMITTED,
            ReadError,
        )
        idle_since = time.monotonic()
        restarter = FetchRestarter(self._positions, ends)
        while any(self._positions[key] < end for key, end in ends.items()):
            for message in consume_ready(self._consumer, 10_000, _VISIBLE_POLL_S):
                key = (message.topic() or "", message.partition() or 0)
                offset = message.offset() or 0
                error = message.error()
                if key not in self._positions:
                    continue
                if error is None:
                    self._values.append(message.value())
                    offset += 1
                elif error.code() != KafkaError._PARTITION_EOF:
                    raise_for_consumer_error(self._pool.settings, error, key)
                    continue
                self._positions[key] = max(self._positions[key], offset)
                idle_since = time.monotonic()
            restarter.restart_if_stalled(self._consumer)
            if time.monotonic() - idle_since > _TIMEOUT_S:
                behind = {
                    k: (self._positions[k], e) for k, e in ends.items() if self._positions[k] < e
                }
                raise ReadError(
                    f"{_CONTEXT}: read_committed reading stopped short of the last stable "
                    f"offsets for {_TIMEOUT_S:g}s ((position, end) by partition): {behind}"
                )
        return list(self._values)

    def close(self) -> None:
        self._consumer.close()


class _ThroughAProxy:
    """What the kit's network-fault checks need of a context.

    The broker's proxied listener, and a configuration bootstrapped through the proxy, with
    5 s timeouts.
    """

    NETWORK_TIMEOUT_KEYS: ClassVar[tuple[str, ...]] = ("timeout.ms",)
    """The connector's keys set to :data:`NETWORK_TIMEOUT_MS` behind the proxy."""

    def config(self) -> ConnectorConfig:
        """The connector's configuration (each context's own)."""
        raise NotImplementedError

    @property
    def network_endpoint(self) -> str | None:
        """The cluster's listener that advertises :attr:`network_proxy_listen`.

        ``None`` for a cluster without one (``KafkaService.proxied``).
        """
        proxied = shared_service().proxied
        return None if proxied is None else proxied[0]

    @property
    def network_proxy_listen(self) -> str | None:
        """Where the proxy must listen: the address the listener tells clients to connect to."""
        proxied = shared_service().proxied
        return None if proxied is None else proxied[1]

    def config_through(self, address: str) -> ConnectorConfig:
        """:meth:`config`, bootstrapped at ``address``, with 5 s timeouts."""
        config = self.config()
        timeouts = {key: str(NETWORK_TIMEOUT_MS) for key in self.NETWORK_TIMEOUT_KEYS}
        return ConnectorConfig(
            config.connector_type, {**config.properties, "bootstrap.servers": address, **timeouts}
        )


class KafkaSinkContext(_ThroughAProxy):
    """The ``kafka`` sink (exactly-once) writing to a fresh two-partition topic.

    :param workdir: where the sink stages pre-committed epochs.
    """

    NETWORK_TIMEOUT_KEYS = ("timeout.ms", "flush.timeout.ms")

    def __init__(self, workdir: Path) -> None:
        self._topics = topics(shared_bootstrap_servers())
        self._topic = self._topics.take(_SINK_PARTITIONS, with_epochs_topic=True)
        self._staging = workdir / "staging"
        self._reader = _CommittedReader(self._topics, self._topic, _SINK_PARTITIONS)

    def config(self) -> ConnectorConfig:
        """The sink writing this context's topic, staging in the work directory."""
        return ConnectorConfig(
            "kafka",
            {
                "bootstrap.servers": self._topics.bootstrap,
                "topic": self._topic,
                "staging.dir": str(self._staging),
                "kafka.linger.ms": "1",
            },
        )

    def batch(self, ids: Sequence[int]) -> pa.RecordBatch:
        """Key and value: each id as decimal text."""
        text = pa.array([str(record).encode() for record in ids], pa.binary())
        return pa.RecordBatch.from_arrays([text, text], schema=SINK_SCHEMA)

    def committed_ids(self) -> list[int]:
        """The ids a ``read_committed`` consumer of the topic sees."""
        return [int(value or b"-1") for value in self._reader.values()]

    def close(self) -> None:
        """Stop reading; the topic and the sink's epochs topic are deleted (in a batch)."""
        self._reader.close()
        with contextlib.suppress(KafkaException):
            self._topics.release(self._topic, default_epochs_topic(self._topic))


class KafkaSourceContext(_ThroughAProxy):
    """The ``kafka`` source reading a fresh topic that grows to three partitions.

    The topic starts with two partitions; the first record appended to the third increases
    the topic's partitions, as an operator would: a partition the kit writes first while a
    source runs (``test_a_partition_that_appears_while_reading_is_read_from_its_beginning``)
    is one the source has never seen.
    """

    partitions = 3
    poll_timeout_s = 10.0
    """How long the kit waits for records it appended to be returned."""
    live_appends = True
    """Records appended while a source runs reach it (Kafka is a stream)."""
    skip_checks: ClassVar[Mapping[str, str]] = {
        "partition-removal": "a Kafka topic's partitions can be added, never removed"
    }

    def __init__(self) -> None:
        self._topics = topics(shared_bootstrap_servers())
        self._partitions = self.partitions - 1
        self._topic = self._topics.take(self._partitions)
        self._producer = self._topics.producer()

    def config(self) -> ConnectorConfig:
        """The source reading this context's topic from its start."""
        return ConnectorConfig(
            "kafka",
            {
                "bootstrap.servers": self._topics.bootstrap,
                "topic": self._topic,
                "kafka.fetch.wait.max.ms": "10",
            },
        )

    def append(self, ids: Sequence[int], partition: int | None = None) -> None:
        """Produce one record per id to ``partition``, and wait until all are acknowledged.

        :raises RuntimeError: when the broker does not acknowledge them in time.
        """
        partition = partition or 0
        if partition >= self._partitions:
            self._grow(partition)
        for record in ids:
            text = str(record).encode()
            self._producer.produce(self._topic, text, text, partition)
        if self._producer.flush(_TIMEOUT_S):
            raise RuntimeError(f"{_CONTEXT}: records to {self._topic} not acknowledged")

    def _grow(self, partition: int) -> None:
        """Increase the topic's partitions to hold ``partition``, known to the producer."""
        count = partition + 1
        increase = NewPartitions(self._topic, count)
        for future in self._topics.admin.create_partitions([increase]).values():
            future.result(timeout=_TIMEOUT_S)
        # The producer learns of the new partition from the metadata it asks for; records
        # it sends before the partition's leader is ready, it retries.
        deadline = time.monotonic() + _TIMEOUT_S
        while (
            len(self._producer.list_topics(self._topic, _TIMEOUT_S).topics[self._topic].partitions)
            < count
        ):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{_CONTEXT}: partition {partition} of {self._topic} never appeared"
                )
            time.sleep(_VISIBLE_POLL_S)
        self._partitions = count

    @staticmethod
    def ids(records: pa.RecordBatch) -> list[int]:
        """The ``value`` column, as integers.

        Static: the kit ships it to Spark's executors, which cannot take the clients.
        """
        return [int(value) for value in records.column("value").to_pylist()]

    def close(self) -> None:
        """The topic is deleted (in a batch)."""
        with contextlib.suppress(KafkaException):
            self._topics.release(self._topic)
