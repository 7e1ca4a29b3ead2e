"""The ``postgres`` source: a table read in key order by keyset polling, range-readable.

Rows are read in the order of ``key`` — one column (``id`` from a sequence) or several
(``updated_at, id``) — each query asking for the rows after the last key returned
(``WHERE (k1, k2) > (last1, last2) ORDER BY k1, k2 LIMIT n``), through ``COPY (SELECT ...) TO
STDOUT`` and Arrow's CSV reader. The checkpoint holds the last key of each partition, in
PostgreSQL's text form; restoring it resumes right after that row.

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
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

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
    Session,
    bounded_by_network_timeout,
    connect,
    copy_out,
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
from laminar_plugin_postgres._values import Column, arrow_schema, from_text, read_csv_as_text

_HASH_MASK = 0x7FFFFFFFFFFFFFFF


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
            for index in range(reader.settings.partitions):
                available[index] = await _count_after(
                    reader, index, starts.get(partition_id(index)), max_records
                )
            for index, count in share_records(available, max_records).items():
                if count:
                    after = starts.get(partition_id(index))
                    offsets[partition_id(index)] = json.dumps(
                        await _key_at(reader, index, after, count)
                    )
        return SourceCheckpoint(offsets, start.epoch, start.metadata)

    async def read_range(self, partition_range: PartitionRange) -> AsyncIterator[pa.RecordBatch]:
        """The rows of one partition after ``start`` up to and including the key ``end``.

        :raises CheckpointError: when the range does not name a partition and keys.
        """
        reader = self._lifecycle.require("read_range")
        index = _partition_index(partition_range.partition, reader.settings.partitions)
        after = None if partition_range.start is None else _key(partition_range.start, reader)
        end = _key(partition_range.end, reader)
        while True:
            async with reader.lock:
                batch, last = await _query(reader, index, after, end, reader.settings.batch_size)
            if batch.num_rows:
                yield batch
            if batch.num_rows < reader.settings.batch_size:
                return
            after = last

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


async def _query(
    reader: _Reader, index: int, after: list[str] | None, through: list[str] | None, limit: int
) -> tuple[pa.RecordBatch, list[str]]:
    """Up to ``limit`` rows of partition ``index`` after ``after`` (through ``through``).

    :returns: the rows, and the last row's key (``after`` when there is none).
    """
    key_names = [f"laminar_key_{i}" for i in range(len(reader.keys))]
    select = sql.SQL(", ").join(
        [sql.Identifier(column.name) for column in reader.read]
        + [
            sql.SQL("{}::text AS {}").format(sql.Identifier(column.name), sql.Identifier(alias))
            for column, alias in zip(reader.keys, key_names, strict=True)
        ]
    )
    query = sql.SQL(
        "COPY (SELECT {select} FROM {table} WHERE {where} ORDER BY {key} LIMIT {limit}) "
        "TO STDOUT (FORMAT csv)"
    ).format(
        select=select,
        table=qualified(reader.settings.table),
        where=_where(reader, index, after, through),
        key=sql.SQL(", ").join(sql.Identifier(column.name) for column in reader.keys),
        limit=sql.Literal(limit),
    )
    try:
        data = await copy_out(reader.session, query)
    except psycopg.Error as error:
        raise failure(
            reader.settings.connection, f"read {reader.settings.table}", error, ReadError
        ) from None
    names = [column.name for column in reader.read] + key_names
    if not data:
        return _empty(reader), after or []
    batch, last = await asyncio.to_thread(_convert, reader, data, names, key_names)
    return batch, last


def _empty(reader: _Reader) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=reader.schema)


def _convert(
    reader: _Reader, data: bytes, names: list[str], key_names: list[str]
) -> tuple[pa.RecordBatch, list[str]]:
    text = read_csv_as_text(data, names)
    arrays = [
        from_text(text.column(column.name), field.type, column.name)
        for column, field in zip(reader.read, reader.schema, strict=True)
    ]
    last = [str(text.column(name)[-1].as_py()) for name in key_names]
    return pa.RecordBatch.from_arrays(arrays, schema=reader.schema), last


async def _count_after(
    reader: _Reader, index: int, after: list[str] | None, limit: int | None
) -> int:
    bounded = sql.SQL("") if limit is None else sql.SQL(" LIMIT {}").format(sql.Literal(limit))
    query = sql.SQL("SELECT count(*) FROM (SELECT 1 FROM {} WHERE {}{}) AS rows").format(
        qualified(reader.settings.table), _where(reader, index, after, None), bounded
    )
    return int(str((await _rows(reader, query))[0][0]))


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
