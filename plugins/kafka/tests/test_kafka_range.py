"""Range reads of the ``kafka`` source (plan_end, read_range) against polling, on a real broker."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time
from concurrent.futures import Future
from types import SimpleNamespace

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka_testing import CLIENT_LOGGER
from laminar_sdk import PartitionRange, ReadError, SourceCheckpoint
from test_kafka_source import config, fill_with_transactions, open_source

from laminar_plugin_kafka import _client
from laminar_plugin_kafka._client import FetchRestarter


async def read(source, partition: str, start: str | None, end: str) -> list[int]:
    ranges = source.as_range_readable()
    ids = []
    async for batch in ranges.read_range(PartitionRange(partition, start, end)):
        assert batch.schema.equals(source.schema())
        ids += [int(v) for v in batch.column("value").to_pylist()]
    return ids


async def read_between(source, start: SourceCheckpoint, end: SourceCheckpoint) -> dict:
    return {
        partition: await read(source, partition, start.offsets.get(partition), offset)
        for partition, offset in sorted(end.offsets.items())
        if start.offsets.get(partition) != offset
    }


async def poll_all(source):
    """Poll to the end: ids by partition in order, and (checkpoint, ids-so-far) after each."""
    by_partition: dict[str, list[int]] = {}
    taken = [(source.checkpoint(), {})]
    while (batch := await source.poll_batch(2)) is not None:
        ids = [int(v) for v in batch.records.column("value").to_pylist()]
        by_partition.setdefault(batch.partition.id, []).extend(ids)
        taken.append((source.checkpoint(), {p: len(i) for p, i in by_partition.items()}))
    return by_partition, taken


def test_range_reads_equal_polled_records_on_a_transactional_topic(kafka, registry):
    partitions = 3
    topic = kafka.topic(partitions)
    fill_with_transactions(kafka, topic, partitions)
    properties = config(kafka, topic)

    async def scenario():
        source = await open_source(registry, properties)
        polled, taken = await poll_all(source)
        final = source.checkpoint()
        await source.close()
        reader = await open_source(registry, properties)
        ranges = reader.as_range_readable()
        # Planned to the end from the start: exactly where polling ended, the same records.
        end = await ranges.plan_end(SourceCheckpoint(), None)
        assert end == final
        assert await read_between(reader, SourceCheckpoint(), end) == polled
        assert await ranges.plan_end(end, None) == end, "nothing new: the same offsets"
        # Between polling checkpoints: what polling returned between them, in order.
        for (first, before), (second, after) in zip(taken[::2], taken[3::2], strict=False):
            got = await read_between(reader, first, second)
            for partition, ids in got.items():
                start, stop = before.get(partition, 0), after.get(partition, 0)
                assert ids == polled[partition][start:stop], (first, second)
        # Micro-batches of at most 4 records, chained: all records once, in order, each <= 4.
        cursor, chained = SourceCheckpoint(), {}
        while (following := await ranges.plan_end(cursor, 4)) != cursor:
            got = await read_between(reader, cursor, following)
            assert sum(map(len, got.values())) <= 4
            for partition, ids in got.items():
                chained.setdefault(partition, []).extend(ids)
            cursor = following
        assert cursor == final
        assert chained == polled
        await reader.close()

    asyncio.run(scenario())


def test_plan_end_splits_max_records_fairly_across_partitions(kafka, registry):
    topic = kafka.topic(3)
    kafka.produce(topic, [b"%d" % i for i in range(10)], partition=0)
    kafka.produce(topic, [b"%d" % i for i in range(10, 12)], partition=1)

    async def scenario():
        source = await open_source(registry, config(kafka, topic))
        end = await source.as_range_readable().plan_end(SourceCheckpoint(), 6)
        await source.close()
        return end

    end = asyncio.run(scenario())
    # Equal shares of 3; partition 1 has only 2, its unused share goes to partition 0.
    assert end.offsets == {f"{topic}/0": "4", f"{topic}/1": "2"}


def test_plan_end_stops_before_an_open_transaction(kafka, registry):
    topic = kafka.topic()
    kafka.produce(topic, [b"1", b"2"])
    producer = kafka.transactional_producer()
    producer.begin_transaction()
    producer.produce(topic, b"3", None, 0)
    producer.flush(30)

    async def scenario():
        source = await open_source(registry, config(kafka, topic))
        ranges = source.as_range_readable()
        before = await ranges.plan_end(SourceCheckpoint(), None)
        await asyncio.to_thread(producer.commit_transaction, 30)
        # The commit returns once the coordinator logged it; the partition's marker, which
        # moves its last stable offset, is written after.
        deadline = time.monotonic() + 30
        while (after := await ranges.plan_end(before, None)) == before:
            assert time.monotonic() < deadline, "the committed transaction never became readable"
            await asyncio.sleep(0.05)
        ids = await read_between(source, before, after)
        await source.close()
        return before, after, ids

    before, after, ids = asyncio.run(scenario())
    assert before.offsets == {f"{topic}/0": "2"}, "the open transaction's record is not named"
    assert after.offsets == {f"{topic}/0": "4"}, "committed: its record and marker follow"
    assert ids == {f"{topic}/0": [3]}


READ_IN_A_CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    from laminar_sdk import PartitionRange, load_connector_registry

    async def main(properties, partition, start, end):
        source, _ = await load_connector_registry().open_source("kafka", properties)
        ids = []
        async for batch in source.as_range_readable().read_range(
            PartitionRange(partition, start, end)
        ):
            ids += [int(v) for v in batch.column("value").to_pylist()]
        await source.close()
        print(json.dumps(ids))

    asyncio.run(main(*json.loads(sys.argv[1])))
    """
)


def test_a_range_read_in_another_process_returns_the_same_records(kafka, registry):
    topic = kafka.topic()
    fill_with_transactions(kafka, topic, 1)
    properties = config(kafka, topic)

    async def scenario():
        source = await open_source(registry, properties)
        end = await source.as_range_readable().plan_end(SourceCheckpoint({f"{topic}/0": "3"}), 5)
        here = await read(source, f"{topic}/0", "3", end.offsets[f"{topic}/0"])
        await source.close()
        return end, here

    end, here = asyncio.run(scenario())
    arguments = [properties, f"{topic}/0", "3", end.offsets[f"{topic}/0"]]
    child = subprocess.run(
        [sys.executable, "-c", READ_IN_A_CHILD, json.dumps(arguments)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(child.stdout.strip().splitlines()[-1]) == here
    assert here, "the range holds records"


def test_a_range_whose_records_were_deleted_is_a_read_error(kafka, registry):
    topic = kafka.topic()
    kafka.produce(topic, [b"%d" % i for i in range(6)])
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap, "logger": CLIENT_LOGGER})

    async def scenario():
        source = await open_source(registry, config(kafka, topic))
        end = await source.as_range_readable().plan_end(SourceCheckpoint({f"{topic}/0": "1"}), None)
        for future in admin.delete_records([TopicPartition(topic, 0, 4)]).values():
            future.result(timeout=30)
        try:
            with pytest.raises(ReadError, match="are gone"):
                await read(source, f"{topic}/0", "1", end.offsets[f"{topic}/0"])
        finally:
            await source.close()

    asyncio.run(scenario())


def test_a_read_that_missed_a_partitions_end_is_told_it_again(kafka, monkeypatch):
    """A partition ending in a transaction marker reports its end once; a restart repeats it."""
    topic = kafka.topic()
    producer = kafka.transactional_producer()
    producer.begin_transaction()
    producer.produce(topic, b"1", None, 0)
    producer.commit_transaction(30)  # offset 0: the record, offset 1: the commit marker
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": "test-refetch",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,
            "logger": CLIENT_LOGGER,
        }
    )
    key = (topic, 0)

    def events(wait_s: float) -> list[tuple[int, bool]]:
        """(offset, is an end report) of what the consumer returns within ``wait_s``."""
        deadline = time.monotonic() + wait_s
        seen = []
        while time.monotonic() < deadline and not any(end for _, end in seen):
            seen += [
                (message.offset() or 0, message.error() is not None)
                for message in consumer.consume(100, 0.1)
            ]
        return seen

    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        assert events(30) == [(0, False), (2, True)]
        # Had the end report been missed, the reading would stall at position 1, one short of
        # the end: nothing tells it again ...
        assert events(2) == []
        # ... until the stalled partition is fetched again from its position.
        monkeypatch.setattr(_client, "_REFETCH_AFTER_S", 0.0)
        FetchRestarter({key: 1}, {key: 2}).restart_if_stalled(consumer)
        assert events(30) == [(2, True)], "the end is reported again, and no record twice"
    finally:
        consumer.close()


class AdminNotYetKnowing:
    """An admin client whose metadata lacks the partitions for its first ``misses`` queries."""

    def __init__(self, misses: int) -> None:
        self.misses = misses
        self.metadata_reads = 0

    def list_offsets(self, requests, **_options):
        answers = {}
        for partition in requests:
            future: Future = Future()
            if self.misses:
                error = KafkaError(KafkaError._UNKNOWN_PARTITION, "Local: Unknown partition")
                future.set_exception(KafkaException(error))
            else:
                future.set_result(SimpleNamespace(offset=7))
            answers[partition] = future
        self.misses = max(0, self.misses - 1)
        return answers

    def list_topics(self, *_args, **_options):
        self.metadata_reads += 1


def test_a_partition_the_admin_client_does_not_know_yet_is_asked_for_again():
    """A topic just created may be unknown to the asking client until it reads the metadata."""
    admin = AdminNotYetKnowing(misses=2)
    settings = _client.ClientSettings("kafka source", "127.0.0.1:9", {}, (), 30.0)
    level = _client.IsolationLevel.READ_COMMITTED
    offsets = _client.latest_offsets(settings, admin, [("t", 0), ("t", 1)], level, ReadError)
    assert offsets == {("t", 0): 7, ("t", 1): 7}
    assert admin.metadata_reads == 2, "the metadata is read again before each new query"


def test_a_partition_still_unknown_at_the_timeout_is_a_read_error_naming_it():
    settings = _client.ClientSettings("kafka source", "127.0.0.1:9", {}, (), 0.2)
    level = _client.IsolationLevel.READ_COMMITTED
    with pytest.raises(ReadError, match="cannot query the offsets of t/0: .*Unknown partition"):
        _client.latest_offsets(settings, AdminNotYetKnowing(10**6), [("t", 0)], level, ReadError)
