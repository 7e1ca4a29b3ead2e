"""Kafka clients built from connector settings, and what they raise, as SDK errors."""

from __future__ import annotations

import bisect
import concurrent.futures
import contextlib
import logging
import re
import time
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ClusterMetadata, OffsetSpec, TopicMetadata
from laminar_sdk import (
    CheckpointError,
    ConfigurationError,
    ConnectionFailed,
    ConnectorError,
    ReadError,
)

from laminar_plugin_kafka._config import PASSTHROUGH_PREFIX, ClientSettings

LIBRDKAFKA_LOGGER = logging.getLogger("laminar_plugin_kafka.librdkafka")
"""Where librdkafka's own log lines go (instead of standard error)."""


class _SharedKeysFilter(logging.Filter):
    """Drops librdkafka's note that a key is for the other kind of client.

    A connector hands the same ``kafka.*`` keys to each client it makes (the sink reads its
    epoch markers with a consumer, say), so ``kafka.linger.ms`` on a sink is not a mistake.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("CONFWARN" in message and "property and will be ignored by this" in message)


LIBRDKAFKA_LOGGER.addFilter(_SharedKeysFilter())

CLIENT_DEFAULTS: Mapping[str, object] = {"reconnect.backoff.ms": 20}
"""Librdkafka settings of every client, unless a ``kafka.*`` key sets them.

``reconnect.backoff.ms`` (librdkafka: 100) also spaces a new client's connections: having
learned the brokers from the bootstrap server, it connects to them only after half of it.
The connectors open clients for every epoch on Spark, and at every restart, so the default
cost 50 ms per client; 20 ms costs about 10 ms. It still grows exponentially while a broker
stays unreachable (``reconnect.backoff.max.ms``)."""

PartitionKey = tuple[str, int]
"""A partition: its topic and number."""

_UNREACHABLE = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError._RESOLVE,
        KafkaError._AUTHENTICATION,
        KafkaError._SSL,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.BROKER_NOT_AVAILABLE,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.NOT_COORDINATOR,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
    }
)
# Leadership moving (a broker restarted, a topic was just created): ask again.
_MOVING = frozenset(
    {
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError._NOENT,
    }
)
# An offsets query names a partition the asking client's metadata does not hold yet (a topic
# just created, seen first by another client): ask again (reading the metadata again) until
# the timeout, after which the partition is taken as really unknown.
_NOT_YET_KNOWN = frozenset({KafkaError._UNKNOWN_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART})
_GONE = frozenset({KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE})
_PROPERTY = re.compile(r'(?:property:?|for) "([^"]+)"')
_IDLE_POLL_S = 0.05
_REFETCH_AFTER_S = 2.0
"""How long a reading that is behind its ends waits for progress before fetching again."""


@contextlib.contextmanager
def fatal_errors_unwrapped() -> Iterator[None]:
    """Raise a fatal client error as the :class:`KafkaException` it is.

    confluent-kafka reports a fatal error (a fenced producer, say) that happens while it serves
    callbacks — in ``flush``, ``poll`` or a transaction call — as a ``SystemError`` caused by
    the ``KafkaException``.
    """
    try:
        yield
    except SystemError as error:
        if isinstance(error.__cause__, KafkaException):
            raise error.__cause__ from None
        raise


def partition_key(key: PartitionKey) -> str:
    """``topic/partition``: how a partition is named in checkpoints and batches."""
    return f"{key[0]}/{key[1]}"


def parse_partition_key(connector: str, text: str) -> PartitionKey:
    """The partition a checkpoint names ``topic/partition``.

    :raises CheckpointError: when ``text`` is not of that form.
    """
    topic, _, number = text.rpartition("/")
    if not topic or not (number.isascii() and number.isdecimal()):
        raise CheckpointError(
            f"{connector}: checkpoint partition {text!r} is not 'topic/partition'; was the "
            "checkpoint written by another connector?"
        )
    return topic, int(number)


def parse_offset(connector: str, partition: str, text: str) -> int:
    """A checkpoint offset: the next offset to read in ``partition``.

    :raises CheckpointError: when ``text`` is not a non-negative decimal integer.
    """
    if not (text.isascii() and text.isdecimal()):
        raise CheckpointError(
            f"{connector}: checkpoint offset of {partition} must be a decimal offset, got {text!r}"
        )
    return int(text)


def kafka_error(error: BaseException) -> KafkaError | None:
    """The :class:`KafkaError` a client exception carries, if any."""
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
        return error.args[0]
    return None


def describe(settings: ClientSettings, error: BaseException | KafkaError) -> str:
    """A one-line description of a client error, without secrets."""
    found = error if isinstance(error, KafkaError) else kafka_error(error)
    text = f"{found.name()}: {found.str()}" if found is not None else str(error)
    return settings.scrub(text)


def is_unreachable(error: BaseException | KafkaError) -> bool:
    """Whether ``error`` says the brokers could not be reached (or answered too late)."""
    found = error if isinstance(error, KafkaError) else kafka_error(error)
    return found is not None and found.code() in _UNREACHABLE


def is_transient(error: KafkaError) -> bool:
    """Whether asking again may succeed: the client says so, or brokers or leaders move.

    (``_NOENT`` from an offsets query means no leader is known for a partition yet.)
    """
    return error.retriable() or error.code() in _UNREACHABLE or error.code() in _MOVING


def unreachable(settings: ClientSettings, what: str, error: BaseException) -> ConnectionFailed:
    """:class:`ConnectionFailed` for ``what`` failing because the brokers did not answer."""
    return ConnectionFailed(
        f"{settings.connector}: cannot {what}: the brokers at bootstrap.servers="
        f"{settings.bootstrap_servers} did not answer within {settings.timeout_s:g}s "
        f"({describe(settings, error)}); check the address, that the brokers run, and the "
        f"{PASSTHROUGH_PREFIX}security.protocol / sasl / ssl settings"
    )


def client_error(
    settings: ClientSettings,
    what: str,
    error: BaseException,
    otherwise: type[ConnectorError],
) -> ConnectorError:
    """The SDK error for ``what`` failing with ``error``: unreachable brokers, or ``otherwise``."""
    if is_unreachable(error):
        return unreachable(settings, what, error)
    return otherwise(f"{settings.connector}: cannot {what}: {describe(settings, error)}")


def _configuration_error(
    settings: ClientSettings, role: str, error: KafkaException
) -> ConfigurationError:
    text = describe(settings, error)
    match = _PROPERTY.search(text)
    key = None
    if match and match[1] in settings.passthrough:
        key = PASSTHROUGH_PREFIX + match[1]
    return ConfigurationError(
        f"{settings.connector}: the Kafka {role} refuses the configuration: {text}; check the "
        f"{PASSTHROUGH_PREFIX}* keys against librdkafka's CONFIGURATION.md",
        key=key,
    )


def client_config(
    settings: ClientSettings, defaults: Mapping[str, object], managed: Mapping[str, object]
) -> dict[str, Any]:
    """Librdkafka settings: :data:`CLIENT_DEFAULTS`, ``defaults``, ``kafka.*``, ``managed``."""
    return {
        **CLIENT_DEFAULTS,
        **defaults,
        **settings.passthrough,
        "bootstrap.servers": settings.bootstrap_servers,
        **managed,
        "logger": LIBRDKAFKA_LOGGER,
    }


def new_consumer(settings: ClientSettings, config: dict[str, Any]) -> Consumer:
    """A consumer of ``config``.

    :raises ConfigurationError: when librdkafka refuses a setting.
    """
    try:
        return Consumer(config)
    except KafkaException as error:
        raise _configuration_error(settings, "consumer", error) from error


def new_producer(settings: ClientSettings, config: dict[str, Any]) -> Producer:
    """A producer of ``config``.

    :raises ConfigurationError: when librdkafka refuses a setting.
    """
    try:
        return Producer(config)
    except KafkaException as error:
        raise _configuration_error(settings, "producer", error) from error


def new_admin(settings: ClientSettings, topics: set[str]) -> AdminClient:
    """An admin client for the brokers of ``settings``, knowing ``topics``' leaders.

    With ``topics`` named, it has asked for their metadata (and so is connected) before it is
    handed out: an offset query made while a new client is between the bootstrap server and
    the broker it learned of finds no broker to ask for the leaders and waits for
    librdkafka's one-second timer (seen with librdkafka 2.16: one, sometimes three seconds).
    With none, nothing is asked.

    Blocking: call it in a worker thread.

    :raises ConfigurationError: when librdkafka refuses a setting.
    """
    try:
        admin = AdminClient(client_config(settings, {}, {}))
    except KafkaException as error:
        raise _configuration_error(settings, "admin client", error) from error
    know_leaders(settings, admin, topics)
    return admin


def consume_ready(consumer: Consumer, count: int, wait_s: float) -> list[Message]:
    """Up to ``count`` records and events: as soon as there is one, all that are there then.

    ``Consumer.consume(count, wait_s)`` returns early only once it has ``count`` messages, so
    a call that gets fewer always waits all of ``wait_s``. Here the wait ends with the first
    message (``poll``), and the rest of what the client has fetched comes without waiting.

    Blocking: call it in a worker thread.
    """
    first = consumer.poll(wait_s)
    if first is None:
        return []
    if count <= 1:
        return [first]
    return [first, *consumer.consume(count - 1, 0)]


class FetchRestarter:
    """Restarts the fetching of partitions whose reading stalls short of their ends.

    librdkafka reports a partition's end (EOF) once per end offset it reaches; a read that
    missed that report (a partition ending in transaction markers only, which no record
    reveals) would wait for its timeout although nothing is left to read. Seeking a stalled
    partition to the position already reached fetches it again from there and reports its
    end anew; nothing is read twice, as the position is the next offset not yet taken.

    :param positions: where the reading stands, moved on by the reader (positions only grow).
    :param ends: where each partition's reading ends.
    """

    def __init__(
        self, positions: Mapping[PartitionKey, int], ends: Mapping[PartitionKey, int]
    ) -> None:
        self._positions = positions
        self._ends = ends
        self._reached = self._progress()
        self._since = time.monotonic()

    def _progress(self) -> int:
        return sum(self._positions[key] for key in self._ends)

    def restart_if_stalled(self, consumer: Consumer) -> None:
        """Fetch again the partitions behind their ends, when no position moved for a while.

        Call it after each fetch. Blocking: call it in a worker thread.
        """
        reached = self._progress()
        if reached != self._reached:
            self._reached, self._since = reached, time.monotonic()
            return
        if time.monotonic() - self._since < _REFETCH_AFTER_S:
            return
        for (topic, partition), end in self._ends.items():
            position = self._positions[topic, partition]
            if position < end:
                consumer.seek(TopicPartition(topic, partition, position))
        self._since = time.monotonic()


def require_topic(
    settings: ClientSettings, metadata: ClusterMetadata, name: str, *, action: str, key: str
) -> TopicMetadata:
    """Topic ``name`` in ``metadata``, checked to exist without an error.

    :raises ConfigurationError: on ``key``, saying the connector cannot ``action`` the topic.
    """
    topic = metadata.topics.get(name)
    problem = None if topic is None else topic.error
    if topic is None or problem is not None:
        reason = "it does not exist" if problem is None else describe(settings, problem)
        raise ConfigurationError(
            f"{settings.connector}: cannot {action} topic {name!r} at bootstrap.servers="
            f"{settings.bootstrap_servers}: {reason}; create it or fix the name",
            key=key,
        )
    return topic


def know_leaders(
    settings: ClientSettings, client: Consumer | Producer | AdminClient, topics: set[str]
) -> None:
    """Ask for ``topics``' metadata, so the client knows their partitions' leaders.

    A consumer assigned a logical offset (beginning, end) before it knows the partition's
    leader looks the offset up only after a fixed 500 ms; a transactional producer that has
    no broker connection yet looks for its coordinator only after 500 ms. Asking first costs
    one round trip. Failures are left to the call that follows, which reports them.

    Blocking: call it in a worker thread.
    """
    with contextlib.suppress(KafkaException):
        for topic in sorted(topics):
            client.list_topics(topic, timeout=settings.timeout_s)


def read_until(
    settings: ClientSettings,
    consumer: Consumer,
    positions: MutableMapping[PartitionKey, int],
    ends: Mapping[PartitionKey, int],
    *,
    batch_size: int,
) -> Iterator[list[Message]]:
    """Read the assigned partitions until each one's position reaches its end offset.

    Blocking: call it in a worker thread. ``positions`` holds where each partition's reading
    starts and is moved on as records are read. Offsets are not dense (transaction markers
    and aborted records take offsets and are never returned), so a partition is done when a
    record at or past its end arrives, or the client reports the partition's end (EOF) at or
    past it — never by counting records. Records at or past the end are dropped. Each chunk
    holds what one ``consume`` call returned (at most ``batch_size`` records).

    :raises ReadError: when records are gone (deleted or truncated), on a fatal error, or
        when no progress is made within the settings' timeout.
    """
    # With one partition assigned, every record is of that partition and arrives in offset
    # order: a chunk is cut at the end offset without reading each record's partition.
    only = next(iter(ends)) if len(ends) == 1 else None
    if only is not None and {(p.topic, p.partition) for p in consumer.assignment()} != {only}:
        only = None
    idle_since = time.monotonic()
    restarter = FetchRestarter(positions, ends)
    while any(positions[key] < end for key, end in ends.items()):
        messages = consume_ready(consumer, batch_size, _IDLE_POLL_S)
        records = [message for message in messages if message.error() is None]
        if only is None:
            chunk = _records_before_ends(records, positions, ends)
        else:
            chunk = _records_before_end(records, positions, only, ends[only])
        if len(records) != len(messages):
            # After the records: an end of partition is reported after the records before it.
            _absorb_events(settings, messages, positions)
        if records and chunk is not None:
            idle_since = time.monotonic()
        restarter.restart_if_stalled(consumer)
        if chunk:
            yield chunk
        elif time.monotonic() - idle_since > settings.timeout_s:
            behind = {
                partition_key(k): (positions[k], e) for k, e in ends.items() if positions[k] < e
            }
            raise ReadError(
                f"{settings.connector}: reading stopped short of the planned end offsets for "
                f"{settings.timeout_s:g}s (partition: (position, end)) {behind}; the brokers "
                "may be unreachable, or the records were truncated"
            )


def _absorb_events(
    settings: ClientSettings,
    messages: list[Message],
    positions: MutableMapping[PartitionKey, int],
) -> None:
    """Move positions on to the ends of partitions reported; raise for the errors that must."""
    for message in messages:
        error = message.error()
        if error is None:
            continue
        key = (message.topic() or "", message.partition() or 0)
        if error.code() == KafkaError._PARTITION_EOF:
            positions[key] = max(positions.get(key, 0), message.offset() or 0)
        else:
            raise_for_consumer_error(settings, error, key)


def _records_before_end(
    records: list[Message],
    positions: MutableMapping[PartitionKey, int],
    key: PartitionKey,
    end: int,
) -> list[Message] | None:
    """The records (all of partition ``key``, in offset order) before ``end``.

    ``None`` when the partition was read to its end before these records came.
    """
    if not records or positions[key] >= end:
        return None if records else []
    offsets = list(map(Message.offset, records))
    positions[key] = max(positions[key], (offsets[-1] or 0) + 1)
    if (offsets[-1] or 0) < end:
        return records
    return records[: bisect.bisect_left(offsets, end, key=lambda offset: offset or 0)]


def _records_before_ends(
    records: list[Message],
    positions: MutableMapping[PartitionKey, int],
    ends: Mapping[PartitionKey, int],
) -> list[Message] | None:
    """The records before their partition's end, of partitions not read to their end yet.

    ``None`` when none of ``records`` is of such a partition.
    """
    chunk: list[Message] = []
    progressed = False
    for message in records:
        key = (message.topic() or "", message.partition() or 0)
        if key not in ends or positions[key] >= ends[key]:
            continue
        offset = message.offset() or 0
        if offset < ends[key]:
            chunk.append(message)
        positions[key] = max(positions[key], offset + 1)
        progressed = True
    return chunk if progressed else None


def latest_offsets(
    settings: ClientSettings,
    admin: AdminClient,
    keys: list[PartitionKey],
    level: IsolationLevel,
    otherwise: type[ConnectorError],
) -> dict[PartitionKey, int]:
    """Each partition's end for readers of ``level``, asking again while a leader is moving.

    The end is the last stable offset (read committed) or the high watermark.

    Blocking: call it in a worker thread.

    :raises ConnectionFailed: when the brokers do not answer within the timeout.
    :raises ConnectorError: ``otherwise``, when they refuse.
    """
    return _list_offsets(settings, admin, keys, level, otherwise, spec=OffsetSpec.latest())


def offset_bounds(
    settings: ClientSettings,
    admin: AdminClient,
    keys: list[PartitionKey],
    level: IsolationLevel,
    otherwise: type[ConnectorError],
) -> dict[PartitionKey, tuple[int, int]]:
    """Each partition's first offset and end for readers of ``level`` (two requests in all).

    Asked of an admin client rather than of a consumer: a consumer's broker connection
    answers a query only after the fetch in flight on it (up to ``fetch.wait.max.ms``).

    Blocking: call it in a worker thread.

    :raises ConnectionFailed: when the brokers do not answer within the timeout.
    :raises ConnectorError: ``otherwise``, when they refuse.
    """
    if not keys:
        return {}
    firsts = _list_offsets(settings, admin, keys, level, otherwise, spec=OffsetSpec.earliest())
    ends = latest_offsets(settings, admin, keys, level, otherwise)
    return {key: (firsts[key], ends[key]) for key in keys}


def _list_offsets(
    settings: ClientSettings,
    admin: AdminClient,
    keys: list[PartitionKey],
    level: IsolationLevel,
    otherwise: type[ConnectorError],
    *,
    spec: OffsetSpec,
) -> dict[PartitionKey, int]:
    requests = {TopicPartition(*key): spec for key in keys}
    deadline = time.monotonic() + settings.timeout_s
    while True:
        futures = admin.list_offsets(
            requests, isolation_level=level, request_timeout=settings.timeout_s
        )
        # Every answer before going on: a callback pending when the client is garbage
        # collected would run in its own thread, where librdkafka aborts on destruction.
        concurrent.futures.wait(list(futures.values()))
        try:
            return {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}
        except KafkaException as error:
            found = kafka_error(error)
            moving = (
                found is not None
                and not found.fatal()
                and (is_transient(found) or found.code() in _NOT_YET_KNOWN)
            )
            if not moving or time.monotonic() > deadline:
                what = "query the offsets of " + ", ".join(partition_key(k) for k in keys)
                raise client_error(settings, what, error, otherwise) from error
        time.sleep(_IDLE_POLL_S)
        # The client asks the leader it knows of, with the leader epoch it knows of: after a
        # broker restart both may be stale until it reads the topics' metadata again.
        with contextlib.suppress(KafkaException):
            for topic in sorted({topic for topic, _ in keys}):
                admin.list_topics(topic, timeout=settings.timeout_s)


def raise_for_consumer_error(
    settings: ClientSettings, error: KafkaError, key: PartitionKey
) -> None:
    """Raise for a consumer error that loses data or cannot be recovered; log the others.

    Transient errors (a broker down, a leader moving) are retried by the client itself.

    :raises ReadError: when records of ``key`` are gone, or the error is fatal.
    """
    if error.code() in _GONE:
        raise ReadError(
            f"{settings.connector}: records of {partition_key(key)} are gone: "
            f"{describe(settings, error)}. They were deleted (retention) or truncated before "
            "they were read; restore a checkpoint at or after the partition's earliest offset"
        )
    if error.fatal() or not is_transient(error):
        raise ReadError(
            f"{settings.connector}: reading {partition_key(key)} failed: "
            f"{describe(settings, error)}"
        )
    LIBRDKAFKA_LOGGER.warning("%s: %s (retrying)", settings.connector, describe(settings, error))
