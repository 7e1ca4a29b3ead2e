"""The fixed row layouts the reference connectors produce and accept, chosen by name."""

from __future__ import annotations

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
