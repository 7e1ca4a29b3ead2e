"""The ``delta`` sink: each epoch appended to a Delta table once, in one Delta transaction."""

from __future__ import annotations

import re
from collections.abc import AsyncIterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import pyarrow as pa
from laminar_sdk import (
    ConfigKeySpec,
    ConfigurationError,
    ConnectorConfig,
    ConnectorMetrics,
    DistributedCommitSink,
    EpochTracker,
    InvalidState,
    SinkConnector,
    SinkConnectorCapabilities,
    TransactionError,
    WriteResult,
    make_dirs,
    write_file_atomically,
)
from laminar_sdk.reference import S3_KEYS, Lifecycle, conform_batch, parse_schema

from laminar_plugin_delta._staging import (
    StagedEpoch,
    StagedWriter,
    check_partition_columns,
    delete_quietly,
)
from laminar_plugin_delta._table import (
    TABLE_PATH_KEY,
    TableLocation,
    arrow_schema,
    check_schema,
    open_table,
    table_location,
    unreachable,
)

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from deltalake.transaction import AddAction, RemoveAction

_LABEL = "delta sink"
APP_ID_PREFIX = "laminar-"
"""The table's transaction identifier of a sink is this followed by its ``sink.id``."""
_SINK_ID = re.compile(r"[A-Za-z0-9._-]{1,100}")
_PRE_COMMITTED = "_laminar"
"""The table's directory of pre-commit records: ``_laminar/<sink.id>/epoch-<e>.json``."""
# Commits lost to another writer's commit, each followed by a re-read of the log, before the
# sink gives up on an epoch (the runtime's retry then starts over).
_COMMIT_ATTEMPTS = 50

SINK_KEYS: tuple[ConfigKeySpec, ...] = (
    TABLE_PATH_KEY,
    *S3_KEYS,
    ConfigKeySpec(
        "sink.id",
        required=True,
        description="names this sink's transactions in the table (app id laminar-<sink.id>); "
        "unique per pipeline writing to the table, the same across its restarts",
    ),
    ConfigKeySpec(
        "schema",
        description="the batches' columns as 'name type, ...' (Arrow types: 'id int64, name "
        "string'); default: the table's columns. Needed with table.create for a new table",
    ),
    ConfigKeySpec(
        "table.create",
        default="false",
        value_type=bool,
        description="create the table from schema (and partition_by) when there is none",
    ),
    ConfigKeySpec(
        "table.properties",
        description="table properties for a table the sink creates, comma-separated "
        "key=value (delta.enableChangeDataFeed=true, delta.appendOnly=true, ...)",
    ),
    ConfigKeySpec(
        "partition_by",
        description="the partition columns, comma-separated, for a table the sink creates; "
        "for an existing table, when given, they must be the table's",
    ),
    ConfigKeySpec(
        "rows_per_file",
        value_type=int,
        description="most rows in one data file; unset = one file per partition value per "
        "epoch (per write task)",
    ),
)
"""The keys the ``delta`` sink declares."""


@dataclass(frozen=True, slots=True)
class _Settings:
    location: TableLocation
    app_id: str
    sink_id: str
    schema: pa.Schema
    partition_by: tuple[str, ...]
    rows_per_file: int | None


class DeltaSink(SinkConnector, DistributedCommitSink):
    """Appends each epoch to a Delta table exactly once: one Delta transaction per epoch.

    The table's log is the commit point. Each epoch's commit adds its data files and records
    the epoch as the table's transaction version of the app id ``laminar-<sink.id>``
    (Delta's ``txn`` action, :meth:`deltalake.DeltaTable.transaction_version` reads it back), so
    the table itself says which epochs it holds: an epoch whose number is not above the recorded
    version is skipped, however often it is delivered.

    The check and the commit are one atomic step: the sink reads the log, checks the recorded
    version, and writes the next log entry without delta-rs's rebase-and-retry
    (``max_commit_retries=0``). If any other writer committed first — another pipeline, or a
    zombie of this one committing the same epoch — the write fails, the sink reads the log again
    and checks again. So even two committers of one epoch add its rows once: delta-rs itself
    does not skip a transaction identifier the log holds already (delta-rs #2580, #3821); it
    refuses one only when a commit racing with it carries the same identifier.

    - :meth:`begin_epoch` skips an epoch the table holds; otherwise it starts writing.
    - :meth:`write_batch` writes Parquet data files into the table's directory (in
      ``column=value/`` directories for a partitioned table): invisible, as no log entry names
      them.
    - :meth:`pre_commit` closes them and records their ``add`` actions under
      ``_laminar/<sink.id>/`` in the table's directory: from then on any instance, in any
      process, can commit the epoch.
    - :meth:`commit_epoch` commits them in one Delta transaction (see above).
    - :meth:`rollback_epoch` deletes the epoch's uncommitted files.

    As a :class:`~laminar_sdk.DistributedCommitSink`, Spark's write tasks :meth:`stage` their
    share as data files in parallel and hand back their ``add`` actions; the driver's
    :meth:`commit_aggregated` commits all of them in one transaction. Files of failed attempts
    or crashed runs are never in the log; ``VACUUM`` deletes them.
    """

    CONFIG_KEYS: ClassVar[tuple[ConfigKeySpec, ...]] = SINK_KEYS
    DESCRIPTION: ClassVar[str] = (
        "Appends each epoch to a Delta Lake table (local or S3) exactly once, in one Delta "
        "transaction recording the epoch"
    )

    def __init__(self) -> None:
        self._lifecycle: Lifecycle[_Settings] = Lifecycle(_LABEL)
        self._epochs: EpochTracker[StagedWriter] = EpochTracker(_LABEL)
        self._records_total = 0
        self._bytes_total = 0
        self._epochs_committed = 0
        self._epochs_skipped = 0

    async def open(self, config: ConnectorConfig) -> None:
        """Check ``config``; open the table (creating it with ``table.create``).

        :raises ConfigurationError: naming the key at fault: ``path`` when there is no table
            there (and ``table.create`` is not set), ``schema`` when it is needed and missing,
            ``partition_by`` for columns that are not the table's.
        :raises SchemaMismatch: when ``schema`` is not the table's, naming the column.
        :raises ConnectionFailed: when the store cannot be reached.
        """
        config = config.validate(self.CONFIG_KEYS)
        location = table_location(_LABEL, config)
        sink_id = config.require("sink.id")
        if not _SINK_ID.fullmatch(sink_id):
            raise ConfigurationError(
                f"{_LABEL}: sink.id {sink_id!r} may hold only letters, digits, '.', '_' and "
                "'-' (1 to 100 of them)",
                key="sink.id",
            )
        rows_per_file = config.get_parsed("rows_per_file", int)
        if rows_per_file is not None and rows_per_file < 1:
            raise ConfigurationError(
                f"{_LABEL}: config key 'rows_per_file' must be >= 1, got {rows_per_file}; leave "
                "it unset for one file per partition value per epoch",
                key="rows_per_file",
            )
        schema_text = config.get("schema")
        declared = parse_schema(schema_text, "schema", _LABEL) if schema_text else None
        partition_text = config.get("partition_by")
        partition_by = (
            tuple(name.strip() for name in partition_text.split(",") if name.strip())
            if partition_text
            else None
        )
        table = open_table(_LABEL, location)
        if table is None:
            table = _create_table(location, config, declared, partition_by)
        schema = _plain_lists(arrow_schema(table))
        if declared is not None:
            check_schema(_LABEL, schema, declared, location.shown)
        table_partitions = tuple(table.metadata().partition_columns)
        if partition_by is not None and partition_by != table_partitions:
            raise ConfigurationError(
                f"{_LABEL}: config key 'partition_by' is {', '.join(partition_by) or '(none)'}, "
                f"and the table at {location.shown} is partitioned by "
                f"{', '.join(table_partitions) or 'nothing'}; give the table's, or leave it unset",
                key="partition_by",
            )
        self._lifecycle.open(
            _Settings(
                location,
                APP_ID_PREFIX + sink_id,
                sink_id,
                schema,
                table_partitions,
                rows_per_file,
            )
        )

    def schema(self) -> pa.Schema:
        """The table's schema (partition columns included)."""
        return self._lifecycle.require("schema").schema

    def capabilities(self) -> SinkConnectorCapabilities:
        """``exactly_once``, ``two_phase_commit`` and ``idempotent`` (per epoch).

        Not ``partitioned``: one instance writes an epoch through :meth:`write_batch`; parallel
        writers use :meth:`as_distributed_commit` instead.
        """
        return (
            SinkConnectorCapabilities()
            .with_exactly_once()
            .with_two_phase_commit()
            .with_idempotent()
        )

    def as_distributed_commit(self) -> DistributedCommitSink:
        """This sink: write tasks :meth:`stage`, one :meth:`commit_aggregated` commits."""
        return self

    async def last_committed_epoch(self) -> int:
        """The table's transaction version for this sink's app id (``-1``: none)."""
        settings = self._lifecycle.require("last_committed_epoch")
        return _committed_epoch(settings, self._table(settings))

    async def begin_epoch(self, epoch: int) -> None:
        """Start writing ``epoch``, or recognise it as committed already and skip it.

        :raises InvalidState: when another epoch is open on this instance.
        """
        settings = self._lifecycle.require("begin_epoch")
        self._epochs.check_can_begin(epoch)
        if _committed_epoch(settings, self._table(settings)) >= epoch:
            self._epochs.skip(epoch)
            self._epochs_skipped += 1
            return
        self._epochs.begin(epoch, self._writer(settings, epoch, "w"))

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        """Write ``batch`` into the open epoch's data files; in a skipped epoch, nothing.

        :returns: the records and Arrow bytes written (0 for a skipped epoch).
        :raises SchemaMismatch: naming how ``batch`` differs from :meth:`schema`.
        :raises InvalidState: when no epoch is open, or it was pre-committed already.
        """
        settings = self._lifecycle.require("write_batch")
        batch = conform_batch(_LABEL, settings.schema, batch)
        writer = self._epochs.writing()
        if writer is None:
            return WriteResult(0)
        writer.write(batch)
        self._records_total += batch.num_rows
        self._bytes_total += batch.nbytes
        return WriteResult(batch.num_rows, batch.nbytes)

    async def pre_commit(self, epoch: int) -> None:
        """Make the data files durable and record their ``add`` actions; still invisible.

        :raises InvalidState: when ``epoch`` is not the epoch open on this instance.
        """
        settings = self._lifecycle.require("pre_commit")
        writer = self._epochs.pre_committing(epoch)
        if writer is None:
            return
        staged = writer.finish()
        _write_record(settings, epoch, staged.to_json().encode())
        self._epochs.pre_committed(epoch)

    async def commit_epoch(self, epoch: int) -> None:
        """Commit pre-committed ``epoch`` in one Delta transaction; nothing if it is committed.

        Any instance may commit an epoch another instance (or process) pre-committed. The
        epoch's files are those its record (written by :meth:`pre_commit`) names, read again
        now: an epoch a newer instance rolled back meanwhile is refused, never committed.

        :raises InvalidState: when ``epoch`` is neither committed nor pre-committed.
        :raises TransactionError: when its record is there but one of its files is gone.
        """
        settings = self._lifecycle.require("commit_epoch")
        self._epochs.committing(epoch)
        table = self._table(settings)
        if _committed_epoch(settings, table) < epoch:
            staged = _read_record(settings, epoch)
            if staged is None:
                raise InvalidState(
                    f"epoch {epoch} pre-committed in the table at {settings.location.shown}",
                    f"epoch {epoch} was never pre-committed there, or was rolled back",
                )
            files = settings.location.files
            for staged_file in staged.files:
                if not _exists(settings, staged_file.path):
                    raise TransactionError(
                        f"{_LABEL}: cannot commit epoch {epoch}: its data file "
                        f"{files.show(staged_file.path)} is gone (the epoch was rolled back); "
                        "the epoch must be written again"
                    )
            self._commit(settings, table, staged)
        _delete_record(settings, epoch)
        self._epochs.finish(epoch)

    async def rollback_epoch(self, epoch: int) -> None:
        """Delete ``epoch``'s uncommitted data files and its record; a committed epoch stays.

        The record goes first, so that a commit of the epoch by another instance, after this,
        finds it rolled back.
        """
        settings = self._lifecycle.require("rollback_epoch")
        rolled_back = self._epochs.finish(epoch)
        held = rolled_back.held if rolled_back is not None else None
        if held is not None:
            held.abandon()
        staged = _read_record(settings, epoch)
        _delete_record(settings, epoch)
        if staged is not None and _committed_epoch(settings, self._table(settings)) < epoch:
            for staged_file in staged.files:
                delete_quietly(settings.location.files, staged_file.path)

    async def stage(self, epoch: int, task: str, batches: AsyncIterable[pa.RecordBatch]) -> str:
        """Write ``batches`` as data files of ``epoch`` (names holding ``task``), durably.

        :returns: the commit descriptor: the files' ``add`` actions, as JSON.
        :raises SchemaMismatch: for a batch that does not match :meth:`schema`.
        """
        settings = self._lifecycle.require("stage")
        writer = self._writer(settings, epoch, task)
        try:
            async for batch in batches:
                conformed = conform_batch(_LABEL, settings.schema, batch)
                writer.write(conformed)
                self._records_total += conformed.num_rows
                self._bytes_total += conformed.nbytes
        except BaseException:
            writer.abandon()
            raise
        return writer.finish().to_json()

    async def commit_aggregated(self, epoch: int, descriptors: Sequence[str]) -> None:
        """Commit the data files ``descriptors`` name as ``epoch``, in one Delta transaction.

        Nothing happens when the table holds the epoch already.

        :raises TransactionError: for a descriptor this sink did not return for ``epoch``, or
            two descriptors naming one file.
        """
        settings = self._lifecycle.require("commit_aggregated")
        parts = [StagedEpoch.from_json(_LABEL, text, epoch) for text in descriptors]
        staged = StagedEpoch.combined(_LABEL, epoch, parts)
        self._commit(settings, self._table(settings), staged)

    def metrics(self) -> ConnectorMetrics:
        """Records and Arrow bytes written by this instance, and epoch counts.

        ``custom`` holds ``epochs_committed`` (epochs this instance committed) and
        ``epochs_skipped`` (epochs it found in the table already and skipped).
        """
        return ConnectorMetrics(
            records_total=self._records_total,
            bytes_total=self._bytes_total,
            custom={
                "epochs_committed": float(self._epochs_committed),
                "epochs_skipped": float(self._epochs_skipped),
            },
        )

    async def close(self) -> None:
        """Stop, abandoning an epoch being written (a pre-committed one stays committable)."""
        abandoned = self._epochs.abandon()
        if abandoned is not None and abandoned.held is not None:
            abandoned.held.abandon()
        self._lifecycle.close()

    def _writer(self, settings: _Settings, epoch: int, name: str) -> StagedWriter:
        return StagedWriter(
            _LABEL,
            settings.location,
            epoch=epoch,
            schema=settings.schema,
            partition_by=settings.partition_by,
            rows_per_file=settings.rows_per_file,
            name=name,
        )

    def _table(self, settings: _Settings) -> DeltaTable:
        table = open_table(_LABEL, settings.location)
        if table is None:
            raise TransactionError(
                f"{_LABEL}: the table at {settings.location.shown} is gone (its _delta_log was "
                "deleted while the pipeline ran); restore it, or start the pipeline afresh"
            )
        return table

    def _commit(self, settings: _Settings, table: DeltaTable, staged: StagedEpoch) -> None:
        """Commit ``staged`` unless the table holds its epoch: a check and a write, atomically.

        The log entry is written without delta-rs's rebase (``max_commit_retries=0``), so it
        fails when any commit landed since the check; then the log is read again and the
        check repeated.
        """
        from deltalake import CommitProperties, Transaction  # noqa: PLC0415
        from deltalake.exceptions import CommitFailedError  # noqa: PLC0415

        actions: list[AddAction | RemoveAction] = [f.add_action() for f in staged.files]
        properties = CommitProperties(
            app_transactions=[Transaction(settings.app_id, staged.epoch)],
            max_commit_retries=0,
            custom_metadata={"laminar.sink_id": settings.sink_id, "laminar.epoch": staged.epoch},
        )
        for _ in range(_COMMIT_ATTEMPTS):
            if _committed_epoch(settings, table) >= staged.epoch:
                return
            version = table.version()
            try:
                table.create_write_transaction(
                    actions,
                    mode="append",
                    schema=table.schema(),
                    partition_by=list(settings.partition_by) or None,
                    commit_properties=properties,
                )
            except CommitFailedError as error:
                try:
                    table.update_incremental()
                except OSError as reading:
                    raise unreachable(_LABEL, settings.location, "read the log", reading) from error
                if table.version() == version:
                    raise TransactionError(
                        f"{_LABEL}: cannot commit epoch {staged.epoch} to the table at "
                        f"{settings.location.shown}: {error}"
                    ) from error
                continue  # another writer committed first: check again
            except OSError as error:
                raise unreachable(
                    _LABEL, settings.location, f"commit epoch {staged.epoch}", error
                ) from error
            self._epochs_committed += 1
            return
        raise TransactionError(
            f"{_LABEL}: epoch {staged.epoch} lost {_COMMIT_ATTEMPTS} commits in a row to other "
            f"writers of the table at {settings.location.shown}; too many writers commit to it "
            "at once (the epoch is committed by the next attempt)"
        )


def _create_table(
    location: TableLocation,
    config: ConnectorConfig,
    declared: pa.Schema | None,
    partition_by: tuple[str, ...] | None,
) -> DeltaTable:
    """Create the table ``config`` describes, or refuse when ``table.create`` is not set."""
    from deltalake import DeltaTable  # noqa: PLC0415

    if not config.get_parsed("table.create", bool, False):
        raise ConfigurationError(
            f"{_LABEL}: there is no Delta table at {location.shown} (config key 'path'); "
            "create it, or set table.create=true (with schema) for the sink to create it",
            key=TABLE_PATH_KEY.name,
        )
    if declared is None:
        raise ConfigurationError(
            f"{_LABEL}: table.create=true needs config key 'schema' for the new table at "
            f"{location.shown} (e.g. schema='id int64, name string')",
            key="schema",
        )
    check_partition_columns(_LABEL, declared, partition_by or ())
    properties: dict[str, str | None] = {}
    for item in (config.get("table.properties") or "").split(","):
        if not item.strip():
            continue
        name, equals, value = item.partition("=")
        if not equals or not name.strip():
            raise ConfigurationError(
                f"{_LABEL}: config key 'table.properties' holds {item.strip()!r}, which is not "
                "key=value (e.g. delta.enableChangeDataFeed=true)",
                key="table.properties",
            )
        properties[name.strip()] = value.strip()
    try:
        # "ignore": a table another instance created meanwhile is kept as it is.
        return DeltaTable.create(
            location.uri,
            declared,
            mode="ignore",
            partition_by=list(partition_by) if partition_by else None,
            configuration=properties or None,
            storage_options=location.storage_options or None,
        )
    except OSError as error:
        raise unreachable(_LABEL, location, "create the table", error) from error


def _plain_lists(schema: pa.Schema) -> pa.Schema:
    """``schema`` with Arrow's default list element name (``item``; Delta says ``element``)."""
    fields = []
    for field in schema:
        data_type = field.type
        if pa.types.is_list(data_type):
            data_type = pa.list_(data_type.value_field.with_name("item"))
        fields.append(field.with_type(data_type))
    return pa.schema(fields)


def _committed_epoch(settings: _Settings, table: DeltaTable) -> int:
    version = table.transaction_version(settings.app_id)
    return -1 if version is None else int(version)


def _record_path(settings: _Settings, epoch: int) -> str:
    return f"{_PRE_COMMITTED}/{settings.sink_id}/epoch-{epoch:020d}.json"


def _write_record(settings: _Settings, epoch: int, data: bytes) -> None:
    files = settings.location.files
    path = _record_path(settings, epoch)
    if not files.remote:
        record = Path(files.path(path))
        make_dirs(record.parent)
        write_file_atomically(record, data)
        return
    try:
        # One PUT when the stream closes: the object appears whole. A call interrupted before
        # the write leaves an empty object (the stream closes all the same): see _read_record.
        with files.filesystem.open_output_stream(files.path(path)) as stream:
            stream.write(data)
    except OSError as error:
        raise unreachable(_LABEL, settings.location, f"record epoch {epoch}", error) from error


def _read_record(settings: _Settings, epoch: int) -> StagedEpoch | None:
    """The record :meth:`DeltaSink.pre_commit` wrote for ``epoch``.

    ``None`` when there is none, or it is empty: a pre-commit that did not finish (on an
    object store, interrupted between opening the object and writing it).
    """
    files = settings.location.files
    try:
        with files.filesystem.open_input_stream(files.path(_record_path(settings, epoch))) as f:
            text = f.read().decode()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise unreachable(_LABEL, settings.location, f"read epoch {epoch}", error) from error
    return StagedEpoch.from_json(_LABEL, text, epoch) if text.strip() else None


def _exists(settings: _Settings, path: str) -> bool:
    import pyarrow.fs as pafs  # noqa: PLC0415

    files = settings.location.files
    try:
        kind = files.filesystem.get_file_info(files.path(path)).type
    except OSError as error:
        raise unreachable(_LABEL, settings.location, f"look for {path}", error) from error
    return bool(kind != pafs.FileType.NotFound)


def _delete_record(settings: _Settings, epoch: int) -> None:
    delete_quietly(settings.location.files, _record_path(settings, epoch))
