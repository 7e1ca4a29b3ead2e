"""The ``kafka`` source against a real broker: records, checkpoints, transactions, groups."""

from __future__ import annotations

import asyncio
import datetime
import json
import uuid

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions
from kafka_testing import CLIENT_LOGGER, wait_until_visible
from laminar_sdk import ConnectorRegistry, ReadError, SerdeError, SourceCheckpoint, SourceConnector

from laminar_plugin_kafka import HEADERS_TYPE
from laminar_plugin_kafka._records import binary_array


def config(kafka, topic: str, **extra: str) -> dict[str, str]:
    return {
        "bootstrap.servers": kafka.bootstrap,
        "topic": topic,
        "kafka.fetch.wait.max.ms": "10",
        **extra,
    }


async def open_source(registry: ConnectorRegistry, properties: dict[str, str]) -> SourceConnector:
    source, _ = await registry.open_source("kafka", properties)
    return source


async def drain(source: SourceConnector, max_records: int = 1000) -> list[pa.RecordBatch]:
    batches = []
    while (batch := await source.poll_batch(max_records)) is not None:
        batches.append(batch.records)
    return batches


def values(batches: list[pa.RecordBatch]) -> list[bytes]:
    return [value for batch in batches for value in batch.column("value").to_pylist()]


async def values_arriving(source: SourceConnector, count: int) -> list[bytes]:
    """The values polled until ``count`` came (or 30 s passed): records produced, or whose
    transaction committed, reach the consumer a moment later, later still on a busy machine."""
    arrived: list[bytes] = []
    deadline = asyncio.get_running_loop().time() + 30
    while len(arrived) < count and asyncio.get_running_loop().time() < deadline:
        arrived += values(await drain(source))
        await asyncio.sleep(0.05)
    return arrived


def test_records_carry_key_value_position_timestamp_and_headers(kafka, registry):
    topic = kafka.topic()
    kafka.produce(
        topic,
        [b"v0", None, b"v2"],
        keys=[b"k0", b"k1", None],
        headers=[("trace", b"abc"), ("empty", b"")],
        timestamp_ms=1_700_000_000_123,
    )

    async def scenario():
        source = await open_source(registry, config(kafka, topic))
        batch = await source.poll_batch(10)
        assert await source.poll_batch(10) is None
        await source.close()
        return batch

    batch = asyncio.run(scenario())
    records = batch.records
    assert records.schema.equals(
        pa.schema(
            [
                ("key", pa.binary()),
                ("value", pa.binary()),
                ("topic", pa.string()),
                ("partition", pa.int32()),
                ("offset", pa.int64()),
                ("timestamp", pa.timestamp("us", tz="UTC")),
                ("headers", HEADERS_TYPE),
            ]
        )
    )
    assert records.column("key").to_pylist() == [b"k0", b"k1", None]
    assert records.column("value").to_pylist() == [b"v0", None, b"v2"]
    assert records.column("topic").to_pylist() == [topic] * 3
    assert records.column("partition").to_pylist() == [0, 0, 0]
    assert records.column("offset").to_pylist() == [0, 1, 2]
    moment = datetime.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=datetime.UTC)
    assert records.column("timestamp").to_pylist() == [moment] * 3
    assert (
        records.column("headers").to_pylist()
        == [[{"key": "trace", "value": b"abc"}, {"key": "empty", "value": b""}]] * 3
    )
    assert str(batch.partition) == f"{topic}/0@3"


def test_json_values_decode_into_the_declared_schema(kafka, registry):
    topic = kafka.topic()
    pretty = json.dumps({"id": 4, "name": "four", "extra": [1]}, indent=2).encode()
    kafka.produce(topic, [b'{"id": 1, "name": "one"}', None, b'{"id": 3}', pretty])
    properties = config(
        kafka, topic, **{"value.format": "json", "value.schema": "id int64, name string"}
    )

    async def scenario():
        source = await open_source(registry, properties)
        schema = source.schema()
        batches = await drain(source)
        await source.close()
        return schema, batches

    schema, batches = asyncio.run(scenario())
    assert schema.field("value").type == pa.struct([("id", pa.int64()), ("name", pa.string())])
    assert values(batches) == [
        {"id": 1, "name": "one"},
        None,
        {"id": 3, "name": None},
        {"id": 4, "name": "four"},
    ]


def test_a_value_that_is_not_json_of_the_schema_is_a_serde_error_naming_it(kafka, registry):
    topic = kafka.topic()
    kafka.produce(topic, [b'{"id": 1}', b'{"id": "not a number"}'])
    properties = config(kafka, topic, **{"value.format": "json", "value.schema": "id int64"})

    async def scenario():
        source = await open_source(registry, properties)
        try:
            with pytest.raises(SerdeError, match=rf"{topic}/0 at offset 1 is not one JSON object"):
                await source.poll_batch(10)
        finally:
            await source.close()

    asyncio.run(scenario())


def fill_with_transactions(kafka, topic: str, partitions: int) -> list[int]:
    """Committed, aborted and plain records interleaved; returns the ids a reader must see."""
    visible: list[int] = []
    producer = kafka.transactional_producer()
    next_id = 0
    for round_ in range(4):
        producer.begin_transaction()
        ids = list(range(next_id, next_id + 2 * partitions))
        next_id += len(ids)
        for record in ids:
            producer.produce(topic, str(record).encode(), None, record % partitions)
        producer.flush(30)
        if round_ == 2:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            visible += ids
        plain = list(range(next_id, next_id + partitions))
        next_id += len(plain)
        for record in plain:
            kafka.produce(topic, [str(record).encode()], partition=record % partitions)
        visible += plain
    return visible


def test_restoring_sampled_checkpoints_on_new_instances_resumes_exactly(kafka, registry):
    partitions = 3
    topic = kafka.topic(partitions)
    expected = fill_with_transactions(kafka, topic, partitions)
    properties = config(kafka, topic)

    async def scenario():
        source = await open_source(registry, properties)
        taken = [(source.checkpoint(), 0)]
        returned: list[int] = []
        while (batch := await source.poll_batch(2)) is not None:
            returned += [int(v) for v in batch.records.column("value").to_pylist()]
            taken.append((source.checkpoint(), len(returned)))
        await source.close()
        assert sorted(returned) == sorted(expected)
        for checkpoint, count in taken[::3] + taken[-1:]:
            restored = await open_source(registry, properties)
            await restored.restore(SourceCheckpoint.from_json(checkpoint.to_json()))
            after = [int(v) for v in values(await drain(restored, 3))]
            await restored.close()
            assert sorted(after) == sorted(returned[count:]), f"restoring {checkpoint}"

    asyncio.run(scenario())


def test_read_committed_returns_committed_transactions_only(kafka, registry):
    topic = kafka.topic()
    producer = kafka.transactional_producer()
    for outcome, value in (("commit", b"committed"), ("abort", b"aborted"), ("open", b"late")):
        producer.begin_transaction()
        producer.produce(topic, value, None, 0)
        producer.flush(30)
        if outcome == "commit":
            producer.commit_transaction(30)
        elif outcome == "abort":
            producer.abort_transaction(30)

    async def scenario():
        source = await open_source(registry, config(kafka, topic))
        first = values(await drain(source))
        before_commit = source.checkpoint()
        await asyncio.to_thread(producer.commit_transaction, 30)
        second = await values_arriving(source, 1)
        at_end = source.checkpoint()
        await source.close()
        return first, before_commit, second, at_end

    first, before_commit, second, at_end = asyncio.run(scenario())
    assert first == [b"committed"]
    assert second == [b"late"]
    # Offsets: committed 0, its marker 1, aborted 2, its marker 3, late 4, its marker 5.
    assert before_commit.offsets == {f"{topic}/0": "4"}, "resumes at the open transaction"
    assert at_end.offsets == {f"{topic}/0": "6"}, "resumes past the last marker"


def test_partitions_absent_from_the_checkpoint_start_at_the_beginning_or_latest(kafka, registry):
    topic = kafka.topic(2)
    kafka.produce(topic, [b"old-0"], partition=0)
    kafka.produce(topic, [b"old-1"], partition=1)

    async def scenario():
        earliest = await open_source(registry, config(kafka, topic))
        await earliest.restore(SourceCheckpoint({f"{topic}/0": "1"}))
        from_beginning = values(await drain(earliest))
        await earliest.close()
        latest = await open_source(registry, config(kafka, topic, **{"start.offset": "latest"}))
        skipped = values(await drain(latest))
        start = latest.checkpoint()
        kafka.produce(topic, [b"new-1"], partition=1)
        new = await values_arriving(latest, 1)
        await latest.close()
        return from_beginning, skipped, start, new

    from_beginning, skipped, start, new = asyncio.run(scenario())
    assert from_beginning == [b"old-1"]
    assert skipped == []
    assert start.offsets == {f"{topic}/0": "1", f"{topic}/1": "1"}, "latest is resolved once"
    assert new == [b"new-1"]


def test_data_ready_notify_is_set_when_records_arrive(kafka, registry):
    topic = kafka.topic()

    async def scenario():
        source = await open_source(registry, config(kafka, topic))
        ready = source.data_ready_notify()
        assert ready is not None
        ready.clear()
        assert await source.poll_batch(10) is None
        await asyncio.sleep(0.3)
        assert not ready.is_set(), "set while nothing arrived"
        await asyncio.to_thread(kafka.produce, topic, [b"hello"])
        await asyncio.wait_for(ready.wait(), 10)
        batch = await source.poll_batch(10)
        await source.close()
        return batch

    batch = asyncio.run(scenario())
    assert batch is not None
    assert batch.records.column("value").to_pylist() == [b"hello"]


def test_lag_is_the_high_watermark_minus_the_next_offset(kafka, registry):
    topic = kafka.topic()
    kafka.produce(topic, [b"%d" % i for i in range(10)])

    async def scenario():
        source = await open_source(registry, config(kafka, topic))
        await source.poll_batch(4)
        lag = source.metrics().lag
        await drain(source)
        metrics = source.metrics()
        await source.close()
        return lag, metrics

    lag, metrics = asyncio.run(scenario())
    assert lag == 6
    assert metrics.lag == 0
    assert metrics.records_total == 10


def committed_offsets(kafka, group: str, topic: str) -> dict[int, int]:
    consumer = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": group, "logger": CLIENT_LOGGER}
    )
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(2)], timeout=30)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found if tp.offset >= 0}


def test_group_offsets_follow_restored_checkpoints_and_never_run_ahead(kafka, registry):
    topic = kafka.topic(2)
    for partition in range(2):
        kafka.produce(topic, [b"a", b"b", b"c", b"d"], partition=partition)
    group = f"test-group-{uuid.uuid4().hex[:8]}"
    properties = config(kafka, topic, **{"group.id": group})

    async def scenario():
        first = await open_source(registry, properties)
        await first.poll_batch(2)
        durable = first.checkpoint()  # say the pipeline committed this epoch
        await drain(first)
        after_reading = committed_offsets(kafka, group, topic)
        await first.close()
        restarted = await open_source(registry, properties)
        await restarted.restore(durable)
        after_restore = committed_offsets(kafka, group, topic)
        await drain(restarted)
        await restarted.close()
        return durable, after_reading, after_restore

    durable, after_reading, after_restore = asyncio.run(scenario())
    assert after_reading == {}, "reading alone must not commit offsets"
    assert after_restore == {
        int(key.rsplit("/", 1)[1]): int(offset) for key, offset in durable.offsets.items()
    }
    assert committed_offsets(kafka, group, topic) == after_restore


def test_a_rebalance_in_subscribe_mode_requests_a_checkpoint(kafka, registry):
    topic = kafka.topic(2)
    for partition in range(2):
        kafka.produce(topic, [b"x"], partition=partition)
    group = f"test-group-{uuid.uuid4().hex[:8]}"
    properties = config(kafka, topic, **{"group.id": group, "consumer.mode": "subscribe"})

    async def poll_until(source, event, seconds):
        async with asyncio.timeout(seconds):
            while not event.is_set():
                await source.poll_batch(10)

    async def scenario():
        first = await open_source(registry, properties)
        requested = first.checkpoint_requested()
        assert requested is not None
        await poll_until(first, requested, 30)  # joining the group assigns partitions
        requested.clear()
        second = await open_source(registry, properties)
        second_requested = second.checkpoint_requested()
        assert second_requested is not None

        async def both():
            await asyncio.gather(
                poll_until(first, requested, 60), poll_until(second, second_requested, 60)
            )

        await both()
        await first.close()
        await second.close()

    asyncio.run(scenario())


def test_a_topic_pattern_reads_every_topic_it_matches(kafka, registry):
    first, second, other = kafka.topic(), kafka.topic(), kafka.topic()
    kafka.produce(first, [b"1"])
    kafka.produce(second, [b"2"])
    kafka.produce(other, [b"3"])
    pattern = f"({first}|{second})"
    properties = {
        "bootstrap.servers": kafka.bootstrap,
        "topic.pattern": pattern,
        "kafka.fetch.wait.max.ms": "10",
    }

    async def scenario():
        source = await open_source(registry, properties)
        got = sorted(values(await drain(source)))
        await source.close()
        return got

    assert asyncio.run(scenario()) == [b"1", b"2"]


def test_records_deleted_by_retention_are_a_read_error_not_a_jump(kafka, registry):
    topic = kafka.topic()
    kafka.produce(topic, [b"%d" % i for i in range(6)])
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap, "logger": CLIENT_LOGGER})
    for future in admin.delete_records([TopicPartition(topic, 0, 4)]).values():
        future.result(timeout=30)

    async def scenario():
        source = await open_source(registry, config(kafka, topic))
        await source.restore(SourceCheckpoint({f"{topic}/0": "2"}))
        try:
            with pytest.raises(ReadError, match=rf"records of {topic}/0 are gone"):
                await drain(source)
        finally:
            await source.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "mode",
    [
        {},
        # The group assigns the new partition after the consumer's next metadata refresh;
        # under start.offset=latest too, its records are all new to the source.
        {"consumer.mode": "subscribe", "start.offset": "latest"},
    ],
    ids=["assigned", "subscribed-from-latest"],
)
def test_a_partition_added_while_the_source_reads_is_read_from_its_beginning(kafka, registry, mode):
    topic = kafka.topic()
    kafka.produce(topic, [b"1", b"2"])
    latest = mode.get("start.offset") == "latest"
    if mode:
        mode = {**mode, "group.id": f"test-group-{uuid.uuid4().hex[:8]}"}

    async def scenario():
        source = await open_source(registry, config(kafka, topic, **mode))
        before = values(await drain(source))
        increase = NewPartitions(topic, 2)
        for future in kafka.admin.create_partitions([increase]).values():
            await asyncio.to_thread(future.result, 30)
        await asyncio.to_thread(wait_until_visible, kafka.admin, topic, 2)
        await asyncio.to_thread(kafka.produce, topic, [b"3", b"4"], partition=1)
        await asyncio.to_thread(kafka.produce, topic, [b"5"], partition=0)
        after = await values_arriving(source, 3)
        checkpoint = source.checkpoint()
        await source.close()
        return before, after, checkpoint

    before, after, checkpoint = asyncio.run(scenario())
    assert before == ([] if latest else [b"1", b"2"])
    assert sorted(after) == [b"3", b"4", b"5"], "the new partition's records, from its first"
    assert checkpoint.offsets == {f"{topic}/0": "3", f"{topic}/1": "2"}


@pytest.mark.parametrize(
    "values",
    [[b"ab", b"", b"xyz"], [], [b"a", None, b""], [None, None], [bytes(range(256)) * 8] * 3],
    ids=["values", "none", "a-null", "all-null", "binary"],
)
def test_a_fetch_s_values_become_a_binary_column_unchanged(values):
    # Joined in one copy (what the poll loop spends most on), or built by pa.array with nulls.
    column = binary_array(list(values))
    column.validate(full=True)
    assert column.type == pa.binary()
    assert column.to_pylist() == values
