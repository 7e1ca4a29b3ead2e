"""The ``postgres-cdc`` source: a table's changes from a logical replication slot (pgoutput).

Reading
-------
Each read is ``pg_logical_slot_peek_binary_changes`` on the slot with the built-in ``pgoutput``
plugin, for the configured publication: it decodes the committed transactions after the slot's
confirmed position, in commit order, *without* consuming them. The source keeps the changes of
its table (an ``insert``, ``update``, ``delete`` or ``truncate`` row each: the key, the new row,
the old row where ``REPLICA IDENTITY`` sends it, the transaction's commit LSN, time and id).

The checkpoint is the LSN after the last transaction returned whole (its commit record's end),
with ``+N`` when the first ``N`` changes of the next transaction were returned too: restoring it
resumes exactly after the last change returned, inside a transaction if need be.

When the slot is advanced, and why there
----------------------------------------
A slot only moves forward, and decoding can never return what it passed: the slot may be
advanced past a change only once the epoch that read the change is durable — committed by the
sink, or kept where a replay finds it. The contract has one call that says so: ``restore``.
Every runtime restores only durable checkpoints: the SDK's pipeline the checkpoint of its last
committed epoch; Spark, for each micro-batch, the micro-batch's start — the end of the previous
one, whose records are in the read log (this source is polled: Spark's planning process polls
it and writes what it returned to the read log, durably, before Spark records the micro-batch)
and, once Spark planned past it, committed. So with ``slot.advance=on-restore`` (the default)
``restore(checkpoint)`` advances the slot (``pg_replication_slot_advance``) to the checkpoint's
last whole transaction, and Spark advances it by one micro-batch at a time. A checkpoint older
than the slot can no longer be restored (the changes are gone): a :class:`ReadError`, never
silence. With ``slot.advance=manual`` the source never moves the slot; advance it yourself
(``SELECT pg_replication_slot_advance('slot', 'LSN')``) to a committed checkpoint's LSN.

A slot that is not advanced keeps every WAL segment since its position: ``metrics().custom
['retained_wal_bytes']`` and ``health_check`` (degraded above ``max.retained.bytes``) report it.
Slots are created and dropped explicitly: ``slot.create=true``, :func:`create_slot` /
:func:`drop_slot`, or SQL (see the plugin's README); never as a side effect of reading.
"""

from __future__ import annotations

import asyncio
from collections import deque
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
    ReadError,
    SchemaMismatch,
    SourceBatch,
    SourceCheckpoint,
    SourceConnector,
)
from laminar_sdk.reference import Lifecycle

from laminar_plugin_postgres._client import Session, connect, failure
from laminar_plugin_postgres._config import (
    CDC_KEYS,
    CDC_NAME,
    CONNECTION_KEYS,
    ConnectionSettings,
    TableName,
    choice,
    connection_settings,
    identifier,
    parse_table,
    positive,
)
from laminar_plugin_postgres._pgoutput import (
    UNCHANGED,
    Change,
    Decoder,
    ProtocolError,
    Transaction,
    lsn_text,
    parse_lsn,
)
from laminar_plugin_postgres._tables import table_columns
from laminar_plugin_postgres._values import Column, arrow_schema, from_text

_FIRST_WINDOW = 10_000  # messages decoded by the first peek of a poll; doubled while short
_SLOT_BUSY_RETRIES = 50  # a peek finds the slot in use by a session that is ending
_SLOT_BUSY_WAIT_S = 0.1


@dataclass(frozen=True, slots=True)
class CdcSettings:
    """The ``postgres-cdc`` source's configuration, checked."""

    connection: ConnectionSettings
    table: TableName
    slot: str
    publication: str
    create_slot: bool
    advance_on_restore: bool
    max_retained_bytes: int


def cdc_settings(config: ConnectorConfig) -> CdcSettings:
    """Check the ``postgres-cdc`` source's configuration.

    :raises ConfigurationError: naming the key at fault.
    """
    config = config.validate(CDC_KEYS)
    return CdcSettings(
        connection=connection_settings(config, CDC_NAME),
        table=parse_table(config, CDC_NAME),
        slot=identifier(config.require("slot"), "slot", CDC_NAME),
        publication=identifier(config.require("publication"), "publication", CDC_NAME),
        create_slot=bool(config.get_parsed("slot.create", bool, False)),
        advance_on_restore=choice(config, "slot.advance", ("on-restore", "manual")) == "on-restore",
        max_retained_bytes=positive(config, "max.retained.bytes"),
    )


@dataclass(frozen=True, slots=True)
class Position:
    """Where the source stands: after the transaction ending at ``lsn``, and ``skip`` changes.

    Every transaction whose commit record ends at ``lsn`` or before is behind it, and so are the
    first ``skip`` changes of the table in the next transaction.
    """

    lsn: int = 0
    skip: int = 0

    def offset(self) -> str:
        """The checkpoint's text: ``LSN`` or ``LSN+N``."""
        return lsn_text(self.lsn) + (f"+{self.skip}" if self.skip else "")

    @classmethod
    def parse(cls, text: str) -> Position:
        """:raises CheckpointError: for text :meth:`offset` did not write."""
        lsn, _, skip = text.partition("+")
        try:
            return cls(parse_lsn(lsn), int(skip) if skip else 0)
        except ValueError:
            raise CheckpointError(
                f"{CDC_NAME}: {text!r} is not a position of this source ('LSN' or 'LSN+N')"
            ) from None


@dataclass(frozen=True, slots=True)
class _Row:
    """One change of the table, with where the source stands once it is returned."""

    change: Change
    transaction: Transaction
    after: Position


@dataclass(slots=True)
class _Reader:
    settings: CdcSettings
    session: Session
    columns: list[Column]
    key: list[str]
    schema: pa.Schema
    position: Position = field(default_factory=Position)
    pending: deque[_Row] = field(default_factory=deque)
    retained_wal_bytes: int = 0


def cdc_schema(columns: list[Column], key: list[str]) -> pa.Schema:
    """The batches' schema for a table of ``columns`` whose replica identity is ``key``."""
    row = arrow_schema(columns)
    nullable_row = pa.struct([pa.field(f.name, f.type) for f in row])
    key_type = pa.struct([pa.field(f.name, f.type) for f in row if f.name in key])
    return pa.schema(
        [
            pa.field("op", pa.string(), nullable=False),
            pa.field("key", key_type),
            pa.field("before", nullable_row),
            pa.field("after", nullable_row),
            pa.field("commit_lsn", pa.int64(), nullable=False),
            pa.field("commit_ts", pa.timestamp("us", "UTC"), nullable=False),
            pa.field("xid", pa.int64(), nullable=False),
        ]
    )


class PostgresCdcSource(SourceConnector):
    """Reads a table's inserts, updates and deletes from a logical replication slot.

    Batch columns: ``op`` (``insert``, ``update``, ``delete``, ``truncate``), ``key`` (a struct
    of the replica identity's columns), ``before`` (the old row, when ``REPLICA IDENTITY FULL``
    sends it), ``after`` (the new row), ``commit_lsn`` (the transaction's commit LSN as an
    integer), ``commit_ts`` and ``xid``. Changes come in commit order, each transaction's in
    its order. See the module documentation for the checkpoint and when the slot advances.
    """

    CONFIG_KEYS: ClassVar[tuple[ConfigKeySpec, ...]] = CDC_KEYS
    DESCRIPTION: ClassVar[str] = (
        "Reads a PostgreSQL table's changes from a logical replication slot (pgoutput); "
        "replayable from the slot's position"
    )

    def __init__(self) -> None:
        self._lifecycle: Lifecycle[_Reader] = Lifecycle(CDC_NAME)
        self._records_total = 0
        self._bytes_total = 0
        self._retained = 0

    async def open(self, config: ConnectorConfig) -> None:
        """Connect; check the table, publication and slot (creating it if asked).

        :raises ConfigurationError: naming the key when the table, publication or slot is
            missing or unusable, with the SQL that fixes it.
        :raises ConnectionFailed: when the server cannot be reached.
        """
        settings = cdc_settings(config)
        session = await connect(settings.connection, autocommit=True)
        try:
            reader = await _reader(session, settings)
            reader.position = Position(await _confirmed_lsn(reader))
            await _measure(reader)
        except psycopg.Error as error:
            await session.close()
            raise failure(settings.connection, "check the slot", error, ReadError) from None
        except BaseException:
            await session.close()
            raise
        self._retained = reader.retained_wal_bytes
        self._lifecycle.open(reader)

    async def close(self) -> None:
        """Close the connection; the slot stays (drop it explicitly)."""
        reader = self._lifecycle.state
        self._lifecycle.close()
        if reader is not None:
            await reader.session.close()

    def schema(self) -> pa.Schema:
        """The change rows' schema (see the class)."""
        return self._lifecycle.require("schema").schema

    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        """Up to ``max_records`` changes after the position, in commit order.

        :raises ReadError: when decoding fails (the slot is gone, the server stopped).
        :raises SchemaMismatch: when the table's columns changed since the source opened.
        :raises ValueError: when ``max_records < 1``.
        """
        reader = self._lifecycle.require("poll_batch")
        if max_records < 1:
            raise ValueError(f"{CDC_NAME}: max_records must be >= 1, got {max_records}")
        if not reader.pending:
            await _fill(reader, max_records)
        if not reader.pending:
            return None
        rows = [reader.pending.popleft() for _ in range(min(max_records, len(reader.pending)))]
        reader.position = rows[-1].after
        batch = await asyncio.to_thread(_batch, reader, rows)
        self._records_total += batch.num_rows
        self._bytes_total += batch.nbytes
        return SourceBatch(batch, PartitionInfo(reader.settings.slot, reader.position.offset()))

    def checkpoint(self) -> SourceCheckpoint:
        """The position after the last change returned (the slot's, before any)."""
        reader = self._lifecycle.require("checkpoint")
        return SourceCheckpoint({reader.settings.slot: reader.position.offset()})

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        """Resume after ``checkpoint``; with ``slot.advance=on-restore``, advance the slot to it.

        :raises CheckpointError: when ``checkpoint`` is not one of this source's.
        :raises ReadError: when the slot is past ``checkpoint`` already: the changes between
            are gone.
        """
        reader = self._lifecycle.require("restore")
        unknown = set(checkpoint.offsets) - {reader.settings.slot}
        if unknown:
            raise CheckpointError(
                f"{CDC_NAME}: checkpoint names {sorted(unknown)}, not slot "
                f"{reader.settings.slot!r}: was it made with another slot?"
            )
        offset = checkpoint.offsets.get(reader.settings.slot)
        reader.pending.clear()
        try:
            confirmed = await _confirmed_lsn(reader)
            position = Position(confirmed) if offset is None else Position.parse(offset)
            reader.position = position
            if position.lsn and position.lsn < confirmed:
                raise ReadError(
                    f"{CDC_NAME}: slot {reader.settings.slot!r} is at "
                    f"{lsn_text(confirmed)}, past the checkpoint's {position.offset()}: the "
                    "changes between were consumed (the slot was advanced for a later "
                    "checkpoint) and cannot be read again"
                )
            if reader.settings.advance_on_restore and position.lsn > confirmed:
                await reader.session.execute(
                    "SELECT pg_replication_slot_advance(%s, %s::pg_lsn)",
                    (reader.settings.slot, lsn_text(position.lsn)),
                )
        except psycopg.Error as error:
            raise failure(
                reader.settings.connection, "advance the slot", error, ReadError
            ) from None

    async def health_check(self) -> HealthStatus:
        """Degraded when the slot retains more WAL than ``max.retained.bytes``."""
        reader = self._lifecycle.require("health_check")
        try:
            await _measure(reader)
        except psycopg.Error as error:
            return HealthStatus.unhealthy(
                str(failure(reader.settings.connection, "read the slot", error, ReadError))
            )
        self._retained = reader.retained_wal_bytes
        if reader.retained_wal_bytes > reader.settings.max_retained_bytes:
            return HealthStatus.degraded(
                f"slot {reader.settings.slot!r} retains {reader.retained_wal_bytes} bytes of "
                f"WAL (max.retained.bytes: {reader.settings.max_retained_bytes}): the pipeline "
                "is behind, or the slot is not advanced (slot.advance)"
            )
        return HealthStatus.healthy()

    def metrics(self) -> ConnectorMetrics:
        """Changes and Arrow bytes returned; ``retained_wal_bytes`` as last measured."""
        return ConnectorMetrics(
            records_total=self._records_total,
            bytes_total=self._bytes_total,
            custom={"retained_wal_bytes": float(self._retained)},
        )


async def _reader(session: Session, settings: CdcSettings) -> _Reader:
    columns = await table_columns(session, settings.table)
    if columns is None:
        raise ConfigurationError(
            f"{CDC_NAME}: table {settings.table} does not exist (or this user cannot see it)",
            key="table",
        )
    published = await session.execute(
        "SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s "
        "AND tablename = %s",
        (settings.publication, settings.table.schema, settings.table.name),
    )
    if not published:
        raise ConfigurationError(
            f"{CDC_NAME}: publication {settings.publication!r} does not include table "
            f"{settings.table} (or does not exist): CREATE PUBLICATION {settings.publication} "
            f"FOR TABLE {settings.table}, or ALTER PUBLICATION ... ADD TABLE",
            key="publication",
        )
    slots = await session.execute(
        "SELECT plugin, database = current_database() FROM pg_replication_slots "
        "WHERE slot_name = %s",
        (settings.slot,),
    )
    if not slots:
        if not settings.create_slot:
            raise ConfigurationError(
                f"{CDC_NAME}: replication slot {settings.slot!r} does not exist: create it "
                f"(SELECT pg_create_logical_replication_slot('{settings.slot}', 'pgoutput')), "
                "or set slot.create=true",
                key="slot",
            )
        await session.execute(
            "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (settings.slot,)
        )
    elif slots[0][0] != "pgoutput" or not slots[0][1]:
        raise ConfigurationError(
            f"{CDC_NAME}: replication slot {settings.slot!r} is not a pgoutput slot of this "
            f"database (plugin {slots[0][0]!r}); use another slot name",
            key="slot",
        )
    key = await _replica_identity(session, settings.table, columns)
    return _Reader(settings, session, columns, key, cdc_schema(columns, key))


async def _replica_identity(session: Session, table: TableName, columns: list[Column]) -> list[str]:
    """The key columns of ``table``'s changes: its primary key, else its replica identity."""
    rows = await session.execute(
        """
        SELECT c.relreplident, (
            SELECT array_agg(a.attname::text ORDER BY a.attnum)
            FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid
                AND a.attnum = ANY(i.indkey)
            WHERE i.indrelid = c.oid
                AND (i.indisreplident OR (c.relreplident = 'd' AND i.indisprimary)))
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s AND c.relname = %s
        """,
        (table.schema, table.name),
    )
    identity, indexed = rows[0]
    primary = await session.execute(
        """
        SELECT array_agg(a.attname::text ORDER BY a.attnum)
        FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
        WHERE i.indrelid = to_regclass(%s) AND i.indisprimary
        """,
        (f'"{table.schema}"."{table.name}"',),
    )
    if primary and primary[0][0]:
        return [str(name) for name in primary[0][0]]
    if identity == "f":
        return [column.name for column in columns]
    if not indexed:
        raise ConfigurationError(
            f"{CDC_NAME}: table {table} has no replica identity (no primary key, REPLICA "
            "IDENTITY NOTHING), so its updates and deletes cannot be told apart: add a primary "
            f"key, or ALTER TABLE {table} REPLICA IDENTITY FULL",
            key="table",
        )
    return [str(name) for name in indexed]


async def _confirmed_lsn(reader: _Reader) -> int:
    rows = await reader.session.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
        (reader.settings.slot,),
    )
    if not rows or rows[0][0] is None:
        raise ReadError(
            f"{CDC_NAME}: replication slot {reader.settings.slot!r} is gone (dropped?): the "
            "changes it held cannot be read; create it again and start the pipeline over"
        )
    return int(parse_lsn(str(rows[0][0])))


async def _measure(reader: _Reader) -> None:
    rows = await reader.session.execute(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint "
        "FROM pg_replication_slots WHERE slot_name = %s",
        (reader.settings.slot,),
    )
    reader.retained_wal_bytes = int(rows[0][0] or 0) if rows else 0


async def _peek(reader: _Reader, window: int) -> list[bytes]:
    """Up to about ``window`` messages after the slot's position, without consuming them."""
    for attempt in range(_SLOT_BUSY_RETRIES):
        try:
            rows = await reader.session.execute(
                "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, %s, "
                "'proto_version', '1', 'publication_names', %s)",
                (reader.settings.slot, window, reader.settings.publication),
            )
        except psycopg.errors.ObjectInUse:
            # The session of a killed reader still holds the slot for a moment.
            if attempt + 1 == _SLOT_BUSY_RETRIES:
                raise
            await asyncio.sleep(_SLOT_BUSY_WAIT_S)
            continue
        return [bytes(row[0]) for row in rows]
    raise AssertionError("unreachable")


async def _fill(reader: _Reader, max_records: int) -> None:
    """Decode the changes after the position into ``pending`` (whole transactions).

    Peeks more messages each time while everything decoded lies before the position; moves
    the position past transactions without changes of the table.
    """
    window = max(_FIRST_WINDOW, 4 * max_records)
    while True:
        try:
            messages = await _peek(reader, window)
        except psycopg.Error as error:
            raise failure(
                reader.settings.connection,
                f"decode slot {reader.settings.slot!r}",
                error,
                ReadError,
            ) from None
        passed = await asyncio.to_thread(_decode, reader, messages)
        if reader.pending or len(messages) < window:
            if passed is not None and not reader.pending:
                reader.position = passed
            return
        window *= 2


def _decode(reader: _Reader, messages: list[bytes]) -> Position | None:
    """Queue the table's changes after the position; the position past the rest, if later.

    The position names the last transaction handed out whole (``lsn``) and how many changes
    of the next one were (``skip``); each queued change carries the position once it is
    handed out.
    """
    decoder = Decoder()
    start = reader.position
    whole = start.lsn  # the end of the last transaction handed out (or passed) whole
    first = True  # the first transaction after start.lsn is the one start.skip counts in
    passed: Position | None = None
    for message in messages:
        try:
            transaction = decoder.feed(message)
        except ProtocolError as error:
            raise ReadError(f"{CDC_NAME}: slot {reader.settings.slot!r}: {error}") from None
        if transaction is None or transaction.end_lsn <= start.lsn:
            continue
        ours = [c for c in transaction.changes if _is_table(decoder, c, reader)]
        skip, first = (start.skip if first else 0), False
        for index in range(skip, len(ours)):
            done = index + 1
            after = Position(transaction.end_lsn) if done == len(ours) else Position(whole, done)
            reader.pending.append(_Row(ours[index], transaction, after))
        whole = transaction.end_lsn
        if not reader.pending:
            passed = Position(whole)
    return passed


def _is_table(decoder: Decoder, change: Change, reader: _Reader) -> bool:
    table = reader.settings.table
    relation = decoder.relations.get(change.relation)
    if relation is None or (relation.schema, relation.name) != (table.schema, table.name):
        return False
    expected = tuple(column.name for column in reader.columns)
    if relation.columns != expected:
        raise SchemaMismatch(
            f"{CDC_NAME}: table {table} has columns {list(relation.columns)} in the change "
            f"stream but {list(expected)} when the source opened (ALTER TABLE since?): restart "
            "the pipeline so that the source reads the new columns"
        )
    return True


def _batch(reader: _Reader, rows: list[_Row]) -> pa.RecordBatch:
    """The change rows as one batch of the source's schema."""
    schema = reader.schema
    names = [column.name for column in reader.columns]
    key_positions = [names.index(name) for name in reader.key]
    before: list[list[object] | None] = []
    after: list[list[object] | None] = []
    keys: list[list[object] | None] = []
    for row in rows:
        change = row.change
        old_full = None if change.old is None or change.old_is_key else change.old
        new = change.new
        if new is not None and old_full is not None:
            new = [o if n is UNCHANGED else n for n, o in zip(new, old_full, strict=True)]
        if new is not None:
            new = [None if value is UNCHANGED else value for value in new]
        before.append(old_full)
        after.append(new)
        source = change.old if change.old is not None else new
        keys.append(None if source is None else [source[p] for p in key_positions])
    row_type = schema.field("after").type
    arrays = [
        pa.array([row.change.op for row in rows], pa.string()),
        _struct(keys, schema.field("key").type, reader.key),
        _struct(before, row_type, names),
        _struct(after, row_type, names),
        pa.array([row.transaction.commit_lsn for row in rows], pa.int64()),
        pa.array([row.transaction.commit_time_us for row in rows], pa.timestamp("us", "UTC")),
        pa.array([row.transaction.xid for row in rows], pa.int64()),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _struct(
    rows: list[list[object] | None], data_type: pa.StructType, names: list[str]
) -> pa.Array:
    """Rows of text values as a struct array of ``data_type`` (a missing row is null)."""
    children = []
    for position, name in enumerate(names):
        texts = pa.array([None if row is None else row[position] for row in rows], pa.string())
        children.append(from_text(texts, data_type.field(name).type, name))
    mask = pa.array([row is None for row in rows], pa.bool_())
    return pa.StructArray.from_arrays(children, fields=list(data_type), mask=mask)


async def create_slot(properties: dict[str, str]) -> str:
    """Create the pgoutput replication slot ``slot`` a ``postgres-cdc`` configuration names.

    Takes the source's own keys (``dsn``, ``password.env`` / ``password.file``, ``slot``);
    the others are ignored. The slot keeps every change committed from now on until a source
    reads and advances past it.

    :returns: the LSN the slot starts at.
    :raises ConfigurationError: naming the key at fault.
    :raises ConnectionFailed: when the server cannot be reached.
    :raises ReadError: when the slot cannot be created (it exists, no free slot).
    """
    settings, slot = _slot_settings(properties)
    session = await connect(settings, autocommit=True)
    try:
        rows = await session.execute(
            "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,)
        )
    except psycopg.Error as error:
        raise failure(settings, f"create slot {slot!r}", error, ReadError) from None
    finally:
        await session.close()
    return str(rows[0][0])


async def drop_slot(properties: dict[str, str]) -> bool:
    """Drop the replication slot ``slot`` names, so that the server frees the WAL it keeps.

    Takes the same keys as :func:`create_slot`. A pipeline reading from the slot cannot resume
    afterwards: drop it only when the pipeline is retired.

    :returns: whether a slot was dropped (``False``: there was none).
    :raises ReadError: when it cannot be dropped (a session is reading from it).
    """
    settings, slot = _slot_settings(properties)
    session = await connect(settings, autocommit=True)
    try:
        rows = await session.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (slot,),
        )
    except psycopg.Error as error:
        raise failure(settings, f"drop slot {slot!r}", error, ReadError) from None
    finally:
        await session.close()
    return bool(rows)


def _slot_settings(properties: dict[str, str]) -> tuple[ConnectionSettings, str]:
    """The connection and ``slot`` keys of ``properties``, validated as the source's are."""
    wanted = {spec.name for spec in CONNECTION_KEYS} | {"slot"}
    given = {key: value for key, value in properties.items() if key in wanted}
    specs = [spec for spec in CDC_KEYS if spec.name in wanted]
    config = ConnectorConfig(CDC_NAME, given).validate(specs)
    return (
        connection_settings(config, CDC_NAME),
        identifier(config.require("slot"), "slot", CDC_NAME),
    )
