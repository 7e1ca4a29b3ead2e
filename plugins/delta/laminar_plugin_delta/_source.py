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
    PartitionRange,
    RangeReadableSource,
    ReadError,
    SchemaMismatch,
    SourceBatch,
    SourceCheckpoint,
    SourceConnector,
)
from laminar_sdk.reference import (
    S3_KEYS,
    Lifecycle,
    OrderedUnits,
    PositionFormat,
    UnitPosition,
    UnitReader,
    first_rows,
    parse_count,
)

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


_POSITIONS: PositionFormat[int] = PositionFormat(
    _LABEL,
    PARTITION,
    "version",
    rows_first=False,
    parse_unit=lambda text: parse_count(_LABEL, text, "table version"),
)
"""A position is a version (every version before it read) and the rows of it read.

Rows are counted in the order of the version's ``add`` actions in its log entry, each file's
in file order. Written ``<version>:<rows>`` or ``<version>:end``; the batch that returns a
version's last row moves the position to ``<version>:end``, so polling and planning name one
end alike.
"""


def _order(position: UnitPosition[int]) -> tuple[int, float]:
    """A key that sorts positions as the rows they follow."""
    return (position.unit, math.inf if position.rows is None else position.rows)


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

    def start(self, position: UnitPosition[int] | None) -> tuple[int, int]:
        """The version to read next after ``position``, and the rows of it already read."""
        if position is None:
            return (self.starting_version, 0)
        return (position.unit + 1, 0) if position.rows is None else (position.unit, position.rows)


class _OpenVersion(UnitReader[int]):
    """The version being read, knowing the rows it holds: it reads no further than it must.

    :param total: the rows the version holds (from the log's statistics or the files' footers).
    """

    def __init__(
        self,
        version: int,
        total: int,
        schema: pa.Schema,
        batches: Generator[pa.RecordBatch, None, None],
        returned: int,
    ) -> None:
        super().__init__(version, schema, batches, returned)
        self.total = total
        self._head: pa.RecordBatch | None = None

    @property
    def finished(self) -> bool:
        """Whether every row of the version has been returned."""
        return self.returned >= self.total

    def take(self, count: int) -> pa.RecordBatch:
        """The next ``count`` rows, or fewer when the version ends first.

        :raises ReadError: when the files end before the rows the version should hold.
        """
        pieces: list[pa.RecordBatch] = []
        wanted = min(count, self.total - self.returned)
        while wanted:
            head = self._head if self._head is not None else next(self._batches, None)
            if head is None:
                raise ReadError(
                    f"{_LABEL}: version {self.unit} ended after {self.returned} of the "
                    f"{self.total} rows its log entry counts; its data files must not change"
                )
            self._head = head.slice(wanted) if head.num_rows > wanted else None
            pieces.append(head.slice(0, wanted))
            wanted -= pieces[-1].num_rows
            self.returned += pieces[-1].num_rows
        return self._joined(pieces)


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
        self._versions: OrderedUnits[int, _Settings] = OrderedUnits(
            _POSITIONS,
            following=self._following,
            open_unit=self._open_version,
            plannable_rows=self._plannable_rows,
            skips_empty_units=True,
        )

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
        return self._versions.poll(settings, max_records, settings.batch_size)

    def _following(
        self, settings: _Settings, position: UnitPosition[int] | None
    ) -> Iterator[tuple[int, int]]:
        """The committed versions after ``position``, with the rows of each already read.

        The table's newest version is looked up (the log listed) once at most, when the
        versions known run out.
        """
        version, skip = settings.start(position)
        refreshed = False
        while True:
            if version > self._latest and not refreshed:
                self._refresh(settings)
                refreshed = True
            if version > self._latest:
                return
            yield version, skip
            version, skip = version + 1, 0

    def _open_version(self, settings: _Settings, version: int, skip: int) -> _OpenVersion | None:
        """A reader of committed ``version`` after its first ``skip`` rows; ``None`` without any.

        :raises ReadError: at a change of rows (see the class) that is not skipped.
        :raises CheckpointError: when the version holds fewer than ``skip`` rows.
        """
        files = self._readable(settings, self._commit(settings, version))
        total = self._rows_of(settings, version, files)
        if not _rows_after(settings, version, total, skip):
            return None
        batches = self._batches(settings, version, files, skip)
        return _OpenVersion(version, total, settings.schema, batches, skip)

    def _plannable_rows(
        self, settings: _Settings, version: int, skip: int, plan_has_rows: bool
    ) -> int | None:
        """The rows of committed ``version`` after its first ``skip``, for a plan.

        ``None`` for a version the source refuses to read (a change of rows) after rows of
        the plan: the plan stops before it, and the next one fails on it.
        """
        commit = self._commit(settings, version)
        try:
            files = self._readable(settings, commit)
        except ReadError:
            if plan_has_rows:
                return None
            raise
        return _rows_after(settings, version, self._rows_of(settings, version, files), skip)

    def checkpoint(self) -> SourceCheckpoint:
        """The position after the last row returned: restoring it resumes right after it."""
        self._lifecycle.require("checkpoint")
        return self._versions.checkpoint()

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        """Resume after the position in ``checkpoint`` (from ``starting_version`` without one).

        :raises CheckpointError: when ``checkpoint`` names another partition or holds a
            position this source cannot have written.
        """
        self._lifecycle.require("restore")
        self._versions.restore(checkpoint)

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
        return self._versions.plan_end(settings, start, max_records)

    async def read_range(self, partition_range: PartitionRange) -> AsyncIterator[pa.RecordBatch]:
        """The rows after ``partition_range.start`` up to its ``end``, version by version.

        :raises CheckpointError: for a range that is not of this source's partition, or that
            ends before it starts.
        :raises ReadError: when a log entry or data file of the range is gone, or a version
            holds fewer rows than the range says.
        """
        settings = self._lifecycle.require("read_range")
        start, end = _POSITIONS.range_positions(partition_range)
        if start is not None and _order(start) > _order(end):
            raise CheckpointError(
                f"{_LABEL}: the range from {partition_range.start} to {partition_range.end} "
                "ends before it starts"
            )
        version, skip = settings.start(start)
        while version <= end.unit:
            if not self._is_committed(settings, version):
                raise ReadError(
                    f"{_LABEL}: the range ends in version {end.unit} of the table at "
                    f"{settings.location.shown}, which is at version {self._latest}; was the "
                    "table replaced by another at this path?"
                )
            files = self._readable(settings, self._commit(settings, version))
            wanted = None if version < end.unit or end.rows is None else end.rows - skip
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
            records_total=self._versions.records_total,
            bytes_total=self._versions.bytes_total,
            custom={
                "versions_finished": float(self._versions.units_finished),
                "latest_version": float(self._latest),
            },
        )

    async def close(self) -> None:
        """Close the file being read; the table is left as it is."""
        self._versions.close()
        self._table = None
        self._lifecycle.close()

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

    def _is_committed(self, settings: _Settings, version: int) -> bool:
        """Whether the table has ``version`` (looked up when it is newer than the newest known)."""
        if version > self._latest:
            self._refresh(settings)
        return version <= self._latest

    def _commit(self, settings: _Settings, version: int) -> _Commit:
        """The log entry of committed ``version``.

        :raises ReadError: when it is gone.
        """
        commit = self._commits.get(version)
        if commit is not None:
            return commit
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


def _rows_after(settings: _Settings, version: int, total: int, skip: int) -> int:
    """The rows of ``version``, ``total`` in all, after its first ``skip``.

    :raises CheckpointError: when ``skip`` is more than ``total``.
    """
    if skip > total:
        raise CheckpointError(
            f"{_LABEL}: the checkpoint is {skip} rows into version {version} of the table at "
            f"{settings.location.shown}, which added only {total}; was it taken from another "
            "table at this path?"
        )
    return total - skip


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
