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
    PartitionInfo,
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
    StorageLocation,
    first_rows,
    parse_count,
    single_offset,
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
_FINISHED = "end"
_BATCH_SIZE = 8192


@dataclass(frozen=True, slots=True)
class _Position:
    """Where the source stands: ``rows`` rows into ``file``, or past it when ``rows`` is None.

    Every file that sorts before ``file`` has been read. Encoded as ``<rows>:<file>`` or
    ``end:<file>`` — small, however many files the directory holds.
    """

    file: str
    rows: int | None

    def encode(self) -> str:
        return f"{_FINISHED if self.rows is None else self.rows}:{self.file}"

    @classmethod
    def decode(cls, text: str) -> _Position:
        head, separator, file = text.partition(":")
        if not separator or not file:
            raise CheckpointError(
                f"{_LABEL}: checkpoint position {text!r} is not '<rows>:<file>' or "
                f"'{_FINISHED}:<file>'; was it written by another connector?"
            )
        if head == _FINISHED:
            return cls(file, None)
        return cls(file, parse_count(_LABEL, head, "row position"))


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


class _OpenFile:
    """The file being read: hands out exactly the rows asked for, and knows when it is done.

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
        self.name = name
        self.returned = returned
        self._schema = schema
        self._batches = batches
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
        if not pieces:
            return pa.RecordBatch.from_pylist([], schema=self._schema)
        return pieces[0] if len(pieces) == 1 else pa.concat_batches(pieces)

    def close(self) -> None:
        """Close the file (the reader's ``finally`` runs now, not at garbage collection)."""
        self._batches.close()


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
        self._position: _Position | None = None
        self._current: _OpenFile | None = None
        self._row_counts: dict[str, int] = {}
        self._records_total = 0
        self._bytes_total = 0
        self._files_finished = 0

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
        if max_records < 1:
            raise ValueError(f"{_LABEL}: max_records must be >= 1, got {max_records}")
        limit = min(max_records, settings.batch_size)
        while True:
            current = self._current or self._open_next(settings)
            if current is None:
                return None
            batch = current.take(limit)
            if current.finished:
                self._position = _Position(current.name, None)
                current.close()
                self._current = None
                self._files_finished += 1
            else:
                self._position = _Position(current.name, current.returned)
            if batch.num_rows:
                self._records_total += batch.num_rows
                self._bytes_total += batch.nbytes
                return SourceBatch(batch, PartitionInfo(PARTITION, self._position.encode()))

    def _open_next(self, settings: _Settings) -> _OpenFile | None:
        """Open the file the position is in, or else the first file after it."""
        position = self._position
        if (
            position is not None
            and position.rows is not None
            and not _is_file(settings.location, position.file)
        ):
            raise CheckpointError(
                f"{_LABEL}: the checkpoint is {position.rows} rows into "
                f"{settings.location.show(position.file)}, which is gone; files must stay "
                "until they have been read"
            )
        following = next(_following(settings, position), None)
        if following is None:
            return None
        name, skip = following
        batches = settings.batches(name, skip)
        self._current = _OpenFile(name, settings.schema, batches, skip)
        return self._current

    def checkpoint(self) -> SourceCheckpoint:
        """The position after the last row returned: restoring it resumes right after it."""
        self._lifecycle.require("checkpoint")
        if self._position is None:
            return SourceCheckpoint()
        return SourceCheckpoint({PARTITION: self._position.encode()})

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        """Resume after the position in ``checkpoint`` (from the first file when it has none).

        :raises CheckpointError: when ``checkpoint`` names another partition or holds a
            position this source cannot have written.
        """
        self._lifecycle.require("restore")
        position = _position_in(checkpoint)
        self._close_current()
        self._position = position

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
        position = _position_in(start)
        end = position
        remaining = max_records
        for name, skip in _following(settings, position):
            if remaining is not None and remaining <= 0:
                break
            if remaining is None:
                end = _Position(name, None)
                continue
            available = self._rows_in(settings, name) - skip
            if available < 0:
                raise CheckpointError(
                    f"{_LABEL}: the checkpoint is {skip} rows into {settings.location.show(name)}, "
                    f"but the file has only {skip + available}; files must not change once "
                    "they are in the directory"
                )
            end = _Position(name, None if available <= remaining else skip + remaining)
            remaining -= min(available, remaining)
        if end is None or end == position:
            return start
        return SourceCheckpoint({PARTITION: end.encode()})

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
        if partition_range.partition != PARTITION:
            raise CheckpointError(
                f"{_LABEL}: a range of partition {partition_range.partition!r} was asked for; "
                f"this source has only {PARTITION!r}"
            )
        start = None if partition_range.start is None else _Position.decode(partition_range.start)
        end = _Position.decode(partition_range.end)
        for name, skip in _following(settings, start):
            if name > end.file:
                break
            wanted = None if name != end.file or end.rows is None else end.rows - skip
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
            if name == end.file:
                return
        raise ReadError(
            f"{_LABEL}: the range ends in {settings.location.show(end.file)}, which is gone; files "
            "must stay until every micro-batch that read them is committed"
        )

    def metrics(self) -> ConnectorMetrics:
        """Rows and Arrow bytes returned; ``custom["files_finished"]``: files read to their end."""
        return ConnectorMetrics(
            records_total=self._records_total,
            bytes_total=self._bytes_total,
            custom={"files_finished": float(self._files_finished)},
        )

    def _close_current(self) -> None:
        if self._current is not None:
            self._current.close()
            self._current = None

    async def close(self) -> None:
        """Close the file being read; the files stay in the directory."""
        self._close_current()
        self._lifecycle.close()


def _position_in(checkpoint: SourceCheckpoint) -> _Position | None:
    """The position ``checkpoint`` holds; ``None`` (the start) when it holds none.

    :raises CheckpointError: when it names another partition or an unreadable position.
    """
    encoded = single_offset(_LABEL, checkpoint, PARTITION)
    return None if encoded is None else _Position.decode(encoded)


def _following(settings: _Settings, position: _Position | None) -> Iterator[tuple[str, int]]:
    """The files to read after ``position``, with the rows of each already read.

    The file the position is in comes first; the directory is listed only when it is done.
    """
    if position is not None and position.rows is not None:
        yield position.file, position.rows
    names = list_files(_LABEL, settings.location, settings.pattern)
    first = 0 if position is None else bisect.bisect_right(names, position.file)
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
