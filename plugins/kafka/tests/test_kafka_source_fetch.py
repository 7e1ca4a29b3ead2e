"""How the ``kafka`` source files a fetch and builds batches from it, without a broker.

The client's messages are made with confluent-kafka's ``Message`` constructor (meant for
tests): a fetch mixing partitions, ends of partitions and records of a partition that is not
assigned, in the order librdkafka can hand them out.
"""

from __future__ import annotations

import datetime
from types import SimpleNamespace

import pyarrow as pa
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    Message,
)

from laminar_plugin_kafka import KafkaSource
from laminar_plugin_kafka._records import RecordFields, records_batch, source_schema
from laminar_plugin_kafka._source import _Reader

TOPIC = "orders"
SCHEMA = source_schema(None)


def record(partition: int, offset: int, **fields: object) -> Message:
    defaults = {
        "value": f"{partition}:{offset}".encode(),
        "timestamp": (TIMESTAMP_CREATE_TIME, 1_700_000_000_000 + offset),
    }
    return Message(topic=TOPIC, partition=partition, offset=offset, **{**defaults, **fields})


def end_of(partition: int, offset: int) -> Message:
    error = KafkaError(KafkaError._PARTITION_EOF)
    return Message(topic=TOPIC, partition=partition, offset=offset, error=error)


def reader(*partitions: int) -> _Reader:
    keys = [(TOPIC, number) for number in partitions]
    settings = SimpleNamespace(value_schema=None)
    state = _Reader(settings, None, SCHEMA, keys)  # type: ignore[arg-type]
    state.assigned = set(keys)
    state.started = True
    return state


def test_a_fetch_is_filed_by_partition_in_order_and_ends_are_noted():
    source, state = KafkaSource(), reader(0, 1)
    fetch = [
        record(0, 0),
        record(0, 1),
        record(1, 0),
        end_of(0, 2),
        record(1, 1),
        record(9, 0),  # fetched before a rebalance took partition 9 away
        record(0, 2),  # arrived after partition 0's end was reported
        end_of(1, 3),  # two offsets past the last record: a transaction marker
    ]
    assert source._absorb(state, fetch) == len(fetch)

    first = source._take(state, 10)
    second = source._take(state, 10)
    assert source._take(state, 10) is None
    assert first is not None
    assert second is not None
    assert first.records.column("value").to_pylist() == [b"0:0", b"0:1", b"0:2"]
    assert first.records.column("offset").to_pylist() == [0, 1, 2]
    assert str(first.partition) == f"{TOPIC}/0@3"
    assert second.records.column("value").to_pylist() == [b"1:0", b"1:1"]
    assert second.records.column("partition").to_pylist() == [1, 1]
    assert str(second.partition) == f"{TOPIC}/1@3", "past the marker before the end reported"
    assert state.at_end == {(TOPIC, 1)}, "partition 0 had a record after its end"
    assert state.next == {(TOPIC, 0): 3, (TOPIC, 1): 3}


def test_batches_taken_in_parts_keep_their_records_as_more_arrive():
    source, state = KafkaSource(), reader(0)
    source._absorb(state, [record(0, offset) for offset in range(5)])
    batches = [source._take(state, 2), source._take(state, 2)]
    source._absorb(state, [record(0, offset) for offset in range(5, 7)])
    batches += [source._take(state, 10)]
    assert [batch.records.column("offset").to_pylist() for batch in batches if batch] == [
        [0, 1],
        [2, 3],
        [4, 5, 6],
    ]
    assert [str(batch.partition) for batch in batches if batch] == [
        f"{TOPIC}/0@2",
        f"{TOPIC}/0@4",
        f"{TOPIC}/0@7",
    ]


def test_records_without_a_timestamp_key_or_headers_have_nulls_there():
    fields = RecordFields()
    fields.extend(
        [
            record(0, 0, key=b"k", headers=[("trace", b"abc")]),
            record(0, 1, timestamp=(TIMESTAMP_NOT_AVAILABLE, -1)),
            record(0, 2, timestamp=(TIMESTAMP_CREATE_TIME, -1), value=None),
        ]
    )
    batch = records_batch("kafka", fields, SCHEMA, None, (TOPIC, 0))
    batch.validate(full=True)
    assert batch.column("key").to_pylist() == [b"k", None, None]
    assert batch.column("value").to_pylist() == [b"0:0", b"0:1", None]
    assert batch.column("timestamp").to_pylist() == [
        datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.UTC),
        None,  # the record has no timestamp
        datetime.datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=datetime.UTC),
    ]
    assert batch.column("headers").to_pylist() == [[{"key": "trace", "value": b"abc"}], None, None]
    assert batch.column("topic").to_pylist() == [TOPIC] * 3
    assert batch.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
