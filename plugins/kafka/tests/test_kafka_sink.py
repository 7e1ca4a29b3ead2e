"""The ``kafka`` sink against a real broker: transactions, restarts, fencing, records."""

from __future__ import annotations

import asyncio
import gc
import json
import tempfile
import threading

import pyarrow as pa
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from kafka_testing import CLIENT_LOGGER
from laminar_sdk import (
    CheckpointError,
    ConfigurationError,
    ConnectorRegistry,
    EpochCoordinator,
    FileCheckpointer,
    SinkConnector,
    SinkConnectorCapabilities,
    TransactionError,
    WriteError,
)

from laminar_plugin_kafka import _sink
from laminar_plugin_kafka._config import EPOCHS_TOPIC_CONFIG, default_epochs_topic
from laminar_plugin_kafka.testing import KafkaSinkContext

SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary())])


def batch(ids: list[int]) -> pa.RecordBatch:
    text = pa.array([str(i).encode() for i in ids], pa.binary())
    return pa.RecordBatch.from_arrays([text, text], schema=SCHEMA)


def sink_config(kafka, topic: str, tmp_path, **extra: str) -> dict[str, str]:
    return {
        "bootstrap.servers": kafka.bootstrap,
        "topic": topic,
        "staging.dir": str(tmp_path / "staging"),
        "kafka.linger.ms": "1",
        **extra,
    }


async def open_sink(registry: ConnectorRegistry, properties: dict[str, str]) -> SinkConnector:
    sink, _ = await registry.open_sink("kafka", properties)
    return sink


async def write_epoch(sink: SinkConnector, epoch: int, ids: list[int], *, commit: bool = True):
    await sink.begin_epoch(epoch)
    await sink.write_batch(batch(ids))
    await sink.pre_commit(epoch)
    if commit:
        await sink.commit_epoch(epoch)


async def finish_epoch(sink: SinkConnector, epoch: int, ids: list[int]):
    await sink.write_batch(batch(ids))
    await sink.pre_commit(epoch)
    await sink.commit_epoch(epoch)


def staged_files(tmp_path) -> list[str]:
    return sorted(path.name for path in (tmp_path / "staging").rglob("*.arrow"))


def test_an_epoch_is_invisible_until_commit_epoch_then_visible_at_once(kafka, registry, tmp_path):
    topic = kafka.topic(2)

    async def scenario():
        sink = await open_sink(registry, sink_config(kafka, topic, tmp_path))
        assert sink.capabilities() == (
            SinkConnectorCapabilities().with_exactly_once().with_two_phase_commit()
        )
        await sink.begin_epoch(0)
        await sink.write_batch(batch([1, 2, 3]))
        await sink.write_batch(batch([4]))
        await sink.pre_commit(0)
        before = kafka.committed_ids(topic, 2)
        staged = staged_files(tmp_path)
        await sink.commit_epoch(0)
        after = kafka.committed_ids(topic, 2)
        await sink.close()
        return before, staged, after

    before, staged, after = asyncio.run(scenario())
    assert before == []
    assert staged == ["epoch-0.arrow"], "pre_commit stages the epoch durably"
    assert after == [1, 2, 3, 4]
    assert staged_files(tmp_path) == [], "a committed epoch's staged copy is removed"


def test_a_rolled_back_epoch_leaves_no_trace(kafka, registry, tmp_path):
    topic = kafka.topic()

    async def scenario():
        sink = await open_sink(registry, sink_config(kafka, topic, tmp_path))
        await write_epoch(sink, 0, [1])
        await write_epoch(sink, 1, [2], commit=False)
        await sink.rollback_epoch(1)
        await sink.rollback_epoch(1)  # idempotent
        await write_epoch(sink, 1, [3])
        await sink.close()

    asyncio.run(scenario())
    assert kafka.committed_ids(topic) == [1, 3]
    assert staged_files(tmp_path) == []


def test_an_epoch_without_room_for_its_spooled_copy_says_where_and_leaves_no_transaction_open(
    kafka, registry, tmp_path, monkeypatch
):
    topic = kafka.topic()
    missing = tmp_path / "no-such-temporary-directory"

    async def scenario():
        sink = await open_sink(registry, sink_config(kafka, topic, tmp_path))
        try:
            monkeypatch.setattr(tempfile, "tempdir", str(missing))
            with pytest.raises(WriteError, match=f"spool epoch 0.*{missing}.*TMPDIR"):
                await sink.begin_epoch(0)
            await sink.rollback_epoch(0)  # what the runtime does after a failed begin_epoch
            monkeypatch.undo()
            await write_epoch(sink, 0, [1])  # no transaction was left open
        finally:
            await sink.close()

    asyncio.run(scenario())
    assert kafka.committed_ids(topic) == [1]


@pytest.mark.parametrize("staging", ["staging.dir", "state store"])
def test_a_new_instance_commits_an_epoch_pre_committed_before_a_crash(
    kafka, registry, tmp_path, staging
):
    topic = kafka.topic()
    properties = sink_config(kafka, topic, tmp_path)
    # Without staging.dir, the runtime's state store in the laminar checkpoint location.
    store = FileCheckpointer(str(tmp_path / "laminar")).state_store("sink.kafka")
    if staging == "state store":
        del properties["staging.dir"]

    async def opened() -> SinkConnector:
        sink, _ = await registry.open_sink("kafka", properties, state_store=store)
        return sink

    async def scenario():
        crashed = await opened()
        await write_epoch(crashed, 0, [1, 2])
        await write_epoch(crashed, 1, [3, 4], commit=False)
        staged = await store.names()
        # The process dies here: the runtime's manifest says "commit epoch 1".
        restarted = await opened()
        # Opening fenced the dead producer and aborted its transaction...
        assert kafka.committed_ids(topic) == [1, 2]
        # ...so the commit produces the staged copy again, in a transaction of its own.
        await restarted.commit_epoch(1)
        await restarted.commit_epoch(1)  # idempotent
        await write_epoch(restarted, 2, [5])
        await restarted.close()
        return staged, await store.names()

    staged, left = asyncio.run(scenario())
    assert kafka.committed_ids(topic) == [1, 2, 3, 4, 5]
    assert staged_files(tmp_path) == []
    assert left == []
    in_store = [f"laminar-{topic}-laminar/epoch-1.arrow"] if staging == "state store" else []
    assert staged == in_store


def test_a_committed_epoch_delivered_again_after_a_restart_is_skipped(kafka, registry, tmp_path):
    topic = kafka.topic()
    properties = sink_config(kafka, topic, tmp_path)

    async def scenario():
        first = await open_sink(registry, properties)
        await write_epoch(first, 0, [1])
        await write_epoch(first, 1, [2])
        restarted = await open_sink(registry, properties)
        await write_epoch(restarted, 1, [2])
        await write_epoch(restarted, 0, [1])
        await write_epoch(restarted, 2, [3])
        metrics = restarted.metrics()
        await restarted.close()
        return metrics

    metrics = asyncio.run(scenario())
    assert kafka.committed_ids(topic) == [1, 2, 3]
    assert metrics.custom == {"epochs_committed": 1.0, "epochs_skipped": 2.0}


def test_a_zombie_instance_is_fenced_and_its_epoch_never_appears(kafka, registry, tmp_path):
    topic = kafka.topic()
    properties = sink_config(kafka, topic, tmp_path)

    async def scenario():
        zombie = await open_sink(registry, properties)
        await zombie.begin_epoch(0)
        await zombie.write_batch(batch([1, 2]))
        successor = await open_sink(registry, properties)
        with pytest.raises(TransactionError, match="fenced"):
            await finish_epoch(zombie, 0, [3])
        await successor.rollback_epoch(0)
        await write_epoch(successor, 0, [10])
        await successor.close()
        await zombie.close()

    asyncio.run(scenario())
    assert kafka.committed_ids(topic) == [10]


def join_unclosed_releases() -> None:
    for thread in threading.enumerate():
        if thread.name == "laminar-kafka-unclosed":
            thread.join(timeout=60)


def test_a_sink_dropped_unclosed_releases_its_producer_once_its_requests_settle(
    kafka, registry, tmp_path, monkeypatch
):
    # A crashed pipeline's instance, dropped in the middle of an epoch: librdkafka aborted
    # the process when it destroyed the producer with a transaction request in flight.
    topic = kafka.topic(partitions=3)
    properties = sink_config(kafka, topic, tmp_path)
    released: list[tuple[str, int]] = []
    flush = _sink._flush_quietly

    def recording(producer, timeout_s: float) -> None:
        flush(producer, timeout_s)
        released.append((threading.current_thread().name, len(producer)))

    # Sinks earlier tests dropped are released first, unrecorded.
    gc.collect()
    join_unclosed_releases()
    monkeypatch.setattr(_sink, "_flush_quietly", recording)

    async def drop_one(*, close: bool) -> None:
        sink = await open_sink(registry, properties)
        await sink.begin_epoch(0)
        await sink.write_batch(batch(list(range(300))))
        if close:
            await sink.close()

    asyncio.run(drop_one(close=True))
    gc.collect()
    assert released == [], "a closed sink's producer is released by close()"

    asyncio.run(drop_one(close=False))
    gc.collect()
    join_unclosed_releases()
    assert released == [("laminar-kafka-unclosed", 0)], (
        "the unclosed sink's producer is flushed (nothing left queued) in a thread of its own"
    )

    async def successor() -> None:
        sink = await open_sink(registry, properties)  # fences the dropped one's transaction
        await write_epoch(sink, 0, [7])
        await sink.close()

    asyncio.run(successor())
    assert kafka.committed_ids(topic, partitions=3) == [7]


def test_two_sinks_on_one_topic_keep_their_own_epochs(kafka, registry, tmp_path):
    topic = kafka.topic()

    async def scenario():
        first = await open_sink(registry, sink_config(kafka, topic, tmp_path, **{"sink.id": "a"}))
        second = await open_sink(registry, sink_config(kafka, topic, tmp_path, **{"sink.id": "b"}))
        await write_epoch(first, 0, [1])
        await write_epoch(first, 1, [2])
        await write_epoch(second, 0, [100])
        again = await open_sink(registry, sink_config(kafka, topic, tmp_path, **{"sink.id": "b"}))
        await write_epoch(again, 0, [100])  # b committed 0 only: skipped
        await write_epoch(again, 1, [101])  # a's epoch 1 is not b's: written
        for sink in (first, second, again):
            await sink.close()

    asyncio.run(scenario())
    assert kafka.committed_ids(topic) == [1, 2, 100, 101]


def test_a_missing_epochs_topic_is_created_compacted_unless_the_config_says_not_to(
    kafka, registry, tmp_path
):
    topic = kafka.topic()
    epochs_topic = f"{topic}.laminar-epochs"
    refusing = sink_config(kafka, topic, tmp_path, **{"epochs.topic.create": "false"})
    with pytest.raises(ConfigurationError, match=epochs_topic) as refused:
        asyncio.run(open_sink(registry, refusing))
    assert refused.value.key == "epochs.topic"
    assert kafka.topic_settings(epochs_topic) is None

    async def scenario():
        sink = await open_sink(registry, sink_config(kafka, topic, tmp_path))
        await write_epoch(sink, 0, [1])
        await sink.close()

    asyncio.run(scenario())
    made = kafka.topic_settings(epochs_topic)
    assert made is not None
    partitions, config = made
    assert partitions == 1
    assert config["cleanup.policy"] == "compact"  # one marker per sink is kept
    assert {name: config[name] for name in EPOCHS_TOPIC_CONFIG} == dict(EPOCHS_TOPIC_CONFIG)


def test_the_conformance_sink_context_makes_the_epochs_topic_as_the_sink_would(kafka, tmp_path):
    context = KafkaSinkContext(tmp_path)
    try:
        made = kafka.topic_settings(default_epochs_topic(context.config().properties["topic"]))
    finally:
        context.close()
    assert made is not None
    partitions, config = made
    assert partitions == 1
    assert {name: config[name] for name in EPOCHS_TOPIC_CONFIG} == dict(EPOCHS_TOPIC_CONFIG)


def test_at_least_once_delivery_flushes_at_pre_commit(kafka, registry, tmp_path):
    topic = kafka.topic()
    properties = sink_config(kafka, topic, tmp_path, delivery="at-least-once")
    del properties["staging.dir"]

    async def scenario():
        sink = await open_sink(registry, properties)
        capabilities = sink.capabilities()
        await sink.begin_epoch(0)
        await sink.write_batch(batch([1, 2]))
        await sink.pre_commit(0)
        after_pre_commit = kafka.committed_ids(topic)
        await sink.commit_epoch(0)
        # Replayed after a crash: written again (at-least-once promises no more).
        restarted = await open_sink(registry, properties)
        await write_epoch(restarted, 0, [1, 2])
        await restarted.close()
        await sink.close()
        return capabilities, after_pre_commit

    capabilities, after_pre_commit = asyncio.run(scenario())
    assert capabilities == SinkConnectorCapabilities()
    assert after_pre_commit == [1, 2]
    assert kafka.committed_ids(topic) == [1, 1, 2, 2]


def read_messages(kafka, topic: str, partitions: int, count: int):
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": "test-read",
            "isolation.level": "read_committed",
            "logger": CLIENT_LOGGER,
        }
    )
    consumer.list_topics(topic, timeout=30)  # leaders known: "beginning" needs no 500 ms wait
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    messages = []
    while len(messages) < count:
        messages += [m for m in consumer.consume(count, 1) if m.error() is None]
    consumer.close()
    return messages


def test_keys_partitions_and_json_values_come_from_the_columns(kafka, registry, tmp_path):
    topic = kafka.topic(3)
    schema = pa.schema([("id", pa.int64()), ("part", pa.int32()), ("name", pa.string())])
    properties = sink_config(
        kafka,
        topic,
        tmp_path,
        schema="id int64, part int32, name string",
        **{"key.column": "id", "partition.column": "part", "value.format": "json"},
    )
    rows = pa.RecordBatch.from_pylist(
        [
            {"id": 1, "part": 2, "name": "one"},
            {"id": 2, "part": 0, "name": None},
            {"id": 3, "part": 2, "name": "three"},
        ],
        schema=schema,
    )

    async def scenario():
        sink = await open_sink(registry, properties)
        assert sink.schema().equals(schema)
        await sink.begin_epoch(0)
        await sink.write_batch(rows)
        await sink.pre_commit(0)
        await sink.commit_epoch(0)
        await sink.close()

    asyncio.run(scenario())
    messages = read_messages(kafka, topic, 3, 3)
    got = sorted((m.key(), m.partition(), json.loads(m.value())) for m in messages)
    assert got == [
        (b"1", 2, {"id": 1, "part": 2, "name": "one"}),
        (b"2", 0, {"id": 2, "part": 0, "name": None}),
        (b"3", 2, {"id": 3, "part": 2, "name": "three"}),
    ]


def test_an_epoch_whose_staged_copy_is_damaged_is_aborted_and_says_why(kafka, registry, tmp_path):
    topic = kafka.topic()
    properties = sink_config(kafka, topic, tmp_path)

    async def scenario():
        crashed = await open_sink(registry, properties)
        await write_epoch(crashed, 0, list(range(100)), commit=False)
        for path in (tmp_path / "staging").rglob("*.arrow"):
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # a torn write
        restarted = await open_sink(registry, properties)
        try:
            with pytest.raises(TransactionError, match=r"staged copy .* cannot be read") as caught:
                await restarted.commit_epoch(0)
            assert not caught.value.is_transient
            await write_epoch(restarted, 1, [7])  # no transaction was left open
        finally:
            await restarted.close()

    asyncio.run(scenario())
    assert kafka.committed_ids(topic) == [7]


def test_an_epoch_whose_staged_copy_is_gone_cannot_be_committed_and_says_why(
    kafka, registry, tmp_path
):
    topic = kafka.topic()
    properties = sink_config(kafka, topic, tmp_path)

    async def scenario():
        crashed = await open_sink(registry, properties)
        await write_epoch(crashed, 0, [1], commit=False)
        for path in (tmp_path / "staging").rglob("*.arrow"):
            path.unlink()
        restarted = await open_sink(registry, properties)
        try:
            with pytest.raises(TransactionError, match=r"staged copy .* is missing") as caught:
                await restarted.commit_epoch(0)
            assert not caught.value.is_transient
        finally:
            await restarted.close()

    asyncio.run(scenario())
    assert kafka.committed_ids(topic) == []


def test_a_query_started_over_with_the_same_sink_id_is_refused_until_given_a_new_one(
    kafka, registry, tmp_path
):
    # A new query (an empty checkpoint location) numbers its epochs from 0: the sink would
    # skip them by its markers in epochs.topic, so the runtime refuses it before writing.
    topic = kafka.topic()
    properties = sink_config(kafka, topic, tmp_path, **{"sink.id": "loader"})

    async def query(location: str, epochs: list[list[int]], config: dict[str, str]) -> None:
        sink = await open_sink(registry, config)
        try:
            store = FileCheckpointer(str(tmp_path / location))
            coordinator = EpochCoordinator(store, {"out": sink})
            await coordinator.recover()
            for epoch, ids in enumerate(epochs):
                await coordinator.run_epoch(epoch, [batch(ids)], {})
        finally:
            await sink.close()

    asyncio.run(query("first", [[1, 2], [3]], properties))
    assert asyncio.run(last_committed(registry, properties)) == 1
    with pytest.raises(CheckpointError, match="sink 'out' records epochs up to 1 as committed"):
        asyncio.run(query("again", [[4, 5], [6]], properties))
    asyncio.run(query("afresh", [[4, 5], [6]], {**properties, "sink.id": "loader-2"}))
    assert kafka.committed_ids(topic) == [1, 2, 3, 4, 5, 6]
    at_least_once = {**properties, "delivery": "at-least-once"}
    assert asyncio.run(last_committed(registry, at_least_once)) is None, "it keeps no markers"


async def last_committed(registry: ConnectorRegistry, properties: dict[str, str]) -> int | None:
    sink = await open_sink(registry, properties)
    try:
        return await sink.last_committed_epoch()
    finally:
        await sink.close()
