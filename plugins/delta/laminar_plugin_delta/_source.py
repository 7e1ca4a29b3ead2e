"""The ``delta`` source: the rows each committed version of a Delta table appended, in order.

A Delta table's log is a sequence of versions, each one JSON file ``_delta_log/<version>.json``
of actions. The rows a version appended are those of the data files its ``add`` actions name
with ``dataChange=true``; a compaction (OPTIMIZE) re-adds rows that are there already, with
``dataChange=false``, and so adds none. The source reads the log entries one by one through
the table's pyarrow filesystem (delta-rs has no reader of one version's actions), and the data
files they name; delta-rs tells it which versions are committed.
"""

from __future__ import annotations

import contextlib
import json
import math
import urllib.parse
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

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
    SchemaMismatch,
    SourceBatch,
    SourceCheckpoint,
    SourceConnector,
)
from laminar_sdk.reference import S3_KEYS, Lifecycle, first_rows, parse_count, single_offset

from laminar_plugin_delta._table import (
    TABLE_PATH_KEY,
    TableLocation,
    arrow_schema,
    open_table,
    table_location,
    unreachable,
)

if TYPE_CHECKING:
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

_LABEL = "delta source"
PARTITION = "delta"
"""The one partition of the source (the table's log is one sequence): checkpoints name it."""
_FINISHED = "end"
_BATCH_SIZE = 8192
_LOG = "_delta_log"
# Log entries (immutable once committed) and Parquet row counts kept per instance: enough for
# a planner walking many small versions, bounded for a source that runs for months.
_CACHED = 4096


def _at_least(minimum: int) -> Callable[[str], str | None]:
    def problem(text: str) -> str | None:
        return None if int(text) >= minimum else f"must be >= {minimum}, got {text}"

    return problem


SOURCE_KEYS: tuple[ConfigKeySpec, ...] = (
    TABLE_PATH_KEY,
    *S3_KEYS,
    ConfigKeySpec(
        "starting_version",
        default="0",
        value_type=int,
        check=_at_least(0),
        description="the first table version read when the pipeline has no checkpoint yet; "
        "0: every version, from the table's creation (its log must hold them all)",
    ),
    ConfigKeySpec(
        "batch_size",
        default=str(_BATCH_SIZE),
        value_type=int,
        check=_at_least(1),
        description="most rows one poll returns",
    ),
    ConfigKeySpec(
        "skip_change_commits",
        default="false",
        value_type=bool,
        description="skip versions that delete or rewrite rows (DELETE, UPDATE, MERGE, "
        "overwrite), rows they add included, instead of failing on them",
    ),
)
"""The keys the ``delta`` source declares."""


@dataclass(frozen=True, slots=True)
class _Position:
    """Where the source stands: ``rows`` rows into ``version``, or past it when ``rows`` is None.

    Rows are counted in the order of the version's ``add`` actions in its log entry, each
    file's in file order. Every version before ``version`` has been read. Encoded as
    ``<version>:<rows>`` or ``<version>:end``; the batch that returns a version's last row
    moves the position to ``<version>:end``, so polling and planning name one end alike.
    """

    version: int
    rows: int | None

    def encode(self) -> str:
        return f"{self.version}:{_FINISHED if self.rows is None else self.rows}"

    @classmethod
    def decode(cls, text: str) -> _Position:
        head, separator, tail = text.partition(":")
        if not separator:
            raise CheckpointError(
                f"{_LABEL}: checkpoint position {text!r} is not '<version>:<rows>' or "
                f"'<version>:{_FINISHED}'; was it written by another connector?"
            )
        version = parse_count(_LABEL, head, "table version")
        if tail == _FINISHED:
            return cls(version, None)
        return cls(version, parse_count(_LABEL, tail, "row position"))

    def order(self) -> tuple[int, float]:
        """A key that sorts positions as the rows they follow."""
        return (self.version, math.inf if self.rows is None else self.rows)

    def following(self) -> tuple[int, int]:
        """The version the next row comes from, and the rows of it already read."""
        return (self.version + 1, 0) if self.rows is None else (self.version, self.rows)


@dataclass(frozen=True, slots=True)
class _DataFile:
    """A data file an ``add`` action of a version names.

    :param path: as the log names it, URI-decoded: relative to the table, or a URI.
    :param partition_values: the file's partition values, as the log writes them.
    :param rows: ``numRecords`` of its statistics; ``None`` when the log has none.
    :param deletion_vector: whether the action carries a deletion vector.
    """

    path: str
    partition_values: tuple[tuple[str, str | None], ...]
    rows: int | None
    deletion_vector: bool


@dataclass(frozen=True, slots=True)
class _Commit:
    """What one version's log entry says, as far as the source cares.

    :param files: the data files added with ``dataChange=true``, in log order.
    :param changes_rows: whether it removes a data file with ``dataChange=true`` (DELETE,
        UPDATE, MERGE, an overwrite): a change of rows the table had, not an append.
    :param operation: the ``commitInfo`` operation (``WRITE``, ``DELETE``, ...), for messages.
    """

    version: int
    files: tuple[_DataFile, ...]
    changes_rows: bool
    operation: str


@dataclass(frozen=True, slots=True)
class _Settings:
    location: TableLocation
    schema: pa.Schema
    partition_columns: frozenset[str]
    starting_version: int
    batch_size: int
    skip_change_commits: bool

    def start(self, position: _Position | None) -> tuple[int, int]:
        """The version to read next after ``position``, and the rows of it already read."""
        return (self.starting_version, 0) if position is None else position.following()


class _OpenVersion:
    """The version being read: hands out exactly the rows asked for, and knows when it is done.

    :param total: the rows the version holds (from the log's statistics or the files' footers).
    :param returned: the rows of it returned before ``batches`` (a restored position).
    """

    def __init__(
        self,
        version: int,
        total: int,
        batches: Generator[pa.RecordBatch, None, None],
        returned: int,
    ) -> None:
        self.version = version
        self.total = total
        self.returned = returned
        self._batches = batches
        self._head: pa.RecordBatch | None = None

    @property
    def finished(self) -> bool:
        """Whether every row of the version has been returned."""
        return self.returned >= self.total

    def take(self, count: int, schema: pa.Schema) -> pa.RecordBatch:
        """The next ``count`` rows, or fewer when the version ends first.

        :raises ReadError: when the files end before the rows the version should hold.
        """
        pieces: list[pa.RecordBatch] = []
        wanted = min(count, self.total - self.returned)
        while wanted:
            head = self._head if self._head is not None else next(self._batches, None)
            if head is None:
                raise ReadError(
                    f"{_LABEL}: version {self.version} ended after {self.returned} of the "
                    f"{self.total} rows its log entry counts; its data files must not change"
                )
            self._head = head.slice(wanted) if head.num_rows > wanted else None
            pieces.append(head.slice(0, wanted))
            wanted -= pieces[-1].num_rows
            self.returned += pieces[-1].num_rows
        if not pieces:
            return pa.RecordBatch.from_pylist([], schema=schema)
        return pieces[0] if len(pieces) == 1 else pa.concat_batches(pieces)

    def close(self) -> None:
        """Close the file being read (generators' ``finally`` run now, not when collected)."""
        self._batches.close()


class DeltaSource(SourceConnector, RangeReadableSource):
    """Reads the rows each committed version of a Delta table appended, version by version.

    Versions are read in order, from ``starting_version`` (default 0: from the table's
    creation) or from the checkpoint, and versions committed while the source runs reach it.
    A version's rows are those of the data files its commit added with ``dataChange=true``,
    in the order of the ``add`` actions in its log entry (``_delta_log/<version>.json``):

    - a version that adds nothing, or only rearranges rows (OPTIMIZE, compaction: adds and
      removes with ``dataChange=false``) holds no rows, and is passed over;
    - a version that changes rows the table had — it removes a data file with
      ``dataChange=true``: DELETE, UPDATE, MERGE, an overwrite — is refused with a
      :class:`~laminar_sdk.ReadError` naming the version and the operation, unless
      ``skip_change_commits=true``, which skips it whole (the rows it adds or rewrites
      included), as Delta Spark's ``skipChangeCommits`` does.

    Every batch has the table's schema as it was when the source opened (the partition
    columns included, in the table's column order): partition values come from the ``add``
    actions, typed as the schema says; a column a data file lacks is null, and a column the
    table gained later is left out.

    The checkpoint holds one position, in the partition ``delta``: ``<version>:<rows>`` (rows
    of the version returned) or ``<version>:end`` (all of it); restoring it on a new instance
    resumes exactly after the last row returned. Reading needs the log entries of every
    version after the position: once the table's log cleanup deleted them
    (``delta.logRetentionDuration``, 30 days by default), the source fails saying so, as it
    does when VACUUM deleted a data file it still has to read.

    As a :class:`~laminar_sdk.RangeReadableSource`, :meth:`plan_end` says where the rows
    committed now end, counting rows from the log's file statistics (``numRecords``; a
    file's Parquet footer when the log has none), and :meth:`read_range` reads the rows
    between two positions in any process.
    """

    CONFIG_KEYS: ClassVar[tuple[ConfigKeySpec, ...]] = SOURCE_KEYS
    DESCRIPTION: ClassVar[str] = (
        "Reads the rows each version of a Delta Lake table (local or S3) appends, in version "
        "order, as versions are committed; replayable"
    )

    def __init__(self) -> None:
        self._lifecycle: Lifecycle[_Settings] = Lifecycle(_LABEL)
        self._table: DeltaTable | None = None
        self._latest = -1
        self._commits: dict[int, _Commit] = {}
        self._row_counts: dict[str, int] = {}
        self._position: _Position | None = None
        self._next: tuple[int, int] | None = None
        self._reading: _OpenVersion | None = None
        self._records_total = 0
        self._bytes_total = 0
        self._versions_finished = 0

    async def open(self, config: ConnectorConfig) -> None:
        """Check ``config`` and open the table; nothing is read yet.

        :raises ConfigurationError: naming the key at fault: one unknown, mistyped or out of
            range; ``path`` when there is no Delta table there, or one whose column mapping
            the source cannot read; ``starting_version`` when the table has no such version.
        :raises ConnectionFailed: when the store cannot be reached.
        """
        config = config.validate(self.CONFIG_KEYS)
        location = table_location(_LABEL, config)
        starting_version = config.get_parsed("starting_version", int, 0)
        batch_size = config.get_parsed("batch_size", int, _BATCH_SIZE)
        skip_change_commits = config.get_parsed("skip_change_commits", bool, False)
        table = open_table(_LABEL, location)
        if table is None:
            raise ConfigurationError(
                f"{_LABEL}: there is no Delta table at {location.shown} (config key 'path'); "
                "check the path, or create the table first (the delta sink creates one with "
                "table.create=true)",
                key=TABLE_PATH_KEY.name,
            )
        metadata = table.metadata()
        mapping = metadata.configuration.get("delta.columnMapping.mode", "none")
        if mapping != "none":
            raise ConfigurationError(
                f"{_LABEL}: the table at {location.shown} (config key 'path') uses column "
                f"mapping (delta.columnMapping.mode={mapping}), which the source cannot read; "
                "read a table without column mapping",
                key=TABLE_PATH_KEY.name,
            )
        if starting_version > table.version():
            raise ConfigurationError(
                f"{_LABEL}: config key 'starting_version' is {starting_version}, and the table "
                f"at {location.shown} is at version {table.version()}; start from a version it "
                "has (0: from its creation)",
                key="starting_version",
            )
        self._table = table
        self._latest = table.version()
        self._lifecycle.open(
            _Settings(
                location,
                arrow_schema(table),
                frozenset(metadata.partition_columns),
                starting_version,
                batch_size,
                skip_change_commits,
            )
        )

    def schema(self) -> pa.Schema:
        """The table's schema when the source opened (partition columns included)."""
        return self._lifecycle.require("schema").schema

    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        """Return up to ``min(max_records, batch_size)`` rows of the version being read.

        Moves on to the next version with rows when the current one is finished; returns
        ``None`` when every version committed so far has been read.

        :raises ValueError: when ``max_records < 1``.
        :raises ReadError: at a version that changes rows (see the class), when a log entry
            or a data file to read is gone, or cannot be read.
        :raises CheckpointError: when the restored position lies beyond its version's rows.
        :raises ConnectionFailed: when the store cannot be reached.
        """
        settings = self._lifecycle.require("poll_batch")
        if max_records < 1:
            raise ValueError(f"{_LABEL}: max_records must be >= 1, got {max_records}")
        limit = min(max_records, settings.batch_size)
        while True:
            reading = self._reading or self._open_next(settings)
            if reading is None:
                return None
            batch = reading.take(limit, settings.schema)
            if reading.finished:
                self._position = _Position(reading.version, None)
                self._next = (reading.version + 1, 0)
                self._close_reading()
                self._versions_finished += 1
            else:
                self._position = _Position(reading.version, reading.returned)
            if batch.num_rows:
                self._records_total += batch.num_rows
                self._bytes_total += batch.nbytes
                return SourceBatch(batch, PartitionInfo(PARTITION, self._position.encode()))

    def _open_next(self, settings: _Settings) -> _OpenVersion | None:
        """Open the version the position is in, or else the next committed one with rows."""
        version, skip = self._next or settings.start(self._position)
        while True:
            self._next = (version, skip)  # versions passed over are not read again
            commit = self._committed(settings, version)
            if commit is None:
                return None
            files = self._readable(settings, commit)
            total = self._rows_of(settings, version, files)
            if skip > total:
                raise CheckpointError(
                    f"{_LABEL}: the checkpoint is {skip} rows into version {version} of the "
                    f"table at {settings.location.shown}, which added only {total}; was it "
                    "taken from another table at this path?"
                )
            if skip < total:
                batches = self._batches(settings, version, files, skip)
                self._reading = _OpenVersion(version, total, batches, skip)
                return self._reading
            version, skip = version + 1, 0

    def checkpoint(self) -> SourceCheckpoint:
        """The position after the last row returned: restoring it resumes right after it."""
        self._lifecycle.require("checkpoint")
        if self._position is None:
            return SourceCheckpoint()
        return SourceCheckpoint({PARTITION: self._position.encode()})

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        """Resume after the position in ``checkpoint`` (from ``starting_version`` without one).

        :raises CheckpointError: when ``checkpoint`` names another partition or holds a
            position this source cannot have written.
        """
        self._lifecycle.require("restore")
        position = _position_in(checkpoint)
        self._close_reading()
        self._position = position
        self._next = None

    def as_range_readable(self) -> RangeReadableSource:
        """This source: a micro-batch is planned from the log and read in a task of its own.

        The table's log is one sequence, so the source has one partition (``delta``) and a
        micro-batch is one task; planning reads log entries only (row counts from their
        statistics), and a micro-batch run again reads exactly its range instead of polling.
        """
        return self

    async def plan_end(self, start: SourceCheckpoint, max_records: int | None) -> SourceCheckpoint:
        """The position after the rows committed now that follow ``start``, at most ``max_records``.

        ``start`` itself when no row follows it. The plan stops before a version that changes
        rows (see the class); when that version comes first, it fails as polling does.

        :raises CheckpointError: when ``start`` is not a checkpoint of this source.
        :raises ReadError: at a version that changes rows, right after ``start``; when a log
            entry after ``start`` is gone.
        """
        settings = self._lifecycle.require("plan_end")
        position = _position_in(start)
        self._refresh(settings)
        version, skip = settings.start(position)
        end, remaining = position, max_records
        while version <= self._latest and (remaining is None or remaining > 0):
            commit = self._committed(settings, version)
            if commit is None:
                break
            try:
                files = self._readable(settings, commit)
            except ReadError:
                if end != position:
                    break  # plan the rows before it: the next plan fails on it
                raise
            available = self._rows_of(settings, version, files) - skip
            if available < 0:
                raise CheckpointError(
                    f"{_LABEL}: the checkpoint is {skip} rows into version {version} of the "
                    f"table at {settings.location.shown}, which added only {skip + available}; "
                    "was it taken from another table at this path?"
                )
            if available and (remaining is None or available <= remaining):
                end = _Position(version, None)
                remaining = None if remaining is None else remaining - available
            elif available and remaining is not None:
                end, remaining = _Position(version, skip + remaining), 0
            version, skip = version + 1, 0
        if end is None or end == position:
            return start
        return SourceCheckpoint({PARTITION: end.encode()})

    async def read_range(self, partition_range: PartitionRange) -> AsyncIterator[pa.RecordBatch]:
        """The rows after ``partition_range.start`` up to its ``end``, version by version.

        :raises CheckpointError: for a range that is not of this source's partition, or that
            ends before it starts.
        :raises ReadError: when a log entry or data file of the range is gone, or a version
            holds fewer rows than the range says.
        """
        settings = self._lifecycle.require("read_range")
        if partition_range.partition != PARTITION:
            raise CheckpointError(
                f"{_LABEL}: a range of partition {partition_range.partition!r} was asked for; "
                f"this source has only {PARTITION!r}"
            )
        start = None if partition_range.start is None else _Position.decode(partition_range.start)
        end = _Position.decode(partition_range.end)
        if start is not None and start.order() > end.order():
            raise CheckpointError(
                f"{_LABEL}: the range from {partition_range.start} to {partition_range.end} "
                "ends before it starts"
            )
        version, skip = settings.start(start)
        while version <= end.version:
            commit = self._committed(settings, version)
            if commit is None:
                raise ReadError(
                    f"{_LABEL}: the range ends in version {end.version} of the table at "
                    f"{settings.location.shown}, which is at version {self._latest}; was the "
                    "table replaced by another at this path?"
                )
            files = self._readable(settings, commit)
            wanted = None if version < end.version or end.rows is None else end.rows - skip
            if wanted == 0:
                return
            read = 0
            for batch in first_rows(self._batches(settings, version, files, skip), wanted):
                read += batch.num_rows
                yield batch
            if wanted is not None and read < wanted:
                raise ReadError(
                    f"{_LABEL}: the range ends {end.rows} rows into version {version} of the "
                    f"table at {settings.location.shown}, which holds only {skip + read}; its "
                    "data files must not change"
                )
            version, skip = version + 1, 0

    def metrics(self) -> ConnectorMetrics:
        """Rows and Arrow bytes returned; figures of the versions read.

        ``custom`` holds ``versions_finished`` (versions whose rows were all returned) and
        ``latest_version`` (the newest version of the table this instance has seen).
        """
        return ConnectorMetrics(
            records_total=self._records_total,
            bytes_total=self._bytes_total,
            custom={
                "versions_finished": float(self._versions_finished),
                "latest_version": float(self._latest),
            },
        )

    async def close(self) -> None:
        """Close the file being read; the table is left as it is."""
        self._close_reading()
        self._table = None
        self._lifecycle.close()

    def _close_reading(self) -> None:
        if self._reading is not None:
            self._reading.close()
            self._reading = None

    def _refresh(self, settings: _Settings) -> None:
        """Learn the table's newest version (delta-rs lists the log after the one it knows).

        :raises ReadError: when the table is gone.
        :raises ConnectionFailed: when the store cannot be reached.
        """
        from deltalake.exceptions import DeltaError  # noqa: PLC0415

        if self._table is None:
            return
        try:
            self._table.update_incremental()
        except OSError as error:
            raise unreachable(_LABEL, settings.location, "read the log", error) from error
        except DeltaError as error:
            raise ReadError(
                f"{_LABEL}: cannot read the log of the table at {settings.location.shown}: "
                f"{error}; check that the table is still there"
            ) from error
        self._latest = max(self._latest, self._table.version())

    def _committed(self, settings: _Settings, version: int) -> _Commit | None:
        """The log entry of ``version``; ``None`` when the table has no such version yet.

        :raises ReadError: when the version is committed but its log entry is gone.
        """
        commit = self._commits.get(version)
        if commit is not None:
            return commit
        if version > self._latest:
            self._refresh(settings)
            if version > self._latest:
                return None
        commit = _read_commit(settings, version)
        if len(self._commits) >= _CACHED:
            del self._commits[next(iter(self._commits))]
        self._commits[version] = commit
        return commit

    def _readable(self, settings: _Settings, commit: _Commit) -> tuple[_DataFile, ...]:
        """The files of ``commit`` to read: none for a change of rows that is skipped.

        :raises ReadError: for a change of rows that is not skipped, and for a file with a
            deletion vector.
        """
        shown = settings.location.shown
        if commit.changes_rows:
            if settings.skip_change_commits:
                return ()
            refused = ReadError(
                f"{_LABEL}: version {commit.version} of the table at {shown} is a "
                f"{commit.operation} that changes rows the table had (it removes data files "
                "with dataChange=true), and the source reads appended rows only. Set "
                "skip_change_commits=true to skip such versions (rows they add or rewrite are "
                "not read), or start a new pipeline (a new checkpoint location) with "
                f"starting_version={commit.version + 1}"
            )
            refused.transient = False
            raise refused
        for data_file in commit.files:
            if data_file.deletion_vector:
                failed = ReadError(
                    f"{_LABEL}: version {commit.version} of the table at {shown} adds "
                    f"{data_file.path} with a deletion vector, which the source cannot apply; "
                    "set skip_change_commits=true to skip the version"
                )
                failed.transient = False
                raise failed
        return commit.files

    def _rows_of(self, settings: _Settings, version: int, files: Sequence[_DataFile]) -> int:
        return sum(self._rows_in(settings, version, data_file) for data_file in files)

    def _rows_in(self, settings: _Settings, version: int, data_file: _DataFile) -> int:
        """The rows of ``data_file``: its statistics' ``numRecords``, else its footer's count."""
        if data_file.rows is not None:
            return data_file.rows
        rows = self._row_counts.get(data_file.path)
        if rows is None:
            with _parquet(settings, version, data_file) as parquet:
                rows = int(parquet.metadata.num_rows)
            if len(self._row_counts) >= _CACHED:
                del self._row_counts[next(iter(self._row_counts))]
            self._row_counts[data_file.path] = rows
        return rows

    def _batches(
        self, settings: _Settings, version: int, files: Sequence[_DataFile], skip: int
    ) -> Generator[pa.RecordBatch, None, None]:
        """The batches of ``files`` (one version's) after their first ``skip`` rows."""
        for data_file in files:
            rows = self._rows_in(settings, version, data_file)
            if skip >= rows:
                skip -= rows
                continue
            yield from _file_batches(settings, version, data_file, skip, rows)
            skip = 0


def _position_in(checkpoint: SourceCheckpoint) -> _Position | None:
    """The position ``checkpoint`` holds; ``None`` (``starting_version``) when it holds none.

    :raises CheckpointError: when it names another partition or an unreadable position.
    """
    encoded = single_offset(_LABEL, checkpoint, PARTITION)
    return None if encoded is None else _Position.decode(encoded)


def _log_entry(version: int) -> str:
    return f"{_LOG}/{version:020d}.json"


def _read_commit(settings: _Settings, version: int) -> _Commit:
    """Read and parse the log entry of committed ``version``.

    :raises ReadError: when it is gone (the log's retention) or is not a Delta log entry.
    :raises ConnectionFailed: when the store cannot be reached.
    """
    files = settings.location.files
    try:
        with files.filesystem.open_input_stream(files.path(_log_entry(version))) as stream:
            text = stream.read().decode()
    except FileNotFoundError:
        oldest = _oldest_log_entry(settings)
        kept = f"the oldest version whose entry is kept is {oldest}" if oldest is not None else ""
        gone = ReadError(
            f"{_LABEL}: the log entry of version {version} of the table at "
            f"{settings.location.shown} ({_log_entry(version)}) is gone: the checkpoint (or "
            "starting_version) is older than the table's log retention "
            "(delta.logRetentionDuration, 30 days by default), and the versions after it cannot "
            f"be read one by one{'; ' + kept if kept else ''}. Start a new pipeline (a new "
            "checkpoint location) with a starting_version the log still holds, and keep "
            "pipelines within the retention (or raise it)"
        )
        gone.transient = False
        raise gone from None
    except OSError as error:
        raise unreachable(_LABEL, settings.location, f"read version {version}", error) from error
    return _parse_commit(settings, version, text)


def _parse_commit(settings: _Settings, version: int, text: str) -> _Commit:
    """The actions of a log entry that say which rows ``version`` appended.

    :raises ReadError: when ``text`` is not a Delta log entry.
    """
    added: list[_DataFile] = []
    changes_rows = False
    operation = "commit"
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            action = json.loads(line)
            if "add" in action:
                add = action["add"]
                if add.get("dataChange", True):
                    values = add.get("partitionValues") or {}
                    added.append(
                        _DataFile(
                            urllib.parse.unquote(str(add["path"])),
                            tuple(sorted(values.items())),
                            _num_records(add.get("stats")),
                            add.get("deletionVector") is not None,
                        )
                    )
            elif "remove" in action:
                changes_rows = changes_rows or bool(action["remove"].get("dataChange", True))
            elif "commitInfo" in action:
                operation = str(action["commitInfo"].get("operation") or operation)
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            failed = ReadError(
                f"{_LABEL}: line {number} of {settings.location.files.show(_log_entry(version))} "
                f"is not a Delta log action ({type(error).__name__}: {error}); the table's log "
                "is damaged"
            )
            failed.transient = False
            raise failed from error
    return _Commit(version, tuple(added), changes_rows, operation)


def _num_records(stats: object) -> int | None:
    """``numRecords`` of an ``add`` action's statistics (JSON text); ``None`` without one."""
    if not isinstance(stats, str):
        return None
    try:
        rows = json.loads(stats).get("numRecords")
    except (ValueError, AttributeError):
        return None
    return rows if isinstance(rows, int) and not isinstance(rows, bool) and rows >= 0 else None


def _oldest_log_entry(settings: _Settings) -> int | None:
    """The oldest version whose log entry is there; ``None`` when the log cannot be listed."""
    files = settings.location.files
    try:
        infos = files.filesystem.get_file_info(pafs.FileSelector(files.path(_LOG)))
    except OSError:
        return None
    versions = [
        int(name[:20])
        for info in infos
        if len(name := info.base_name) == 25 and name.endswith(".json") and name[:20].isdecimal()
    ]
    return min(versions, default=None)


def _file_path(settings: _Settings, data_file: _DataFile) -> str:
    """Where ``data_file`` is in the table's filesystem (a path the log names, or a URI)."""
    files = settings.location.files
    parts = urllib.parse.urlsplit(data_file.path)
    if not parts.scheme:
        return files.path(data_file.path)
    if parts.scheme == "file" and not files.remote:
        return parts.path
    if parts.scheme in ("s3", "s3a") and files.remote:
        return f"{parts.netloc}{parts.path}"
    failed = ReadError(
        f"{_LABEL}: the table at {settings.location.shown} names the data file "
        f"{data_file.path}, on another store than the table's; the source reads data files "
        "on the table's own store"
    )
    failed.transient = False
    raise failed


@contextlib.contextmanager
def _parquet(settings: _Settings, version: int, data_file: _DataFile) -> Iterator[pq.ParquetFile]:
    """``data_file`` opened for reading.

    :raises ReadError: when it is gone (VACUUM) or is not a Parquet file.
    :raises ConnectionFailed: when the store cannot be reached.
    """
    import pyarrow.parquet as pq  # noqa: PLC0415 - ~30 ms, for the processes that read

    path = _file_path(settings, data_file)
    shown = settings.location.files.show(data_file.path)
    try:
        with settings.location.files.filesystem.open_input_file(path) as stream:
            yield pq.ParquetFile(stream)
    except FileNotFoundError:
        gone = ReadError(
            f"{_LABEL}: the data file {shown} that version {version} added is gone: VACUUM "
            "deleted it, so the position is older than the table's file retention "
            "(delta.deletedFileRetentionDuration); start a new pipeline with a later "
            "starting_version"
        )
        gone.transient = False
        raise gone from None
    except pa.ArrowInvalid as error:
        failed = ReadError(f"{_LABEL}: the data file {shown} is not readable Parquet: {error}")
        failed.transient = False
        raise failed from error
    except OSError as error:
        raise unreachable(_LABEL, settings.location, f"read {data_file.path}", error) from error


def _file_batches(
    settings: _Settings, version: int, data_file: _DataFile, skip: int, rows: int
) -> Iterator[pa.RecordBatch]:
    """The rows of ``data_file`` after its first ``skip``, in batches of the table's schema.

    Row groups before ``skip`` are not read.

    :raises ReadError: when the file holds another number of rows than ``rows``.
    :raises SchemaMismatch: when a column cannot be cast to the table's type of it.
    """
    shown = settings.location.files.show(data_file.path)
    with _parquet(settings, version, data_file) as parquet:
        metadata = parquet.metadata
        if metadata.num_rows != rows:
            failed = ReadError(
                f"{_LABEL}: the data file {shown} of version {version} holds "
                f"{metadata.num_rows} rows, and the log counts {rows}; its data files must "
                "not change"
            )
            failed.transient = False
            raise failed
        first = 0
        while skip >= metadata.row_group(first).num_rows:
            skip -= metadata.row_group(first).num_rows
            first += 1
        present = set(parquet.schema_arrow.names)
        columns = [
            field.name
            for field in settings.schema
            if field.name not in settings.partition_columns and field.name in present
        ]
        constants = _partition_scalars(settings, data_file, shown)
        batches = parquet.iter_batches(
            batch_size=settings.batch_size,
            row_groups=list(range(first, metadata.num_row_groups)),
            columns=columns or None,
        )
        for batch in batches:
            if skip >= batch.num_rows:
                skip -= batch.num_rows
                continue
            yield _conformed(settings, batch.slice(skip), constants, shown)
            skip = 0


def _partition_scalars(
    settings: _Settings, data_file: _DataFile, shown: str
) -> dict[str, pa.Scalar]:
    """The partition columns' values of ``data_file``, typed as the table's schema says.

    :raises ReadError: for a value that is not one of its column's type.
    """
    values: Mapping[str, str | None] = dict(data_file.partition_values)
    scalars = {}
    for name in settings.partition_columns:
        data_type = settings.schema.field(name).type
        text = values.get(name)
        if text is None or (text == "" and not pa.types.is_string(data_type)):
            scalars[name] = pa.scalar(None, data_type)
            continue
        try:
            scalars[name] = _typed(text, data_type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            failed = ReadError(
                f"{_LABEL}: the partition value {text!r} of column {name!r} of {shown} is not "
                f"a {data_type}: {error}"
            )
            failed.transient = False
            raise failed from error
    return scalars


def _typed(text: str, data_type: pa.DataType) -> pa.Scalar:
    """A partition value as the Delta log writes it (``2024-01-31 10:00:00`` ...), as a scalar."""
    array = pa.array([text])
    if pa.types.is_timestamp(data_type) and data_type.tz is not None:
        try:
            return array.cast(data_type)[0]
        except pa.ArrowInvalid:
            # Delta writes timestamps of partition values in UTC, often without the zone.
            naive = pa.timestamp(data_type.unit)
            return array.cast(naive).cast(data_type)[0]
    return array.cast(data_type)[0]


def _conformed(
    settings: _Settings,
    batch: pa.RecordBatch,
    constants: Mapping[str, pa.Scalar],
    shown: str,
) -> pa.RecordBatch:
    """``batch`` (of a data file) in the table's schema, its partition columns added.

    :raises SchemaMismatch: when a column cannot be cast to the table's type of it.
    """
    arrays = []
    for field in settings.schema:
        if field.name in constants:
            arrays.append(pa.repeat(constants[field.name], batch.num_rows))
            continue
        index = batch.schema.get_field_index(field.name)
        if index < 0:
            arrays.append(pa.nulls(batch.num_rows, field.type))
            continue
        column = batch.column(index)
        if column.type != field.type:
            try:
                column = column.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                raise SchemaMismatch(
                    f"{_LABEL}: column {field.name!r} of the data file {shown} is "
                    f"{column.type}, which does not cast to the table's {field.type}: {error}"
                ) from error
        arrays.append(column)
    return pa.RecordBatch.from_arrays(arrays, schema=settings.schema)
