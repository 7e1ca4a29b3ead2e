"""A third-party plugin as an outside author writes it: a queue source, SQLite and file sinks.

The queue is a directory of JSON-lines files, ``p0.jsonl`` to ``p2.jsonl``, one per partition,
appended to by producers. ``outsider-queue`` reads it correctly; each ``outsider-*`` variant
has one bug an author plausibly writes (``outsider-queue-blind-context`` has it in its test
context, which fills one partition only; ``outsider-lists-its-partitions-when-it-opens`` reads
only the partition files that exist when it opens; ``outsider-refuses-a-checkpoint-past-the-
files`` cannot restore once a partition file was removed). ``outsider-sqlite`` is an
exactly-once SQLite sink that publishes an epoch's rows and records the epoch in one transaction;
``outsider-sqlite-marker-apart`` does it in two, both inside ``commit_epoch`` (in a worker
thread), unmarked. ``outsider-jsonl`` stages an epoch in a file and publishes it with a rename;
``outsider-jsonl-buffered-pre-commit`` returns from ``pre_commit`` with the rows still in the
file's buffer. ``outsider-outbox`` reads an SQLite outbox table and moves what it read to an
archive in one transaction; ``outsider-outbox-archives-apart`` copies and deletes in two, so
that a crash between them leaves rows both archived and queued (read twice after a restore):
only a crash inside ``poll_batch`` shows it. Four more pass every in-process check of the epoch
protocol and break only on Spark — the kit must catch them first: a source stamping records in
nanoseconds, one inferring its schema from the data, one that takes records off the queue when
it polls (lost when it is closed holding some), and a sink taking unsigned ids. The source's
test context is written as an author writes one after reading only the protocol: it does not
declare ``partitions`` or ``live_appends`` — the kit has to find out. Used with ``--plugin
outsider``; it imports nothing from the kit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import sqlite3
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TextIO

import pyarrow as pa
import pyarrow.compute as pc

from laminar_sdk import (
    CheckpointError,
    ConfigKeySpec,
    ConfigurationError,
    ConnectorConfig,
    ConnectorRegistry,
    InvalidState,
    PartitionInfo,
    PartitionRange,
    RangeReadableSource,
    SchemaMismatch,
    SinkConnector,
    SinkConnectorCapabilities,
    SourceBatch,
    SourceCheckpoint,
    SourceConnector,
    TransactionError,
    WriteResult,
    hookimpl,
)

PARTITIONS = ("p0", "p1", "p2")
SCHEMA = pa.schema([("id", pa.int64())])


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


class QueueSource(SourceConnector):
    """Round-robin over the partitions; the position of each is the number of lines read."""

    def __init__(self) -> None:
        self.directory = Path()
        self.positions: dict[str, int] = {}
        self.cursor = 0

    async def open(self, config: ConnectorConfig) -> None:
        path = config.properties.get("path")
        if not path:
            raise ConfigurationError("queue source: set `path` to the queue directory", key="path")
        self.directory = Path(path)
        self.positions = dict.fromkeys(PARTITIONS, 0)

    def schema(self) -> pa.Schema:
        return SCHEMA

    def lines(self, partition: str) -> list[str]:
        return _lines(self.directory / f"{partition}.jsonl")

    def partitions(self) -> Sequence[str]:
        """The partitions to read, in turn."""
        return PARTITIONS

    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        partitions = self.partitions()
        for _ in partitions:
            self.cursor %= len(partitions)
            partition = partitions[self.cursor]
            start = self.positions.get(partition, 0)
            taken = self.lines(partition)[start : start + max_records]
            self.cursor = (self.cursor + 1) % len(partitions)
            if taken:
                self.advance(partition, len(taken))
                records = self.records([json.loads(line)["id"] for line in taken])
                return SourceBatch(records, PartitionInfo(partition, str(start + len(taken))))
        return None

    def records(self, ids: list[int]) -> pa.RecordBatch:
        return pa.record_batch([pa.array(ids, pa.int64())], schema=SCHEMA)

    def advance(self, partition: str, count: int) -> None:
        self.positions[partition] = self.positions.get(partition, 0) + count

    def checkpoint(self) -> SourceCheckpoint:
        return SourceCheckpoint({p: str(position) for p, position in self.positions.items()})

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        for partition, offset in checkpoint.offsets.items():
            self.positions[partition] = int(offset)

    async def close(self) -> None:
        pass


class ListsItsPartitionsWhenItOpens(QueueSource):
    """Reads the partitions whose files exist when it opens: one created later goes unread."""

    async def open(self, config: ConnectorConfig) -> None:
        await super().open(config)
        self.listed = [p for p in PARTITIONS if (self.directory / f"{p}.jsonl").exists()]

    def partitions(self) -> Sequence[str]:
        return self.listed


class RestoresFirstPartitionOnly(QueueSource):
    """Seeks the first partition of the checkpoint and forgets to loop over the others."""

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        for partition, offset in checkpoint.offsets.items():
            self.positions[partition] = int(offset)
            break


class RestoresNothing(QueueSource):
    """Forgets to seek: every restored instance reads each partition from its first line."""

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        pass


class RefusesACheckpointPastTheFiles(QueueSource):
    """Refuses a checkpoint whose position is past a partition file's lines ("wrong queue?").

    A guard an author adds against restoring into the wrong directory: a partition whose file
    was removed after it was read then makes every later restore fail.
    """

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        for partition, offset in checkpoint.offsets.items():
            if int(offset) > len(self.lines(partition)):
                raise CheckpointError(
                    f"queue source: {partition} has {len(self.lines(partition))} lines, the "
                    f"checkpoint says {offset}: is this the queue it was taken on?"
                )
        await super().restore(checkpoint)


class CheckpointLagsInOnePartition(QueueSource):
    """Counts partition p1's position from 1 in its checkpoint (an off-by-one in one place)."""

    def checkpoint(self) -> SourceCheckpoint:
        offsets = {p: str(position) for p, position in self.positions.items()}
        offsets["p1"] = str(max(0, self.positions["p1"] - 1))
        return SourceCheckpoint(offsets)


class CheckpointsTheEndWhenCaughtUp(QueueSource):
    """Once it has returned every line it last read, checkpoints the end of the file instead.

    Records appended after its last poll of a partition and before the checkpoint are then
    skipped by a restore: they are lost. With nothing appended meanwhile, it is right.
    """

    async def open(self, config: ConnectorConfig) -> None:
        await super().open(config)
        self.read_up_to = dict.fromkeys(PARTITIONS, 0)

    def lines(self, partition: str) -> list[str]:
        lines = super().lines(partition)
        self.read_up_to[partition] = len(lines)
        return lines

    def checkpoint(self) -> SourceCheckpoint:
        offsets = {}
        for partition, position in self.positions.items():
            caught_up = position >= self.read_up_to[partition]
            end = len(_lines(self.directory / f"{partition}.jsonl"))
            offsets[partition] = str(end if caught_up else position)
        return SourceCheckpoint(offsets)


class AdvancesTheNextPartition(QueueSource):
    """Moves the cursor before it records the position: one partition's records move another."""

    def advance(self, partition: str, count: int) -> None:
        self.positions[PARTITIONS[self.cursor]] += count


STAMPED = pa.schema([("id", pa.int64()), ("read_at", pa.timestamp("ns", tz="UTC"))])


class StampsInNanoseconds(QueueSource):
    """Adds when each record was read, in nanoseconds as pandas and time.time_ns() give it."""

    def schema(self) -> pa.Schema:
        return STAMPED

    def records(self, ids: list[int]) -> pa.RecordBatch:
        now = pa.array([time.time_ns()] * len(ids), pa.timestamp("ns", tz="UTC"))
        return pa.record_batch([pa.array(ids, pa.int64()), now], schema=STAMPED)


class QueueOnTheNewestPyarrow(QueueSource):
    """Counts the odd ids it reads with ``pyarrow.compute.modulo``: its author's pyarrow has
    it; pyarrow 18, the lowest laminar-sdk supports, does not."""

    odd_ids = 0

    def records(self, ids: list[int]) -> pa.RecordBatch:
        batch = super().records(ids)
        self.odd_ids += pc.sum(pc.modulo(batch.column("id"), 2)).as_py() or 0
        return batch


class InfersItsSchemaFromTheData(QueueSource):
    """Declares the keys of the first record in the queue as its columns (none while empty)."""

    def schema(self) -> pa.Schema:
        for partition in PARTITIONS:
            for line in self.lines(partition)[:1]:
                return pa.schema([(key, pa.int64()) for key in json.loads(line)])
        return pa.schema([])


class AcknowledgesOnReceipt(QueueSource):
    """Takes every waiting line off the queue when it polls (a consumer that acknowledges on
    receipt), then returns them a batch at a time; cannot go back, so it does not replay."""

    async def open(self, config: ConnectorConfig) -> None:
        await super().open(config)
        self.received: list[str] = []
        self.returned = 0

    def supports_replay(self) -> bool:
        return False

    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        if not self.received:
            for partition in PARTITIONS:
                self.received += self.lines(partition)
                (self.directory / f"{partition}.jsonl").write_text("", encoding="utf-8")
        taken, self.received = self.received[:max_records], self.received[max_records:]
        if not taken:
            return None
        self.returned += len(taken)
        records = self.records([json.loads(line)["id"] for line in taken])
        return SourceBatch(records, PartitionInfo("queue", str(self.returned)))

    def checkpoint(self) -> SourceCheckpoint:
        return SourceCheckpoint({"queue": str(self.returned)})

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        pass


class RangeReadableQueue(QueueSource, RangeReadableSource):
    """Reads each partition's lines between two checkpoints in parallel tasks on Spark."""

    def as_range_readable(self) -> RangeReadableSource:
        return self

    def line_counts(self) -> dict[str, int]:
        return {partition: len(self.lines(partition)) for partition in PARTITIONS}

    async def plan_end(self, start: SourceCheckpoint, max_records: int | None) -> SourceCheckpoint:
        budget = max_records
        offsets = {}
        for partition, count in self.line_counts().items():
            begin = int(start.offsets.get(partition, "0"))
            end = count if budget is None else min(count, begin + budget)
            if budget is not None:
                budget -= end - begin
            offsets[partition] = str(end)
        return SourceCheckpoint(offsets)

    async def read_range(self, partition_range: PartitionRange) -> AsyncIterator[pa.RecordBatch]:
        begin, end = int(partition_range.start or 0), int(partition_range.end)
        taken = self.lines(partition_range.partition)[begin:end]
        yield self.records([json.loads(line)["id"] for line in taken])


class PlansFromTheLinesSeenAtOpen(RangeReadableQueue):
    """Counts each partition's lines when it opens, and plans from those counts."""

    async def open(self, config: ConnectorConfig) -> None:
        await super().open(config)
        self.counted_at_open = super().line_counts()

    def line_counts(self) -> dict[str, int]:
        return self.counted_at_open


# Sources: an SQLite outbox, moved to an archive as it is read -------------------------------

OUTBOX_TABLES = (
    "CREATE TABLE IF NOT EXISTS outbox (partition TEXT, seq INTEGER, id INTEGER);"
    "CREATE TABLE IF NOT EXISTS archive (partition TEXT, seq INTEGER, id INTEGER);"
)


class OutboxSource(SourceConnector):
    """Reads an SQLite outbox, partition by partition, moving the rows it read to an archive.

    Producers insert ``(partition, seq, id)`` rows into ``outbox``. To keep it small, the
    source moves each batch it returns into ``archive``, in one transaction, and reads both
    tables, so that an instance restored from an earlier checkpoint finds what a later one
    moved. Autocommit mode: transactions are SQL statements run through ``execute``.
    """

    def __init__(self) -> None:
        self.db: sqlite3.Connection | None = None
        self.positions: dict[str, int] = {}
        self.cursor = 0

    async def open(self, config: ConnectorConfig) -> None:
        path = config.properties.get("path")
        if not path:
            raise ConfigurationError("outbox source: set `path` to the database file", key="path")
        self.db = sqlite3.connect(path, isolation_level=None, timeout=30)
        self.db.executescript(OUTBOX_TABLES)

    def connection(self) -> sqlite3.Connection:
        if self.db is None:
            raise InvalidState("open()", "not opened")
        return self.db

    def schema(self) -> pa.Schema:
        return SCHEMA

    def partitions(self) -> list[str]:
        rows = self.connection().execute(
            "SELECT partition FROM outbox UNION SELECT partition FROM archive ORDER BY 1"
        )
        return [row[0] for row in rows]

    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        partitions = self.partitions()
        for _ in partitions:
            self.cursor %= len(partitions)
            partition = partitions[self.cursor]
            self.cursor += 1
            start = self.positions.get(partition, 0)
            rows = (
                self.connection()
                .execute(
                    "SELECT seq, id FROM (SELECT * FROM archive UNION ALL SELECT * FROM outbox) "
                    "WHERE partition = ? AND seq > ? ORDER BY seq LIMIT ?",
                    (partition, start, max_records),
                )
                .fetchall()
            )
            if rows:
                last = rows[-1][0]
                self.archive(partition, start, last)
                self.positions[partition] = last
                records = pa.record_batch([pa.array([row[1] for row in rows], pa.int64())], SCHEMA)
                return SourceBatch(records, PartitionInfo(partition, str(last)))
        return None

    def archive(self, partition: str, after: int, through: int) -> None:
        db = self.connection()
        db.execute("BEGIN IMMEDIATE")
        db.execute(ARCHIVE, (partition, after, through))
        db.execute(UNQUEUE, (partition, after, through))
        db.execute("COMMIT")

    def checkpoint(self) -> SourceCheckpoint:
        return SourceCheckpoint({p: str(position) for p, position in self.positions.items()})

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        self.positions = {p: int(offset) for p, offset in checkpoint.offsets.items()}

    async def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None


ARCHIVE = "INSERT INTO archive SELECT * FROM outbox WHERE partition = ? AND seq > ? AND seq <= ?"
UNQUEUE = "DELETE FROM outbox WHERE partition = ? AND seq > ? AND seq <= ?"


class OutboxSourceArchivesApart(OutboxSource):
    """Copies the rows to the archive in one transaction and deletes them in a second one."""

    def archive(self, partition: str, after: int, through: int) -> None:
        db = self.connection()
        db.execute("BEGIN IMMEDIATE")
        db.execute(ARCHIVE, (partition, after, through))
        db.execute("COMMIT")
        db.execute("BEGIN IMMEDIATE")
        db.execute(UNQUEUE, (partition, after, through))
        db.execute("COMMIT")


SOURCES: dict[str, type[SourceConnector]] = {
    "outsider-queue-blind-context": QueueSource,
    "outsider-queue": QueueSource,
    "outsider-lists-its-partitions-when-it-opens": ListsItsPartitionsWhenItOpens,
    "outsider-restores-first-partition-only": RestoresFirstPartitionOnly,
    "outsider-restores-nothing": RestoresNothing,
    "outsider-refuses-a-checkpoint-past-the-files": RefusesACheckpointPastTheFiles,
    "outsider-checkpoint-lags-in-one-partition": CheckpointLagsInOnePartition,
    "outsider-checkpoints-the-end-when-caught-up": CheckpointsTheEndWhenCaughtUp,
    "outsider-advances-the-next-partition": AdvancesTheNextPartition,
    "outsider-stamps-in-nanoseconds": StampsInNanoseconds,
    "outsider-queue-on-the-newest-pyarrow": QueueOnTheNewestPyarrow,
    "outsider-infers-its-schema-from-the-data": InfersItsSchemaFromTheData,
    "outsider-acknowledges-on-receipt": AcknowledgesOnReceipt,
    "outsider-queue-ranges": RangeReadableQueue,
    "outsider-plans-from-the-lines-seen-at-open": PlansFromTheLinesSeenAtOpen,
    "outsider-outbox": OutboxSource,
    "outsider-outbox-archives-apart": OutboxSourceArchivesApart,
}


class QueueContext:
    """A fresh queue in ``workdir``; ``append`` writes lines as a producer would."""

    def __init__(self, connector: str, workdir: Path) -> None:
        self.connector = connector
        self.directory = workdir / "queue"
        self.directory.mkdir()

    def config(self) -> ConnectorConfig:
        return ConnectorConfig(self.connector, {"path": str(self.directory)})

    def append(self, ids: Sequence[int], partition: int | None = None) -> None:
        name = PARTITIONS[partition or 0]
        with (self.directory / f"{name}.jsonl").open("a", encoding="utf-8") as file:
            file.writelines(json.dumps({"id": record}) + "\n" for record in ids)
            file.flush()
            os.fsync(file.fileno())

    def remove_partition(self, partition: int) -> None:
        (self.directory / f"{PARTITIONS[partition]}.jsonl").unlink()

    def ids(self, records: pa.RecordBatch) -> list[int]:
        return [int(value) for value in records.column("id").to_pylist()]

    def close(self) -> None:
        pass


class OutboxContext:
    """A fresh outbox database in ``workdir``; ``append`` inserts rows as a producer would."""

    def __init__(self, connector: str, workdir: Path) -> None:
        self.connector = connector
        self.path = workdir / "outbox.db"
        with contextlib.closing(sqlite3.connect(self.path)) as db:
            db.executescript(OUTBOX_TABLES)

    def config(self) -> ConnectorConfig:
        return ConnectorConfig(self.connector, {"path": str(self.path)})

    def append(self, ids: Sequence[int], partition: int | None = None) -> None:
        name = PARTITIONS[partition or 0]
        with contextlib.closing(sqlite3.connect(self.path, timeout=30)) as db, db:
            last = db.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM "
                "(SELECT seq FROM outbox WHERE partition = ? UNION ALL "
                "SELECT seq FROM archive WHERE partition = ?)",
                (name, name),
            ).fetchone()[0]
            rows = [(name, last + 1 + n, record) for n, record in enumerate(ids)]
            db.executemany("INSERT INTO outbox VALUES (?, ?, ?)", rows)

    def ids(self, records: pa.RecordBatch) -> list[int]:
        return [int(value) for value in records.column("id").to_pylist()]

    def close(self) -> None:
        pass


class BlindContext(QueueContext):
    """Appends everything to the first partition, whatever partition the kit names."""

    def append(self, ids: Sequence[int], partition: int | None = None) -> None:
        super().append(ids, None)


# Sinks: SQLite, exactly-once through an epochs table ---------------------------------------


class SqliteSink(SinkConnector):
    """Stages an epoch's ids at ``pre_commit``; publishes them and records the epoch at once."""

    def __init__(self) -> None:
        self.db: sqlite3.Connection | None = None
        self.pending: list[int] = []

    async def open(self, config: ConnectorConfig) -> None:
        path = config.properties.get("path")
        if not path:
            raise ConfigurationError("sqlite sink: set `path` to the database file", key="path")
        self.db = sqlite3.connect(path, check_same_thread=False)
        self.db.executescript(
            "CREATE TABLE IF NOT EXISTS rows (id INTEGER);"
            "CREATE TABLE IF NOT EXISTS staged (epoch INTEGER, id INTEGER);"
            "CREATE TABLE IF NOT EXISTS pre_committed (epoch INTEGER PRIMARY KEY);"
            "CREATE TABLE IF NOT EXISTS epochs (epoch INTEGER PRIMARY KEY);"
        )
        self.db.commit()

    def schema(self) -> pa.Schema:
        return SCHEMA

    def capabilities(self) -> SinkConnectorCapabilities:
        return SinkConnectorCapabilities().with_exactly_once().with_two_phase_commit()

    def connection(self) -> sqlite3.Connection:
        if self.db is None:
            raise InvalidState("open()", "not opened")
        return self.db

    async def begin_epoch(self, epoch: int) -> None:
        self.pending = []

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        if not batch.schema.equals(SCHEMA):
            raise SchemaMismatch(f"expected {SCHEMA}, got {batch.schema}")
        self.pending += batch.column("id").to_pylist()
        return WriteResult(batch.num_rows, batch.nbytes)

    async def pre_commit(self, epoch: int) -> None:
        db = self.connection()
        db.execute("DELETE FROM staged WHERE epoch = ?", (epoch,))
        db.executemany("INSERT INTO staged VALUES (?, ?)", [(epoch, i) for i in self.pending])
        db.execute("INSERT OR REPLACE INTO pre_committed VALUES (?)", (epoch,))
        db.commit()

    def committed(self, epoch: int) -> bool:
        found = self.connection().execute("SELECT 1 FROM epochs WHERE epoch = ?", (epoch,))
        return found.fetchone() is not None

    async def last_committed_epoch(self) -> int:
        newest = self.connection().execute("SELECT coalesce(max(epoch), -1) FROM epochs")
        return int(newest.fetchone()[0])

    async def commit_epoch(self, epoch: int) -> None:
        if self.committed(epoch):
            return
        db = self.connection()
        if db.execute("DELETE FROM pre_committed WHERE epoch = ?", (epoch,)).rowcount == 0:
            db.rollback()
            raise TransactionError(
                f"sqlite sink: epoch {epoch} is not staged any more (rolled back since its "
                "pre-commit, by a newer instance?): nothing to commit"
            )
        db.execute("INSERT INTO rows SELECT id FROM staged WHERE epoch = ?", (epoch,))
        db.execute("INSERT INTO epochs VALUES (?)", (epoch,))
        db.execute("DELETE FROM staged WHERE epoch = ?", (epoch,))
        db.commit()

    async def rollback_epoch(self, epoch: int) -> None:
        self.pending = []
        db = self.connection()
        db.execute("DELETE FROM staged WHERE epoch = ?", (epoch,))
        db.execute("DELETE FROM pre_committed WHERE epoch = ?", (epoch,))
        db.commit()

    async def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None


class SqliteSinkCommitsWhatIsLeft(SqliteSink):
    """Commits whatever of an epoch is staged: after a newer instance rolled the epoch back,
    an old instance that goes on publishes it empty, and records it as committed."""

    async def commit_epoch(self, epoch: int) -> None:
        if self.committed(epoch):
            return
        db = self.connection()
        db.execute("INSERT INTO rows SELECT id FROM staged WHERE epoch = ?", (epoch,))
        db.execute("INSERT INTO epochs VALUES (?)", (epoch,))
        db.execute("DELETE FROM staged WHERE epoch = ?", (epoch,))
        db.commit()


LAG_COUNTER_VARIABLE = "LAMINAR_OUTSIDER_LAG_COUNTER"
"""A file counting the lagging sink's restarts: with it, the first restart of three lags."""


def _one_time_in_three() -> bool:
    """Whether the replica lags this time: one time in three (counted, when a file is set)."""
    counter = os.environ.get(LAG_COUNTER_VARIABLE)
    if counter is None:
        return random.random() < 1 / 3
    path = Path(counter)
    count = int(path.read_text()) if path.exists() else 0
    path.write_text(str(count + 1))
    return count % 3 == 0


class SqliteSinkReadsALaggingReplica(SqliteSink):
    """Looks up committed epochs on a read replica, which after a restart lags one time in
    three: an epoch delivered again is then committed again."""

    lagging = False

    async def open(self, config: ConnectorConfig) -> None:
        await super().open(config)
        self.lagging = await self.last_committed_epoch() >= 0 and _one_time_in_three()

    def committed(self, epoch: int) -> bool:
        return not self.lagging and super().committed(epoch)


class SqliteSinkMarkerApart(SqliteSink):
    """Publishes the rows in one transaction and records the epoch in a second one.

    In a worker thread, as async code runs blocking I/O: the kit must find the commits there.
    """

    async def commit_epoch(self, epoch: int) -> None:
        await asyncio.to_thread(self._publish, epoch)

    def _publish(self, epoch: int) -> None:
        if self.committed(epoch):
            return
        db = self.connection()
        db.execute("INSERT INTO rows SELECT id FROM staged WHERE epoch = ?", (epoch,))
        db.commit()
        db.execute("INSERT INTO epochs VALUES (?)", (epoch,))
        db.execute("DELETE FROM staged WHERE epoch = ?", (epoch,))
        db.commit()


# Sinks: JSON-lines files, exactly-once by renaming a staged file ----------------------------


JSONL_TOKEN = "outsider-token-0f3a9c"
"""The secret the JSON-lines sinks' context configures: no output may show it."""


class JsonLinesSink(SinkConnector):
    """Stages an epoch in ``staging/N.jsonl``; publishes it by renaming it to ``out/N.jsonl``.

    Its ``token`` (a service's API token, in the plugin it was cut from) is taken and unused.
    """

    def __init__(self) -> None:
        self.directory = Path()
        self.file: TextIO | None = None

    async def open(self, config: ConnectorConfig) -> None:
        path = config.properties.get("path")
        if not path:
            raise ConfigurationError("jsonl sink: set `path` to a directory", key="path")
        self.directory = Path(path)
        (self.directory / "staging").mkdir(parents=True, exist_ok=True)
        (self.directory / "out").mkdir(exist_ok=True)

    def schema(self) -> pa.Schema:
        return SCHEMA

    def capabilities(self) -> SinkConnectorCapabilities:
        return SinkConnectorCapabilities().with_exactly_once().with_two_phase_commit()

    def staged(self, epoch: int) -> Path:
        return self.directory / "staging" / f"{epoch}.jsonl"

    def published(self, epoch: int) -> Path:
        return self.directory / "out" / f"{epoch}.jsonl"

    async def last_committed_epoch(self) -> int:
        published = (self.directory / "out").glob("*.jsonl")
        return max((int(path.stem) for path in published), default=-1)

    async def begin_epoch(self, epoch: int) -> None:
        self.discard()
        self.file = self.staged(epoch).open("w", encoding="utf-8")

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        if not batch.schema.equals(SCHEMA):
            raise SchemaMismatch(f"expected {SCHEMA}, got {batch.schema}")
        if self.file is None:
            raise InvalidState("begin_epoch()", "no epoch is open")
        self.file.writelines(json.dumps({"id": i}) + "\n" for i in batch.column("id").to_pylist())
        return WriteResult(batch.num_rows, batch.nbytes)

    async def pre_commit(self, epoch: int) -> None:
        if self.file is not None:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.discard()

    async def commit_epoch(self, epoch: int) -> None:
        self.discard()
        if self.published(epoch).exists():  # delivered again after a restart
            self.staged(epoch).unlink(missing_ok=True)
            return
        os.replace(self.staged(epoch), self.published(epoch))

    async def rollback_epoch(self, epoch: int) -> None:
        self.discard()
        self.staged(epoch).unlink(missing_ok=True)

    def discard(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    async def close(self) -> None:
        self.discard()


class JsonLinesSinkLogsItsConfiguration(JsonLinesSink):
    """Logs what it opened with at DEBUG, its configuration's properties (``token`` too)."""

    async def open(self, config: ConnectorConfig) -> None:
        logging.getLogger("outsider.jsonl").debug("opening with %s", config.properties)
        await super().open(config)


class JsonLinesSinkBufferedPreCommit(JsonLinesSink):
    """Leaves the staged rows in the file's buffer at ``pre_commit``: they reach the disk when
    ``commit_epoch`` closes the file, so a process killed in between loses them."""

    async def pre_commit(self, epoch: int) -> None:
        pass


UNSIGNED = pa.schema([("id", pa.uint64())])


class JsonLinesSinkOfUnsignedIds(JsonLinesSink):
    """Takes its ids as unsigned integers, as its upstream system keeps them."""

    def schema(self) -> pa.Schema:
        return UNSIGNED

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        if not batch.schema.equals(UNSIGNED):
            raise SchemaMismatch(f"expected {UNSIGNED}, got {batch.schema}")
        return await super().write_batch(batch.cast(SCHEMA))


class JsonLinesContext:
    """A fresh directory in ``workdir``; what a reader of its published files sees."""

    def __init__(self, connector: str, workdir: Path) -> None:
        self.connector = connector
        self.directory = workdir / "jsonl"
        self.schema = UNSIGNED if connector == "outsider-jsonl-unsigned-ids" else SCHEMA

    def config(self) -> ConnectorConfig:
        properties = {"path": str(self.directory), "token": JSONL_TOKEN}
        return ConnectorConfig(self.connector, properties)

    def batch(self, ids: Sequence[int]) -> pa.RecordBatch:
        return pa.record_batch([pa.array(list(ids), self.schema.field("id").type)], self.schema)

    def committed_ids(self) -> list[int]:
        files = sorted((self.directory / "out").glob("*.jsonl"))
        return [json.loads(line)["id"] for file in files for line in _lines(file)]

    def close(self) -> None:
        pass


SINKS: dict[str, type[SqliteSink] | type[JsonLinesSink]] = {
    "outsider-sqlite": SqliteSink,
    "outsider-sqlite-marker-apart": SqliteSinkMarkerApart,
    "outsider-sqlite-commits-what-is-left": SqliteSinkCommitsWhatIsLeft,
    "outsider-sqlite-reads-a-lagging-replica": SqliteSinkReadsALaggingReplica,
    "outsider-jsonl": JsonLinesSink,
    "outsider-jsonl-buffered-pre-commit": JsonLinesSinkBufferedPreCommit,
    "outsider-jsonl-logs-its-configuration": JsonLinesSinkLogsItsConfiguration,
    "outsider-jsonl-unsigned-ids": JsonLinesSinkOfUnsignedIds,
}


class SqliteContext:
    """A fresh database file in ``workdir``; what a reader of ``rows`` sees."""

    def __init__(self, connector: str, workdir: Path) -> None:
        self.connector = connector
        self.path = workdir / "sink.db"

    def config(self) -> ConnectorConfig:
        return ConnectorConfig(self.connector, {"path": str(self.path)})

    def batch(self, ids: Sequence[int]) -> pa.RecordBatch:
        return pa.record_batch([pa.array(list(ids), pa.int64())], schema=SCHEMA)

    def committed_ids(self) -> list[int]:
        if not self.path.exists():
            return []
        with contextlib.closing(sqlite3.connect(self.path)) as db:
            try:
                return [row[0] for row in db.execute("SELECT id FROM rows")]
            except sqlite3.OperationalError:  # no table yet
                return []

    def close(self) -> None:
        pass


@hookimpl
def laminar_register_connectors(registry: ConnectorRegistry) -> None:
    for name, source in SOURCES.items():
        registry.add_source(
            name, source, config_keys=[ConfigKeySpec("path", required=True)], description=name
        )
    for name, sink in SINKS.items():
        keys = [ConfigKeySpec("path", required=True)]
        if name.startswith("outsider-jsonl"):
            keys.append(ConfigKeySpec("token", description="the service's API token"))
        registry.add_sink(name, sink, config_keys=keys, description=name)


@hookimpl
def laminar_conformance_context(
    connector: str, role: str, workdir: Path
) -> QueueContext | OutboxContext | SqliteContext | JsonLinesContext | None:
    if role == "sink" and connector.startswith("outsider-jsonl"):
        return JsonLinesContext(connector, workdir)
    if role == "sink" and connector in SINKS:
        return SqliteContext(connector, workdir)
    if role != "source" or connector not in SOURCES:
        return None
    if connector == "outsider-queue-blind-context":
        return BlindContext(connector, workdir)
    if connector.startswith("outsider-outbox"):
        return OutboxContext(connector, workdir)
    return QueueContext(connector, workdir)
