"""Kafka messages as Arrow columns, and Arrow rows as Kafka records, column by column."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message
from laminar_sdk import SchemaMismatch, SerdeError

from laminar_plugin_kafka._config import SinkSettings

HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
"""Record headers: a list of (key, value) pairs, in the order they were written."""

_MIN_JSON_BLOCK = 1 << 20

# What Message.headers() returns: a list of (key, value) pairs (a dict for produced messages).
_Headers = list[tuple[str, str | bytes | None]] | dict[str, str | bytes | None]


def source_schema(value_schema: pa.Schema | None) -> pa.Schema:
    """The schema of the source's batches; ``value`` is binary, or a struct of ``value_schema``."""
    value_type = pa.binary() if value_schema is None else pa.struct(list(value_schema))
    return pa.schema(
        [
            pa.field("key", pa.binary()),
            pa.field("value", value_type),
            pa.field("topic", pa.string()),
            pa.field("partition", pa.int32()),
            pa.field("offset", pa.int64()),
            pa.field("timestamp", pa.timestamp("us", tz="UTC")),
            pa.field("headers", HEADERS_TYPE),
        ]
    )


def records_batch(
    connector: str,
    messages: Sequence[Message],
    schema: pa.Schema,
    value_schema: pa.Schema | None,
    partition: tuple[str, int],
) -> pa.RecordBatch:
    """``messages`` (records of ``partition``, no events) as one batch of ``schema``.

    Built column by column. Each field is read with one ``map`` over the messages (the
    cheapest way to call a method of each), and ``topic`` and ``partition``, the same in
    every row, are filled without reading them from each message.

    :param partition: the topic and partition every one of ``messages`` comes from.
    :raises SerdeError: when a value is not a JSON object of ``value_schema``, naming it.
    """
    count = len(messages)
    raw_values = list(map(Message.value, messages))
    values = (
        binary_array(raw_values)
        if value_schema is None
        else _decoded_values(connector, messages, raw_values, value_schema)
    )
    topic, number = partition
    columns = [
        binary_array(list(map(Message.key, messages))),
        values,
        pa.repeat(pa.scalar(topic, pa.string()), count),
        pa.repeat(pa.scalar(number, pa.int32()), count),
        pa.array(list(map(Message.offset, messages)), pa.int64()),
        pa.array(
            [
                None if kind == TIMESTAMP_NOT_AVAILABLE else ms
                for kind, ms in map(Message.timestamp, messages)
            ],
            pa.timestamp("ms", tz="UTC"),
        ).cast(pa.timestamp("us", tz="UTC")),
        _headers(list(map(Message.headers, messages))),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


_MAX_BINARY_BYTES = 2**31 - 1
"""The most bytes a ``binary`` array (32-bit offsets) holds."""


def binary_array(values: list[bytes | None]) -> pa.Array:
    """``values`` as a ``binary`` array, its bytes copied in one join.

    ``pa.array`` appends the values one at a time to a growing buffer: for a fetch of 1-KiB
    values, most of a poll's time. Joined, the data is one copy, and the offsets are the
    running sum of the lengths. With a null among the values (a tombstone, a record without
    a key), or more data than 32-bit offsets reach, ``pa.array`` builds it.
    """
    if values.count(None):
        return pa.array(values, pa.binary())
    present = cast("list[bytes]", values)
    data = b"".join(present)
    if len(data) > _MAX_BINARY_BYTES:
        return pa.array(values, pa.binary())
    offsets = pa.array(itertools.accumulate(map(len, present), initial=0), pa.int32())
    return pa.Array.from_buffers(
        pa.binary(), len(values), [None, offsets.buffers()[1], pa.py_buffer(data)]
    )


def _headers(headers: Sequence[_Headers | None]) -> pa.Array:
    if headers.count(None) == len(headers):
        return pa.nulls(len(headers), HEADERS_TYPE)
    offsets = [0]
    names: list[str] = []
    values: list[str | bytes | None] = []
    missing: list[bool] = []
    for item in headers:
        missing.append(item is None)
        pairs = item.items() if isinstance(item, dict) else item or ()
        for name, value in pairs:
            names.append(name)
            values.append(value)
        offsets.append(len(names))
    pairs = pa.StructArray.from_arrays(
        [pa.array(names, pa.string()), pa.array(values, pa.binary())],
        fields=list(HEADERS_TYPE.value_type),
    )
    return pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()), pairs, type=HEADERS_TYPE, mask=pa.array(missing)
    )


def _parse_json(data: bytes, value_schema: pa.Schema, multiline: bool) -> pa.Table:
    return pa_json.read_json(
        pa.BufferReader(data),
        read_options=pa_json.ReadOptions(block_size=max(len(data) + 1, _MIN_JSON_BLOCK)),
        parse_options=pa_json.ParseOptions(
            explicit_schema=value_schema,
            unexpected_field_behavior="ignore",
            newlines_in_values=multiline,
        ),
    )


def _decoded_values(
    connector: str,
    messages: Sequence[Message],
    raw_values: list[bytes | None],
    value_schema: pa.Schema,
) -> pa.Array:
    """The values decoded as JSON objects in one pass over all of them; null stays null."""
    value_type = pa.struct(list(value_schema))
    present = [value for value in raw_values if value is not None]
    if not present:
        return pa.nulls(len(raw_values), value_type)
    multiline = any(b"\n" in value or b"\r" in value for value in present)
    try:
        table = _parse_json(b"\n".join(present), value_schema, multiline)
    except pa.ArrowInvalid:
        table = None
    if table is None or table.num_rows != len(present):
        _raise_for_bad_value(connector, messages, value_schema)
    assert table is not None
    structs = table.to_struct_array().combine_chunks().cast(value_type)
    if len(present) == len(raw_values):
        return structs
    # Spread the decoded rows back out, a null index giving a null row for a null value.
    indices: list[int | None] = []
    position = 0
    for value in raw_values:
        indices.append(None if value is None else position)
        position += value is not None
    return structs.take(pa.array(indices, pa.int64()))


def _raise_for_bad_value(
    connector: str, messages: Sequence[Message], value_schema: pa.Schema
) -> None:
    for message in messages:
        value = message.value()
        if value is None:
            continue
        try:
            rows = _parse_json(value, value_schema, multiline=True).num_rows
            reason = f"{rows} JSON values in one record"
        except pa.ArrowInvalid as error:
            rows, reason = 0, str(error)
        if rows != 1:
            raise SerdeError(
                f"{connector}: the value of {message.topic()}/{message.partition()} at offset "
                f"{message.offset()} is not one JSON object of value.schema ({reason}); fix "
                "the producer, or read the topic with value.format=bytes"
            )
    raise SerdeError(
        f"{connector}: the values of {len(messages)} records decode one by one but not "
        "together as JSON objects of value.schema; read the topic with value.format=bytes"
    )


@dataclass(frozen=True, slots=True)
class OutgoingRecords:
    """The Kafka records of one batch, ready to produce.

    :param values: each record's value.
    :param keys: each record's key, or ``None`` when records have no key.
    :param partitions: each record's partition (``-1``: by key), or ``None`` for all by key.
    :param size: the bytes of keys and values together.
    """

    values: list[bytes | None]
    keys: list[bytes | None] | None
    partitions: list[int] | None
    size: int


def _as_binary(column: pa.Array) -> pa.Array:
    data_type = column.type
    if pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type):
        return column
    if not (pa.types.is_string(data_type) or pa.types.is_large_string(data_type)):
        column = column.cast(pa.string())
    return column.cast(pa.binary())


def _size(column: pa.Array) -> int:
    total = pc.sum(pc.binary_length(column)).as_py()
    return int(total or 0)


def outgoing_records(
    connector: str, batch: pa.RecordBatch, settings: SinkSettings
) -> OutgoingRecords:
    """The records to produce for ``batch``.

    :raises SchemaMismatch: when ``batch`` is not in the sink's schema.
    """
    if not batch.schema.equals(settings.schema):
        raise SchemaMismatch(
            f"{connector}: batch schema ({batch.schema.to_string(show_schema_metadata=False)}) "
            f"is not the configured schema ({settings.schema.to_string()}); cast or select "
            "the columns, or change the sink's schema key"
        )
    size = 0
    if settings.value_column is not None:
        value_column = _as_binary(batch.column(settings.value_column))
        size += _size(value_column)
        values: list[bytes | None] = value_column.to_pylist()
    else:
        encoded = [
            json.dumps(row, default=str, separators=(",", ":")).encode()
            for row in batch.to_pylist()
        ]
        size += sum(map(len, encoded))
        values = list(encoded)
    keys: list[bytes | None] | None = None
    if settings.key_column is not None:
        key_column = _as_binary(batch.column(settings.key_column))
        size += _size(key_column)
        keys = key_column.to_pylist()
    partitions: list[int] | None = None
    if settings.partition_column is not None:
        partitions = batch.column(settings.partition_column).fill_null(-1).to_pylist()
    return OutgoingRecords(values, keys, partitions, size)
