"""The fixed row layouts the reference connectors produce and accept, chosen by name."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import pyarrow as pa

from laminar_sdk import ConfigKeySpec, ConfigurationError, ConnectorConfig, SchemaMismatch

IDS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("partition", pa.int32()),
        pa.field("value", pa.float64()),
    ]
)
"""``id: int64, partition: int32, value: double`` — the layout loss and duplicates are
counted with, id by id."""


def ids_batch(ids: Iterable[int], partition: int = 0) -> pa.RecordBatch:
    """Records of :data:`IDS_SCHEMA` carrying ``ids`` in ``partition``, each ``value`` its id.

    The batch the reference connectors, the conformance kit's reference contexts and tests
    count loss and duplicates with.
    """
    id_array = pa.array(list(ids), pa.int64())
    return pa.RecordBatch.from_arrays(
        [
            id_array,
            pa.repeat(pa.scalar(partition, pa.int32()), len(id_array)),
            id_array.cast(pa.float64(), safe=False),
        ],
        schema=IDS_SCHEMA,
    )


WIDE_SCHEMA = pa.schema(
    [
        *IDS_SCHEMA,
        pa.field("event_time", pa.timestamp("us", tz="UTC")),
        pa.field("key", pa.string()),
        pa.field("flag", pa.bool_()),
    ]
)
"""The ``ids`` columns plus a UTC timestamp, a string and a boolean."""

SCHEMAS: Mapping[str, pa.Schema] = {"ids": IDS_SCHEMA, "wide": WIDE_SCHEMA}
"""The named schemas a ``schema`` key may give (``ids``, ``wide``), by name."""

SCHEMA_KEY = ConfigKeySpec(
    "schema",
    default="ids",
    description="row layout: ids (id, partition, value) or wide (ids + event_time, key, flag)",
)


def configured_schema(config: ConnectorConfig) -> pa.Schema:
    """The schema the validated ``config`` names with its ``schema`` key.

    :raises ConfigurationError: naming the key when the name is not one of :data:`SCHEMAS`.
    """
    name = config.require(SCHEMA_KEY.name)
    try:
        return SCHEMAS[name]
    except KeyError:
        raise ConfigurationError(
            f"{config.connector_type}: config key {SCHEMA_KEY.name!r} must be one of "
            f"{', '.join(SCHEMAS)}, got {name!r}",
            key=SCHEMA_KEY.name,
        ) from None


def conform_batch(connector: str, expected: pa.Schema, batch: pa.RecordBatch) -> pa.RecordBatch:
    """Return ``batch`` with exactly the schema ``expected``, or explain why it cannot be.

    Column names, order and types must match. A column that the batch declares non-nullable
    where ``expected`` allows nulls is accepted (Spark marks ``range`` ids non-nullable): the
    returned batch carries ``expected``'s nullability, so batches from different writers
    concatenate.

    :raises SchemaMismatch: naming every missing, unexpected or mistyped column.
    """
    actual = batch.schema
    if actual.equals(expected):
        return batch
    problems = _schema_differences(expected, actual)
    if problems:
        raise SchemaMismatch(
            f"{connector}: batch does not match the sink's schema: {'; '.join(problems)}. "
            f"Expected {_render(expected)}; cast the batch or configure the matching 'schema'"
        )
    return pa.RecordBatch.from_arrays(batch.columns, schema=expected)


def _schema_differences(expected: pa.Schema, actual: pa.Schema) -> list[str]:
    wanted = {field.name: field for field in expected}
    given = {field.name: field for field in actual}
    problems = []
    missing = [name for name in wanted if name not in given]
    if missing:
        problems.append(f"missing column(s) {', '.join(missing)}")
    unexpected = [name for name in given if name not in wanted]
    if unexpected:
        problems.append(f"unexpected column(s) {', '.join(unexpected)}")
    for name, field in wanted.items():
        other = given.get(name)
        if other is None:
            continue
        if not other.type.equals(field.type):
            problems.append(f"column {name!r} is {other.type}, expected {field.type}")
        elif other.nullable and not field.nullable:
            problems.append(f"column {name!r} is nullable, expected non-nullable")
    if not problems and (actual.names != expected.names or len(actual) != len(expected)):
        problems.append(f"columns are in the order {', '.join(actual.names)}")
    return problems


def _render(schema: pa.Schema) -> str:
    return ", ".join(f"{field.name}: {field.type}" for field in schema)


_DECIMAL = re.compile(r"decimal(128|256)?\((\d+),\s*(-?\d+)\)")
_TIMESTAMP = re.compile(r"timestamp\[(s|ms|us|ns)(?:,\s*tz=([^\]]+))?\]")
_LIST = re.compile(r"list<(?:item:\s*)?(.+)>")
TYPE_EXAMPLES = (
    "int64, double, string, binary, bool, date32, decimal128(10, 2), timestamp[us], "
    "timestamp[us, tz=UTC] or list<int64>"
)
"""Arrow type names, as :func:`arrow_type` reads them, for messages that ask for one."""


def arrow_type(text: str) -> pa.DataType:
    """The Arrow type written ``text``, as Arrow prints types.

    Arrow's aliases (``int64``, ``string``, ``date32``), ``decimal128(P, S)`` and
    ``decimal256(P, S)``, ``timestamp[us]`` and ``timestamp[us, tz=UTC]``, and ``list<TYPE>``.

    :raises ValueError: for text that names no such type.
    """
    text = text.strip()
    if match := _DECIMAL.fullmatch(text):
        decimal = pa.decimal256 if match[1] == "256" else pa.decimal128
        return decimal(int(match[2]), int(match[3]))
    if match := _TIMESTAMP.fullmatch(text):
        return pa.timestamp(match[1], match[2].strip() if match[2] else None)
    if match := _LIST.fullmatch(text):
        return pa.list_(arrow_type(match[1]))
    if not text:
        raise ValueError("no type")
    try:
        return pa.type_for_alias(text)
    except (KeyError, pa.ArrowException) as error:
        raise ValueError(f"{text!r} is not an Arrow type") from error


def parse_schema(text: str, key: str, connector: str) -> pa.Schema:
    """A schema written as ``name type, name type`` (types as :func:`arrow_type` reads them).

    :param key: the configuration key ``text`` came from, for the error.
    :param connector: the connector, for the error.
    :raises ConfigurationError: naming ``key`` for an empty list, a malformed field, an
        unknown type or a repeated name.
    """
    fields: list[pa.Field] = []
    for item in _top_level_split(text):
        name, _, type_text = item.strip().partition(" ")
        if not name or not type_text.strip():
            raise ConfigurationError(
                f"{connector}: {key} must list fields as 'name type, name type' (e.g. "
                f"'id int64, name string'); {item.strip()!r} is not one",
                key=key,
            )
        try:
            data_type = arrow_type(type_text)
        except ValueError:
            raise ConfigurationError(
                f"{connector}: {key} field {name!r} has unknown type {type_text.strip()!r}; "
                f"use an Arrow type such as {TYPE_EXAMPLES}",
                key=key,
            ) from None
        fields.append(pa.field(name, data_type))
    names = [field.name for field in fields]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigurationError(
            f"{connector}: {key} repeats field(s) {', '.join(repeated)}", key=key
        )
    return pa.schema(fields)


def _top_level_split(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        depth += (char in "([<") - (char in ")]>")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts
