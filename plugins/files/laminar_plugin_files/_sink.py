"""The ``files`` sink: Parquet or JSON Lines files, each epoch published by one atomic rename."""

from __future__ import annotations

from collections.abc import AsyncIterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar
from urllib.parse import quote

import pyarrow as pa
from laminar_sdk import (
    ConfigKeySpec,
    ConfigurationError,
    ConnectorConfig,
    ConnectorMetrics,
    DistributedCommitSink,
    EpochTracker,
    SinkConnector,
    SinkConnectorCapabilities,
    WriteResult,
    make_dirs,
    write_file_atomically,
)
from laminar_sdk.reference import Lifecycle, conform_batch

from laminar_plugin_files._config import (
    PATH_KEY,
    SCHEMA_KEY,
    FileFormat,
    configured_format,
    configured_schema,
    format_key,
    local_directory,
)
from laminar_plugin_files._epochs import (
    MANIFEST,
    PARTITION_COLUMN,
    STAGING,
    EpochFiles,
    check_layout,
    combined,
    discard_staging,
    last_published,
    publish,
    published_before,
    published_directory,
    read_staged_manifest,
    staging_directory,
)
from laminar_plugin_files._writing import StagedFiles

_LABEL = "files sink"
_FORMATS = (FileFormat.PARQUET, FileFormat.JSONL)
_REMOTE_REFUSAL = (
    "this sink publishes each epoch with one atomic directory rename, which object stores "
    "(S3, GCS, Azure Blob Storage) do not have — a rename there copies object by object, so "
    "a reader could see part of an epoch and exactly-once delivery could not be kept. Use a "
    "local path, or a mounted file system with atomic rename"
)
_SINGLE_WRITER_PREFIX = "part"
_TASK_PREFIX = "task-"
_TASK_SAFE = "-_."  # characters a task name keeps in a file name; the rest is %-escaped


def _check_no_partition_column(schema: pa.Schema) -> None:
    # Readers that discover partitions add the column: Spark replaces the data's values with
    # the epoch's, pyarrow (and so pandas) fails to merge the two.
    clash = [name for name in schema.names if name.lower() == PARTITION_COLUMN]
    if clash:
        raise ConfigurationError(
            f"{_LABEL}: config key 'schema' has a column named {clash[0]!r}, the partition "
            f"column of the sink's {PARTITION_COLUMN}=<e>/ directories: readers that discover "
            "partitions (Spark, pyarrow.parquet, pandas) would overwrite or reject it. Rename "
            f"the column before the sink (in a pipeline file's transform: "
            f"{clash[0]} AS event_{clash[0]})",
            key=SCHEMA_KEY.name,
        )


@dataclass(frozen=True, slots=True)
class _Settings:
    directory: Path
    file_format: FileFormat
    schema: pa.Schema
    rows_per_file: int | None


class FilesSink(SinkConnector, DistributedCommitSink):
    """Writes each epoch as Parquet or JSON Lines files, published exactly once.

    Layout under ``path``: the published epochs are Hive-style partitions, which
    ``spark.read.parquet(path)``, ``pyarrow.parquet.read_table(path)``, ``pyarrow.dataset``
    and ``pandas.read_parquet(path)`` read as they are (adding an ``epoch`` column when they
    discover partitions); they all skip the ``_``-prefixed bookkeeping::

        epoch=<e, 20 digits>/          a published epoch: its data files and _MANIFEST.json
        _staging/epoch-<e>/            an epoch being written: invisible
        _staging/publishing-<e>/       its files gathered for publishing: invisible
        _LAYOUT.json                   says the directory holds this layout

    - :meth:`begin_epoch` stages ``e`` afresh (an earlier attempt's staging is discarded) —
      unless ``epoch=<e>`` is published already: then ``e`` is a re-delivery, and every call
      for it up to :meth:`commit_epoch` writes nothing.
    - :meth:`write_batch` appends to ``part-NNNNN`` files in the staging directory, starting
      a new file every ``rows_per_file`` rows.
    - :meth:`pre_commit` closes and fsyncs the files and records them in the staging
      directory's manifest: from then on any instance, in any process, can commit the epoch.
    - :meth:`commit_epoch` moves the recorded files to ``_staging/publishing-<e>/`` and
      renames that directory to ``epoch=<e>`` (fsyncing it and its parents): one atomic step
      that publishes the epoch and records that it is committed. What is left staged is then
      deleted. Committing again does nothing.
    - :meth:`rollback_epoch` deletes everything staged for the epoch; a published epoch is
      never touched.

    As a :class:`~laminar_sdk.DistributedCommitSink` (:meth:`as_distributed_commit`), write
    tasks :meth:`stage` their share as ``task-<task>-NNNNN`` files in the same staging
    directory, and :meth:`commit_aggregated` publishes exactly the files their descriptors
    name the same way; every other staged file of the epoch (failed attempts, crashed runs,
    a straggling attempt still writing) is deleted, never published.
    """

    CONFIG_KEYS: ClassVar[tuple[ConfigKeySpec, ...]] = (
        PATH_KEY,
        format_key(_FORMATS),
        SCHEMA_KEY,
        ConfigKeySpec(
            "rows_per_file",
            value_type=int,
            description="most rows in one file; unset = one file per epoch (per write task)",
        ),
    )
    DESCRIPTION: ClassVar[str] = (
        "Writes Parquet or JSON Lines files to a directory, each epoch published exactly once "
        "by an atomic rename"
    )

    def __init__(self) -> None:
        self._lifecycle: Lifecycle[_Settings] = Lifecycle(_LABEL)
        self._epochs: EpochTracker[StagedFiles] = EpochTracker(_LABEL)
        self._records_total = 0
        self._bytes_total = 0
        self._epochs_committed = 0
        self._epochs_skipped = 0

    async def open(self, config: ConnectorConfig) -> None:
        """Check ``config`` and create ``path`` (and its staging directory) if needed.

        :raises ConfigurationError: naming the key that is unknown, mistyped or out of range;
            ``schema`` when it has a column named ``epoch`` (the partition column readers
            add); ``path`` when it is an object-store URI, cannot be created as a directory,
            or holds epochs an earlier release published as ``epoch-<e>/`` directories.
        """
        config = config.validate(self.CONFIG_KEYS)
        file_format = configured_format(_LABEL, config, _FORMATS)
        directory = local_directory(_LABEL, config, _REMOTE_REFUSAL)
        rows_per_file = config.get_parsed("rows_per_file", int)
        if rows_per_file is not None and rows_per_file < 1:
            raise ConfigurationError(
                f"{_LABEL}: config key 'rows_per_file' must be >= 1, got {rows_per_file}; "
                "leave it unset for one file per epoch",
                key="rows_per_file",
            )
        schema = configured_schema(_LABEL, config)
        _check_no_partition_column(schema)
        try:
            make_dirs(directory / STAGING)
            check_layout(_LABEL, directory, PATH_KEY.name)
        except OSError as error:
            raise ConfigurationError(
                f"{_LABEL}: config key 'path' names {directory}, where the sink cannot create "
                f"its directories ({error}); point it at a directory this process may write",
                key=PATH_KEY.name,
            ) from error
        self._lifecycle.open(_Settings(directory, file_format, schema, rows_per_file))

    def schema(self) -> pa.Schema:
        """The declared schema (the ``schema`` key)."""
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
        """This sink: write tasks :meth:`stage`, one :meth:`commit_aggregated` publishes."""
        return self

    async def last_committed_epoch(self) -> int:
        """The newest epoch published under ``path`` (``epoch=<e>``; ``-1``: none)."""
        settings = self._lifecycle.require("last_committed_epoch")
        return last_published(settings.directory)

    async def begin_epoch(self, epoch: int) -> None:
        """Stage ``epoch`` afresh, or recognise it as published already and skip it.

        :raises InvalidState: when another epoch is open on this instance.
        """
        settings = self._lifecycle.require("begin_epoch")
        self._epochs.check_can_begin(epoch)
        if published_directory(settings.directory, epoch).exists():
            self._epochs.skip(epoch)
            self._epochs_skipped += 1
            return
        discard_staging(settings.directory, epoch)
        staging = staging_directory(settings.directory, epoch)
        make_dirs(staging)
        files = StagedFiles(
            _LABEL,
            staging,
            prefix=_SINGLE_WRITER_PREFIX,
            file_format=settings.file_format,
            schema=settings.schema,
            rows_per_file=settings.rows_per_file,
        )
        self._epochs.begin(epoch, files)

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        """Stage ``batch`` in the open epoch; in a skipped epoch, write nothing.

        :returns: the records and Arrow bytes staged (0 for a skipped epoch).
        :raises SchemaMismatch: naming how ``batch`` differs from :meth:`schema`.
        :raises InvalidState: when no epoch is open, or it was pre-committed already.
        """
        settings = self._lifecycle.require("write_batch")
        batch = conform_batch(_LABEL, settings.schema, batch)
        files = self._epochs.writing()
        if files is None:
            return WriteResult(0)
        files.write(batch)
        self._records_total += batch.num_rows
        self._bytes_total += batch.nbytes
        return WriteResult(batch.num_rows, batch.nbytes)

    async def pre_commit(self, epoch: int) -> None:
        """Make the staged files durable and record them; the epoch is still invisible.

        :raises InvalidState: when ``epoch`` is not the epoch open on this instance.
        """
        settings = self._lifecycle.require("pre_commit")
        files = self._epochs.pre_committing(epoch)
        if files is None:
            return
        staged = EpochFiles(epoch, tuple(files.finish()), files.rows)
        manifest = staging_directory(settings.directory, epoch) / MANIFEST
        write_file_atomically(manifest, staged.to_json().encode())
        self._epochs.pre_committed(epoch)

    async def commit_epoch(self, epoch: int) -> None:
        """Publish pre-committed ``epoch`` with one rename; nothing happens if it is published.

        Any instance may commit an epoch another instance (or process) pre-committed.

        :raises InvalidState: when ``epoch`` is neither published nor pre-committed (on this
            instance: begun but not pre-committed).
        """
        settings = self._lifecycle.require("commit_epoch")
        self._epochs.committing(epoch)
        if not published_before(settings.directory, epoch):
            staged = read_staged_manifest(_LABEL, settings.directory, epoch)
            if publish(_LABEL, settings.directory, staged):
                self._epochs_committed += 1
        self._epochs.finish(epoch)

    async def rollback_epoch(self, epoch: int) -> None:
        """Delete everything staged for ``epoch``, by any writer; a published epoch stays."""
        settings = self._lifecycle.require("rollback_epoch")
        rolled_back = self._epochs.finish(epoch)
        if rolled_back is not None and rolled_back.held is not None:
            rolled_back.held.abandon()
        discard_staging(settings.directory, epoch)

    async def stage(self, epoch: int, task: str, batches: AsyncIterable[pa.RecordBatch]) -> str:
        """Write ``batches`` as ``task-<task>-NNNNN`` files in ``epoch``'s staging, durably.

        ``task`` is kept in the names (characters other than letters, digits, ``-``, ``_``
        and ``.`` %-escaped), so attempts never share a file. When ``epoch`` is published
        already (a micro-batch run again after a crash), nothing is staged.

        :returns: the commit descriptor, a JSON record of the staged file names and rows.
        :raises SchemaMismatch: for a batch that does not match :meth:`schema`.
        """
        settings = self._lifecycle.require("stage")
        if published_directory(settings.directory, epoch).exists():
            return EpochFiles(epoch, (), 0).to_json()
        staging = staging_directory(settings.directory, epoch)
        make_dirs(staging)
        files = StagedFiles(
            _LABEL,
            staging,
            prefix=_TASK_PREFIX + quote(task, safe=_TASK_SAFE),
            file_format=settings.file_format,
            schema=settings.schema,
            rows_per_file=settings.rows_per_file,
        )
        try:
            async for batch in batches:
                conformed = conform_batch(_LABEL, settings.schema, batch)
                files.write(conformed)
                self._records_total += conformed.num_rows
                self._bytes_total += conformed.nbytes
        except BaseException:
            files.abandon()
            raise
        return EpochFiles(epoch, tuple(files.finish()), files.rows).to_json()

    async def commit_aggregated(self, epoch: int, descriptors: Sequence[str]) -> None:
        """Publish the files ``descriptors`` name as ``epoch``, with one rename.

        Staged files of ``epoch`` no descriptor names (failed attempts, crashed runs) are
        deleted. Nothing is published when the epoch is published already.

        :raises TransactionError: for a descriptor this sink did not return for ``epoch``,
            two descriptors naming one file, or a named file that is no longer staged.
        """
        settings = self._lifecycle.require("commit_aggregated")
        if published_before(settings.directory, epoch):
            return
        parts = [EpochFiles.from_json(_LABEL, text, epoch) for text in descriptors]
        if publish(_LABEL, settings.directory, combined(_LABEL, epoch, parts)):
            self._epochs_committed += 1

    def metrics(self) -> ConnectorMetrics:
        """Records and Arrow bytes staged by this instance, and epoch counts.

        ``custom`` holds ``epochs_committed`` (epochs this instance published) and
        ``epochs_skipped`` (epochs it recognised as published before and skipped).
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
        """Stop, abandoning an open epoch.

        A pre-committed epoch stays committable by another instance; any other is discarded
        by the next attempt at it, or by the rollback recovery performs.
        """
        abandoned = self._epochs.abandon()
        if abandoned is not None and abandoned.held is not None:
            abandoned.held.abandon()
        self._lifecycle.close()
