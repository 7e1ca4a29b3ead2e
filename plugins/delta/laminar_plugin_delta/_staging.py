"""Data files staged for an epoch, and the descriptor that names them for the commit.

A writer (one write task, or the one instance of the sink) writes Parquet files into the
table's directory — in the Hive-style ``column=value/`` directories of the table's partition
columns — and describes each as a Delta ``add`` action: path, size, partition values,
modification time and statistics. Nothing is visible to a Delta reader until the commit adds
the actions to the table's log; files of attempts that are never committed stay invisible,
and ``VACUUM`` deletes them.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from laminar_sdk import ConfigurationError, TransactionError, fsync_path
from laminar_sdk.reference import StorageLocation

from laminar_plugin_delta._table import TableLocation, unreachable

if TYPE_CHECKING:
    from deltalake.transaction import AddAction

# Partition columns of these types: their values have one plain text form in a path.
_PARTITION_TYPES = (
    pa.types.is_integer,
    pa.types.is_string,
    pa.types.is_date32,
    pa.types.is_boolean,
)
# Columns whose minimum and maximum go into a file's statistics (readers skip files by them):
# types whose Delta statistics text is exact. Strings are left out: Delta truncates them.
_STATISTICS_TYPES = (pa.types.is_integer, pa.types.is_date32)


def check_partition_columns(label: str, schema: pa.Schema, columns: Sequence[str]) -> None:
    """Refuse partition columns that are not columns of ``schema``, or of a type not supported.

    :raises ConfigurationError: naming ``partition_by`` and the column.
    """
    for name in columns:
        if name not in schema.names:
            raise ConfigurationError(
                f"{label}: config key 'partition_by' names {name!r}, which is not a column "
                f"(columns: {', '.join(schema.names)})",
                key="partition_by",
            )
        data_type = schema.field(name).type
        if not any(accepts(data_type) for accepts in _PARTITION_TYPES):
            raise ConfigurationError(
                f"{label}: config key 'partition_by' names {name!r}, of type {data_type}; "
                "partition by a column of an integer, string, date32 or bool type",
                key="partition_by",
            )
    if len(columns) == len(schema.names):
        raise ConfigurationError(
            f"{label}: config key 'partition_by' names every column; a data file needs at "
            "least one column that is not a partition column",
            key="partition_by",
        )


@dataclass(frozen=True, slots=True)
class StagedFile:
    """One data file, as the ``add`` action the commit records.

    :param path: the file's path relative to the table's directory, as the filesystem names it.
    """

    path: str
    size: int
    partition_values: dict[str, str | None]
    modification_time: int
    stats: str

    def add_action(self) -> AddAction:
        """The delta-rs ``add`` action of this file."""
        from deltalake.transaction import AddAction  # noqa: PLC0415

        return AddAction(
            path=self.path,  # delta-rs encodes it as the log's relative URI
            size=self.size,
            partition_values=self.partition_values,
            modification_time=self.modification_time,
            data_change=True,
            stats=self.stats,
        )


@dataclass(frozen=True, slots=True)
class StagedEpoch:
    """The files a writer staged for an epoch: the commit descriptor, parsed."""

    epoch: int
    files: tuple[StagedFile, ...]

    def to_json(self) -> str:
        """Canonical JSON text: the commit descriptor, and the pre-commit record."""
        record = {
            "epoch": self.epoch,
            "files": [
                [f.path, f.size, f.partition_values, f.modification_time, f.stats]
                for f in self.files
            ],
        }
        return json.dumps(record, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, label: str, text: str, epoch: int) -> StagedEpoch:
        """Parse :meth:`to_json` output recorded for ``epoch``.

        :raises TransactionError: when ``text`` is not such a record, is for another epoch,
            or names a path outside the table.
        """
        try:
            record = json.loads(text)
            recorded = record["epoch"]
            files = tuple(
                StagedFile(str(path), int(size), dict(values), int(mtime), str(stats))
                for path, size, values, mtime, stats in record["files"]
            )
        except (ValueError, TypeError, KeyError) as error:
            raise TransactionError(
                f"{label}: {text[:200]!r} is not a record of data files staged by this sink"
            ) from error
        if recorded != epoch:
            raise TransactionError(
                f"{label}: a record of data files staged for epoch {recorded} was given for "
                f"epoch {epoch}"
            )
        for staged in files:
            if staged.path.startswith(("/", "_", ".")) or ".." in staged.path.split("/"):
                raise TransactionError(
                    f"{label}: the record of epoch {epoch} names {staged.path!r}, which is not "
                    "a data file path this sink writes"
                )
        return cls(epoch, files)

    @classmethod
    def combined(cls, label: str, epoch: int, parts: Sequence[StagedEpoch]) -> StagedEpoch:
        """The files of every one of ``parts`` (several writers' descriptors) as one epoch.

        :raises TransactionError: naming a file that two parts list.
        """
        files = [staged for part in parts for staged in part.files]
        paths = [staged.path for staged in files]
        twice = sorted({path for path in paths if paths.count(path) > 1})
        if twice:
            raise TransactionError(
                f"{label}: data file(s) {', '.join(twice[:5])} of epoch {epoch} are named by "
                "more than one commit descriptor; each write task must stage under a task "
                "name of its own"
            )
        return cls(epoch, tuple(files))


class _OpenFile:
    """A Parquet file being written, and the statistics of what it holds so far."""

    def __init__(self, writer: pq.ParquetWriter, path: str, schema: pa.Schema) -> None:
        self.writer = writer
        self.path = path
        self.rows = 0
        self.nulls = dict.fromkeys(schema.names, 0)
        self.minimum: dict[str, Any] = {}
        self.maximum: dict[str, Any] = {}
        self._summarised = [
            field.name
            for field in schema
            if any(accepts(field.type) for accepts in _STATISTICS_TYPES)
        ]

    def write(self, table: pa.Table) -> None:
        self.writer.write_table(table)
        self.rows += table.num_rows
        for name in table.column_names:
            self.nulls[name] += table.column(name).null_count
        for name in self._summarised:
            bounds = pc.min_max(table.column(name)).as_py()
            low, high = bounds["min"], bounds["max"]
            if low is None:
                continue
            self.minimum[name] = low if name not in self.minimum else min(self.minimum[name], low)
            self.maximum[name] = high if name not in self.maximum else max(self.maximum[name], high)

    def stats(self) -> str:
        def text(value: object) -> object:
            return value.isoformat() if isinstance(value, datetime.date) else value

        return json.dumps(
            {
                "numRecords": self.rows,
                "minValues": {name: text(value) for name, value in self.minimum.items()},
                "maxValues": {name: text(value) for name, value in self.maximum.items()},
                "nullCount": self.nulls,
            },
            separators=(",", ":"),
        )


class StagedWriter:
    """The data files one writer stages for one epoch.

    Rows go to one open file per partition (per combination of partition values), which
    rolls over at ``rows_per_file`` rows (``None``: never). Nothing is durable, or named in a
    descriptor, before :meth:`finish`.

    :param label: the connector, for messages.
    :param location: the table.
    :param schema: the table's schema (partition columns included); batches are in it.
    :param partition_by: the table's partition columns.
    :param name: unique to this writer and attempt: every file name holds it.
    """

    def __init__(
        self,
        label: str,
        location: TableLocation,
        *,
        epoch: int,
        schema: pa.Schema,
        partition_by: Sequence[str],
        rows_per_file: int | None,
        name: str,
    ) -> None:
        self.epoch = epoch
        self._label = label
        self._table = location
        self._location = location.files
        self._partition_by = list(partition_by)
        self._data_schema = pa.schema([f for f in schema if f.name not in self._partition_by])
        self._rows_per_file = rows_per_file
        self._prefix = f"part-{epoch:020d}-{quote(name, safe='-_.')}-{uuid.uuid4().hex[:12]}"
        self._open: dict[tuple[str | None, ...], _OpenFile] = {}
        self._done: list[StagedFile] = []
        self._count = 0

    def write(self, batch: pa.RecordBatch) -> None:
        """Append ``batch`` (in the table's schema) to the staged files.

        :raises ConnectionFailed: when the object store fails a request (naming its endpoint).
        :raises ConnectorIOError: when the local disk refuses a write.
        """
        try:
            self._write(batch)
        except OSError as error:
            raise unreachable(self._label, self._table, "write data files", error) from error

    def _write(self, batch: pa.RecordBatch) -> None:
        table = pa.Table.from_batches([batch])
        if not self._partition_by:
            self._write_partition((), table)
            return
        keys = table.select(self._partition_by).group_by(self._partition_by).aggregate([])
        for values in keys.to_pylist():
            mask = None
            for column in self._partition_by:
                value = values[column]
                test = (
                    pc.is_null(table.column(column))
                    if value is None
                    else pc.equal(table.column(column), value)
                )
                mask = test if mask is None else pc.and_(mask, test)
            part = table.filter(mask).drop_columns(self._partition_by)
            key = tuple(_partition_text(values[column]) for column in self._partition_by)
            self._write_partition(key, part)

    def _write_partition(self, key: tuple[str | None, ...], table: pa.Table) -> None:
        offset = 0
        while offset < table.num_rows:
            current = self._open.get(key)
            if current is None or current.rows == self._rows_per_file:
                if current is not None:
                    self._close(key)
                current = self._start(key)
            count = table.num_rows - offset
            if self._rows_per_file is not None:
                count = min(count, self._rows_per_file - current.rows)
            current.write(table.slice(offset, count).cast(self._data_schema))
            offset += count

    def _start(self, key: tuple[str | None, ...]) -> _OpenFile:
        # As delta-rs names them: a directory per partition column, its name and value
        # percent-encoded (the log holds the path encoded once more, as a URI).
        directory = "".join(
            f"{quote(column, safe='')}="
            f"{'__HIVE_DEFAULT_PARTITION__' if value is None else quote(value, safe='')}/"
            for column, value in zip(self._partition_by, key, strict=True)
        )
        path = f"{directory}{self._prefix}-{self._count:05d}.parquet"
        self._count += 1
        if directory:
            self._location.filesystem.create_dir(self._location.path(directory.rstrip("/")))
        writer = pq.ParquetWriter(
            self._location.path(path), self._data_schema, filesystem=self._location.filesystem
        )
        opened = _OpenFile(writer, path, self._data_schema)
        self._open[key] = opened
        return opened

    def _close(self, key: tuple[str | None, ...]) -> None:
        current = self._open.pop(key)
        current.writer.close()
        partition_values = dict(zip(self._partition_by, key, strict=True))
        info = self._location.filesystem.get_file_info(self._location.path(current.path))
        if not self._location.remote:
            fsync_path(Path(self._location.path(current.path)))
        self._done.append(
            StagedFile(
                current.path,
                int(info.size or 0),
                partition_values,
                int(time.time() * 1000),
                current.stats(),
            )
        )

    def finish(self) -> StagedEpoch:
        """Close the files, make them durable, and describe them.

        :raises ConnectionFailed: when the object store fails a request (naming its endpoint).
        :raises ConnectorIOError: when the local disk refuses a write.
        """
        try:
            return self._finish()
        except OSError as error:
            raise unreachable(self._label, self._table, "write data files", error) from error

    def _finish(self) -> StagedEpoch:
        for key in list(self._open):
            self._close(key)
        if not self._location.remote:
            for directory in {Path(self._location.path(f.path)).parent for f in self._done}:
                fsync_path(directory)
        return StagedEpoch(self.epoch, tuple(self._done))

    def abandon(self) -> None:
        """Stop writing and delete what was written (best effort: ``VACUUM`` does the rest)."""
        opened = [current.path for current in self._open.values()]
        for current in self._open.values():
            with contextlib.suppress(OSError):
                current.writer.close()
        self._open.clear()
        for path in [*opened, *(f.path for f in self._done)]:
            delete_quietly(self._location, path)
        self._done.clear()


def delete_quietly(location: StorageLocation, path: str) -> None:
    """Delete ``path`` (relative to the table), if it can be.

    A file that is gone, or a store that is unreachable, leaves at most an orphan file that no
    reader of the table sees (``VACUUM`` deletes it).
    """
    with contextlib.suppress(OSError):
        location.filesystem.delete_file(location.path(path))


def _partition_text(value: object) -> str | None:
    """A partition value as the Delta log records it (``None`` for null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.date):
        return value.isoformat()
    return str(value)
