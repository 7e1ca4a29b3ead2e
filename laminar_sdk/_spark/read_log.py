"""The read log: what each micro-batch of a polled source read, kept until Spark commits it.

A source that is not range-readable can only be polled: restored to a checkpoint, it returns
whatever is available *now*. If Spark re-ran a micro-batch after a crash by polling again from
the micro-batch's start, a source whose data kept arriving would return more than the first
run did, in its own order — and a source that cannot replay could not return the first run's
records at all. So the bridge never polls for a re-run. The process that plans a micro-batch
polls the source once, writes the records to the read log, and only then gives Spark the
micro-batch's end offset, which names the log entry; Spark records that offset in its offset
log before anything reads it. Every task of the micro-batch — in its first run and in any
re-run, on any machine — reads its records from the entry. Once Spark has committed the
micro-batch the entry is deleted (Spark's receiver write-ahead log and Feldera's step log work
the same way).

The log lives in a checkpoint store (file system or object store, see
:mod:`laminar_sdk._checkpointing.registry`) at ``<laminar checkpoint location>/read-log``, so it
survives whatever the laminar checkpoint location survives. An entry is one checkpoint id (a
UUIDv7, ordered by time); its records are Arrow IPC streams, LZ4-compressed
(:data:`~laminar_sdk._spark.ipc.COMPRESSED_IPC_OPTIONS`), stored as that checkpoint's
artifacts ``{id}/operators/{source}/partition-{n}.snap``, one per *slice* of at most
:data:`SLICE_BYTES` of uncompressed Arrow, each read by a Spark task of its own. The end
offset holds every slice's path, row count and SHA-256, checked when the slice is read back.
Slices are encoded and written while the source goes on being polled, at most
:data:`SLICES_IN_FLIGHT` at a time, so the planning process holds a few slices at most, however
big the micro-batch.

A crash between the poll and Spark's offset log leaves an entry no offset names; it is deleted
by a later commit once it is older than :data:`ORPHAN_GRACE_S`.

An entry that is gone when Spark runs its micro-batch again — set aside with ``laminar
checkpoints quarantine`` because a slice was damaged, or lost with the location — is read
again from the source when the source can replay (see
:class:`~laminar_sdk._spark.reader.LaminarPolledReader`): restored to the micro-batch's start
offset, it must return the entry's number of records and reach the end offset Spark logged.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from laminar_sdk._checkpointing.checkpointer import Checkpointer
from laminar_sdk._checkpointing.errors import CheckpointCorrupted, CheckpointNotFound
from laminar_sdk._checkpointing.ids import CheckpointId, parse_artifact_path
from laminar_sdk._contract.errors import CheckpointError, ReadError
from laminar_sdk._contract.state import connector_space
from laminar_sdk._runtime.coordinator import as_async_batches
from laminar_sdk._spark.ipc import COMPRESSED_IPC_OPTIONS

READ_LOG_DIRECTORY = "read-log"
"""The directory under the laminar checkpoint location that holds the read log."""

READ_LOG_OFFSET_KEY = "read_log"
"""The key of a polled micro-batch's read-log entry in its end offset."""

SLICE_BYTES = 32 * 1024 * 1024
"""The most Arrow bytes one slice holds (a batch larger than that is cut, by rows): a
micro-batch of more is read by several tasks in parallel."""

SLICES_IN_FLIGHT = 2
"""How many full slices may be in the making (encoded, hashed, stored) while polling goes
on: the planning process holds at most this many more slices than one."""

ORPHAN_GRACE_S = 600.0
"""How old an entry that no committed micro-batch named must be before it is deleted."""


@dataclass(frozen=True, slots=True)
class LoggedSlice:
    """One slice of a logged micro-batch: an Arrow IPC stream in the read log's store.

    :param path: the artifact's path in the store.
    :param sha256: its SHA-256, checked when it is read back.
    :param rows: how many records it holds.
    """

    path: str
    sha256: str
    rows: int


@dataclass(frozen=True, slots=True)
class ReadLogEntry:
    """The records of one micro-batch in the read log: its id and its slices, in order."""

    checkpoint_id: CheckpointId
    slices: tuple[LoggedSlice, ...]

    @property
    def rows(self) -> int:
        """How many records the micro-batch holds."""
        return sum(logged.rows for logged in self.slices)

    def to_dict(self) -> dict[str, Any]:
        """A plain, JSON-ready dictionary (it travels in Spark's offset log)."""
        return {
            "id": str(self.checkpoint_id),
            "slices": [{"path": s.path, "sha256": s.sha256, "rows": s.rows} for s in self.slices],
        }

    @classmethod
    def from_dict(cls, data: object) -> ReadLogEntry:
        """Read an entry back from :meth:`to_dict` output.

        :raises CheckpointError: when ``data`` is not one (a hand-edited offset log).
        """
        try:
            if not isinstance(data, Mapping):
                raise TypeError(f"a JSON object, not {type(data).__name__}")
            slices = tuple(
                LoggedSlice(str(item["path"]), str(item["sha256"]), int(item["rows"]))
                for item in data["slices"]
            )
            entry = cls(CheckpointId.parse(str(data["id"])), slices)
            for logged in slices:
                if parse_artifact_path(logged.path).checkpoint_id != entry.checkpoint_id:
                    raise CheckpointError(f"slice {logged.path} is not in entry {data['id']}")
        except (KeyError, TypeError, ValueError, CheckpointError) as error:
            raise CheckpointError(
                f"the read-log entry in Spark's offset log is malformed ({error!r}): was the "
                "offset log edited by hand? Restore it, or start the query over"
            ) from error
        return entry


def read_log_location(laminar_location: str) -> str:
    """Where the read log of the laminar checkpoint location ``laminar_location`` is."""
    return f"{laminar_location.rstrip('/')}/{READ_LOG_DIRECTORY}"


def laminar_location_of(location: str) -> str | None:
    """The laminar checkpoint location whose read log ``location`` is, ``None`` for another."""
    parent, _, name = location.rstrip("/").rpartition("/")
    return parent if name == READ_LOG_DIRECTORY and parent else None


class ReadLog:
    """The read log of one source in one laminar checkpoint location.

    :param store: the checkpoint store at ``<laminar checkpoint location>/read-log``.
    :param source: the source connector's name: its entries are kept under it.
    :param replayable: whether the source can replay a micro-batch whose entry is gone (its
        ``supports_replay()``): its errors then say how to have it read again.
    """

    def __init__(self, store: Checkpointer, source: str, *, replayable: bool = False) -> None:
        self._store = store
        self._source = source
        self._replayable = replayable
        self._operator = connector_space("source", source)

    @property
    def location(self) -> str:
        """Where the log is, safe to show."""
        return self._store.location

    async def holds(self, entry: ReadLogEntry) -> bool:
        """Whether every slice of ``entry`` is stored (not whether it is intact)."""
        stored = set(await self._store.list_artifacts())
        return all(logged.path in stored for logged in entry.slices)

    def way_back(self, entry_id: CheckpointId, *, gone: bool = False) -> str:
        """What to do about a damaged entry (or one ``gone`` already), for an error message."""
        if self._replayable:
            laminar = laminar_location_of(self.location) or "LAMINAR_LOCATION"
            first = (
                "Restart the query"
                if gone
                else f"Set the entry aside with `laminar checkpoints quarantine {laminar} "
                f"{entry_id}` and restart"
            )
            return (
                f"{first}: the micro-batch is then read again from source {self._source!r}, "
                "restored to its start offset, and delivered if the source reaches the end "
                "offset its first run reached (else the run says so). Or restore the laminar "
                "checkpoint location from a backup taken with Spark's checkpoint"
            )
        return (
            f"Source {self._source!r} cannot replay (its supports_replay() is False), so "
            "this entry holds the only copy of those records: restore the laminar checkpoint "
            "location from a backup taken with Spark's checkpoint, or delete both to start "
            "the query over"
        )

    async def append(
        self, batches: Iterable[pa.RecordBatch] | AsyncIterable[pa.RecordBatch], schema: pa.Schema
    ) -> ReadLogEntry:
        """Store ``batches`` durably as a new entry, in slices; return the entry.

        Each slice is stored as soon as it is full (encoded in a worker thread, then written),
        while ``batches`` is still being consumed; at most :data:`SLICES_IN_FLIGHT` are in the
        making at a time.
        No batch: an entry without slices, and nothing stored. Nothing refers to the entry
        until the caller hands it to Spark: a crash part-way leaves an orphan, deleted later
        (:meth:`discard`).

        :raises CheckpointError: when the store cannot write (naming where, and why).
        """
        entry_id = CheckpointId.new()
        stored: list[asyncio.Task[LoggedSlice]] = []
        try:
            async for group in _slices(batches):
                if len(stored) >= SLICES_IN_FLIGHT:
                    await stored[-SLICES_IN_FLIGHT]
                number = len(stored)
                stored.append(
                    asyncio.create_task(self._store_slice(entry_id, number, group, schema))
                )
            return ReadLogEntry(entry_id, tuple([await task for task in stored]))
        finally:
            for task in stored:
                task.cancel()
            await asyncio.gather(*stored, return_exceptions=True)

    async def _store_slice(
        self, entry_id: CheckpointId, number: int, group: list[pa.RecordBatch], schema: pa.Schema
    ) -> LoggedSlice:
        # Encoded off the event loop: the loop goes on polling the source meanwhile.
        data = await asyncio.to_thread(_ipc_stream, group, schema)
        sha256 = await self._store.save_snapshot(entry_id, self._operator, number, data)
        path = self._store.artifact_path(entry_id, self._operator, number)
        return LoggedSlice(path, sha256, sum(batch.num_rows for batch in group))

    async def read(self, logged: LoggedSlice) -> pa.RecordBatchStreamReader:
        """The batches of one slice, as the first run logged them.

        :raises ReadError: when the slice is gone or corrupted, naming it.
        """
        try:
            data = await self._store.load_artifact(logged.path, sha256=logged.sha256)
        except CheckpointNotFound as error:
            raise ReadError(
                f"source {self._source!r}: the records of this micro-batch are gone from the "
                f"read log ({logged.path} at {self.location}) while it was being read. The "
                "laminar checkpoint location was deleted, changed or restored from an older "
                "backup while Spark's checkpoint was kept. "
                + self.way_back(parse_artifact_path(logged.path).checkpoint_id, gone=True)
            ) from error
        except CheckpointCorrupted as error:
            raise ReadError(
                f"source {self._source!r}: the read log's record of this micro-batch is "
                f"corrupted ({logged.path} at {self.location} fails its SHA-256 check), so it "
                "cannot be read as its first run read it. "
                + self.way_back(parse_artifact_path(logged.path).checkpoint_id)
            ) from error
        return pa.ipc.open_stream(pa.py_buffer(data))

    async def discard(self, entry: ReadLogEntry, *, grace_s: float = ORPHAN_GRACE_S) -> None:
        """Delete ``entry`` (its micro-batch is committed) and older orphans.

        An orphan is an entry of this source older than ``entry`` and than ``grace_s``
        seconds: its micro-batch was committed before (its discard was lost in a crash) or
        never named in Spark's offset log (a crash came first).
        """
        doomed = {logged.path for logged in entry.slices}
        cutoff_ms = time.time_ns() // 1_000_000 - grace_s * 1000
        for path in await self._store.list_artifacts():
            try:
                parts = parse_artifact_path(path)
            except CheckpointError:
                continue  # not an artifact (a store's leftover of an interrupted write)
            if (
                parts.operator == self._operator
                and parts.checkpoint_id < entry.checkpoint_id
                and parts.checkpoint_id.timestamp_ms < cutoff_ms
            ):
                doomed.add(path)
        for path in sorted(doomed):
            await self._store.delete_artifact(path)


@dataclass(frozen=True, slots=True)
class LoggedMicroBatch:
    """What Spark's offset log says of one slice: its micro-batch, and its SHA-256."""

    micro_batch: int
    sha256: str


def slices_in_offset_log(offsets: Path) -> dict[str, LoggedMicroBatch]:
    """The read-log slices Spark's offset log directory ``offsets`` names, by path.

    Spark writes a file per planned micro-batch (``offsets/<N>``): a version line, a metadata
    line, then each source's end offset; a polled source's names its read-log entry
    (:data:`READ_LOG_OFFSET_KEY`). Lines that are not such an offset are passed over.
    """
    named: dict[str, LoggedMicroBatch] = {}
    files = sorted(offsets.iterdir()) if offsets.is_dir() else []
    for file in (file for file in files if file.name.isdigit()):
        for line in file.read_text(errors="replace").splitlines()[2:]:
            try:
                offset = json.loads(line)
                entry = ReadLogEntry.from_dict(offset[READ_LOG_OFFSET_KEY])
            except (ValueError, TypeError, KeyError, CheckpointError):
                continue
            for logged in entry.slices:
                named[logged.path] = LoggedMicroBatch(int(file.name), logged.sha256)
    return named


async def damaged_slices(
    store: Checkpointer, stored: Iterable[str], named: Mapping[str, LoggedMicroBatch]
) -> list[tuple[str, str]]:
    """Every slice of ``stored`` (in the read log ``store``) that cannot be read back, with why.

    A slice Spark's offset log names (``named``, :func:`slices_in_offset_log`) must match
    its SHA-256; any other must decode whole as an Arrow stream.
    """
    damaged = []
    for path in stored:
        expected = named.get(path)
        try:
            data = await store.load_artifact(path, sha256=expected.sha256 if expected else None)
            if expected is None:
                pa.ipc.open_stream(pa.py_buffer(data)).read_all()
        except CheckpointCorrupted:
            damaged.append((path, "fails the SHA-256 check Spark's offset log records for it"))
        except pa.ArrowException as error:
            damaged.append((path, f"is not a readable Arrow stream ({error})"))
    return damaged


def _ipc_stream(group: list[pa.RecordBatch], schema: pa.Schema) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=COMPRESSED_IPC_OPTIONS) as stream:
        for batch in group:
            stream.write_batch(batch)
    data: bytes = sink.getvalue().to_pybytes()
    return data


async def _slices(
    batches: Iterable[pa.RecordBatch] | AsyncIterable[pa.RecordBatch],
) -> AsyncIterator[list[pa.RecordBatch]]:
    """``batches`` in groups of at most :data:`SLICE_BYTES`, a larger batch cut by rows.

    Between two batches it lets the event loop run: a source whose ``poll_batch`` never
    awaits would otherwise hold the loop until the last batch, and the slices being stored
    meanwhile would not get on.
    """
    group: list[pa.RecordBatch] = []
    size = 0
    async for batch in as_async_batches(batches):
        await asyncio.sleep(0)
        for piece in _pieces(batch):
            if group and size + piece.nbytes > SLICE_BYTES:
                yield group
                group, size = [], 0
            group.append(piece)
            size += piece.nbytes
    if group:
        yield group


def _pieces(batch: pa.RecordBatch) -> list[pa.RecordBatch]:
    """``batch``, cut (without copying) into pieces of at most :data:`SLICE_BYTES` each."""
    if batch.nbytes <= SLICE_BYTES or batch.num_rows < 2:
        return [batch]
    rows = max(1, batch.num_rows * SLICE_BYTES // batch.nbytes)
    return [batch.slice(first, rows) for first in range(0, batch.num_rows, rows)]
