"""The ``memory`` source and sink: exactly-once test connectors whose state lives in a directory.

Nothing is kept only in memory, despite the name: a test in another process, or a new
instance after a crash, finds everything in the directory given by the ``path`` key. Layout::

    path/source/partition-<p>/<first offset, 20 digits>.arrow   appended records (source)
    path/source/partition-<p>/_REMOVED                          a removed partition's end offset
    path/_sink.json                                             the sink's schema name
    path/_staging/epoch-<e>/part-<n>.arrow                      batches of an open epoch
    path/_staging/epoch-<e>/task-<t>/part-<n>.arrow             batches task <t> staged
    path/_staging/epoch-<e>/_MANIFEST.json                      present once pre-committed
    path/committed/epoch-<e>/                                   a committed epoch, as staged

Every ``.arrow`` file holds one Arrow IPC batch. The source is range-readable and the sink a
distributed-commit sink (the opt-in extensions of :mod:`laminar_sdk._contract.parallel`), so each is
the reference for its extension too.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pyarrow as pa

from laminar_sdk import (
    CheckpointError,
    ConfigKeySpec,
    ConfigurationError,
    ConnectorConfig,
    ConnectorMetrics,
    DistributedCommitSink,
    EpochTracker,
    InvalidState,
    PartitionInfo,
    PartitionRange,
    PathKind,
    RangeReadableSource,
    ReadError,
    SinkConnector,
    SinkConnectorCapabilities,
    SourceBatch,
    SourceCheckpoint,
    SourceConnector,
    TransactionError,
    WriteResult,
)
from laminar_sdk._contract.durable import (
    create_file_atomically,
    fsync_path,
    make_dirs,
    write_file_atomically,
)
from laminar_sdk.reference._files import arrow_file_bytes, read_arrow_file
from laminar_sdk.reference._lifecycle import Lifecycle
from laminar_sdk.reference._offsets import (
    NEXT_PARTITION,
    next_partition_in,
    offsets_in,
    planned_ends,
    range_bounds,
)
from laminar_sdk.reference._schemas import (
    IDS_SCHEMA,
    SCHEMA_KEY,
    SCHEMAS,
    configured_schema,
    conform_batch,
    ids_batch,
)

_PATH_KEY = ConfigKeySpec(
    "path",
    required=True,
    description="directory holding the data, shared by every process and instance of a test",
    path=PathKind.MAY_CREATE,
)
_SOURCE = "source"
_SOURCE_NAME = "memory source"
_PARTITION = re.compile(r"partition-(\d+)")
_SEGMENT = re.compile(r"(\d{20})\.arrow")
_REMOVED = "_REMOVED"
_SINK_FILE = "_sink.json"
_STAGING = "_staging"
_COMMITTED = "committed"
_EPOCH = re.compile(r"epoch-(\d+)")
_MANIFEST = "_MANIFEST.json"
_TASK = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_PART = re.compile(r"part-\d{6}\.arrow")
_MAX_PARTITION = 2**31 - 1  # the partition column is int32


def _configured_directory(config: ConnectorConfig) -> Path:
    directory = Path(config.require(_PATH_KEY.name))
    if directory.exists() and not directory.is_dir():
        raise ConfigurationError(
            f"{config.connector_type}: config key 'path' must name a directory, and "
            f"{directory} is a file",
            key=_PATH_KEY.name,
        )
    return directory


def _numbered(directory: Path, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
    """The entries of ``directory`` whose names match ``pattern``, by their number, ascending."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    matches = (pattern.fullmatch(name) for name in names)
    return sorted((int(match[1]), directory / match[0]) for match in matches if match)


# Source -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Segment:
    """One appended file: offsets ``start`` (included) to ``stop`` (excluded) of a partition."""

    start: int
    stop: int
    path: Path


def _checked_partition(partition: int) -> int:
    if not 0 <= partition <= _MAX_PARTITION:
        raise ValueError(f"{_SOURCE_NAME}: partition must be in [0, 2**31), got {partition}")
    return partition


def _partition_directory(directory: Path, partition: int) -> Path:
    return directory / _SOURCE / f"partition-{partition}"


def _segment_path(partition_directory: Path, start: int) -> Path:
    return partition_directory / f"{start:020d}.arrow"


def _removed_end(partition_directory: Path) -> int | None:
    """The end offset of a removed partition, ``None`` when it was not removed."""
    try:
        return int((partition_directory / _REMOVED).read_text(encoding="ascii"))
    except FileNotFoundError:
        return None


def _end_offset(partition_directory: Path) -> int:
    segments = _numbered(partition_directory, _SEGMENT)
    if not segments:
        return 0
    start, path = segments[-1]
    return start + int(read_arrow_file(path).num_rows)


class MemorySource(SourceConnector, RangeReadableSource):
    """Replays records that a test appended with :meth:`append`, exactly, from any checkpoint.

    Records have the ``ids`` schema (``id: int64, partition: int32, value: double``, with
    ``value = float(id)``). Partition ``p``'s records have offsets ``0, 1, 2, …`` in the order
    they were appended; a partition appears when its first record is appended, so the source
    never ends: :meth:`poll_batch` returns ``None`` when nothing new has been appended. A
    partition goes away with :meth:`remove_partition`, as a directory deleted or a table
    partition dropped: its records are gone, and checkpoints that name it still restore.

    It is range-readable (:meth:`as_range_readable`): :meth:`plan_end` shares the records
    appended so far among the partitions, and :meth:`read_range` returns the records between
    two offsets of a partition in any process, also after more were appended.
    """

    CONFIG_KEYS: ClassVar[tuple[ConfigKeySpec, ...]] = (_PATH_KEY,)
    DESCRIPTION: ClassVar[str] = (
        "Replays records a test appended to a directory (MemorySource.append), from any checkpoint"
    )

    def __init__(self) -> None:
        self._lifecycle: Lifecycle[Path] = Lifecycle(_SOURCE_NAME)
        self._segments: dict[int, list[_Segment]] = {}
        self._removed: dict[int, int] = {}
        """The end offsets of the partitions removed, by partition."""
        self._next: dict[int, int] = {}
        self._cursor = 0
        self._records_total = 0
        self._bytes_total = 0

    @classmethod
    def append(cls, path: str | os.PathLike[str], ids: Iterable[int], *, partition: int = 0) -> int:
        """Durably append records carrying ``ids``, in order, to ``partition`` at ``path``.

        The records of one call are written as one file, complete or not at all, before this
        returns. Several processes may append at once: each call's records stay together.

        :returns: the partition's record count after the append (the offset after the last
            new record).
        :raises ValueError: when ``partition`` is not in ``[0, 2**31)``, or was removed.
        """
        directory = _partition_directory(Path(path), _checked_partition(partition))
        if _removed_end(directory) is not None:
            raise ValueError(
                f"{_SOURCE_NAME}: partition {partition} was removed (remove_partition); a "
                "removed partition's number is not used again: append to another"
            )
        make_dirs(directory)
        batch = ids_batch(ids, partition)
        if not batch.num_rows:
            return _end_offset(directory)
        data = arrow_file_bytes(batch)
        while True:
            # Another process may take this offset first; then the end has moved: try again.
            start = _end_offset(directory)
            if create_file_atomically(_segment_path(directory, start), data):
                return start + len(batch)

    @classmethod
    def remove_partition(cls, path: str | os.PathLike[str], partition: int) -> int:
        """Remove ``partition`` at ``path`` with its records, read or not, for good.

        Sources reading ``path`` go on with the other partitions; a checkpoint naming it
        restores (its offset there is checked, then dropped). Its number is not used again.
        Nothing may be appended to it while it is being removed.

        :returns: the partition's record count when it was removed.
        :raises ValueError: when ``partition`` is not in ``[0, 2**31)``.
        """
        directory = _partition_directory(Path(path), _checked_partition(partition))
        end = _removed_end(directory)
        if end is not None:
            return end
        end = _end_offset(directory)
        make_dirs(directory)
        # The marker first: a reader that sees a segment gone sees the partition removed.
        write_file_atomically(directory / _REMOVED, str(end).encode("ascii"))
        for _, segment in _numbered(directory, _SEGMENT):
            segment.unlink()
        fsync_path(directory)
        return end

    async def open(self, config: ConnectorConfig) -> None:
        """Check ``config``; the directory need not exist yet (nothing appended so far).

        :raises ConfigurationError: when ``path`` is missing or names a file.
        """
        config = config.validate(self.CONFIG_KEYS)
        self._lifecycle.open(_configured_directory(config))

    def schema(self) -> pa.Schema:
        """The ``ids`` schema: ``id: int64, partition: int32, value: double``."""
        return IDS_SCHEMA

    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        """Return up to ``max_records`` records of the next partition that has unread ones.

        Partitions are visited in turn, by number. Returns ``None`` when every record
        appended so far has been returned.

        :raises ValueError: when ``max_records < 1``.
        """
        directory = self._lifecycle.require("poll_batch")
        if max_records < 1:
            raise ValueError(f"{_SOURCE_NAME}: max_records must be >= 1, got {max_records}")
        self._refresh(directory)
        partitions = sorted(self._segments)
        rotation = [p for p in partitions if p >= self._cursor] + [
            p for p in partitions if p < self._cursor
        ]
        for partition in rotation:
            start = self._next.get(partition, 0)
            segment = next((s for s in self._segments[partition] if s.stop > start), None)
            if segment is None:
                continue
            stop = min(segment.stop, start + max_records)
            batch = read_arrow_file(segment.path).slice(start - segment.start, stop - start)
            self._next[partition] = stop
            self._cursor = partition + 1
            self._records_total += stop - start
            self._bytes_total += batch.nbytes
            return SourceBatch(batch, PartitionInfo(str(partition), str(stop)))
        return None

    def _refresh(self, directory: Path) -> None:
        """Learn of records appended, and partitions removed, since the last look."""
        for partition, partition_directory in _numbered(directory / _SOURCE, _PARTITION):
            if partition in self._removed:
                continue
            removed_end = _removed_end(partition_directory)
            if removed_end is not None:
                self._removed[partition] = removed_end
                self._segments.pop(partition, None)
                self._next.pop(partition, None)
                continue
            known = self._segments.setdefault(partition, [])
            for start, path in _numbered(partition_directory, _SEGMENT)[len(known) :]:
                stop = start + int(read_arrow_file(path).num_rows)
                known.append(_Segment(start, stop, path))

    def _end(self, partition: int) -> int:
        if partition in self._removed:
            return self._removed[partition]
        segments = self._segments.get(partition)
        return segments[-1].stop if segments else 0

    def checkpoint(self) -> SourceCheckpoint:
        """Each partition's next offset: restoring resumes *after* the last record returned.

        Partitions at offset 0 are left out, so records appended to a new partition later do
        not change a checkpoint taken before; so are removed partitions.
        """
        self._lifecycle.require("checkpoint")
        offsets = {str(p): str(offset) for p, offset in sorted(self._next.items()) if offset}
        return SourceCheckpoint(offsets, metadata={NEXT_PARTITION: str(self._cursor)})

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        """Seek every partition to its offset in ``checkpoint``; partitions it omits to 0.

        The offsets of removed partitions are checked, then dropped.

        :raises CheckpointError: for an offset that is not a count, or one past the records
            appended to its partition (the directory is not the one the checkpoint was taken
            against).
        """
        directory = self._lifecycle.require("restore")
        self._refresh(directory)
        offsets = offsets_in(_SOURCE_NAME, checkpoint)
        for partition, offset in offsets.items():
            self._check_appended(directory, partition, offset)
        self._next = {p: offset for p, offset in offsets.items() if p not in self._removed}
        self._cursor = next_partition_in(_SOURCE_NAME, checkpoint)

    def as_range_readable(self) -> RangeReadableSource:
        """This source: it plans micro-batches and reads partition ranges in any process."""
        return self

    async def plan_end(self, start: SourceCheckpoint, max_records: int | None) -> SourceCheckpoint:
        """The checkpoint after at most ``max_records`` records appended after ``start``.

        The records are shared fairly among the partitions that have new ones. Partitions at
        offset 0 stay out of the result, as in :meth:`checkpoint`. Returns ``start`` when
        nothing new was appended.

        :raises CheckpointError: for an offset that is not a count, or one past the records
            appended to its partition.
        """
        directory = self._lifecycle.require("plan_end")
        self._refresh(directory)
        starts = offsets_in(_SOURCE_NAME, start)
        for partition, offset in starts.items():
            self._check_appended(directory, partition, offset)
        ends = planned_ends(starts, {p: self._end(p) for p in self._segments}, max_records)
        if not ends:
            return start
        offsets = {
            str(p): str(offset) for p, offset in sorted({**starts, **ends}.items()) if offset
        }
        return SourceCheckpoint(offsets, metadata=start.metadata)

    async def read_range(self, partition_range: PartitionRange) -> AsyncIterator[pa.RecordBatch]:
        """The records of one partition between two offsets, one batch per appended file.

        The same records every time, in any process, whatever was appended since.

        :raises CheckpointError: for a range that is not a range of offsets.
        :raises ReadError: when the range ends past the records appended to the partition
            (the directory is not the one the range was planned against), or the partition
            was removed (its records are gone).
        """
        directory = self._lifecycle.require("read_range")
        partition, first, stop = range_bounds(_SOURCE_NAME, partition_range)
        if stop > self._end(partition) or first < stop:
            self._refresh(directory)
        if partition in self._removed and first < stop:
            raise ReadError(
                f"{_SOURCE_NAME}: partition {partition} of {directory} was removed after the "
                f"range {first}..{stop} was planned; its records are gone"
            )
        if stop > self._end(partition):
            raise ReadError(
                f"{_SOURCE_NAME}: partition {partition} holds {self._end(partition)} record(s) "
                f"in {directory}, not the {stop} the range asks for; was the directory replaced?"
            )
        for segment in self._segments.get(partition, []):
            if segment.stop <= first or segment.start >= stop:
                continue
            begin = max(first, segment.start)
            end = min(stop, segment.stop)
            yield read_arrow_file(segment.path).slice(begin - segment.start, end - begin)

    def _check_appended(self, directory: Path, partition: int, offset: int) -> None:
        if offset > self._end(partition):
            raise CheckpointError(
                f"{_SOURCE_NAME}: checkpoint offset {offset} of partition {partition} is "
                f"past the {self._end(partition)} record(s) appended in {directory}; was the "
                "directory replaced?"
            )

    def metrics(self) -> ConnectorMetrics:
        """Records and Arrow bytes returned, and the lag.

        ``lag`` is the appended records not yet returned, as of the last poll or restore.
        """
        lag = sum(self._end(p) - self._next.get(p, 0) for p in self._segments)
        return ConnectorMetrics(
            records_total=self._records_total, bytes_total=self._bytes_total, lag=lag
        )

    async def close(self) -> None:
        """Stop; the appended records stay in the directory."""
        self._lifecycle.close()


# Sink -------------------------------------------------------------------------------------


@dataclass(slots=True)
class _StagedParts:
    """Where an open epoch is staged, the files it staged, and how many records they hold."""

    directory: Path
    parts: list[str] = field(default_factory=list)
    records: int = 0


@dataclass(frozen=True, slots=True)
class _SinkSettings:
    directory: Path
    schema: pa.Schema


def _epoch_directory(directory: Path, area: str, epoch: int) -> Path:
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"memory sink: an epoch is an int >= 0, got {epoch!r}")
    return directory / area / f"epoch-{epoch}"


def _discard_staging(directory: Path, epoch: int) -> None:
    """Remove the staged data of ``epoch``; a crash part-way leaves it not pre-committed."""
    staging = _epoch_directory(directory, _STAGING, epoch)
    if not staging.exists():
        return
    (staging / _MANIFEST).unlink(missing_ok=True)
    fsync_path(staging)
    shutil.rmtree(staging)
    fsync_path(staging.parent)


def _record_schema(directory: Path, name: str) -> None:
    """Record which schema the sink at ``directory`` writes; refuse a different one later."""
    record = directory / _SINK_FILE
    if create_file_atomically(record, json.dumps({"schema": name}).encode()):
        return
    recorded = json.loads(record.read_bytes())["schema"]
    if recorded != name:
        raise ConfigurationError(
            f"memory sink: {directory} already holds a memory sink with schema {recorded!r}, "
            f"not {name!r}; use that schema or another path",
            key=SCHEMA_KEY.name,
        )


class MemorySink(SinkConnector, DistributedCommitSink):
    """An exactly-once sink that commits epochs to a directory with a two-phase commit.

    - :meth:`begin_epoch` starts the epoch afresh in ``path/_staging/epoch-<e>/`` (staged
      data of an earlier, failed attempt at ``e`` is discarded) — unless ``path/committed``
      already holds ``e``: then the epoch is a re-delivery and every call for it up to
      :meth:`commit_epoch` or :meth:`rollback_epoch` does nothing.
    - :meth:`write_batch` stages each batch as a file, not yet durable and never visible.
    - :meth:`pre_commit` fsyncs the staged files, then writes the epoch's manifest: only a
      pre-committed epoch can be committed, by this instance or any other.
    - :meth:`commit_epoch` renames the staging directory to ``path/committed/epoch-<e>/``:
      that rename, made durable, is the commit record; re-committing does nothing.
    - :meth:`rollback_epoch` deletes the staged data and never touches a committed epoch.

    Read what was committed with :meth:`committed_ids` / :meth:`committed_table`. Writers of
    one epoch must not call :meth:`write_batch` in parallel (the sink is not
    ``partitioned``): with nothing to say which writer's staged files belong to the epoch, a
    retried writer's stale files would be committed too.

    Parallel writers use the distributed commit instead (:meth:`as_distributed_commit`):

    - :meth:`stage` writes a task's batches to ``path/_staging/epoch-<e>/task-<t>/`` and
      fsyncs them; its descriptor is JSON naming the task and its files;
    - :meth:`commit_aggregated` deletes everything in the epoch's staging directory that no
      descriptor names (failed attempts, crashed runs), writes the epoch's manifest listing
      the named files, and publishes the epoch with one rename, as :meth:`commit_epoch` does.
    """

    CONFIG_KEYS: ClassVar[tuple[ConfigKeySpec, ...]] = (_PATH_KEY, SCHEMA_KEY)
    DESCRIPTION: ClassVar[str] = (
        "Commits epochs exactly once to a directory (two-phase, rename-based), for tests"
    )

    def __init__(self) -> None:
        self._lifecycle: Lifecycle[_SinkSettings] = Lifecycle("memory sink")
        self._epochs: EpochTracker[_StagedParts] = EpochTracker("memory sink")
        self._records_total = 0
        self._bytes_total = 0
        self._epochs_committed = 0
        self._epochs_skipped = 0

    @staticmethod
    def committed_ids(path: str | os.PathLike[str]) -> list[int]:
        """The ``id`` of every committed record at ``path``, by epoch then write order.

        Duplicates are kept, so an exactly-once check is ``sorted(ids) == expected``.
        """
        return list(
            itertools.chain.from_iterable(
                batch.column("id").to_pylist() for batch in _committed_batches(Path(path))
            )
        )

    @staticmethod
    def committed_table(path: str | os.PathLike[str]) -> pa.Table:
        """Every committed record at ``path``, by epoch then write order.

        :raises InvalidState: when no memory sink was ever opened at ``path``.
        """
        directory = Path(path)
        try:
            name = json.loads((directory / _SINK_FILE).read_bytes())["schema"]
        except FileNotFoundError:
            raise InvalidState(
                "a path a memory sink was opened at", f"no memory sink at {directory}"
            ) from None
        return pa.Table.from_batches(_committed_batches(directory), schema=SCHEMAS[name])

    async def open(self, config: ConnectorConfig) -> None:
        """Check ``config`` and create the directory layout under ``path``.

        :raises ConfigurationError: when ``path`` is missing or not a directory, or holds a
            sink with another ``schema``.
        """
        config = config.validate(self.CONFIG_KEYS)
        schema = configured_schema(config)
        directory = _configured_directory(config)
        try:
            make_dirs(directory / _STAGING)
            make_dirs(directory / _COMMITTED)
        except (NotADirectoryError, FileExistsError) as error:
            raise ConfigurationError(
                f"memory sink: cannot create the sink's directories under {directory}: {error}",
                key=_PATH_KEY.name,
            ) from error
        _record_schema(directory, config.require(SCHEMA_KEY.name))
        self._lifecycle.open(_SinkSettings(directory, schema))

    def schema(self) -> pa.Schema:
        """The configured schema (``ids`` or ``wide``)."""
        return self._lifecycle.require("schema").schema

    def capabilities(self) -> SinkConnectorCapabilities:
        """``exactly_once``, ``two_phase_commit`` and ``idempotent`` (per epoch)."""
        return (
            SinkConnectorCapabilities()
            .with_exactly_once()
            .with_two_phase_commit()
            .with_idempotent()
        )

    async def last_committed_epoch(self) -> int:
        """The newest epoch under ``path/committed`` (``-1``: none)."""
        settings = self._lifecycle.require("last_committed_epoch")
        committed = _numbered(settings.directory / _COMMITTED, _EPOCH)
        return committed[-1][0] if committed else -1

    async def begin_epoch(self, epoch: int) -> None:
        """Start ``epoch`` afresh, or recognise it as committed already and skip it.

        :raises InvalidState: when another epoch is open on this instance.
        """
        settings = self._lifecycle.require("begin_epoch")
        self._epochs.check_can_begin(epoch)
        if _epoch_directory(settings.directory, _COMMITTED, epoch).exists():
            self._epochs.skip(epoch)
            self._epochs_skipped += 1
            return
        _discard_staging(settings.directory, epoch)
        staging = _epoch_directory(settings.directory, _STAGING, epoch)
        make_dirs(staging)
        self._epochs.begin(epoch, _StagedParts(staging))

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        """Stage ``batch`` in the open epoch; in a skipped epoch, write nothing.

        :returns: the records and bytes staged (0 for a skipped epoch).
        :raises SchemaMismatch: naming how ``batch`` differs from :meth:`schema`.
        :raises InvalidState: when no epoch is open, or it was pre-committed already.
        """
        settings = self._lifecycle.require("write_batch")
        batch = conform_batch("memory sink", settings.schema, batch)
        staged = self._epochs.writing()
        if staged is None:
            return WriteResult(0)
        name = f"part-{len(staged.parts):06d}.arrow"
        (staged.directory / name).write_bytes(arrow_file_bytes(batch))
        staged.parts.append(name)
        staged.records += batch.num_rows
        self._records_total += batch.num_rows
        self._bytes_total += batch.nbytes
        return WriteResult(batch.num_rows, batch.nbytes)

    async def pre_commit(self, epoch: int) -> None:
        """Make the staged batches durable and mark the epoch pre-committed; still invisible.

        :raises InvalidState: when ``epoch`` is not the epoch open on this instance.
        """
        self._lifecycle.require("pre_commit")
        staged = self._epochs.pre_committing(epoch)
        if staged is None:
            return
        for part in staged.parts:
            fsync_path(staged.directory / part)
        manifest = {"epoch": epoch, "parts": staged.parts, "records": staged.records}
        write_file_atomically(staged.directory / _MANIFEST, json.dumps(manifest).encode())
        self._epochs.pre_committed(epoch)

    async def commit_epoch(self, epoch: int) -> None:
        """Publish pre-committed ``epoch`` atomically; nothing happens if it is committed.

        Any instance may commit an epoch another instance (or process) pre-committed.

        :raises InvalidState: when ``epoch`` is neither committed nor pre-committed (on this
            instance: begun but not pre-committed).
        """
        settings = self._lifecycle.require("commit_epoch")
        self._epochs.committing(epoch)
        committed = _epoch_directory(settings.directory, _COMMITTED, epoch)
        if not committed.exists():
            staging = _epoch_directory(settings.directory, _STAGING, epoch)
            if not (staging / _MANIFEST).exists():
                raise InvalidState(
                    f"epoch {epoch} pre-committed in {settings.directory}",
                    f"epoch {epoch} was never pre-committed there, or was rolled back",
                )
            staging.rename(committed)
            fsync_path(committed.parent)
            fsync_path(staging.parent)
            self._epochs_committed += 1
        self._epochs.finish(epoch)

    def as_distributed_commit(self) -> DistributedCommitSink:
        """This sink: write tasks stage in parallel, one commit publishes them."""
        return self

    async def stage(self, epoch: int, task: str, batches: AsyncIterable[pa.RecordBatch]) -> str:
        """Stage ``batches`` durably as task ``task``'s share of ``epoch``; still invisible.

        When ``epoch`` is committed already (a re-delivery), the batches are read but
        nothing is staged.

        :returns: JSON ``{"task": task, "parts": [file names], "records": n}``.
        :raises ValueError: when ``task`` cannot be part of a file name (letters, digits,
            ``.``, ``_``, ``-``; at most 128) or ``epoch`` is not an epoch.
        :raises SchemaMismatch: naming how a batch differs from :meth:`schema`.
        """
        settings = self._lifecycle.require("stage")
        if not _TASK.fullmatch(task):
            raise ValueError(f"memory sink: {task!r} cannot name a task's staging directory")
        skip = _epoch_directory(settings.directory, _COMMITTED, epoch).exists()
        staging = _epoch_directory(settings.directory, _STAGING, epoch) / f"task-{task}"
        parts: list[str] = []
        records = 0
        async for batch in batches:
            conformed = conform_batch("memory sink", settings.schema, batch)
            if skip:
                continue
            if not parts:
                make_dirs(staging)
            part = staging / f"part-{len(parts):06d}.arrow"
            part.write_bytes(arrow_file_bytes(conformed))
            fsync_path(part)
            parts.append(part.name)
            records += conformed.num_rows
            self._records_total += conformed.num_rows
            self._bytes_total += conformed.nbytes
        if parts:
            fsync_path(staging)
        return json.dumps({"task": task, "parts": parts, "records": records})

    async def commit_aggregated(self, epoch: int, descriptors: Sequence[str]) -> None:
        """Publish the staging ``descriptors`` name as ``epoch``, atomically, discarding the rest.

        Committing an epoch that is committed already does nothing but discard what was
        staged for it since (a re-delivery's staging).

        :raises TransactionError: when a descriptor is not one :meth:`stage` returned, names
            a task twice, or names staged files that are gone (rolled back?).
        """
        settings = self._lifecycle.require("commit_aggregated")
        committed = _epoch_directory(settings.directory, _COMMITTED, epoch)
        staging = _epoch_directory(settings.directory, _STAGING, epoch)
        if committed.exists():
            _discard_staging(settings.directory, epoch)
            return
        tasks = _staged_tasks(epoch, descriptors)
        parts = [f"task-{task}/{part}" for task, task_parts, _ in tasks for part in task_parts]
        missing = [part for part in parts if not (staging / part).exists()]
        if missing:
            raise TransactionError(
                f"memory sink: epoch {epoch} cannot be committed: staged file(s) "
                f"{', '.join(missing)} are gone from {staging} (rolled back, or the directory "
                "was replaced?)"
            )
        make_dirs(staging)
        named = {f"task-{task}" for task, task_parts, _ in tasks if task_parts}
        for entry in sorted(os.listdir(staging)):
            if entry not in named:
                _remove(staging / entry)
        fsync_path(staging)
        manifest = {"epoch": epoch, "parts": parts, "records": sum(n for _, _, n in tasks)}
        write_file_atomically(staging / _MANIFEST, json.dumps(manifest).encode())
        staging.rename(committed)
        fsync_path(committed.parent)
        fsync_path(staging.parent)
        self._epochs_committed += 1

    async def rollback_epoch(self, epoch: int) -> None:
        """Delete ``epoch``'s staged data, if any; a committed epoch is left as it is.

        That includes what every task staged for it.
        """
        settings = self._lifecycle.require("rollback_epoch")
        _discard_staging(settings.directory, epoch)
        self._epochs.finish(epoch)

    def metrics(self) -> ConnectorMetrics:
        """Records and Arrow bytes staged by this instance, and epoch counts.

        ``custom`` holds ``epochs_committed`` (epochs this instance published) and
        ``epochs_skipped`` (epochs it recognised as committed before and skipped).
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
        by the next attempt at it.
        """
        self._epochs.abandon()
        self._lifecycle.close()


def _staged_tasks(epoch: int, descriptors: Sequence[str]) -> list[tuple[str, list[str], int]]:
    """``(task, parts, records)`` of each descriptor :meth:`MemorySink.stage` returned."""
    tasks: list[tuple[str, list[str], int]] = []
    for descriptor in descriptors:
        try:
            document = json.loads(descriptor)
            task, parts, records = document["task"], document["parts"], document["records"]
        except (ValueError, TypeError, KeyError) as error:
            raise TransactionError(
                f"memory sink: {descriptor!r} is not a commit descriptor of a memory sink's "
                f"stage ({error}); epoch {epoch} cannot be committed with it"
            ) from error
        valid = (
            isinstance(task, str)
            and _TASK.fullmatch(task)
            and isinstance(parts, list)
            and all(isinstance(part, str) and _PART.fullmatch(part) for part in parts)
            and isinstance(records, int)
        )
        if not valid:
            raise TransactionError(
                f"memory sink: {descriptor!r} is not a commit descriptor of a memory sink's "
                f"stage; epoch {epoch} cannot be committed with it"
            )
        if any(task == seen for seen, _, _ in tasks):
            raise TransactionError(
                f"memory sink: task {task!r} is named twice in the commit of epoch {epoch}; "
                "its records would be published twice"
            )
        tasks.append((task, parts, records))
    return tasks


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()


def _committed_batches(directory: Path) -> list[pa.RecordBatch]:
    batches = []
    for _, epoch_directory in _numbered(directory / _COMMITTED, _EPOCH):
        manifest = json.loads((epoch_directory / _MANIFEST).read_bytes())
        batches += [read_arrow_file(epoch_directory / part) for part in manifest["parts"]]
    return batches
