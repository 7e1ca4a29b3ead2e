"""The ``postgres`` sink: epochs written to a table exactly once (two ways) or upserted.

The ``postgres`` sink: exactly once with a marker row
-----------------------------------------------------
``begin_epoch`` reads the sink's marker row and skips an epoch committed before; otherwise it
opens a transaction, in which ``write_batch`` copies the rows (``COPY ... FROM STDIN``, in
binary where every column's type allows, else CSV: :class:`~._values.CopyFormat`).
``pre_commit`` keeps the epoch's batches durably (an Arrow IPC stream in the laminar checkpoint
location, or ``staging.location``) and leaves the transaction open: nothing is visible yet.
``commit_epoch`` upserts the marker row ``(sink_id, '*') → epoch`` in the same transaction and
commits it: the rows and the marker commit together or not at all, and the upsert's condition
(``WHERE epoch < new epoch``) makes a second committer of the same epoch roll back instead.

The runtime's commit decision is taken between ``pre_commit`` and ``commit_epoch``. When the
process dies there, its open transaction dies with its connection, so an instance that did not
write the epoch commits it from the staged copy: one new transaction, marker first, then the
rows. This is why the staged copy exists; it is removed once the epoch is committed or rolled
back. The server needs nothing special (no prepared transactions).

The ``postgres-2pc`` sink: PostgreSQL's own two-phase commit
-----------------------------------------------------------
The epoch's transaction is named ``laminar:<sink_id>:<epoch>:<suffix>``; ``pre_commit`` inserts a
marker row named after it and runs ``PREPARE TRANSACTION``: the rows are durable in the server,
invisible, and survive the crash of any process. ``commit_epoch`` runs ``COMMIT PREPARED``,
``rollback_epoch`` ``ROLLBACK PREPARED``, from any instance, finding the epoch's transactions in
``pg_prepared_xacts``. A transaction that left ``pg_prepared_xacts`` committed if its marker row
is visible; so committing again after a restart does nothing, and a transaction rolled back by
hand is an error, never silent loss. The server needs ``max_prepared_transactions`` > 0.

On Spark the sink is then a distributed-commit sink (:class:`~laminar_sdk.DistributedCommitSink`):
each write task prepares a transaction of its own with its share of the epoch, and the driver
commits them all (``commit_aggregated``) and rolls back any other transaction of the epoch (a
failed attempt). ``COMMIT PREPARED`` commits one transaction at a time: while the driver commits
an epoch a reader may see some tasks' rows before the others', and after a crash there the
recovery commits the rest; no epoch stays half-visible.

The ``postgres-upsert`` sink: ``INSERT ... ON CONFLICT (key) DO UPDATE``, idempotent
------------------------------------------------------------------------------------
A connector of its own, since what it promises differs (capabilities are known before the
configuration is read). Each batch is copied into a temporary table and upserted on ``key``
(the last row of a key in an epoch wins); ``pre_commit`` commits. An epoch written again
after a crash upserts the same rows again: the table ends the same (at least once,
idempotent).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import logging
import uuid
from collections.abc import AsyncIterable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import psycopg
import pyarrow as pa
from laminar_sdk import (
    CheckpointError,
    ConfigKeySpec,
    ConfigurationError,
    ConnectorConfig,
    ConnectorError,
    ConnectorMetrics,
    DistributedCommitSink,
    EpochPhase,
    EpochTracker,
    HealthStatus,
    InvalidState,
    SchemaMismatch,
    SinkConnector,
    SinkConnectorCapabilities,
    StateStore,
    TransactionError,
    WriteError,
    WriteResult,
    crash_point,
    open_checkpointer,
    with_destination,
)
from laminar_sdk.reference import Lifecycle, parse_schema
from psycopg import sql

from laminar_plugin_postgres._client import (
    Session,
    bounded_by_network_timeout,
    connect,
    failure,
    qualified,
    transaction_failure,
)
from laminar_plugin_postgres._config import (
    SINK_KEYS,
    SINK_NAME,
    TWO_PHASE_KEYS,
    UPSERT_KEYS,
    ConnectionSettings,
    TableName,
    connection_settings,
    identifier,
    parse_columns,
    parse_table,
    sink_id,
)
from laminar_plugin_postgres._tables import (
    Markers,
    finish_prepared,
    has_unique_key,
    make_gid,
    prepared_transactions,
    stale_prepared_transactions,
    table_columns,
)
from laminar_plugin_postgres._values import (
    CopyFormat,
    arrow_schema,
    check_batch_against_table,
    postgres_type,
)

logger = logging.getLogger("laminar_plugin_postgres")

STALE_PREPARED_S = 300.0
"""How old a prepared transaction of the sink must be for health to report it."""

STAGING_SPACE = "sink.postgres"
"""The state-store space of staged epochs under ``staging.location``."""


class Mode(enum.Enum):
    """How the sink writes."""

    APPEND = "append"
    TWO_PHASE = "two-phase"
    UPSERT = "upsert"


@dataclass(frozen=True, slots=True)
class SinkSettings:
    """The ``postgres`` sink's configuration, checked.

    :param connection: how to connect.
    :param table: the table written.
    :param mode: how it is written.
    :param key: upsert: the conflict columns.
    :param schema: the declared schema (``None``: the table's columns).
    :param create: create the table when missing.
    :param sink_id: names the markers and transactions.
    :param marker_table: where committed epochs are recorded.
    :param staging: append: where pre-committed epochs are kept.
    """

    connection: ConnectionSettings
    table: TableName
    mode: Mode
    key: tuple[str, ...]
    schema: pa.Schema | None
    create: bool
    sink_id: str
    marker_table: TableName
    staging: StateStore | None


def sink_settings(config: ConnectorConfig, mode: Mode = Mode.APPEND) -> SinkSettings:
    """Check the configuration of the sink that writes the ``mode`` way.

    :raises ConfigurationError: naming the key at fault.
    """
    keys = {Mode.APPEND: SINK_KEYS, Mode.TWO_PHASE: TWO_PHASE_KEYS, Mode.UPSERT: UPSERT_KEYS}
    config = config.validate(keys[mode])
    connection = connection_settings(config, SINK_NAME)
    table = parse_table(config, SINK_NAME)
    key = parse_columns(config.require("key"), "key", SINK_NAME) if mode is Mode.UPSERT else ()
    schema_text = config.get("schema")
    schema = parse_schema(schema_text, "schema", SINK_NAME) if schema_text else None
    if schema is not None:
        for schema_field in schema:
            if postgres_type(schema_field.type) is None:
                raise ConfigurationError(
                    f"{SINK_NAME}: schema field {schema_field.name!r} has type "
                    f"{schema_field.type}, which no PostgreSQL column takes; see the plugin's "
                    "README for the types it writes",
                    key="schema",
                )
    create = bool(config.get_parsed("table.create", bool, False))
    if create and schema is None:
        raise ConfigurationError(
            f"{SINK_NAME}: table.create=true needs schema, the columns to create the table with "
            "(e.g. 'id int64, name string')",
            key="schema",
        )
    staging: StateStore | None = None
    if mode is Mode.APPEND:
        staging = _staging(config)
    marker = identifier(
        config.get("marker.table", "laminar_sink_epochs"), "marker.table", SINK_NAME
    )
    return SinkSettings(
        connection=connection,
        table=table,
        mode=mode,
        key=key,
        schema=schema,
        create=create,
        sink_id=sink_id(config, table),
        marker_table=table.sibling(marker),
        staging=staging,
    )


def _staging(config: ConnectorConfig) -> StateStore:
    location = config.get("staging.location")
    if location:
        try:
            store = open_checkpointer(location).state_store(STAGING_SPACE)
        except CheckpointError as error:
            raise ConfigurationError(
                f"{SINK_NAME}: staging.location {location!r} cannot be used: {error}",
                key="staging.location",
            ) from error
        if store is None:
            raise ConfigurationError(
                f"{SINK_NAME}: staging.location {location!r} is in a store that cannot keep "
                "state; name a directory or an object-store URI",
                key="staging.location",
            )
        return store
    if config.state_store is None:
        raise ConfigurationError(
            f"{SINK_NAME}: the sink keeps each pre-committed epoch where a restart of the "
            "committing process finds it: in the laminar checkpoint location, which this runtime "
            "did not give the sink (on Spark it always does). Set staging.location to a "
            "directory that survives such a restart, or use the postgres-2pc sink",
            key="staging.location",
        )
    return config.state_store


@dataclass(slots=True)
class _Transaction:
    """An epoch's (or a write task's) transaction: its ``COPY``, its prepared id, its batches."""

    epoch: int
    in_transaction: bool = False
    gid: str | None = None
    batches: list[pa.RecordBatch] = field(default_factory=list)
    stream: _CopyStream | None = None


@dataclass(slots=True)
class _Writer:
    """What an open sink holds."""

    settings: SinkSettings
    session: Session
    schema: pa.Schema
    copy_format: CopyFormat
    markers: Markers
    epochs: EpochTracker[_Transaction] = field(default_factory=lambda: EpochTracker(SINK_NAME))


class PostgresSink(SinkConnector):
    """Writes batches to a PostgreSQL table, each epoch exactly once: ``COPY`` and a marker row.

    Nothing of an epoch is visible before ``commit_epoch``, which commits its rows and its
    marker row in one transaction (see the module documentation). The subclasses write the
    other ways: :class:`PostgresTwoPhaseSink` and :class:`PostgresUpsertSink`.

    The table must exist and take the batches' columns (checked when the sink opens, with an
    error naming the column), unless ``table.create=true`` creates it from ``schema``.
    """

    MODE: ClassVar[Mode] = Mode.APPEND
    """How the sink writes: fixed by the class, so that what it offers is known unopened."""
    CONFIG_KEYS: ClassVar[tuple[ConfigKeySpec, ...]] = SINK_KEYS
    DESCRIPTION: ClassVar[str] = (
        "Writes to a PostgreSQL table exactly once: COPY and a marker row in one transaction"
    )

    def __init__(self) -> None:
        self._lifecycle: Lifecycle[_Writer] = Lifecycle(SINK_NAME)
        self._mode = type(self).MODE
        self._records_total = 0
        self._bytes_total = 0
        self._errors_total = 0
        self._epochs_skipped = 0

    # Lifecycle ------------------------------------------------------------------------------

    async def open(self, config: ConnectorConfig) -> None:
        """Connect; check (or create) the table and the marker table.

        :raises ConfigurationError: for bad configuration or a missing table.
        :raises SchemaMismatch: when the table does not take the declared schema, naming the
            column.
        :raises ConnectionFailed: when the server cannot be reached.
        """
        settings = sink_settings(config, self._mode)
        session = await connect(settings.connection, autocommit=True)
        try:
            schema, copy_format = await _prepare_table(session, settings)
            markers = Markers(settings.marker_table, settings.sink_id)
            if settings.mode is not Mode.UPSERT:
                await markers.create(session)
            if settings.mode is Mode.APPEND:
                await _discard_staged_through(settings, await markers.last_committed(session))
        except psycopg.Error as error:
            await session.close()
            raise failure(settings.connection, f"prepare table {settings.table}", error) from None
        except BaseException:
            await session.close()
            raise
        self._lifecycle.open(_Writer(settings, session, schema, copy_format, markers))

    async def close(self) -> None:
        """Abandon an open epoch (its transaction is rolled back; a prepared one stays)."""
        writer = self._lifecycle.state
        self._lifecycle.close()
        if writer is not None:
            await writer.session.close()

    @property
    def connection_settings(self) -> ConnectionSettings | None:
        """How the open sink connects (``None`` when it is not open)."""
        writer = self._lifecycle.state
        return None if writer is None else writer.settings.connection

    def schema(self) -> pa.Schema:
        """The declared ``schema``, or the table's columns as Arrow types."""
        return self._lifecycle.require("schema").schema

    def capabilities(self) -> SinkConnectorCapabilities:
        """Exactly once, and nothing visible before ``commit_epoch`` (two-phase commit)."""
        return SinkConnectorCapabilities().with_exactly_once().with_two_phase_commit()

    @bounded_by_network_timeout
    async def last_committed_epoch(self) -> int | None:
        """The newest epoch the marker table records for ``sink.id`` (``-1``: none).

        ``None`` for ``upsert``, which keeps no markers: an epoch written again writes the
        same rows.
        """
        writer = self._lifecycle.require("last_committed_epoch")
        if writer.settings.mode is Mode.UPSERT:
            return None
        await _live_session(writer)
        try:
            return await writer.markers.last_committed(writer.session)
        except psycopg.Error as error:
            raise failure(writer.settings.connection, "read the epoch markers", error) from None

    # The epoch protocol ---------------------------------------------------------------------

    @bounded_by_network_timeout
    async def begin_epoch(self, epoch: int) -> None:
        """Open the epoch's transaction, or skip an epoch committed before.

        :raises InvalidState: when another epoch is still open.
        """
        writer = self._lifecycle.require("begin_epoch")
        writer.epochs.check_can_begin(epoch)
        settings = writer.settings
        await _live_session(writer)
        try:
            if settings.mode is not Mode.UPSERT:
                last = await writer.markers.last_committed(writer.session)
                if epoch <= last:
                    logger.info(
                        "%s: epoch %d was committed before (last: %d); skipping its re-delivery",
                        SINK_NAME,
                        epoch,
                        last,
                    )
                    self._epochs_skipped += 1
                    writer.epochs.skip(epoch)
                    return
            if settings.mode is Mode.TWO_PHASE:
                # The runtime resolves every epoch it decided before it begins another: any
                # prepared transaction of this sink left now is undecided (a crash's orphan).
                await _roll_back_orphans(writer, lambda _: True)
            await writer.session.execute("BEGIN")
        except psycopg.Error as error:
            raise transaction_failure(settings.connection, f"begin epoch {epoch}", error) from None
        gid = make_gid(settings.sink_id, epoch, uuid.uuid4().hex[:12])
        writer.epochs.begin(epoch, _Transaction(epoch, in_transaction=True, gid=gid))

    @bounded_by_network_timeout
    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        """Copy the batch's rows into the epoch's transaction (upsert: upsert them).

        :raises SchemaMismatch: when ``batch`` is not in :meth:`schema`, naming the column.
        :raises InvalidState: outside an epoch being written.
        :raises WriteError: when the server refuses the rows (a value that does not fit).
        """
        writer = self._lifecycle.require("write_batch")
        _check_schema(batch.schema, writer.schema)
        transaction = writer.epochs.writing()
        if transaction is None:  # skipped
            return WriteResult(batch.num_rows, 0)
        try:
            if writer.settings.mode is Mode.UPSERT:
                sent = await _upsert(writer, batch)
            else:
                if transaction.stream is None:
                    transaction.stream = _CopyStream(writer, writer.settings.table)
                sent = await transaction.stream.write(batch)
        except psycopg.Error as error:
            self._errors_total += 1
            writer.epochs.failed(transaction.epoch)
            await _abandon(writer, transaction)
            raise _epoch_failure(writer, transaction.epoch, error) from None
        if writer.settings.mode is Mode.APPEND:
            transaction.batches.append(batch)
        self._records_total += batch.num_rows
        self._bytes_total += sent
        return WriteResult(batch.num_rows, sent)

    @bounded_by_network_timeout
    async def pre_commit(self, epoch: int) -> None:
        """Make the epoch durable and invisible (append: staged; two-phase: prepared).

        ``upsert`` commits here (its epochs are idempotent, not invisible).

        :raises WriteError: when the staged copy cannot be written.
        :raises TransactionError: when ``PREPARE TRANSACTION`` fails.
        """
        writer = self._lifecycle.require("pre_commit")
        current = writer.epochs.pre_committing(epoch)
        if current is None:  # skipped, or pre-committed already
            return
        settings = writer.settings
        if settings.mode is Mode.APPEND:
            # The server stores the rows while the staged copy is written.
            copied, staged = await asyncio.gather(
                _finish_stream(current),
                _stage(settings, epoch, writer.schema, current.batches),
                return_exceptions=True,
            )
            if isinstance(copied, psycopg.Error):
                await _abandon(writer, current)
                await _discard_staged(settings, epoch)
                raise _epoch_failure(writer, epoch, copied) from None
            for outcome in (copied, staged):
                if isinstance(outcome, BaseException):
                    raise outcome
            crash_point("epoch-staged")
        else:
            try:
                await _finish_stream(current)
                if settings.mode is Mode.TWO_PHASE:
                    assert current.gid is not None
                    await writer.markers.record_prepared(writer.session, current.gid, epoch)
                    await writer.session.execute(
                        sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(current.gid))
                    )
                    crash_point("transaction-prepared")
                else:
                    await writer.session.execute("COMMIT")
            except psycopg.Error as error:
                await _abandon(writer, current)
                raise _epoch_failure(writer, epoch, error) from None
            current.in_transaction = False  # prepared (two-phase) or committed (upsert)
        writer.epochs.pre_committed(epoch)

    @bounded_by_network_timeout
    async def commit_epoch(self, epoch: int) -> None:
        """Publish the epoch: commit its transaction with the marker, or ``COMMIT PREPARED``.

        Idempotent, and works on an instance that did not write the epoch (after a crash).

        :raises TransactionError: when the epoch's data is gone (its staged copy removed, or
            its prepared transaction rolled back by hand).
        """
        writer = self._lifecycle.require("commit_epoch")
        open_here = writer.epochs.committing(epoch)
        writer.epochs.finish(epoch)  # a commit that fails is retried from what the server holds
        if open_here is not None and open_here.phase is EpochPhase.SKIPPED:
            return
        current = None if open_here is None else open_here.held
        settings = writer.settings
        if settings.mode is Mode.UPSERT:
            return  # committed by pre_commit
        if settings.mode is Mode.TWO_PHASE:
            await _commit_prepared(writer, epoch, await _prepared_of(writer, epoch, current))
            return
        committed = False
        if current is not None and current.in_transaction and not writer.session.broken:
            committed = await _commit_open_transaction(writer, epoch)
        if not committed:
            await _commit_staged(writer, epoch)
        await _discard_staged(settings, epoch)

    @bounded_by_network_timeout
    async def rollback_epoch(self, epoch: int) -> None:
        """Discard the epoch: roll back its transaction(s) and remove its staged copy.

        Idempotent; also for an epoch this instance never began.
        """
        writer = self._lifecycle.require("rollback_epoch")
        rolled_back = writer.epochs.finish(epoch)
        if rolled_back is not None and rolled_back.held is not None:
            await _abandon(writer, rolled_back.held)
        settings = writer.settings
        try:
            if settings.mode is Mode.TWO_PHASE:
                await _live_session(writer)
                await _roll_back_orphans(writer, lambda orphan: orphan == epoch)
            elif settings.mode is Mode.APPEND:
                await _discard_staged(settings, epoch)
        except psycopg.Error as error:
            raise transaction_failure(
                settings.connection, f"roll back epoch {epoch}", error
            ) from None

    # Monitoring -----------------------------------------------------------------------------

    async def health_check(self) -> HealthStatus:
        """Healthy when the server answers; degraded while old prepared transactions wait.

        ``two-phase``: a prepared transaction of this sink older than
        :data:`STALE_PREPARED_S` waits for a commit decision no running pipeline is taking
        (a crashed run's); it holds its locks, and the WAL, until this sink's next epoch
        resolves it.
        """
        writer = self._lifecycle.require("health_check")
        try:
            await writer.session.execute("SELECT 1")
            stale = (
                await stale_prepared_transactions(
                    writer.session, writer.settings.sink_id, STALE_PREPARED_S
                )
                if writer.settings.mode is Mode.TWO_PHASE
                else []
            )
        except psycopg.Error as error:
            return HealthStatus.unhealthy(
                str(failure(writer.settings.connection, "ask the server", error))
            )
        if stale:
            return HealthStatus.degraded(
                f"{len(stale)} prepared transaction(s) of sink {writer.settings.sink_id} "
                f"({', '.join(stale[:3])}) have waited over {STALE_PREPARED_S:g}s for a "
                "commit decision; they hold locks until this sink's next epoch resolves them "
                "(or ROLLBACK PREPARED them)"
            )
        return HealthStatus.healthy()

    def metrics(self) -> ConnectorMetrics:
        """Rows and COPY bytes written, server errors, and epochs skipped as committed before."""
        return ConnectorMetrics(
            records_total=self._records_total,
            bytes_total=self._bytes_total,
            errors_total=self._errors_total,
            custom={"epochs_skipped": float(self._epochs_skipped)},
        )


async def _commit_prepared(writer: _Writer, epoch: int, descriptors: Sequence[str]) -> None:
    """``COMMIT PREPARED`` the named transactions of ``epoch``; roll back its others.

    :raises TransactionError: when a named transaction is neither prepared nor committed.
    """
    settings = writer.settings
    named = [gid for gid in descriptors if gid]
    session = await _live_session(writer)
    try:
        async with writer.markers.sole_committer(session):
            await _commit_prepared_alone(writer, session, epoch, named)
    except psycopg.Error as error:
        raise transaction_failure(settings.connection, f"commit epoch {epoch}", error) from None


async def _commit_prepared_alone(
    writer: _Writer, session: Session, epoch: int, named: list[str]
) -> None:
    """:func:`_commit_prepared`, holding the sink's commit lock.

    An epoch recorded whole was committed by another instance (this one was presumed dead,
    and went on): what is still prepared of it, and of older epochs, is rolled back.
    """
    settings = writer.settings
    prepared = await prepared_transactions(session, settings.sink_id)
    if await writer.markers.whole_epoch(session) >= epoch:
        stale = [gid for gid, number in prepared.items() if number <= epoch]
        for gid in stale:
            await finish_prepared(session, gid, commit=False)
        if stale:
            logger.warning(
                "%s: epoch %d was committed by another instance; rolled back %d prepared "
                "transaction(s) of it left by an instance presumed dead",
                SINK_NAME,
                epoch,
                len(stale),
            )
        return
    missing = [gid for gid in named if gid not in prepared]
    if missing:
        committed = await writer.markers.committed_transactions(session, missing)
        lost = sorted(set(missing) - committed)
        if lost and await writer.markers.last_committed(session) < epoch:
            raise TransactionError(
                f"{SINK_NAME}: epoch {epoch} of table {settings.table} must be committed, "
                f"but its prepared transaction(s) {lost} are neither prepared nor "
                "committed: were they rolled back by hand (ROLLBACK PREPARED)? Their "
                "rows cannot be recovered by this sink"
            )
    for gid in named:
        if gid in prepared:
            await finish_prepared(session, gid, commit=True)
            crash_point("transaction-committed")
    for gid, orphan_epoch in prepared.items():
        if gid not in named and orphan_epoch <= epoch:
            await finish_prepared(session, gid, commit=False)
    await writer.markers.finish_prepared_epoch(session, epoch)


async def _finish_stream(transaction: _Transaction) -> None:
    """End the transaction's ``COPY``, if it began one."""
    stream, transaction.stream = transaction.stream, None
    if stream is not None:
        await stream.finish()


async def _abandon(writer: _Writer, transaction: _Transaction) -> None:
    """Stop the transaction's ``COPY`` and roll it back (the server aborts it)."""
    stream, transaction.stream = transaction.stream, None
    if stream is not None:
        await stream.abandon()
    if transaction.in_transaction and not writer.session.broken:
        with contextlib.suppress(psycopg.Error):
            await writer.session.execute("ROLLBACK")
    transaction.in_transaction = False


async def _live_session(writer: _Writer) -> Session:
    """The writer's session, connected again when the connection was lost.

    Only between transactions: a transaction the lost connection held is gone.
    """
    if writer.session.broken:
        writer.session = await connect(writer.settings.connection, autocommit=True)
    return writer.session


def _epoch_failure(writer: _Writer, epoch: int, error: psycopg.Error) -> ConnectorError:
    """The error for a failure inside epoch ``epoch``'s transaction, which is now aborted.

    Never transient: the server rolled the transaction back (a lost connection aborts it), so
    the epoch must be rolled back and written again whole, not the call retried.
    """
    settings = writer.settings
    cause = failure(settings.connection, f"write epoch {epoch} to {settings.table}", error)
    if writer.session.broken:
        return TransactionError(
            f"{SINK_NAME}: the connection was lost while writing epoch {epoch} to "
            f"{settings.table} ({cause}); the server aborted the epoch's transaction, so "
            "nothing of it was committed: roll the epoch back and write it again"
        )
    return cause


async def _prepared_of(writer: _Writer, epoch: int, current: _Transaction | None) -> list[str]:
    """The prepared transactions holding ``epoch``: this instance's, else any in the server.

    :raises TransactionError: when there is none and the epoch was not committed.
    """
    if current is not None and current.gid is not None:
        return [current.gid]
    session = await _live_session(writer)
    try:
        prepared = await prepared_transactions(session, writer.settings.sink_id)
        found = sorted(gid for gid, number in prepared.items() if number == epoch)
        if not found and await writer.markers.last_committed(session) < epoch:
            raise TransactionError(
                f"{SINK_NAME}: epoch {epoch} of table {writer.settings.table} was pre-committed "
                "and must be committed, but no prepared transaction holds it and it was not "
                "committed: was it rolled back by hand (ROLLBACK PREPARED)? Its rows cannot be "
                "recovered by this sink"
            )
    except psycopg.Error as error:
        raise transaction_failure(
            writer.settings.connection, f"find epoch {epoch}'s transactions", error
        ) from None
    return found


def _check_schema(given: pa.Schema, expected: pa.Schema) -> None:
    """:raises SchemaMismatch: naming the first column that differs (nullability aside)."""
    if given.names == expected.names and all(
        g.type.equals(e.type) for g, e in zip(given, expected, strict=True)
    ):
        return
    for position, expected_field in enumerate(expected):
        if position >= len(given) or given.field(position).name != expected_field.name:
            raise SchemaMismatch(
                f"{SINK_NAME}: the batch's columns {given.names} are not the sink's "
                f"{expected.names}: column {expected_field.name!r} is missing or out of place"
            )
        if not given.field(position).type.equals(expected_field.type):
            raise SchemaMismatch(
                f"{SINK_NAME}: column {expected_field.name!r} of the batch is "
                f"{given.field(position).type}, the sink's schema says {expected_field.type}"
            )
    raise SchemaMismatch(
        f"{SINK_NAME}: the batch has extra columns {given.names[len(expected) :]} beyond the "
        f"sink's {expected.names}"
    )


async def _prepare_table(session: Session, settings: SinkSettings) -> tuple[pa.Schema, CopyFormat]:
    """Check the table against the declared schema (or create it).

    :returns: the sink's schema, and how its batches are copied into the table.
    """
    columns = await table_columns(session, settings.table)
    if columns is None:
        if not settings.create:
            raise ConfigurationError(
                f"{SINK_NAME}: table {settings.table} does not exist; create it, or set "
                "table.create=true (with schema)",
                key="table",
            )
        assert settings.schema is not None, "sink_settings requires schema with table.create"
        await _create_table(session, settings, settings.schema)
        columns = await table_columns(session, settings.table)
        assert columns is not None
    schema = settings.schema if settings.schema is not None else arrow_schema(columns)
    check_batch_against_table(schema, columns, str(settings.table), SINK_NAME)
    if settings.mode is Mode.UPSERT:
        missing = [name for name in settings.key if name not in schema.names]
        if missing:
            raise ConfigurationError(
                f"{SINK_NAME}: key column(s) {missing} are not among the batches' columns "
                f"{schema.names}",
                key="key",
            )
        if not await has_unique_key(session, settings.table, settings.key):
            raise ConfigurationError(
                f"{SINK_NAME}: table {settings.table} has no primary key or unique index on "
                f"({', '.join(settings.key)}), which INSERT ... ON CONFLICT needs; create one",
                key="key",
            )
    return with_destination(schema, f"table {settings.table}"), CopyFormat.choose(schema, columns)


async def _create_table(session: Session, settings: SinkSettings, schema: pa.Schema) -> None:
    definitions = [
        sql.SQL("{} {}").format(sql.Identifier(f.name), sql.SQL(postgres_type(f.type) or "text"))
        for f in schema
    ]
    if settings.key:
        definitions.append(
            sql.SQL("PRIMARY KEY ({})").format(
                sql.SQL(", ").join(map(sql.Identifier, settings.key))
            )
        )
    await session.execute(
        sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            qualified(settings.table), sql.SQL(", ").join(definitions)
        )
    )
    logger.info("%s: created table %s", SINK_NAME, settings.table)


class _CopyStream:
    """One ``COPY ... FROM STDIN`` for all of an epoch's (or a task's) batches.

    The server parses and stores the rows as they arrive, in its own process, while this one
    encodes the next batch (:class:`~._values.CopyEncoder`, in a thread); a failure the server
    reports may surface at a later :meth:`write` or only at :meth:`finish`. (psycopg's queued
    writer would overlap more, but its writer task, left behind by an instance abandoned as a
    killed process's would be, fails when its event loop closes.)

    :param writer: the sink (its session, and the format of its batches).
    :param table: the table copied into (the sink's, or the upsert's temporary table).
    """

    def __init__(self, writer: _Writer, table: TableName) -> None:
        self._session = writer.session
        self._encoder = writer.copy_format.encoder()
        self._statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT {})").format(
            qualified(table),
            sql.SQL(", ").join(map(sql.Identifier, writer.schema.names)),
            sql.SQL(writer.copy_format.name),
        )
        self._cursor: psycopg.AsyncCursor[Any] | None = None
        self._manager: contextlib.AbstractAsyncContextManager[psycopg.AsyncCopy] | None = None
        self._copy: psycopg.AsyncCopy | None = None

    async def write(self, batch: pa.RecordBatch) -> int:
        """Send ``batch``'s rows, starting the ``COPY`` first if need be; the bytes sent.

        :raises SerdeError: for a value PostgreSQL cannot take (a NUL character in text).
        """
        data = await asyncio.to_thread(self._encoder.encode, batch)
        if self._copy is None:
            self._cursor = self._session.connection.cursor()
            manager = self._cursor.copy(self._statement)
            self._copy = await manager.__aenter__()
            self._manager = manager  # only a COPY that began is ended
        await self._copy.write(data)
        return len(data)

    async def finish(self) -> None:
        """End the ``COPY``, waiting until the server stored every row."""
        manager, copy, self._manager, self._copy = self._manager, self._copy, None, None
        if manager is not None and copy is not None:
            await copy.write(self._encoder.finish())
            await manager.__aexit__(None, None, None)
        await self._close_cursor()

    async def abandon(self) -> None:
        """Stop the ``COPY`` (the server discards it); the transaction must be rolled back."""
        manager, self._manager, self._copy = self._manager, None, None
        if manager is not None:
            stop = InvalidState("the epoch's COPY to go on", "the epoch abandoned")
            with contextlib.suppress(psycopg.Error, InvalidState):
                await manager.__aexit__(type(stop), stop, None)
        await self._close_cursor()

    async def _close_cursor(self) -> None:
        cursor, self._cursor = self._cursor, None
        if cursor is not None:
            with contextlib.suppress(psycopg.Error):
                await cursor.close()


_UPSERT_TABLE = "laminar_upsert"


async def _upsert(writer: _Writer, batch: pa.RecordBatch) -> int:
    """Copy ``batch`` into a temporary table, then upsert it into the table on ``key``.

    :returns: the bytes copied.
    """
    session, settings, names = writer.session, writer.settings, batch.schema.names
    staged = sql.Identifier(_UPSERT_TABLE)
    # In the epoch's transaction: a rolled-back epoch takes the table with it.
    await session.execute(
        sql.SQL(
            "CREATE TEMPORARY TABLE IF NOT EXISTS {} (LIKE {} INCLUDING DEFAULTS, "
            "laminar_row bigserial)"
        ).format(staged, qualified(settings.table))
    )
    stream = _CopyStream(writer, TableName("pg_temp", _UPSERT_TABLE))
    try:
        sent = await stream.write(batch)
        await stream.finish()
    except BaseException:
        await stream.abandon()
        raise
    columns = sql.SQL(", ").join(map(sql.Identifier, names))
    key = sql.SQL(", ").join(map(sql.Identifier, settings.key))
    others = [name for name in names if name not in settings.key]
    action = (
        sql.SQL("DO UPDATE SET {}").format(
            sql.SQL(", ").join(
                sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(name)) for name in others
            )
        )
        if others
        else sql.SQL("DO NOTHING")
    )
    await session.execute(
        sql.SQL(
            "INSERT INTO {table} ({columns}) SELECT DISTINCT ON ({key}) {columns} FROM {staged} "
            "ORDER BY {key}, laminar_row DESC ON CONFLICT ({key}) {action}"
        ).format(
            table=qualified(settings.table),
            columns=columns,
            key=key,
            staged=staged,
            action=action,
        )
    )
    await session.execute(sql.SQL("TRUNCATE {}").format(staged))
    return sent


async def _roll_back_orphans(writer: _Writer, doomed: Callable[[int], bool]) -> None:
    """Roll back this sink's prepared transactions whose epoch ``doomed(epoch)`` selects."""
    for gid, epoch in (
        await prepared_transactions(writer.session, writer.settings.sink_id)
    ).items():
        if doomed(epoch):
            await finish_prepared(writer.session, gid, commit=False)


async def _commit_open_transaction(writer: _Writer, epoch: int) -> bool:
    """Commit this instance's open transaction of ``epoch`` with its marker.

    :returns: ``True`` when committed (or found committed by another instance, which rolled
        this one back); ``False`` when the connection was lost and the staged copy must do.
    """
    session = writer.session
    try:
        recorded = await writer.markers.record_whole(session, epoch)
        crash_point("marker-upserted")
        await session.execute("COMMIT" if recorded else "ROLLBACK")
    except psycopg.OperationalError as error:
        logger.warning(
            "%s: the connection was lost while committing epoch %d (%s); committing it from its "
            "staged copy",
            SINK_NAME,
            epoch,
            writer.settings.connection.scrub(str(error).strip()),
        )
        return False
    except psycopg.Error as error:
        with contextlib.suppress(psycopg.Error):
            await session.execute("ROLLBACK")
        raise transaction_failure(
            writer.settings.connection, f"commit epoch {epoch}", error
        ) from None
    crash_point("epoch-committed")
    return True


async def _commit_staged(writer: _Writer, epoch: int) -> None:
    """Commit ``epoch`` from its staged copy, in a new transaction on a (new) connection."""
    settings = writer.settings
    if writer.session.broken:
        writer.session = await connect(settings.connection, autocommit=True)
    session = writer.session
    try:
        if await writer.markers.last_committed(session) >= epoch:
            return
        batches = await _load_staged(settings, epoch)
        await session.execute("BEGIN")
        try:
            if not await writer.markers.record_whole(session, epoch):
                await session.execute("ROLLBACK")
                return
            crash_point("marker-upserted")
            stream = _CopyStream(writer, settings.table)
            try:
                for batch in batches:
                    await stream.write(batch)
                await stream.finish()
            except BaseException:
                await stream.abandon()
                raise
        except BaseException:
            with contextlib.suppress(psycopg.Error):
                await session.execute("ROLLBACK")
            raise
        await session.execute("COMMIT")
        crash_point("epoch-committed")
    except psycopg.Error as error:
        raise failure(
            settings.connection, f"commit epoch {epoch} from its staged copy", error
        ) from None


def _staged_name(settings: SinkSettings, epoch: int) -> str:
    return f"{settings.sink_id}/epoch-{epoch}.arrow"


async def _stage(
    settings: SinkSettings, epoch: int, schema: pa.Schema, batches: list[pa.RecordBatch]
) -> None:
    assert settings.staging is not None
    data = await asyncio.to_thread(_ipc_stream, schema, batches)
    try:
        await settings.staging.put(_staged_name(settings, epoch), data)
    except (OSError, CheckpointError) as error:
        raise WriteError(
            f"{SINK_NAME}: cannot stage epoch {epoch} in {settings.staging.location}: {error}; "
            "check that the laminar checkpoint location (or staging.location) is writable"
        ) from error


def _ipc_stream(schema: pa.Schema, batches: list[pa.RecordBatch]) -> bytes:
    stream = pa.BufferOutputStream()
    with pa.ipc.new_stream(stream, schema) as ipc:
        for batch in batches:
            ipc.write_batch(batch)
    return bytes(stream.getvalue().to_pybytes())


async def _load_staged(settings: SinkSettings, epoch: int) -> list[pa.RecordBatch]:
    assert settings.staging is not None
    data = await settings.staging.get(_staged_name(settings, epoch))
    if data is None:
        raise TransactionError(
            f"{SINK_NAME}: epoch {epoch} was pre-committed by an instance that stopped and must "
            f"be committed, but its staged copy {settings.staging.location}/"
            f"{_staged_name(settings, epoch)} is missing: was the laminar checkpoint location "
            "(or staging.location) changed or cleaned? The epoch's rows cannot be recovered"
        )
    batches: list[pa.RecordBatch] = pa.ipc.open_stream(pa.py_buffer(data)).read_all().to_batches()
    return batches


async def _discard_staged(settings: SinkSettings, epoch: int) -> None:
    if settings.staging is not None:
        await settings.staging.delete(_staged_name(settings, epoch))


async def _discard_staged_through(settings: SinkSettings, epoch: int) -> None:
    """Remove the staged copies of ``epoch`` and older epochs (committed)."""
    if settings.staging is None:
        return
    prefix = f"{settings.sink_id}/epoch-"
    for name in await settings.staging.names(prefix):
        number = name[len(prefix) :].removesuffix(".arrow")
        if number.isdigit() and int(number) <= epoch:
            await settings.staging.delete(name)


class PostgresTwoPhaseSink(PostgresSink, DistributedCommitSink):
    """Writes batches to a PostgreSQL table exactly once through ``PREPARE TRANSACTION``.

    ``pre_commit`` prepares the epoch's transaction, ``commit_epoch`` runs ``COMMIT PREPARED``
    from any process (see the module documentation). On Spark it is a distributed-commit sink:
    each write task prepares a transaction of its own with its share of the epoch
    (:meth:`stage`), and the driver commits them all (:meth:`commit_aggregated`). The server
    needs ``max_prepared_transactions`` > 0.
    """

    MODE: ClassVar[Mode] = Mode.TWO_PHASE
    CONFIG_KEYS: ClassVar[tuple[ConfigKeySpec, ...]] = TWO_PHASE_KEYS
    DESCRIPTION: ClassVar[str] = (
        "Writes to a PostgreSQL table exactly once through PREPARE TRANSACTION, each Spark "
        "write task preparing its share"
    )

    def capabilities(self) -> SinkConnectorCapabilities:
        """Exactly once, two-phase commit, and ``partitioned``: tasks prepare in parallel."""
        return super().capabilities().with_partitioned()

    def as_distributed_commit(self) -> DistributedCommitSink:
        """This sink: each write task prepares its own transaction."""
        return self

    @bounded_by_network_timeout
    async def stage(self, epoch: int, task: str, batches: AsyncIterable[pa.RecordBatch]) -> str:
        """Prepare a transaction holding this task's share of ``epoch``; return its id.

        Returns ``""`` (and prepares nothing) for an epoch committed before.
        """
        writer = self._lifecycle.require("stage")
        settings = writer.settings
        suffix = hashlib.sha256(task.encode()).hexdigest()[:16]
        gid = make_gid(settings.sink_id, epoch, suffix)
        task_transaction = _Transaction(epoch)
        try:
            if epoch <= await writer.markers.last_committed(writer.session):
                async for _ in batches:
                    pass
                return ""
            await writer.session.execute("BEGIN")
            task_transaction = _Transaction(epoch, in_transaction=True, gid=gid)
            stream = task_transaction.stream = _CopyStream(writer, settings.table)
            async for batch in batches:
                _check_schema(batch.schema, writer.schema)
                self._bytes_total += await stream.write(batch)
                self._records_total += batch.num_rows
            await stream.finish()
            await writer.markers.record_prepared(writer.session, gid, epoch)
            await writer.session.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
        except psycopg.Error as error:
            await _abandon(writer, task_transaction)
            raise failure(settings.connection, f"stage epoch {epoch} ({task})", error) from None
        except BaseException:
            await _abandon(writer, task_transaction)
            raise
        crash_point("task-prepared")
        return gid

    @bounded_by_network_timeout
    async def commit_aggregated(self, epoch: int, descriptors: Sequence[str]) -> None:
        """``COMMIT PREPARED`` the named transactions; roll back the epoch's others.

        Idempotent: a named transaction no longer prepared is checked to have committed.

        :raises TransactionError: when a named transaction is neither prepared nor committed
            (someone ran ``ROLLBACK PREPARED``): its rows are lost.
        """
        await _commit_prepared(self._lifecycle.require("commit_aggregated"), epoch, descriptors)


class PostgresUpsertSink(PostgresSink):
    """Upserts batches into a PostgreSQL table on ``key``: idempotent, at least once.

    Each batch is ``INSERT ... ON CONFLICT (key) DO UPDATE`` (the last row of a key in an
    epoch wins); ``pre_commit`` commits the epoch. An epoch written again after a crash
    upserts the same rows again, so the table ends as if it were written once. The table
    needs a primary key or unique index on ``key``.
    """

    CONFIG_KEYS: ClassVar[tuple[ConfigKeySpec, ...]] = UPSERT_KEYS
    DESCRIPTION: ClassVar[str] = (
        "Upserts into a PostgreSQL table (INSERT ... ON CONFLICT): idempotent, at least once"
    )

    MODE: ClassVar[Mode] = Mode.UPSERT

    def capabilities(self) -> SinkConnectorCapabilities:
        """Idempotent upserts (at least once)."""
        return SinkConnectorCapabilities().with_idempotent().with_upsert()
