"""The ``postgres`` source: a table read in key order by keyset polling, range-readable.

Rows are read in the order of ``key`` — one column (``id`` from a sequence) or several
(``updated_at, id``) — each query asking for the rows after the last key returned
(``WHERE (k1, k2) > (last1, last2) ORDER BY k1, k2 LIMIT n``). Rows arrive through ADBC's
PostgreSQL driver — binary ``COPY (SELECT ...) TO STDOUT`` decoded straight into Arrow — with
the bounds in the query as literals (a query with parameters would not be copied). Columns of
types the driver decodes as the plugin maps them (integers, floats, booleans, ``bytea``, dates,
timestamps, ``text``, ``varchar``, ``char``) arrive as they are; the others are selected as
text and converted as the plugin always did. The checkpoint holds the last key of each
partition, in PostgreSQL's text form; restoring it resumes right after that row.

A range (:meth:`PostgresKeysetSource.read_range`) is one query on a connection of its own,
its rows streamed in batches of at most ``batch.size`` rows while the server still sends.

Partitions split the table so that Spark reads them in parallel, each in key order: by hash of
``partition.column`` (``partitions=N``), or by ranges of it (``partition.bounds``). A range
partition reads its own part of the key's index; a hash partition filters the whole key range,
so hash partitioning costs the server ``N`` times the reading: prefer ranges for big tables.

What keyset polling cannot see: a row whose key is not greater than every key already read
when it becomes visible. With a key from a sequence, a transaction that took a smaller value
and commits after a larger one was read is missed; so is an ``updated_at`` set before commit
by a transaction slower than another. Use it for tables written in key order (one writer,
or keys assigned at commit), and the ``postgres-cdc`` source, which reads the commit log, for
anything else. Updates and deletes of rows already read are not seen either.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

import adbc_driver_manager as adbc
import psycopg
import pyarrow as pa
from laminar_sdk import (
    CheckpointError,
    ConfigKeySpec,
    ConfigurationError,
    ConnectorConfig,
    ConnectorMetrics,
    HealthStatus,
    PartitionInfo,
    PartitionRange,
    RangeReadableSource,
    ReadError,
    SourceBatch,
    SourceCheckpoint,
    SourceConnector,
    share_records,
)
from laminar_sdk.reference import Lifecycle
from psycopg import sql

from laminar_plugin_postgres._client import (
    ArrowSession,
    Session,
    answered_within,
    arrow_failure,
    bounded_by_network_timeout,
    connect,
    connect_arrow,
    failure,
    qualified,
)
from laminar_plugin_postgres._config import (
    SOURCE_KEYS,
    SOURCE_NAME,
    ConnectionSettings,
    TableName,
    connection_settings,
    parse_columns,
    parse_table,
    positive,
)
from laminar_plugin_postgres._tables import table_columns
from laminar_plugin_postgres._values import Column, arrow_schema, check_in_range, from_text

_HASH_MASK = 0x7FFFFFFFFFFFFFFF
_T = TypeVar("_T")

_DECODED = frozenset(
    {"int2", "int4", "int8", "float4", "float8", "bool", "bytea", "date", "timestamp"}
    | {"timestamptz", "text", "varchar", "bpchar"}
)
"""Types ADBC's driver decodes as :meth:`Column.arrow_type` maps them; the rest are read as text."""

_HAS_MAX = frozenset(
    {"int2", "int4", "int8", "float4", "float8", "numeric", "text", "varchar", "bpchar", "date"}
    | {"timestamp", "timestamptz", "oid"}
)
"""Key types whose ``max`` aggregate orders as ``ORDER BY`` does: :func:`_count_after` finds
the last key of the rows it counts with it, and ``plan_end`` needs no second scan."""


@dataclass(frozen=True, slots=True)
class KeysetSettings:
    """The ``postgres`` source's configuration, checked.

    :param connection: how to connect.
    :param table: the table read.
    :param key: the key columns, in order.
    :param columns: the columns read (``None``: all).
    :param partitions: how many partitions.
    :param partition_column: the column partitions are made of.
    :param bounds: range partitioning: the bounds (text), else ``None`` (hash).
    :param batch_size: the most rows one query returns.
    """

    connection: ConnectionSettings
    table: TableName
    key: tuple[str, ...]
    columns: tuple[str, ...] | None
    partitions: int
    partition_column: str
    bounds: tuple[str, ...] | None
    batch_size: int


def keyset_settings(config: ConnectorConfig) -> KeysetSettings:
    """Check the ``postgres`` source's configuration.

    :raises ConfigurationError: naming the key at fault.
    """
    config = config.validate(SOURCE_KEYS)
    key = parse_columns(config.require("key"), "key", SOURCE_NAME)
    columns_text = config.get("columns")
    columns = parse_columns(columns_text, "columns", SOURCE_NAME) if columns_text else None
    bounds_text = config.get("partition.bounds")
    bounds = tuple(b.strip() for b in bounds_text.split(",")) if bounds_text else None
    partitions_given = "partitions" in config
    partitions = positive(config, "partitions") if partitions_given else 1
    if bounds is not None:
        if not all(bounds):
            raise ConfigurationError(
                f"{SOURCE_NAME}: partition.bounds has an empty value: {bounds_text!r}",
                key="partition.bounds",
            )
        if partitions_given and partitions != len(bounds) + 1:
            raise ConfigurationError(
                f"{SOURCE_NAME}: partition.bounds makes {len(bounds) + 1} partitions, but "
                f"partitions says {partitions}; remove partitions",
                key="partitions",
            )
        partitions = len(bounds) + 1
    partition_column = (config.get("partition.column") or key[0]).strip()
    parse_columns(partition_column, "partition.column", SOURCE_NAME)
    return KeysetSettings(
        connection=connection_settings(config, SOURCE_NAME),
        table=parse_table(config, SOURCE_NAME),
        key=key,
        columns=columns,
        partitions=partitions,
        partition_column=partition_column,
        bounds=bounds,
        batch_size=positive(config, "batch.size"),
    )


def partition_id(index: int) -> str:
    """The id of partition ``index`` in checkpoints and batches: ``p<index>``."""
    return f"p{index}"


@dataclass(slots=True)
class _Reader:
    """What an open source holds: the session, the table's shape, and each partition's last key."""

    settings: KeysetSettings
    session: Session
    read: list[Column]
    keys: list[Column]
    partition_type: str
    schema: pa.Schema
    last: dict[str, list[str]] = field(default_factory=dict)
    turn: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    arrow: ArrowSession | None = None


class PostgresKeysetSource(SourceConnector, RangeReadableSource):
    """Reads a table in the order of a monotonic key, replayably, in partitions.

    Batch columns: the table's columns (or ``columns``), as Arrow types (see the plugin's
    README); each batch holds rows of one partition (``p0``, ``p1``, ...), in key order. The
    checkpoint maps each partition to its last key; restoring it resumes after that row.
    Range-readable: Spark reads each partition of a micro-batch in a task of its own. See the
    module documentation for the rows keyset polling cannot see.
    """

    CONFIG_KEYS: ClassVar[tuple[ConfigKeySpec, ...]] = SOURCE_KEYS
    DESCRIPTION: ClassVar[str] = (
        "Reads a PostgreSQL table in key order (keyset polling); replayable, range-readable"
    )

    def __init__(self) -> None:
        self._lifecycle: Lifecycle[_Reader] = Lifecycle(SOURCE_NAME)
        self._records_total = 0
        self._bytes_total = 0

    async def open(self, config: ConnectorConfig) -> None:
        """Connect and read the table's columns.

        :raises ConfigurationError: for bad configuration, a missing table or column.
        :raises ConnectionFailed: when the server cannot be reached.
        """
        settings = keyset_settings(config)
        session = await connect(settings.connection, autocommit=True)
        try:
            reader = await _reader(session, settings)
        except psycopg.Error as error:
            await session.close()
            raise failure(settings.connection, f"read {settings.table}", error, ReadError) from None
        except BaseException:
            await session.close()
            raise
        self._lifecycle.open(reader)

    async def close(self) -> None:
        """Close the connection."""
        reader = self._lifecycle.state
        self._lifecycle.close()
        if reader is not None:
            if reader.arrow is not None:
                await reader.arrow.close()
            await reader.session.close()

    @property
    def connection_settings(self) -> ConnectionSettings | None:
        """How the open source connects (``None`` when it is not open)."""
        reader = self._lifecycle.state
        return None if reader is None else reader.settings.connection

    def schema(self) -> pa.Schema:
        """The columns read, as Arrow types."""
        return self._lifecycle.require("schema").schema

    @bounded_by_network_timeout
    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        """Up to ``max_records`` rows of one partition after its last key; partitions in turn.

        :raises ReadError: when the query fails.
        :raises ValueError: when ``max_records < 1``.
        """
        reader = self._lifecycle.require("poll_batch")
        if max_records < 1:
            raise ValueError(f"{SOURCE_NAME}: max_records must be >= 1, got {max_records}")
        limit = min(max_records, reader.settings.batch_size)
        async with reader.lock:
            for step in range(reader.settings.partitions):
                index = (reader.turn + step) % reader.settings.partitions
                partition = partition_id(index)
                batch, last = await _query(reader, index, reader.last.get(partition), None, limit)
                if batch.num_rows:
                    reader.turn = index + 1
                    reader.last[partition] = last
                    self._records_total += batch.num_rows
                    self._bytes_total += batch.nbytes
                    offset = json.dumps(last)
                    return SourceBatch(batch, PartitionInfo(partition, offset))
        return None

    def checkpoint(self) -> SourceCheckpoint:
        """The last key returned of each partition that returned rows."""
        reader = self._lifecycle.require("checkpoint")
        return SourceCheckpoint({p: json.dumps(key) for p, key in sorted(reader.last.items())})

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        """Resume each partition after its key in ``checkpoint`` (from its start if absent).

        :raises CheckpointError: when ``checkpoint`` is not one of this source's.
        """
        reader = self._lifecycle.require("restore")
        reader.last = _keys_of(checkpoint, reader)
        reader.turn = 0

    # Ranges ---------------------------------------------------------------------------------

    def as_range_readable(self) -> RangeReadableSource:
        """This source: its partitions can be read range by range, in parallel."""
        return self

    @bounded_by_network_timeout
    async def plan_end(self, start: SourceCheckpoint, max_records: int | None) -> SourceCheckpoint:
        """Each partition's key ``max_records`` rows (shared fairly) after ``start``, or its last.

        :raises CheckpointError: when ``start`` is not one of this source's checkpoints.
        """
        reader = self._lifecycle.require("plan_end")
        starts = _keys_of(start, reader)
        offsets = dict(start.offsets)
        async with reader.lock:
            if max_records is None:
                for index in range(reader.settings.partitions):
                    last = await _last_key(reader, index, starts.get(partition_id(index)))
                    if last is not None:
                        offsets[partition_id(index)] = json.dumps(last)
                return SourceCheckpoint(offsets, start.epoch, start.metadata)
            available: dict[int, int] = {}
            lasts: dict[int, list[str] | None] = {}
            for index in range(reader.settings.partitions):
                available[index], lasts[index] = await _count_after(
                    reader, index, starts.get(partition_id(index)), max_records
                )
            for index, count in share_records(available, max_records).items():
                last = lasts[index] if count == available[index] else None
                if count and last is None:
                    last = await _key_at(reader, index, starts.get(partition_id(index)), count)
                if count:
                    offsets[partition_id(index)] = json.dumps(last)
        return SourceCheckpoint(offsets, start.epoch, start.metadata)

    async def read_range(self, partition_range: PartitionRange) -> AsyncIterator[pa.RecordBatch]:
        """The rows of one partition after ``start`` up to and including the key ``end``.

        :raises CheckpointError: when the range does not name a partition and keys.
        """
        reader = self._lifecycle.require("read_range")
        index = _partition_index(partition_range.partition, reader.settings.partitions)
        after = None if partition_range.start is None else _key(partition_range.start, reader)
        end = _key(partition_range.end, reader)
        settings = reader.settings
        action = f"read partition {partition_range.partition} of {settings.table}"
        query = _select(reader, index, after, end, None, with_keys=False)
        async with answered_within(settings.connection, action):
            arrow = await connect_arrow(settings.connection, reader.session)
        try:
            with contextlib.ExitStack() as statement:
                async with answered_within(settings.connection, action):
                    rows = await _arrow_call(
                        reader, action, lambda: statement.enter_context(arrow.batches(query))
                    )
                while True:
                    async with answered_within(settings.connection, action):
                        batch = await _arrow_call(reader, action, lambda: _next_batch(rows))
                    if batch is None:
                        return
                    converted = _converted(reader, batch)
                    for offset in range(0, converted.num_rows, settings.batch_size):
                        yield converted.slice(offset, settings.batch_size)
        finally:
            await arrow.close()

    async def health_check(self) -> HealthStatus:
        """Healthy when the server answers."""
        reader = self._lifecycle.require("health_check")
        try:
            await reader.session.execute("SELECT 1")
        except psycopg.Error as error:
            return HealthStatus.unhealthy(
                str(failure(reader.settings.connection, "ask the server", error, ReadError))
            )
        return HealthStatus.healthy()

    def metrics(self) -> ConnectorMetrics:
        """Rows and Arrow bytes returned."""
        return ConnectorMetrics(records_total=self._records_total, bytes_total=self._bytes_total)


async def _reader(session: Session, settings: KeysetSettings) -> _Reader:
    columns = await table_columns(session, settings.table)
    if columns is None:
        raise ConfigurationError(
            f"{SOURCE_NAME}: table {settings.table} does not exist (or this user cannot see it)",
            key="table",
        )
    by_name = {column.name: column for column in columns}

    def named(names: Sequence[str], key: str) -> list[Column]:
        missing = [name for name in names if name not in by_name]
        if missing:
            raise ConfigurationError(
                f"{SOURCE_NAME}: {key} names column(s) {missing} that table {settings.table} "
                f"does not have ({', '.join(by_name)})",
                key=key,
            )
        return [by_name[name] for name in names]

    read = named(settings.columns, "columns") if settings.columns else columns
    keys = named(settings.key, "key")
    (partition,) = named((settings.partition_column,), "partition.column")
    return _Reader(settings, session, read, keys, partition.declared, arrow_schema(read))


def _key_expression(reader: _Reader) -> sql.Composable:
    return sql.SQL("({})").format(
        sql.SQL(", ").join(sql.Identifier(column.name) for column in reader.keys)
    )


def _key_value(reader: _Reader, key: list[str]) -> sql.Composable:
    return sql.SQL("({})").format(
        sql.SQL(", ").join(
            sql.SQL("{}::{}").format(sql.Literal(text), sql.SQL(column.declared))
            for text, column in zip(key, reader.keys, strict=True)
        )
    )


def _partition_filter(reader: _Reader, index: int) -> sql.Composable:
    settings = reader.settings
    column = sql.Identifier(settings.partition_column)
    if settings.bounds is None:
        if settings.partitions == 1:
            return sql.SQL("TRUE")
        return sql.SQL("(hashtextextended({}::text, 0) & {}) % {} = {}").format(
            column, sql.Literal(_HASH_MASK), sql.Literal(settings.partitions), sql.Literal(index)
        )
    parts: list[sql.Composable] = [sql.SQL("TRUE")]
    cast = sql.SQL(reader.partition_type)
    if index > 0:
        lower = sql.Literal(settings.bounds[index - 1])
        parts.append(sql.SQL("{} >= {}::{}").format(column, lower, cast))
    if index < len(settings.bounds):
        upper = sql.Literal(settings.bounds[index])
        parts.append(sql.SQL("{} < {}::{}").format(column, upper, cast))
    return sql.SQL(" AND ").join(parts)


def _where(
    reader: _Reader, index: int, after: list[str] | None, through: list[str] | None
) -> sql.Composable:
    key = _key_expression(reader)
    parts = [_partition_filter(reader, index)]
    # A row whose key is NULL has no place in the key order: it is never read.
    parts += [sql.SQL("{} IS NOT NULL").format(sql.Identifier(c.name)) for c in reader.keys]
    if after is not None:
        parts.append(sql.SQL("{} > {}").format(key, _key_value(reader, after)))
    if through is not None:
        parts.append(sql.SQL("{} <= {}").format(key, _key_value(reader, through)))
    return sql.SQL(" AND ").join(parts)


def _select(
    reader: _Reader,
    index: int,
    after: list[str] | None,
    through: list[str] | None,
    limit: int | None,
    *,
    with_keys: bool,
) -> sql.Composable:
    """The rows of partition ``index`` after ``after`` (through ``through``), in key order.

    :param with_keys: add each key column as text (``laminar_key_<i>``), for the checkpoint.
    """
    selected: list[sql.Composable] = [
        sql.Identifier(column.name)
        if column.element is None and column.type_name in _DECODED
        else sql.SQL("{0}::text AS {0}").format(sql.Identifier(column.name))
        for column in reader.read
    ]
    if with_keys:
        selected += [
            sql.SQL("{}::text AS {}").format(
                sql.Identifier(column.name), sql.Identifier(f"laminar_key_{position}")
            )
            for position, column in enumerate(reader.keys)
        ]
    limited = sql.SQL("") if limit is None else sql.SQL(" LIMIT {}").format(sql.Literal(limit))
    return sql.SQL("SELECT {select} FROM {table} WHERE {where} ORDER BY {key}{limit}").format(
        select=sql.SQL(", ").join(selected),
        table=qualified(reader.settings.table),
        where=_where(reader, index, after, through),
        key=sql.SQL(", ").join(sql.Identifier(column.name) for column in reader.keys),
        limit=limited,
    )


async def _query(
    reader: _Reader, index: int, after: list[str] | None, through: list[str] | None, limit: int
) -> tuple[pa.RecordBatch, list[str]]:
    """Up to ``limit`` rows of partition ``index`` after ``after`` (through ``through``).

    :returns: the rows, and the last row's key (``after`` when there is none).
    """
    settings = reader.settings
    action = f"read {settings.table}"
    if reader.arrow is None:
        reader.arrow = await connect_arrow(settings.connection, reader.session)
    arrow = reader.arrow
    query = _select(reader, index, after, through, limit, with_keys=True)
    table = await _arrow_call(reader, action, lambda: arrow.read_all(query))
    if not table.num_rows:
        return _empty(reader), after or []
    (batch,) = table.combine_chunks().to_batches()
    last = [
        str(batch.column(f"laminar_key_{position}")[-1].as_py())
        for position in range(len(reader.keys))
    ]
    return await asyncio.to_thread(_converted, reader, batch), last


def _next_batch(rows: pa.RecordBatchReader) -> pa.RecordBatch | None:
    try:
        return rows.read_next_batch()
    except StopIteration:
        return None


async def _arrow_call(reader: _Reader, action: str, call: Callable[[], _T]) -> _T:
    """``call()`` (ADBC's, which blocks) in a thread; its errors as the SDK's."""
    try:
        return await asyncio.to_thread(call)
    except (adbc.Error, pa.ArrowException) as error:
        raise arrow_failure(reader.settings.connection, action, error, ReadError) from None


def _empty(reader: _Reader) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=reader.schema)


def _converted(reader: _Reader, batch: pa.RecordBatch) -> pa.RecordBatch:
    """The columns read of ``batch`` as :attr:`_Reader.schema` has them.

    :raises SerdeError: naming the column of a value that does not convert.
    """
    arrays = []
    for position, (column, wanted) in enumerate(zip(reader.read, reader.schema, strict=True)):
        values = batch.column(position)
        if column.element is None and column.type_name in _DECODED:
            check_in_range(values, column.name)
            arrays.append(values if values.type.equals(wanted.type) else values.cast(wanted.type))
        else:
            arrays.append(from_text(values, wanted.type, column.name))
    return pa.RecordBatch.from_arrays(arrays, schema=reader.schema)


async def _count_after(
    reader: _Reader, index: int, after: list[str] | None, limit: int
) -> tuple[int, list[str] | None]:
    """How many rows of partition ``index`` follow ``after`` (at most ``limit``), and more.

    :returns: the count, and the key of the last row counted when the same scan can tell (a
        one-column key whose type has ``max``), else ``None``.
    """
    (key,) = reader.keys if len(reader.keys) == 1 else (None,)
    last = (
        sql.SQL("max({})::text").format(sql.Identifier(key.name))
        if key is not None and key.element is None and key.type_name in _HAS_MAX
        else sql.SQL("NULL")
    )
    query = sql.SQL(
        "SELECT count(*), {last} FROM (SELECT {keys} FROM {table} WHERE {where} ORDER BY {keys} "
        "LIMIT {limit}) AS rows"
    ).format(
        last=last,
        keys=sql.SQL(", ").join(sql.Identifier(column.name) for column in reader.keys),
        table=qualified(reader.settings.table),
        where=_where(reader, index, after, None),
        limit=sql.Literal(limit),
    )
    count, text = (await _rows(reader, query))[0]
    return int(str(count)), None if text is None else [str(text)]


async def _last_key(reader: _Reader, index: int, after: list[str] | None) -> list[str] | None:
    """The key of the last row of partition ``index`` after ``after``; ``None``: no row."""
    query = sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {} LIMIT 1").format(
        _key_texts(reader),
        qualified(reader.settings.table),
        _where(reader, index, after, None),
        sql.SQL(", ").join(sql.SQL("{} DESC").format(sql.Identifier(c.name)) for c in reader.keys),
    )
    rows = await _rows(reader, query)
    return [str(value) for value in rows[0]] if rows else None


def _key_texts(reader: _Reader) -> sql.Composable:
    """The key columns as text, aliased: ``ORDER BY`` a key's name would sort the text."""
    return sql.SQL(", ").join(
        sql.SQL("{}::text AS {}").format(
            sql.Identifier(column.name), sql.Identifier(f"laminar_key_{position}")
        )
        for position, column in enumerate(reader.keys)
    )


async def _key_at(reader: _Reader, index: int, after: list[str] | None, position: int) -> list[str]:
    """The key of the ``position``-th row (1-based) of partition ``index`` after ``after``."""
    query = sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {} LIMIT 1 OFFSET {}").format(
        _key_texts(reader),
        qualified(reader.settings.table),
        _where(reader, index, after, None),
        sql.SQL(", ").join(sql.Identifier(column.name) for column in reader.keys),
        sql.Literal(position - 1),
    )
    return [str(value) for value in (await _rows(reader, query))[0]]


async def _rows(reader: _Reader, query: sql.Composable) -> list[tuple[object, ...]]:
    try:
        return await reader.session.execute(query)
    except psycopg.Error as error:
        raise failure(
            reader.settings.connection, f"read {reader.settings.table}", error, ReadError
        ) from None


def _partition_index(partition: str, partitions: int) -> int:
    index = partition[1:]
    if not (partition.startswith("p") and index.isdigit() and int(index) < partitions):
        raise CheckpointError(
            f"{SOURCE_NAME}: {partition!r} is not a partition of this source (p0 .. "
            f"p{partitions - 1}); was the checkpoint made with another partitions setting?"
        )
    return int(index)


def _key(text: str, reader: _Reader) -> list[str]:
    try:
        values = json.loads(text)
    except json.JSONDecodeError:
        values = None
    if not (
        isinstance(values, list)
        and len(values) == len(reader.keys)
        and all(isinstance(v, str) for v in values)
    ):
        raise CheckpointError(
            f"{SOURCE_NAME}: {text!r} is not a key of ({', '.join(reader.settings.key)}) as this "
            "source records it (a JSON list of texts); was the checkpoint made with another key?"
        )
    return values


def _keys_of(checkpoint: SourceCheckpoint, reader: _Reader) -> dict[str, list[str]]:
    keys: dict[str, list[str]] = {}
    for partition, offset in checkpoint.offsets.items():
        _partition_index(partition, reader.settings.partitions)
        keys[partition] = _key(offset, reader)
    return keys
