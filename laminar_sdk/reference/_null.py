"""The ``null`` sink: counts what arrives, keeps nothing."""

from __future__ import annotations

import dataclasses
import json
import os
import time
import uuid
from pathlib import Path
from typing import ClassVar

import pyarrow as pa

from laminar_sdk import (
    ConfigKeySpec,
    ConfigurationError,
    ConnectorConfig,
    ConnectorMetrics,
    PathKind,
    SinkConnector,
    SinkConnectorCapabilities,
    WriteResult,
)
from laminar_sdk._contract.durable import make_dirs, write_file_atomically
from laminar_sdk.reference._lifecycle import Lifecycle
from laminar_sdk.reference._schemas import SCHEMA_KEY, configured_schema, conform_batch

_NAME = "null sink"
_COUNT_FILE_PREFIX = "counts-"


@dataclasses.dataclass(frozen=True, slots=True)
class EpochCount:
    """What one :class:`NullSink` instance received in an epoch, recorded when it flushed.

    ``epoch`` is ``None`` for records written outside any epoch.
    """

    epoch: int | None
    records_written: int
    bytes_written: int


@dataclasses.dataclass(frozen=True, slots=True)
class _NullSettings:
    directory: Path | None
    schema: pa.Schema


class NullSink(SinkConnector):
    """Checks each batch's schema, counts its records and Arrow bytes, and drops it.

    At-least-once only. With ``path`` set, every flush (hence every :meth:`pre_commit`) and
    :meth:`commit_epoch` records the counts received since the previous flush as a small JSON
    file of its own in that directory, written atomically, so a test in another process can
    read them with :meth:`read_counts` — and several instances (Spark tasks) writing one
    epoch in parallel never overwrite each other's counts. A rolled-back epoch's counts not
    yet flushed are not recorded; :meth:`metrics` counts everything received.
    """

    CONFIG_KEYS: ClassVar[tuple[ConfigKeySpec, ...]] = (
        ConfigKeySpec(
            "path",
            description="directory to record per-epoch counts in (NullSink.read_counts); "
            "unset = counts in metrics only",
            path=PathKind.MAY_CREATE,
        ),
        SCHEMA_KEY,
    )
    DESCRIPTION: ClassVar[str] = (
        "Counts records and bytes and drops them (at-least-once), for benchmarks and tests"
    )

    def __init__(self) -> None:
        self._lifecycle: Lifecycle[_NullSettings] = Lifecycle(_NAME)
        self._epoch: int | None = None
        self._pending_records = 0
        self._pending_bytes = 0
        self._records_total = 0
        self._bytes_total = 0

    @staticmethod
    def read_counts(path: str | os.PathLike[str]) -> list[EpochCount]:
        """Every count recorded at ``path``, by epoch (``None`` first), then as recorded.

        An epoch delivered more than once (at-least-once) appears once per delivery; the
        records that arrived are ``sum(count.records_written for count in counts)``.
        """
        counts = [
            EpochCount(**json.loads(file.read_bytes()))
            for file in sorted(Path(path).glob(f"{_COUNT_FILE_PREFIX}*.json"))
        ]
        return sorted(counts, key=lambda count: -1 if count.epoch is None else count.epoch)

    async def open(self, config: ConnectorConfig) -> None:
        """Check ``config``; create the ``path`` directory when one is given.

        :raises ConfigurationError: naming the key that is unknown or wrong, or ``path`` when
            it is not a directory.
        """
        config = config.validate(self.CONFIG_KEYS)
        schema = configured_schema(config)
        path = config.get("path")
        directory = None if path is None else Path(path)
        if directory is not None:
            try:
                make_dirs(directory)
            except (NotADirectoryError, FileExistsError) as error:
                raise ConfigurationError(
                    f"{_NAME}: config key 'path' must name a directory: {error}", key="path"
                ) from error
        self._lifecycle.open(_NullSettings(directory, schema))

    def schema(self) -> pa.Schema:
        """The configured schema (``ids`` or ``wide``)."""
        return self._lifecycle.require("schema").schema

    def capabilities(self) -> SinkConnectorCapabilities:
        """``partitioned`` only: at-least-once, and writers of one epoch may run in parallel."""
        return SinkConnectorCapabilities().with_partitioned()

    async def begin_epoch(self, epoch: int) -> None:
        """Attribute the records that follow to ``epoch`` (flushing any of an earlier one)."""
        self._lifecycle.require("begin_epoch")
        await self.flush()
        self._epoch = epoch

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        """Count ``batch``.

        :raises SchemaMismatch: naming how ``batch`` differs from :meth:`schema`.
        """
        settings = self._lifecycle.require("write_batch")
        conform_batch(_NAME, settings.schema, batch)
        self._pending_records += batch.num_rows
        self._pending_bytes += batch.nbytes
        self._records_total += batch.num_rows
        self._bytes_total += batch.nbytes
        return WriteResult(batch.num_rows, batch.nbytes)

    async def flush(self) -> None:
        """Record the counts received since the last flush under ``path``, if set."""
        settings = self._lifecycle.require("flush")
        if self._pending_records and settings.directory is not None:
            count = EpochCount(self._epoch, self._pending_records, self._pending_bytes)
            # Named by time first, so that sorting the names orders the records.
            name = f"{_COUNT_FILE_PREFIX}{time.time_ns():020d}-{uuid.uuid4().hex}.json"
            record = settings.directory / name
            write_file_atomically(record, json.dumps(dataclasses.asdict(count)).encode())
        self._pending_records = self._pending_bytes = 0

    async def commit_epoch(self, epoch: int) -> None:
        """Flush, and end ``epoch``."""
        await self.flush()
        if self._epoch == epoch:
            self._epoch = None

    async def rollback_epoch(self, epoch: int) -> None:
        """End ``epoch``, dropping its counts not flushed yet."""
        self._lifecycle.require("rollback_epoch")
        if self._epoch == epoch:
            self._pending_records = self._pending_bytes = 0
            self._epoch = None

    def metrics(self) -> ConnectorMetrics:
        """Every record and Arrow byte received by this instance."""
        return ConnectorMetrics(records_total=self._records_total, bytes_total=self._bytes_total)

    async def close(self) -> None:
        """Stop; counts not flushed are not recorded (an open epoch is abandoned)."""
        self._lifecycle.close()
