"""PostgreSQL columns and Arrow types: the mapping, the text form of values, and COPY's CSV.

Values go through PostgreSQL's *text* form — what ``COPY ... (FORMAT csv)`` writes and what
``pgoutput`` sends — converted column by column with Arrow's vectorised casts, never row by
row in Python (except for ``bytea`` and arrays, whose text forms Arrow cannot parse); the
keyset source reads most types in binary instead (ADBC), the sinks write them so (pgpq).

==============================  ==============================================
Arrow                           PostgreSQL
==============================  ==============================================
int8, int16 / int32 / int64     smallint / integer / bigint
uint8 / uint16 / uint32         smallint / integer / bigint
float16, float32 / float64      real / double precision
decimal128(p, s)                numeric(p, s)
string, large_string            text (also accepted: varchar, char, json, jsonb, uuid, ...)
bool                            boolean
binary, large_binary            bytea
date32                          date
timestamp (no zone / zone)      timestamp / timestamptz (microseconds)
list<scalar>                    scalar[] (one dimension)
==============================  ==============================================

Read back, ``numeric`` without a precision, and types outside this list (``interval``,
``inet``, ...), are strings in PostgreSQL's text form.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass

import pgpq
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
from laminar_sdk import SchemaMismatch, SerdeError

_SCALARS: dict[str, pa.DataType] = {
    "int2": pa.int16(),
    "int4": pa.int32(),
    "int8": pa.int64(),
    "float4": pa.float32(),
    "float8": pa.float64(),
    "bool": pa.bool_(),
    "bytea": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us"),
    "timestamptz": pa.timestamp("us", "UTC"),
}
_TEXTUAL = frozenset(
    {"text", "varchar", "bpchar", "name", "json", "jsonb", "uuid", "citext", "xml", "char"}
)


@dataclass(frozen=True, slots=True)
class Column:
    """A column of a table, as the catalog describes it.

    :param name: the column's name.
    :param type_name: the type's internal name (``int8``, ``_text`` for ``text[]``).
    :param declared: the type as declared (``numeric(10,2)``), for messages.
    :param element: for an array, the element type's internal name.
    :param not_null: whether the column is ``NOT NULL``.
    :param has_default: whether it has a default (or is generated / an identity).
    """

    name: str
    type_name: str
    declared: str
    element: str | None = None
    not_null: bool = False
    has_default: bool = False

    def arrow_type(self) -> pa.DataType:
        """The Arrow type values of this column are read as (see the module's table)."""
        if self.element is not None:
            return pa.list_(_scalar_type(self.element, self.element))
        return _scalar_type(self.type_name, self.declared)


def _scalar_type(type_name: str, declared: str) -> pa.DataType:
    if type_name in _SCALARS:
        return _SCALARS[type_name]
    if type_name == "numeric" and "(" in declared:
        precision, _, scale = declared[declared.index("(") + 1 : declared.index(")")].partition(",")
        if int(precision) <= 38:
            return pa.decimal128(int(precision), int(scale or 0))
    return pa.string()


CATALOG_QUERY = """
SELECT a.attname, t.typname, format_type(a.atttypid, a.atttypmod), e.typname,
       a.attnotnull, a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> ''
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typcategory = 'A'
WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""
"""The columns of the table ``(schema, name)``, as :func:`columns_from_rows` reads them."""


def columns_from_rows(rows: Sequence[Sequence[object]]) -> list[Column]:
    """The :data:`CATALOG_QUERY` rows as columns."""
    return [
        Column(str(n), str(t), str(d), None if e is None else str(e), bool(nn), bool(df))
        for n, t, d, e, nn, df in rows
    ]


def arrow_schema(columns: Sequence[Column]) -> pa.Schema:
    """The Arrow schema rows of ``columns`` are read as.

    Every field is nullable, ``NOT NULL`` columns too: the server enforces that, and Spark
    renders what it reads back from files as nullable.
    """
    return pa.schema([pa.field(c.name, c.arrow_type()) for c in columns])


# Arrow → PostgreSQL ---------------------------------------------------------------------------


def postgres_type(data_type: pa.DataType) -> str | None:
    """The PostgreSQL type a column of ``data_type`` is created as; ``None``: not supported."""
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        element = postgres_type(data_type.value_type)
        nested = pa.types.is_list(data_type.value_type)
        return None if element is None or nested else f"{element}[]"
    checks: list[tuple[bool, str]] = [
        (pa.types.is_int8(data_type) or pa.types.is_int16(data_type), "smallint"),
        (pa.types.is_uint8(data_type), "smallint"),
        (pa.types.is_int32(data_type) or pa.types.is_uint16(data_type), "integer"),
        (pa.types.is_int64(data_type) or pa.types.is_uint32(data_type), "bigint"),
        (pa.types.is_uint64(data_type), "numeric(20)"),
        (pa.types.is_float16(data_type) or pa.types.is_float32(data_type), "real"),
        (pa.types.is_float64(data_type), "double precision"),
        (pa.types.is_string(data_type) or pa.types.is_large_string(data_type), "text"),
        (pa.types.is_boolean(data_type), "boolean"),
        (pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type), "bytea"),
        (pa.types.is_date(data_type), "date"),
    ]
    for matches, name in checks:
        if matches:
            return name
    if pa.types.is_decimal(data_type):
        return f"numeric({data_type.precision},{data_type.scale})"
    if pa.types.is_timestamp(data_type):
        return "timestamptz" if data_type.tz is not None else "timestamp"
    return None


_ACCEPTED: dict[str, frozenset[str]] = {
    "smallint": frozenset({"int2", "int4", "int8", "numeric", "float4", "float8"}),
    "integer": frozenset({"int4", "int8", "numeric", "float8"}),
    "bigint": frozenset({"int8", "numeric"}),
    "numeric(20)": frozenset({"numeric"}),
    "real": frozenset({"float4", "float8", "numeric"}),
    "double precision": frozenset({"float8", "numeric"}),
    "text": _TEXTUAL,
    "boolean": frozenset({"bool"}),
    "bytea": frozenset({"bytea"}),
    "date": frozenset({"date", "timestamp", "timestamptz"}),
    "timestamp": frozenset({"timestamp", "timestamptz"}),
    "timestamptz": frozenset({"timestamptz", "timestamp"}),
}


def accepts(column: Column, data_type: pa.DataType) -> bool:
    """Whether ``column`` takes values of ``data_type`` without losing any."""
    wanted = postgres_type(data_type)
    if wanted is None:
        return False
    if wanted.endswith("[]"):
        return column.element is not None and accepts(
            Column(column.name, column.element, column.element), data_type.value_type
        )
    if column.element is not None:
        return False
    if wanted.startswith("numeric("):
        return column.type_name == "numeric"
    return column.type_name in _ACCEPTED.get(wanted, frozenset())


def check_batch_against_table(
    schema: pa.Schema, columns: Sequence[Column], table: str, connector: str
) -> None:
    """Check that rows of ``schema`` fit ``table``'s ``columns``.

    :raises SchemaMismatch: naming the first column that is missing from the table, of a type
        that does not fit, or ``NOT NULL`` without a default and missing from ``schema``.
    """
    by_name = {column.name: column for column in columns}
    for field in schema:
        column = by_name.get(field.name)
        if column is None:
            raise SchemaMismatch(
                f"{connector}: the batches' column {field.name!r} is not a column of table "
                f"{table} ({', '.join(by_name)}); add it (ALTER TABLE ... ADD COLUMN) or drop it "
                "from the stream"
            )
        if not accepts(column, field.type):
            wanted = postgres_type(field.type) or "no PostgreSQL type"
            raise SchemaMismatch(
                f"{connector}: column {field.name!r} of table {table} is {column.declared}, but "
                f"the batches' column {field.name!r} is {field.type} (written as {wanted}); cast "
                "the column in the stream, or change the table's column type"
            )
    names = set(schema.names)
    for column in columns:
        if column.name not in names and column.not_null and not column.has_default:
            raise SchemaMismatch(
                f"{connector}: column {column.name!r} of table {table} is NOT NULL without a "
                "default, and the batches do not carry it; add it to the stream or give it a "
                "default"
            )


_NUL_MESSAGE = "a value holds a NUL character (\\0), which PostgreSQL text cannot store; remove it"


def copy_csv(batch: pa.RecordBatch) -> bytes:
    """``batch`` as CSV for ``COPY ... FROM STDIN (FORMAT csv)``: nulls unquoted and empty.

    :raises SerdeError: for a value PostgreSQL cannot take in text (a NUL character).
    """
    arrays: list[pa.Array] = []
    for column in batch.columns:
        data_type = column.type
        if pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type):
            hexed = [None if v is None else "\\x" + v.hex() for v in column.to_pylist()]
            arrays.append(pa.array(hexed, pa.string()))
        elif pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
            arrays.append(pa.array([array_literal(v) for v in column.to_pylist()], pa.string()))
        else:
            arrays.append(column)
    prepared = pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)
    sink = io.BytesIO()
    try:
        pcsv.write_csv(prepared, sink, pcsv.WriteOptions(include_header=False))
    except pa.ArrowInvalid as error:
        raise SerdeError(f"cannot write the batch as CSV for COPY: {error}") from None
    data = sink.getvalue()
    if b"\x00" in data:
        raise SerdeError(_NUL_MESSAGE)
    return data


_BINARY: dict[str, pa.DataType] = {**_SCALARS, "text": pa.string(), "varchar": pa.string()}
"""The Arrow type whose values pgpq encodes in the binary form of each column type."""


def _binary_type(data_type: pa.DataType, column: Column) -> pa.DataType | None:
    """What a column of ``data_type`` is cast to for ``column`` in binary; ``None``: no way.

    The same type, a narrower integer (widened exactly), or a timestamp in another zone (the
    same instants): casts that change no value. A ``real`` into ``double precision`` would
    (CSV sends its shortest text), so that goes as CSV.
    """
    wanted = _BINARY.get(column.type_name) if column.element is None else None
    if wanted is None:
        return None
    widened = pa.types.is_integer(data_type) and pa.types.is_integer(wanted)
    if widened and data_type.bit_width < wanted.bit_width and not pa.types.is_uint64(data_type):
        return wanted
    if pa.types.is_timestamp(data_type) and pa.types.is_timestamp(wanted):
        zoned = data_type.tz is not None
        same = data_type.unit == "us" and zoned == (wanted.tz is not None)
        return wanted if same else None
    return wanted if data_type.equals(wanted) else None


@dataclass(frozen=True, slots=True)
class CopyFormat:
    """How batches of one schema are sent with ``COPY ... FROM STDIN`` into a table.

    ``binary`` (encoded by pgpq, in Rust) when every column of the batches has an exact
    binary form for its column of the table (:func:`_binary_type`): the server then parses
    nothing; else ``csv`` (:func:`copy_csv`).

    :param name: ``binary`` or ``csv``, as ``COPY``'s ``FORMAT`` option.
    :param casts: binary: each column's type in the encoded batch.
    """

    name: str
    casts: tuple[pa.DataType, ...] = ()

    @classmethod
    def choose(cls, schema: pa.Schema, columns: Sequence[Column]) -> CopyFormat:
        """The format for batches of ``schema`` into a table of ``columns``."""
        by_name = {column.name: column for column in columns}
        casts = [
            _binary_type(field.type, by_name[field.name]) if field.name in by_name else None
            for field in schema
        ]
        if all(cast is not None for cast in casts):
            return cls("binary", tuple(c for c in casts if c is not None))
        return cls("csv")

    def encoder(self) -> CopyEncoder:
        """A new encoder, for one ``COPY``."""
        return CopyEncoder(self)


class CopyEncoder:
    """Batches as the data of one ``COPY ... FROM STDIN`` in a :class:`CopyFormat`.

    :param copy_format: the format.
    """

    def __init__(self, copy_format: CopyFormat) -> None:
        self._format = copy_format
        self._binary: pgpq.ArrowToPostgresBinaryEncoder | None = None

    def encode(self, batch: pa.RecordBatch) -> bytes:
        """The data of ``batch``'s rows (binary: the header first, the first time).

        :raises SerdeError: for a value PostgreSQL cannot take in text (a NUL character).
        """
        if self._format.name == "csv":
            return copy_csv(batch)
        cast = pa.RecordBatch.from_arrays(
            [
                column if column.type.equals(to) else column.cast(to)
                for column, to in zip(batch.columns, self._format.casts, strict=True)
            ],
            names=batch.schema.names,
        )
        for column in cast.columns:
            if (
                pa.types.is_string(column.type)
                and pc.any(pc.match_substring(column, "\x00")).as_py()
            ):
                raise SerdeError(_NUL_MESSAGE)
        header = b""
        if self._binary is None:
            self._binary = pgpq.ArrowToPostgresBinaryEncoder(cast.schema)
            header = self._binary.write_header()
        return header + self._binary.write_batch(cast)

    def finish(self) -> bytes:
        """What ends the data (binary: what pgpq holds back, and the trailer)."""
        return b"" if self._binary is None else self._binary.finish()


def array_literal(values: list[object] | None) -> str | None:
    """A one-dimensional PostgreSQL array literal of ``values`` (``None`` for a null array)."""
    if values is None:
        return None
    items: list[str] = []
    for value in values:
        if value is None:
            items.append("NULL")
            continue
        if isinstance(value, bytes):
            text = "\\x" + value.hex()
        elif isinstance(value, bool):
            text = "true" if value else "false"
        else:
            text = str(value)
        escaped = text.replace("\\", "\\\\").replace('"', '\\"')
        items.append(f'"{escaped}"')
    return "{" + ",".join(items) + "}"


# PostgreSQL text → Arrow ------------------------------------------------------------------------


_DAYS = (-2_440_588, 2_145_042_905)
"""The dates PostgreSQL holds, in days since 1970 (4714-11-24 BC to 5874897-12-31)."""
_MICROSECONDS = (-210_866_803_200_000_000, 2**63 - 1)
"""The timestamps PostgreSQL holds that Arrow holds too, in microseconds since 1970: from
4714-11-24 BC to 294247-01-10 (PostgreSQL's, to 294276, do not fit in 64 bits since 1970;
the driver's decoding of those, and of infinity, wraps around below the lower bound)."""


def check_in_range(values: pa.Array, column: str) -> None:
    """Check that the dates or timestamps ``values`` (binary ``COPY``'s) are real ones.

    ``infinity`` and ``-infinity`` arrive decoded as values outside PostgreSQL's range.

    :raises SerdeError: naming ``column`` when one does (Arrow has no infinite date).
    """
    if pa.types.is_date32(values.type):
        low, high = _DAYS
        numbers = values.view(pa.int32())
    elif pa.types.is_timestamp(values.type):
        low, high = _MICROSECONDS
        numbers = values.view(pa.int64())
    else:
        return
    extremes = pc.min_max(numbers)
    least, most = extremes["min"].as_py(), extremes["max"].as_py()
    if least is not None and (least < low or most > high):
        raise SerdeError(
            f"column {column!r}: a value does not convert to {values.type}: infinity, "
            "-infinity, or a timestamp after 294247-01-10, which Arrow cannot hold; select the "
            "column as text, or filter them out"
        )


def from_text(values: pa.Array | pa.ChunkedArray, data_type: pa.DataType, column: str) -> pa.Array:
    """Values in PostgreSQL's text form (session in UTC, ISO dates) as ``data_type``.

    :raises SerdeError: naming ``column`` for a value that does not convert (``infinity``
        dates, a ``NaN`` numeric into a decimal).
    """
    text = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    try:
        if pa.types.is_string(data_type):
            return text
        if pa.types.is_boolean(data_type):
            return pc.equal(text, "t")
        if pa.types.is_binary(data_type):
            return pa.array(
                [None if v is None else bytes.fromhex(v[2:]) for v in text.to_pylist()],
                pa.binary(),
            )
        if pa.types.is_list(data_type):
            element = data_type.value_type
            parsed = [None if v is None else parse_array_literal(v) for v in text.to_pylist()]
            flat = pa.array([item for items in parsed if items for item in items], pa.string())
            converted = from_text(flat, element, column).to_pylist()
            rebuilt: list[list[object] | None] = []
            position = 0
            for items in parsed:
                if items is None:
                    rebuilt.append(None)
                else:
                    rebuilt.append(converted[position : position + len(items)])
                    position += len(items)
            return pa.array(rebuilt, data_type)
        return pc.cast(text, data_type)
    except (pa.ArrowInvalid, ValueError, json.JSONDecodeError) as error:
        raise SerdeError(
            f"column {column!r}: a value does not convert to {data_type}: {error}"
        ) from None


def parse_array_literal(text: str) -> list[str | None]:
    """The elements of a one-dimensional PostgreSQL array literal (``{1,"a b",NULL}``), as text.

    :raises ValueError: for a multi-dimensional or malformed literal.
    """
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError(f"not an array literal: {text[:40]!r}")
    body = text[1:-1]
    items: list[str | None] = []
    position = 0
    while position < len(body):
        if body[position] == "{":
            raise ValueError("multi-dimensional arrays are not supported")
        if body[position] == '"':
            position += 1
            chars: list[str] = []
            while body[position] != '"':
                if body[position] == "\\":
                    position += 1
                chars.append(body[position])
                position += 1
            items.append("".join(chars))
            position += 1
        else:
            end = body.find(",", position)
            end = len(body) if end < 0 else end
            raw = body[position:end]
            items.append(None if raw == "NULL" else raw)
            position = end
        if position < len(body):
            if body[position] != ",":
                raise ValueError(f"malformed array literal: {text[:40]!r}")
            position += 1
    return items
