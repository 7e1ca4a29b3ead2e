"""Kafka messages as Arrow columns, and Arrow rows as Kafka records, column by column."""

from __future__ import annotations

import itertools
import json
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, cast

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


@dataclass(slots=True)
class RecordFields:
    """Records of one partition, in offset order, held field by field.

    The fields are read from the client's messages a run of one partition at a time, with one
    ``map`` per field (the cheapest way to call a method of each), and the messages are then
    dropped: held in large numbers, they outlive the garbage collector's young generation (700
    allocations) and each full collection walks every one of them, while the bytes and ints
    kept here are not tracked at all.
    """

    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    offsets: list[int | None] = field(default_factory=list)
    timestamp_types: list[int] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    headers: list[_Headers | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.offsets)

    def extend(self, messages: Sequence[Message]) -> None:
        """Add ``messages`` (records of this partition, no events) after the records held."""
        self.keys.extend(map(Message.key, messages))
        self.values.extend(map(Message.value, messages))
        self.offsets.extend(map(Message.offset, messages))
        stamps = list(map(Message.timestamp, messages))
        self.timestamp_types.extend(map(_TYPE, stamps))
        self.timestamps.extend(map(_MILLISECONDS, stamps))
        self.headers.extend(map(Message.headers, messages))

    def first(self, count: int) -> RecordFields:
        """The first ``count`` records (all of them, when there are fewer); they stay held."""
        if count >= len(self):
            return RecordFields(*self._columns())
        return RecordFields(*(column[:count] for column in self._columns()))

    def drop_first(self, count: int) -> None:
        """Forget the first ``count`` records (a :meth:`first` taken before keeps them)."""
        if count < len(self):
            for column in self._columns():
                del column[:count]
            return
        for each in fields(self):  # new lists: the old ones may be a first()'s
            setattr(self, each.name, [])

    def _columns(self) -> list[list[Any]]:
        return [getattr(self, column.name) for column in fields(self)]


_TYPE = operator.itemgetter(0)
_MILLISECONDS = operator.itemgetter(1)


def records_batch(
    connector: str,
    records: RecordFields,
    schema: pa.Schema,
    value_schema: pa.Schema | None,
    partition: tuple[str, int],
) -> pa.RecordBatch:
    """``records`` (of ``partition``) as one batch of ``schema``, built column by column.

    Each column is made by one pyarrow call over a field's list; ``topic`` and ``partition``,
    the same in every row, are filled without a list.

    :param partition: the topic and partition every one of ``records`` comes from.
    :raises SerdeError: when a value is not a JSON object of ``value_schema``, naming it.
    """
    count = len(records)
    values = (
        binary_array(records.values)
        if value_schema is None
        else _decoded_values(connector, records, value_schema, partition)
    )
    topic, number = partition
    stamps: list[int | None] | list[int] = records.timestamps
    if TIMESTAMP_NOT_AVAILABLE in records.timestamp_types:
        stamps = [
            None if kind == TIMESTAMP_NOT_AVAILABLE else ms
            for kind, ms in zip(records.timestamp_types, records.timestamps, strict=True)
        ]
    columns = [
        binary_array(records.keys),
        values,
        pa.repeat(pa.scalar(topic, pa.string()), count),
        pa.repeat(pa.scalar(number, pa.int32()), count),
        pa.array(records.offsets, pa.int64()),
        pa.array(stamps, pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC")),
        _headers(records.headers),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


_MAX_BINARY_BYTES = 2**31 - 1
"""The most bytes a ``binary`` array (32-bit offsets) holds."""


def binary_array(values: list[bytes | None]) -> pa.Array:
    """``values`` as a ``binary`` array, its bytes copied in one join.

    ``pa.array`` appends the values one at a time to a growing buffer: for a fetch of 1-KiB
    values, most of a poll's time. Joined, the data is one copy, and the offsets are the
    running sum of the lengths. With a null among the values (a tombstone, a record without
    a key), or more data than 32-bit offsets reach, ``pa.array`` builds it; all null (no
    record has a key), ``pa.nulls``.
    """
    nulls = values.count(None)
    if nulls == len(values):
        return pa.nulls(nulls, pa.binary())
    if nulls:
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
    connector: str, records: RecordFields, value_schema: pa.Schema, partition: tuple[str, int]
) -> pa.Array:
    """The values decoded as JSON objects in one pass over all of them; null stays null."""
    raw_values = records.values
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
        _raise_for_bad_value(connector, records, value_schema, partition)
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
    connector: str, records: RecordFields, value_schema: pa.Schema, partition: tuple[str, int]
) -> None:
    topic, number = partition
    for value, offset in zip(records.values, records.offsets, strict=True):
        if value is None:
            continue
        try:
            rows = _parse_json(value, value_schema, multiline=True).num_rows
            reason = f"{rows} JSON values in one record"
        except pa.ArrowInvalid as error:
            rows, reason = 0, str(error)
        if rows != 1:
            raise SerdeError(
                f"{connector}: the value of {topic}/{number} at offset "
                f"{offset} is not one JSON object of value.schema ({reason}); fix "
                "the producer, or read the topic with value.format=bytes"
            )
    raise SerdeError(
        f"{connector}: the values of {len(records)} records decode one by one but not "
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
