"""The configuration of the Kafka connectors: declared keys, and the settings built from them.

Every key with the prefix ``kafka.`` is passed to librdkafka without the prefix
(``kafka.security.protocol=SASL_SSL`` → ``security.protocol``), except the few the connectors
manage themselves, which are refused with the key to use instead. Secret values (keys whose
names look like secrets, and the ones declared below) never appear in messages.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from laminar_sdk import (
    REDACTED,
    ConfigKeySpec,
    ConfigurationError,
    ConnectorConfig,
    DeliveryGuarantee,
    PathKind,
)
from laminar_sdk.reference import parse_schema

PASSTHROUGH_PREFIX = "kafka."
"""Keys with this prefix go to librdkafka, prefix removed."""

SOURCE_NAME = "kafka source"
SINK_NAME = "kafka sink"

# Pass-through keys holding secrets whose names the SDK does not recognise as secret.
_SECRET_PASSTHROUGH = (
    ConfigKeySpec("kafka.ssl.key.pem", secret=True, description="client private key (PEM)"),
    ConfigKeySpec(
        "kafka.sasl.oauthbearer.config",
        secret=True,
        description="OAUTHBEARER settings (may hold a client secret)",
    ),
)

_BOOTSTRAP = ConfigKeySpec(
    "bootstrap.servers", required=True, description="host:port[,host:port] of the Kafka brokers"
)
_TIMEOUT = ConfigKeySpec(
    "timeout.ms",
    default="10000",
    value_type=int,
    description="bound on connecting, metadata and transaction calls, in milliseconds",
)
_VALUE_FORMAT = ConfigKeySpec(
    "value.format",
    default="bytes",
    description="record values: 'bytes' (as they are) or 'json' (objects of value.schema)",
)
_VALUE_SCHEMA = ConfigKeySpec(
    "value.schema",
    description="with value.format=json: the value's fields, e.g. 'id int64, name string'",
)

SOURCE_KEYS: tuple[ConfigKeySpec, ...] = (
    _BOOTSTRAP,
    ConfigKeySpec("topic", description="the topic to read, or several separated by commas"),
    ConfigKeySpec("topics", description="the topics to read, separated by commas"),
    ConfigKeySpec(
        "topic.pattern", description="a regular expression: read every topic it matches fully"
    ),
    ConfigKeySpec(
        "group.id",
        description="consumer group: its offsets follow committed checkpoints (never ahead)",
    ),
    ConfigKeySpec(
        "consumer.mode",
        default="assign",
        description="'assign' (every partition, positions from checkpoints) or 'subscribe' "
        "(partitions from the consumer group; requires group.id)",
    ),
    ConfigKeySpec(
        "start.offset",
        default="earliest",
        description="where partitions absent from the checkpoint start: 'earliest' or 'latest'",
    ),
    ConfigKeySpec(
        "isolation.level",
        default="read_committed",
        description="'read_committed' (only committed transactions) or 'read_uncommitted'",
    ),
    _VALUE_FORMAT,
    _VALUE_SCHEMA,
    ConfigKeySpec(
        "batch.size",
        default="10000",
        value_type=int,
        description="the most messages taken from the client in one call",
    ),
    ConfigKeySpec(
        "poll.timeout.ms",
        default="1000",
        value_type=int,
        description="how long poll_batch waits for records before it returns none",
    ),
    _TIMEOUT,
    *_SECRET_PASSTHROUGH,
)
"""The keys the ``kafka`` source declares (plus ``kafka.*`` pass-through)."""

SINK_KEYS: tuple[ConfigKeySpec, ...] = (
    _BOOTSTRAP,
    ConfigKeySpec("topic", required=True, description="the topic to write to"),
    ConfigKeySpec(
        "delivery",
        default="exactly-once",
        description="'exactly-once' (transactions) or 'at-least-once' (idempotent producer)",
    ),
    ConfigKeySpec(
        "sink.id",
        default="laminar",
        description="names this sink's transactions (transactional.id laminar-TOPIC-SINK.ID); "
        "unique per pipeline writing to the topic, and the same across its restarts",
    ),
    ConfigKeySpec(
        "staging.dir",
        description="exactly-once: where each pre-committed epoch is kept until it is "
        "committed; default: the laminar checkpoint location (on Spark, under "
        "checkpointLocation), so a restart on any machine finds it",
        path=PathKind.MAY_CREATE,
    ),
    ConfigKeySpec(
        "schema",
        default="key binary, value binary",
        description="the columns of the batches written, e.g. 'key binary, value binary'",
    ),
    ConfigKeySpec(
        "key.column",
        default="key",
        description="the column holding record keys (empty: records without a key)",
    ),
    ConfigKeySpec(
        "value.column",
        default="value",
        description="with value.format=bytes: the column holding record values",
    ),
    ConfigKeySpec(
        "value.format",
        default="bytes",
        description="'bytes' (value.column as it is) or 'json' (each row as a JSON object)",
    ),
    ConfigKeySpec(
        "partition.column",
        description="an integer column choosing each record's partition (default: by key)",
    ),
    ConfigKeySpec(
        "epochs.topic",
        description="exactly-once: the compacted topic recording committed epochs "
        "(default TOPIC.laminar-epochs)",
    ),
    ConfigKeySpec(
        "epochs.topic.create",
        default="true",
        value_type=bool,
        description="create epochs.topic when it does not exist",
    ),
    ConfigKeySpec(
        "flush.timeout.ms",
        default="30000",
        value_type=int,
        description="how long pre_commit waits for the epoch's records to be acknowledged",
    ),
    _TIMEOUT,
    *_SECRET_PASSTHROUGH,
)
"""The keys the ``kafka`` sink declares (plus ``kafka.*`` pass-through)."""

# librdkafka settings the connectors set themselves, and the key to use instead.
_SOURCE_MANAGED = {
    "bootstrap.servers": "bootstrap.servers",
    "group.id": "group.id",
    "isolation.level": "isolation.level",
    "auto.offset.reset": "start.offset",
    "enable.auto.commit": "group.id (offsets follow committed checkpoints)",
    "enable.auto.offset.store": "group.id (offsets follow committed checkpoints)",
    "enable.partition.eof": "poll.timeout.ms",
}
_SINK_MANAGED = {
    "bootstrap.servers": "bootstrap.servers",
    "transactional.id": "sink.id",
    "enable.idempotence": "delivery",
}
_SINK_ID = re.compile(r"[A-Za-z0-9._-]+")


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """What every Kafka client of one connector is built from.

    :param connector: the connector, for messages (``kafka source``).
    :param bootstrap_servers: where the brokers are.
    :param passthrough: librdkafka settings from the ``kafka.*`` keys; may hold secrets, so
        never show it.
    :param secrets: the secret values of the configuration, removed from every message.
    :param timeout_s: the bound on connecting, metadata and transaction calls.
    """

    connector: str
    bootstrap_servers: str
    passthrough: Mapping[str, str]
    secrets: tuple[str, ...]
    timeout_s: float

    def scrub(self, text: str) -> str:
        """``text`` with every secret value of the configuration replaced by ``***``."""
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text


@dataclass(frozen=True, slots=True)
class SourceSettings:
    """The ``kafka`` source's configuration, checked.

    :param topics: topics to read (empty when ``pattern`` is given).
    :param pattern: topics to read, as a regular expression matched in full.
    :param group_id: the consumer group, when configured.
    :param subscribe: take partitions from the consumer group instead of assigning all.
    :param start_latest: partitions absent from a checkpoint start at their end.
    :param read_committed: read only committed transactional records.
    :param value_schema: decode values as JSON objects of this schema (``None``: raw bytes).
    :param batch_size: the most messages taken from the client in one call.
    :param poll_timeout_s: how long ``poll_batch`` waits for records.
    """

    client: ClientSettings
    topics: tuple[str, ...]
    pattern: re.Pattern[str] | None
    group_id: str | None
    subscribe: bool
    start_latest: bool
    read_committed: bool
    value_schema: pa.Schema | None
    batch_size: int
    poll_timeout_s: float


@dataclass(frozen=True, slots=True)
class SinkSettings:
    """The ``kafka`` sink's configuration, checked.

    :param topic: the topic written to.
    :param exactly_once: transactions (else an idempotent producer, at-least-once).
    :param transactional_id: the producer's transactional id (also its staging name).
    :param staging_dir: where pre-committed epochs are kept (exactly-once); ``None`` for the
        state store the runtime gives the sink.
    :param schema: the schema of the batches written.
    :param key_column: the column holding keys, if any.
    :param value_column: the column holding values (``None`` with JSON values).
    :param partition_column: the column choosing partitions, if any.
    :param epochs_topic: where committed epochs are recorded (exactly-once).
    :param create_epochs_topic: create ``epochs_topic`` when missing.
    :param flush_timeout_s: how long ``pre_commit`` waits for acknowledgements.
    """

    client: ClientSettings
    topic: str
    exactly_once: bool
    transactional_id: str
    staging_dir: Path | None
    schema: pa.Schema
    key_column: str | None
    value_column: str | None
    partition_column: str | None
    epochs_topic: str
    create_epochs_topic: bool
    flush_timeout_s: float


def _choice(config: ConnectorConfig, key: str, choices: tuple[str, ...]) -> str:
    value = config.require(key).strip().lower()
    if value not in choices:
        raise ConfigurationError(
            f"{config.connector_type}: {key} must be one of {', '.join(choices)}; got "
            f"{config.get(key)!r}",
            key=key,
        )
    return value


def _positive(config: ConnectorConfig, key: str) -> int:
    value = config.get_parsed(key, int)
    if value is None or value < 1:
        raise ConfigurationError(
            f"{config.connector_type}: {key} must be a positive integer, got {config.get(key)!r}",
            key=key,
        )
    return value


def _client_settings(
    config: ConnectorConfig, connector: str, managed: Mapping[str, str]
) -> ClientSettings:
    passthrough = config.properties_with_prefix(PASSTHROUGH_PREFIX)
    for name in sorted(passthrough):
        if name in managed:
            raise ConfigurationError(
                f"{connector}: {PASSTHROUGH_PREFIX}{name} is set by the connector; use "
                f"{managed[name]} instead",
                key=PASSTHROUGH_PREFIX + name,
            )
    bootstrap = config.require("bootstrap.servers").strip()
    if not bootstrap:
        raise ConfigurationError(
            f"{connector}: bootstrap.servers is empty; give host:port of a broker",
            key="bootstrap.servers",
        )
    secrets = tuple(
        value for key, value in config.properties.items() if config.is_secret(key) and value
    )
    return ClientSettings(
        connector=connector,
        bootstrap_servers=bootstrap,
        passthrough=passthrough,
        secrets=secrets,
        timeout_s=_positive(config, "timeout.ms") / 1000,
    )


def _value_schema(config: ConnectorConfig, connector: str) -> pa.Schema | None:
    value_format = _choice(config, "value.format", ("bytes", "json"))
    text = config.get("value.schema")
    if value_format == "bytes":
        if text is not None:
            raise ConfigurationError(
                f"{connector}: value.schema applies to value.format=json only; remove it or "
                "set value.format=json",
                key="value.schema",
            )
        return None
    if not text:
        raise ConfigurationError(
            f"{connector}: value.format=json needs value.schema, the value's fields "
            "(e.g. 'id int64, name string')",
            key="value.schema",
        )
    return parse_schema(text, "value.schema", connector)


def source_settings(config: ConnectorConfig) -> SourceSettings:
    """Check the ``kafka`` source's configuration.

    :raises ConfigurationError: naming the key at fault.
    """
    config = config.validate(SOURCE_KEYS, allow_prefixes=(PASSTHROUGH_PREFIX,))
    client = _client_settings(config, SOURCE_NAME, _SOURCE_MANAGED)
    given = [key for key in ("topic", "topics", "topic.pattern") if config.get(key)]
    if len(given) != 1:
        raise ConfigurationError(
            f"{SOURCE_NAME}: name what to read with exactly one of topic, topics and "
            f"topic.pattern; got {', '.join(given) or 'none'}",
            key="topic",
        )
    (key,) = given
    pattern: re.Pattern[str] | None = None
    topics: tuple[str, ...] = ()
    if key == "topic.pattern":
        try:
            pattern = re.compile(config.require(key))
        except re.error as error:
            raise ConfigurationError(
                f"{SOURCE_NAME}: topic.pattern is not a regular expression: {error}", key=key
            ) from error
    else:
        topics = tuple(sorted({t.strip() for t in config.require(key).split(",") if t.strip()}))
        if not topics:
            raise ConfigurationError(f"{SOURCE_NAME}: {key} names no topic", key=key)
    group_id = config.get("group.id") or None
    subscribe = _choice(config, "consumer.mode", ("assign", "subscribe")) == "subscribe"
    if subscribe and group_id is None:
        raise ConfigurationError(
            f"{SOURCE_NAME}: consumer.mode=subscribe needs group.id, the consumer group to join",
            key="group.id",
        )
    return SourceSettings(
        client=client,
        topics=topics,
        pattern=pattern,
        group_id=group_id,
        subscribe=subscribe,
        start_latest=_choice(config, "start.offset", ("earliest", "latest")) == "latest",
        read_committed=_choice(config, "isolation.level", ("read_committed", "read_uncommitted"))
        == "read_committed",
        value_schema=_value_schema(config, SOURCE_NAME),
        batch_size=_positive(config, "batch.size"),
        poll_timeout_s=_positive(config, "poll.timeout.ms") / 1000,
    )


def _column(schema: pa.Schema, config: ConnectorConfig, key: str) -> str | None:
    name = config.get(key, "").strip()
    if not name:
        return None
    if name not in schema.names:
        raise ConfigurationError(
            f"{SINK_NAME}: {key} {name!r} is not a column of the schema ({', '.join(schema.names)})"
            f"; name one of them{', or set it empty' if key == 'key.column' else ''}",
            key=key,
        )
    return name


def _check_binary_like(schema: pa.Schema, column: str, key: str) -> None:
    data_type = schema.field(column).type
    binary_like = (
        pa.types.is_binary(data_type)
        or pa.types.is_large_binary(data_type)
        or pa.types.is_string(data_type)
        or pa.types.is_large_string(data_type)
    )
    if not binary_like:
        raise ConfigurationError(
            f"{SINK_NAME}: {key} {column!r} has type {data_type}; values must be binary or "
            "string (or use value.format=json)",
            key=key,
        )


def sink_settings(config: ConnectorConfig) -> SinkSettings:
    """Check the ``kafka`` sink's configuration.

    :raises ConfigurationError: naming the key at fault.
    """
    config = config.validate(SINK_KEYS, allow_prefixes=(PASSTHROUGH_PREFIX,))
    client = _client_settings(config, SINK_NAME, _SINK_MANAGED)
    topic = config.require("topic").strip()
    if not topic:
        raise ConfigurationError(f"{SINK_NAME}: topic is empty", key="topic")
    exactly_once = (
        DeliveryGuarantee.parse(config.require("delivery")) is DeliveryGuarantee.EXACTLY_ONCE
    )
    sink_id = config.require("sink.id")
    if not _SINK_ID.fullmatch(sink_id):
        raise ConfigurationError(
            f"{SINK_NAME}: sink.id {sink_id!r} may hold only letters, digits, '.', '_' and '-'",
            key="sink.id",
        )
    staging = config.get("staging.dir")
    if exactly_once and not staging and config.state_store is None:
        raise ConfigurationError(
            f"{SINK_NAME}: delivery=exactly-once keeps each pre-committed epoch where a restart "
            "of the committing process finds it: in the laminar checkpoint location, which this "
            "runtime did not give the sink (on Spark it always does). Set staging.dir to a "
            "directory that survives such a restart, or delivery=at-least-once",
            key="staging.dir",
        )
    schema = parse_schema(config.require("schema"), "schema", SINK_NAME)
    key_column = _column(schema, config, "key.column")
    partition_column = _column(schema, config, "partition.column")
    if partition_column is not None and not pa.types.is_integer(
        schema.field(partition_column).type
    ):
        raise ConfigurationError(
            f"{SINK_NAME}: partition.column {partition_column!r} must be an integer column",
            key="partition.column",
        )
    value_column: str | None = None
    if _choice(config, "value.format", ("bytes", "json")) == "bytes":
        value_column = _column(schema, config, "value.column")
        if value_column is None:
            raise ConfigurationError(
                f"{SINK_NAME}: value.format=bytes needs value.column", key="value.column"
            )
        _check_binary_like(schema, value_column, "value.column")
    return SinkSettings(
        client=client,
        topic=topic,
        exactly_once=exactly_once,
        transactional_id=f"laminar-{topic}-{sink_id}",
        staging_dir=Path(staging) if exactly_once and staging else None,
        schema=schema,
        key_column=key_column,
        value_column=value_column,
        partition_column=partition_column,
        epochs_topic=config.get("epochs.topic") or default_epochs_topic(topic),
        create_epochs_topic=bool(config.get_parsed("epochs.topic.create", bool, True)),
        flush_timeout_s=_positive(config, "flush.timeout.ms") / 1000,
    )


def default_epochs_topic(topic: str) -> str:
    """The sink's ``epochs.topic`` when the key is not set: ``TOPIC.laminar-epochs``."""
    return f"{topic}.laminar-epochs"


EPOCHS_TOPIC_CONFIG: Mapping[str, str] = {
    "cleanup.policy": "compact",
    "segment.ms": "600000",
    "min.cleanable.dirty.ratio": "0.1",
}
"""How the sink creates ``epochs.topic`` when it is missing (``epochs.topic.create``): it keeps
one marker per sink (compaction) and a short uncompacted tail."""
