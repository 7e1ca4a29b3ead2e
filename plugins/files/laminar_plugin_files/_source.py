"""The ``files`` source: Parquet, CSV and JSON Lines files read from a directory, in name order."""

from __future__ import annotations

import bisect
from collections.abc import AsyncIterator, Generator, Iterator
from dataclasses import dataclass
from typing import ClassVar

import pyarrow as pa
import pyarrow.fs as pafs
from laminar_sdk import (
    CheckpointError,
    ConfigKeySpec,
    ConfigurationError,
    ConnectorConfig,
    ConnectorMetrics,
    PartitionRange,
    RangeReadableSource,
    ReadError,
    SourceBatch,
    SourceCheckpoint,
    SourceConnector,
)
from laminar_sdk.reference import (
    S3_KEYS,
    Lifecycle,
    OrderedUnits,
    PositionFormat,
    StorageLocation,
    UnitPosition,
    UnitReader,
    first_rows,
    storage_location,
)

from laminar_plugin_files._config import (
    SCHEMA_KEY,
    FileFormat,
    configured_format,
    configured_schema,
    format_key,
)
from laminar_plugin_files._location import SOURCE_PATH_KEY, check_location
from laminar_plugin_files._reading import count_rows, file_batches, list_files

_LABEL = "files source"
_FORMATS = (FileFormat.PARQUET, FileFormat.CSV, FileFormat.JSONL)
PARTITION = "files"
"""The one partition of the source: its checkpoints and batches name it."""
_BATCH_SIZE = 8192
_POSITIONS: PositionFormat[str] = PositionFormat(
    _LABEL, PARTITION, "file", rows_first=True, parse_unit=lambda text: text or None
)
"""A position is a file (every file sorting before it read) and the rows of it read, written
``<rows>:<file>`` or ``end:<file>`` — small, however many files the directory holds."""


@dataclass(frozen=True, slots=True)
class _Settings:
    location: StorageLocation
    file_format: FileFormat
    schema: pa.Schema
    pattern: str
    batch_size: int

    def batches(self, name: str, skip: int) -> Generator[pa.RecordBatch, None, None]:
        """The batches of file ``name`` after its first ``skip`` rows."""
        return file_batches(
            _LABEL,
            self.location,
            name,
            file_format=self.file_format,
            schema=self.schema,
            batch_size=self.batch_size,
            skip=skip,
        )


class _OpenFile(UnitReader[str]):
    """The file being read, its rows not counted beforehand.

    It reads one row ahead, so that the batch returning a file's last row already moves the
    position past the file.
    """

    def __init__(
        self,
        name: str,
        schema: pa.Schema,
        batches: Generator[pa.RecordBatch, None, None],
        returned: int,
    ) -> None:
        super().__init__(name, schema, batches, returned)
        self._buffer: list[pa.RecordBatch] = []
        self._buffered = 0
        self._exhausted = False

    @property
    def finished(self) -> bool:
        """Whether every row of the file has been returned."""
        return self._exhausted and not self._buffered

    def take(self, count: int) -> pa.RecordBatch:
        """The next ``count`` rows, or fewer when the file ends first."""
        while not self._exhausted and self._buffered <= count:
            batch = next(self._batches, None)
            if batch is None:
                self._exhausted = True
            elif batch.num_rows:
                self._buffer.append(batch)
                self._buffered += batch.num_rows
        pieces: list[pa.RecordBatch] = []
        wanted = count
        while wanted and self._buffer:
            head = self._buffer[0]
            if head.num_rows <= wanted:
                pieces.append(self._buffer.pop(0))
            else:
                pieces.append(head.slice(0, wanted))
                self._buffer[0] = head.slice(wanted)
            wanted -= pieces[-1].num_rows
        taken = count - wanted
        self._buffered -= taken
        self.returned += taken
        return self._joined(pieces)


class FilesSource(SourceConnector, RangeReadableSource):
    """Reads the Parquet, CSV or JSON Lines files of a directory as they appear, replayably.

    Files are read whole, one after the other, in the order of their paths relative to
    ``path`` (code-point order, so name new files so that they sort after the old ones: a
    timestamp or sequence number first). A file must appear complete — write it elsewhere (or
    under a name starting with ``.``) and rename it in — and must not change or vanish until
    it has been read. Files and directories whose names start with ``.`` or ``_`` are ignored.

    ``path`` may be a local directory or an object-store prefix (``s3://bucket/prefix``, with
    the ``s3.*`` keys, or any URI :meth:`pyarrow.fs.FileSystem.from_uri` opens): everything
    is listed and read through a :class:`pyarrow.fs.FileSystem`, and positions are paths
    relative to ``path`` in both cases. On an object store, "appear complete" is what a PUT
    gives: an object is visible only once uploaded whole.

    Every batch has exactly :meth:`schema`: the declared columns, picked by name and cast;
    other columns are ignored. A file whose columns do not fit raises
    :class:`~laminar_sdk.SchemaMismatch` naming it. :meth:`poll_batch` returns at most
    ``batch_size`` rows, all from one file, and ``None`` when no new file is there.

    The checkpoint holds one position — the file being read and the rows returned from it, or
    the last file finished — so restoring it on a new instance resumes exactly after the last
    row returned. A file that appears later with a path sorting before that position is never
    read.

    As a :class:`~laminar_sdk.RangeReadableSource`, :meth:`plan_end` says where the rows
    present now end (counting rows from Parquet footers, or by reading other files once) and
    :meth:`read_range` reads the rows between two positions in any process.
    """

    CONFIG_KEYS: ClassVar[tuple[ConfigKeySpec, ...]] = (
        SOURCE_PATH_KEY,
        format_key(_FORMATS),
        SCHEMA_KEY,
        ConfigKeySpec(
            "pattern",
            description="glob matched against each file's path relative to 'path' ('*' also "
            "matches '/'); default *.<format>, e.g. *.parquet",
        ),
        ConfigKeySpec(
            "batch_size",
            default=str(_BATCH_SIZE),
            value_type=int,
            description="most rows one poll returns",
        ),
        *S3_KEYS,
    )
    DESCRIPTION: ClassVar[str] = (
        "Reads Parquet, CSV or JSON Lines files from a directory or object-store prefix (s3://) "
        "as they appear, in name order; replayable"
    )

    def __init__(self) -> None:
        self._lifecycle: Lifecycle[_Settings] = Lifecycle(_LABEL)
        self._files: OrderedUnits[str, _Settings] = OrderedUnits(
            _POSITIONS,
            following=_following,
            open_unit=self._open_file,
            plannable_rows=self._rows_after,
            skips_empty_units=False,
        )
        self._row_counts: dict[str, int] = {}

    async def open(self, config: ConnectorConfig) -> None:
        """Check ``config`` and the directory; nothing is read yet.

        An object store is contacted once, to check that the bucket exists and the prefix may
        be listed (a prefix with no objects yet is an empty directory).

        :raises ConfigurationError: naming the key that is unknown, mistyped or out of range,
            or ``path`` when the directory (or bucket) does not exist or may not be read.
        :raises ConnectionFailed: naming ``path`` when the object store cannot be reached or
            refuses to list the prefix.
        """
        config = config.validate(self.CONFIG_KEYS)
        file_format = configured_format(_LABEL, config, _FORMATS)
        location = storage_location(_LABEL, config)
        batch_size = config.get_parsed("batch_size", int, _BATCH_SIZE)
        if batch_size < 1:
            raise ConfigurationError(
                f"{_LABEL}: config key 'batch_size' must be >= 1, got {batch_size}",
                key="batch_size",
            )
        pattern = config.get("pattern") or f"*{file_format.extension}"
        schema = configured_schema(_LABEL, config)
        check_location(_LABEL, location)  # last: every key is checked before a store is asked
        self._lifecycle.open(_Settings(location, file_format, schema, pattern, batch_size))

    def schema(self) -> pa.Schema:
        """The declared schema (the ``schema`` key)."""
        return self._lifecycle.require("schema").schema

    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        """Return up to ``min(max_records, batch_size)`` rows of the file being read.

        Moves on to the next file (by path) when the current one is finished; returns
        ``None`` when every file present has been read.

        :raises ValueError: when ``max_records < 1``.
        :raises SchemaMismatch: naming a file whose columns do not fit the schema.
        :raises SerdeError: naming a file that cannot be parsed in the configured format.
        :raises ReadError: when the directory or a file cannot be read.
        :raises CheckpointError: when the file the checkpoint is in the middle of is gone or
            shorter than the checkpoint's position.
        """
        settings = self._lifecycle.require("poll_batch")
        return self._files.poll(settings, max_records, settings.batch_size)

    def _open_file(self, settings: _Settings, name: str, skip: int) -> _OpenFile:
        """Open file ``name`` after its first ``skip`` rows.

        :raises CheckpointError: when it is the file the position is inside of, and is gone.
        """
        position = self._files.position
        if (
            position is not None
            and position.rows is not None
            and position.unit == name
            and not _is_file(settings.location, name)
        ):
            raise CheckpointError(
                f"{_LABEL}: the checkpoint is {position.rows} rows into "
                f"{settings.location.show(name)}, which is gone; files must stay "
                "until they have been read"
            )
        return _OpenFile(name, settings.schema, settings.batches(name, skip), skip)

    def checkpoint(self) -> SourceCheckpoint:
        """The position after the last row returned: restoring it resumes right after it."""
        self._lifecycle.require("checkpoint")
        return self._files.checkpoint()

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        """Resume after the position in ``checkpoint`` (from the first file when it has none).

        :raises CheckpointError: when ``checkpoint`` names another partition or holds a
            position this source cannot have written.
        """
        self._lifecycle.require("restore")
        self._files.restore(checkpoint)

    def as_range_readable(self) -> RangeReadableSource:
        """This source: a micro-batch is planned by position and read in a task of its own.

        The whole directory is one partition (``files``), so a micro-batch is one task; what
        range reads bring is that planning reads Parquet footers only, and a micro-batch run
        again reads exactly its range instead of polling.
        """
        return self

    async def plan_end(self, start: SourceCheckpoint, max_records: int | None) -> SourceCheckpoint:
        """The position after the rows present now that follow ``start``, at most ``max_records``.

        Unbounded, that is the end of the last file present; bounded, the rows of the files
        are counted (Parquet footers, other files read once; counts are kept, files being
        immutable). ``start`` itself when no file follows it.

        :raises CheckpointError: when ``start`` is not a checkpoint of this source.
        """
        settings = self._lifecycle.require("plan_end")
        return self._files.plan_end(settings, start, max_records)

    def _rows_after(self, settings: _Settings, name: str, skip: int, _plan_has_rows: bool) -> int:
        """The rows of file ``name`` after its first ``skip``; a plan never stops before one.

        :raises CheckpointError: when the file has fewer than ``skip`` rows.
        """
        available = self._rows_in(settings, name) - skip
        if available < 0:
            raise CheckpointError(
                f"{_LABEL}: the checkpoint is {skip} rows into {settings.location.show(name)}, "
                f"but the file has only {skip + available}; files must not change once "
                "they are in the directory"
            )
        return available

    def _rows_in(self, settings: _Settings, name: str) -> int:
        rows = self._row_counts.get(name)
        if rows is None:
            rows = count_rows(
                _LABEL,
                settings.location,
                name,
                file_format=settings.file_format,
                schema=settings.schema,
                batch_size=settings.batch_size,
            )
            self._row_counts[name] = rows
        return rows

    async def read_range(self, partition_range: PartitionRange) -> AsyncIterator[pa.RecordBatch]:
        """The rows after ``partition_range.start`` up to its ``end``, file by file, in batches.

        :raises CheckpointError: for a range that is not of this source's partition.
        :raises ReadError: when a file of the range is gone or shorter than the range says.
        """
        settings = self._lifecycle.require("read_range")
        start, end = _POSITIONS.range_positions(partition_range)
        for name, skip in _following(settings, start):
            if name > end.unit:
                break
            wanted = None if name != end.unit or end.rows is None else end.rows - skip
            read = 0
            try:
                for batch in first_rows(settings.batches(name, skip), wanted):
                    read += batch.num_rows
                    yield batch
            except CheckpointError as error:
                raise ReadError(f"{error}: the range cannot be read again") from error
            if wanted is not None and read < wanted:
                raise ReadError(
                    f"{_LABEL}: the range ends {end.rows} rows into "
                    f"{settings.location.show(name)}, but the file has only {skip + read}; "
                    "files must not change once they are in the directory"
                )
            if name == end.unit:
                return
        raise ReadError(
            f"{_LABEL}: the range ends in {settings.location.show(end.unit)}, which is gone; files "
            "must stay until every micro-batch that read them is committed"
        )

    def metrics(self) -> ConnectorMetrics:
        """Rows and Arrow bytes returned; ``custom["files_finished"]``: files read to their end."""
        return ConnectorMetrics(
            records_total=self._files.records_total,
            bytes_total=self._files.bytes_total,
            custom={"files_finished": float(self._files.units_finished)},
        )

    async def close(self) -> None:
        """Close the file being read; the files stay in the directory."""
        self._files.close()
        self._lifecycle.close()


def _following(
    settings: _Settings, position: UnitPosition[str] | None
) -> Iterator[tuple[str, int]]:
    """The files to read after ``position``, with the rows of each already read.

    The file the position is in comes first; the directory is listed only when it is done.
    """
    if position is not None and position.rows is not None:
        yield position.unit, position.rows
    names = list_files(_LABEL, settings.location, settings.pattern)
    first = 0 if position is None else bisect.bisect_right(names, position.unit)
    for name in names[first:]:
        yield name, 0


def _is_file(location: StorageLocation, name: str) -> bool:
    """Whether ``name`` (relative to ``location``) is a file.

    :raises ReadError: when the filesystem cannot say (an object store unreachable).
    """
    try:
        return location.filesystem.get_file_info(location.path(name)).type is pafs.FileType.File
    except OSError as error:
        raise ReadError(
            f"{_LABEL}: cannot look up {location.show(name)}: {error}; check that the store "
            "is reachable and the credentials valid"
        ) from error
