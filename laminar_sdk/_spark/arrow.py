"""Arrow schemas on both sides of the bridge: connector schemas ↔ Spark schemas, and batches.

Data crosses the bridge as ``pyarrow.RecordBatch`` only. A batch is *conformed* to the schema
the other side expects: same column names in the same order; types equal, or differing only
where a cast is lossless metadata (a timestamp's time zone); nullability taken from the target.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from laminar_sdk._contract.errors import SchemaMismatch


def spark_schema(schema: pa.Schema, connector: str) -> StructType:
    """The Spark schema of a source's Arrow ``schema``.

    :raises SchemaMismatch: naming the column whose type Spark cannot represent.
    """
    try:
        return from_arrow_schema(schema)
    except Exception as error:  # pyspark raises its own TypeError subclasses
        unsupported = []
        for field in schema:
            try:
                from_arrow_schema(pa.schema([field]))
            except Exception:  # noqa: BLE001 - only collecting which columns fail
                unsupported.append(f"{field.name}: {field.type}")
        raise SchemaMismatch(
            f"connector {connector!r} declares column(s) Spark cannot represent: "
            f"{', '.join(unsupported) or schema}; the connector has to offer another type"
        ) from error


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark exchanges batches of ``schema`` in (timestamps in UTC)."""
    return to_arrow_schema(schema, timezone="UTC")


def spark_round_trip_schema(schema: pa.Schema, connector: str) -> pa.Schema:
    """The Arrow schema batches of a connector's ``schema`` have after crossing Spark.

    Spark keeps its own types (timestamps in microseconds, no ``large_string``, no
    dictionaries): a source's batches are conformed to this schema on their way in, a sink
    receives batches of it. Where it differs from ``schema`` (:func:`schema_differences`),
    the connector's batches cannot cross the bridge.

    :raises SchemaMismatch: naming the columns whose type Spark cannot represent at all.
    """
    return arrow_schema(spark_schema(schema, connector))


def schema_differences(expected: pa.Schema, actual: pa.Schema) -> list[str]:
    """Why batches of ``actual`` cannot be conformed to ``expected``; empty when they can."""
    if actual.names != expected.names:
        wanted = f"({', '.join(expected.names)})"
        missing = [repr(name) for name in expected.names if name not in actual.names]
        extra = [repr(name) for name in actual.names if name not in expected.names]
        problems = [f"missing column(s) {', '.join(missing)} of {wanted}"] if missing else []
        problems += [f"column(s) {', '.join(extra)} not in {wanted}"] if extra else []
        return problems or [f"columns in the order ({', '.join(actual.names)}), expected {wanted}"]
    return [
        f"column {want.name!r} is {have.type}, expected {want.type}"
        for want, have in zip(expected, actual, strict=True)
        if not _compatible(want.type, have.type)
    ]


def _compatible(expected: pa.DataType, actual: pa.DataType) -> bool:
    if expected.equals(actual):
        return True
    return (
        pa.types.is_timestamp(expected)
        and pa.types.is_timestamp(actual)
        and expected.unit == actual.unit
        and expected.tz is not None
        and actual.tz is not None
    )


def conform(batch: pa.RecordBatch, target: pa.Schema, what: str) -> pa.RecordBatch:
    """``batch`` with exactly the schema ``target``, without copying data where types match.

    :param what: names the connector for messages.
    :raises SchemaMismatch: when the columns differ (see :func:`schema_differences`) or a
        column ``target`` declares non-nullable holds nulls.
    """
    if batch.schema.equals(target):
        return batch
    problems = schema_differences(target, batch.schema)
    problems += [
        f"column {field.name!r} holds nulls but is not nullable"
        for field, column in zip(target, batch.columns, strict=False)
        if not field.nullable and column.null_count
    ]
    if problems:
        raise SchemaMismatch(
            f"{what}: batch does not match the schema {_render(target)}: {'; '.join(problems)}. "
            "Select or cast the columns before the laminar stage"
        )
    columns = [
        column if column.type.equals(field.type) else column.cast(field.type)
        for field, column in zip(target, batch.columns, strict=True)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=target)


def conform_source_batch(
    batch: pa.RecordBatch, declared: pa.Schema, target: pa.Schema, connector: str
) -> pa.RecordBatch:
    """A batch a source returned, checked against the schema it declares, for Spark.

    :param declared: the source's ``schema()``.
    :param target: the Arrow schema Spark expects the batches in.
    :raises SchemaMismatch: when the batch does not have the source's declared schema (the
        source is broken), or cannot be conformed to ``target``.
    """
    if not batch.schema.equals(declared):
        raise SchemaMismatch(
            f"source {connector!r} returned a batch whose schema "
            f"({batch.schema.to_string(show_schema_metadata=False)}) differs from the schema it "
            "declares; the source is broken: report it to its authors"
        )
    return conform(batch, target, f"source {connector!r}")


def _render(schema: pa.Schema) -> str:
    return "(" + ", ".join(f"{field.name}: {field.type}" for field in schema) + ")"
