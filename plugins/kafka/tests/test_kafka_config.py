"""Configuration of the ``kafka`` connectors: clear errors, bounded waits, secrets kept secret."""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import pyarrow as pa
import pytest
from laminar_sdk import (
    ConfigurationError,
    ConnectionFailed,
    ConnectorConfig,
    ConnectorRole,
    SchemaMismatch,
)
from laminar_sdk._cli.main import main

from laminar_plugin_kafka._client import LIBRDKAFKA_LOGGER, client_config
from laminar_plugin_kafka._config import ClientSettings, sink_settings
from laminar_plugin_kafka._sink import _Deliveries, _producer_config

SECRET = "hunter2-not-for-logs"


def closed_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"127.0.0.1:{port}"


def open_connector(registry, role: str, properties: dict[str, str]):
    async def scenario():
        if role == "source":
            connector, _ = await registry.open_source("kafka", properties)
        else:
            connector, _ = await registry.open_sink("kafka", properties)
        await connector.close()

    asyncio.run(scenario())


def source_properties(bootstrap: str, **extra: str) -> dict[str, str]:
    return {"bootstrap.servers": bootstrap, "topic": "anything", **extra}


def sink_properties(bootstrap: str, tmp_path, **extra: str) -> dict[str, str]:
    return {
        "bootstrap.servers": bootstrap,
        "topic": "anything",
        "staging.dir": str(tmp_path),
        **extra,
    }


@pytest.mark.parametrize(
    ("role", "delivery"),
    [("source", None), ("sink", "exactly-once"), ("sink", "at-least-once")],
)
def test_an_unreachable_broker_is_connection_failed_naming_it_within_the_bound(
    registry, tmp_path, caplog, role, delivery
):
    bootstrap = closed_port()
    secrets = {"kafka.sasl.password": SECRET, "kafka.sasl.username": "user"}
    if role == "source":
        properties = source_properties(bootstrap, **{"timeout.ms": "3000"}, **secrets)
    else:
        properties = sink_properties(
            bootstrap, tmp_path, delivery=delivery, **{"timeout.ms": "3000"}, **secrets
        )
    properties["kafka.security.protocol"] = "SASL_PLAINTEXT"
    properties["kafka.sasl.mechanism"] = "PLAIN"
    started = time.monotonic()
    with caplog.at_level(logging.DEBUG), pytest.raises(ConnectionFailed) as caught:
        open_connector(registry, role, properties)
    elapsed = time.monotonic() - started
    assert elapsed < 10, f"gave up after {elapsed:.1f}s"
    message = str(caught.value)
    assert f"bootstrap.servers={bootstrap}" in message
    assert "did not answer within 3s" in message
    assert SECRET not in message
    assert SECRET not in caplog.text


def test_secret_keys_are_redacted_everywhere_the_config_is_shown(registry, tmp_path):
    spec = registry.get("kafka", ConnectorRole.SINK)
    config = spec.configure(
        sink_properties(
            "broker:9092",
            tmp_path,
            **{
                "kafka.sasl.password": SECRET,
                "kafka.ssl.key.password": SECRET + "-2",
                "kafka.ssl.key.pem": SECRET + "-3",
                "kafka.sasl.oauthbearer.config": f"clientSecret={SECRET}-4",
            },
        )
    )
    for shown in (repr(config), str(config), str(config.redacted())):
        assert SECRET not in shown
        assert "***" in shown
    assert config.require("kafka.sasl.password") == SECRET, "the connector itself can read it"


@pytest.mark.parametrize(
    ("properties", "key", "message"),
    [
        ({"topic": "t", "topics": "u"}, "topic", "exactly one of topic, topics"),
        ({}, "topic", "exactly one of topic, topics"),
        ({"topic": "t", "consumer.mode": "subscribe"}, "group.id", "needs group.id"),
        ({"topic": "t", "start.offset": "middle"}, "start.offset", "earliest, latest"),
        ({"topic": "t", "value.format": "json"}, "value.schema", "needs value.schema"),
        (
            {"topic": "t", "value.format": "json", "value.schema": "id integer"},
            "value.schema",
            "unknown type 'integer'",
        ),
        ({"topic": "t", "topic.pattern": "("}, "topic", "exactly one of"),
        ({"topic.pattern": "("}, "topic.pattern", "not a regular expression"),
        ({"topic": "t", "kafka.enable.auto.commit": "true"}, "kafka.enable.auto.commit", "group"),
        ({"topic": "t", "kafka.no.such.setting": "1"}, "kafka.no.such.setting", "refuses"),
        ({"topic": "t", "batch.size": "0"}, "batch.size", "positive integer"),
    ],
)
def test_bad_source_configuration_names_the_key(registry, properties, key, message):
    with pytest.raises(ConfigurationError, match=message) as caught:
        open_connector(registry, "source", {"bootstrap.servers": "127.0.0.1:1", **properties})
    assert caught.value.key == key


@pytest.mark.parametrize(
    ("properties", "key", "message"),
    [
        ({"staging.dir": None}, "staging.dir", "Set staging.dir"),
        ({"delivery": "twice"}, "delivery", "unknown delivery guarantee"),
        ({"sink.id": "a/b"}, "sink.id", "letters, digits"),
        ({"kafka.transactional.id": "x"}, "kafka.transactional.id", "use sink.id instead"),
        ({"schema": "id int64"}, "key.column", "not a column"),
        ({"schema": "key binary, value int64"}, "value.column", "binary or string"),
        ({"partition.column": "value"}, "partition.column", "integer column"),
        ({"schema": "key binary, key binary, value binary"}, "schema", "repeats"),
    ],
)
def test_bad_sink_configuration_names_the_key(registry, tmp_path, properties, key, message):
    merged = {**sink_properties("127.0.0.1:1", tmp_path), **properties}
    given = {name: value for name, value in merged.items() if value is not None}
    with pytest.raises(ConfigurationError, match=message) as caught:
        open_connector(registry, "sink", given)
    assert caught.value.key == key


@pytest.mark.parametrize("role", ["source", "sink"])
def test_a_topic_that_does_not_exist_is_a_configuration_error(kafka, registry, tmp_path, role):
    properties = (
        source_properties(kafka.bootstrap, topic="no-such-topic-here")
        if role == "source"
        else sink_properties(kafka.bootstrap, tmp_path, topic="no-such-topic-here")
    )
    with pytest.raises(ConfigurationError, match="'no-such-topic-here'.*does not exist") as caught:
        open_connector(registry, role, properties)
    assert caught.value.key == "topic"


def test_the_sink_refuses_a_batch_of_another_schema_by_name(kafka, registry, tmp_path):
    topic = kafka.topic()

    async def scenario():
        sink, _ = await registry.open_sink(
            "kafka", sink_properties(kafka.bootstrap, tmp_path, topic=topic)
        )
        await sink.begin_epoch(0)
        wrong = pa.record_batch([pa.array([1])], names=["id"])
        with pytest.raises(SchemaMismatch, match="is not the configured schema"):
            await sink.write_batch(wrong)
        await sink.rollback_epoch(0)
        await sink.close()

    asyncio.run(scenario())


def test_the_plugin_registers_both_connectors_with_kafka_pass_through(registry):
    for role in (ConnectorRole.SOURCE, ConnectorRole.SINK):
        spec = registry.get("kafka", role)
        assert spec.distribution == "laminar-plugin-kafka"
        assert spec.config_prefixes == ("kafka.",)


def test_every_client_connects_promptly_unless_a_kafka_key_says_otherwise():
    # librdkafka waits half of reconnect.backoff.ms before its first connection to a learned
    # broker; its default (100 ms) cost every client the connectors open ~50 ms.
    settings = ClientSettings("kafka sink", "localhost:9092", {}, (), 10.0)
    assert client_config(settings, {}, {})["reconnect.backoff.ms"] == 20
    chosen = ClientSettings("kafka sink", "localhost:9092", {"reconnect.backoff.ms": "250"}, (), 1)
    assert client_config(chosen, {}, {})["reconnect.backoff.ms"] == "250"


def test_the_producer_has_room_for_a_whole_epoch_unless_a_kafka_key_says_otherwise():
    # An epoch is flushed at pre_commit: with librdkafka's 100000-record queue, producing a
    # larger epoch stalled on the brokers' acknowledgements midway.
    def queue_bound(config: dict[str, str]) -> object:
        settings = sink_settings(
            ConnectorConfig(
                "kafka", {"bootstrap.servers": "b:9092", "topic": "t", "staging.dir": "s", **config}
            )
        )
        return _producer_config(settings, _Deliveries())["queue.buffering.max.messages"]

    assert queue_bound({}) == 1_000_000
    assert queue_bound({"kafka.queue.buffering.max.messages": "5000"}) == "5000"


def test_librdkafka_notes_about_keys_for_the_other_kind_of_client_are_dropped(caplog):
    # The connectors hand the same kafka.* keys to each client they make, on purpose.
    with caplog.at_level(logging.WARNING, LIBRDKAFKA_LOGGER.name):
        LIBRDKAFKA_LOGGER.warning(
            "CONFWARN [rdkafka#consumer-1] [thrd:app]: Configuration property linger.ms is a "
            "producer property and will be ignored by this consumer instance"
        )
        LIBRDKAFKA_LOGGER.warning("FAIL [rdkafka#producer-1] [thrd:main]: Connection refused")
    assert [record.getMessage()[:4] for record in caplog.records] == ["FAIL"]


def test_run_check_connect_names_an_unreachable_broker_as_the_run_would(tmp_path, capsys):
    # `laminar run --check` cannot know; `--connect` opens the source and gets the run's error.
    bootstrap = closed_port()
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(
        f'[source]\nconnector = "kafka"\n"bootstrap.servers" = "{bootstrap}"\ntopic = "t"\n'
        f'"timeout.ms" = 2000\n"kafka.sasl.password" = "{SECRET}"\n\n'
        '[sink]\nconnector = "memory"\npath = "out"\n\n[pipeline]\ncheckpoint_location = "s"\n'
    )
    assert main(["run", "--check", str(pipeline)]) == 0
    assert main(["run", "--check", "--connect", str(pipeline)]) == 2
    shown = capsys.readouterr()
    expected = (
        "laminar: error: kafka source: cannot read the cluster's metadata: the brokers at "
        f"bootstrap.servers={bootstrap} did not answer within 2s"
    )
    assert expected in shown.err, shown.err
    assert SECRET not in shown.out + shown.err
