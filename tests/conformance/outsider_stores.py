"""Exactly-once sinks an outside author writes for five stores the kit was never tuned to.

Each sink buffers an epoch's ids, stages them durably at ``pre_commit`` and, at
``commit_epoch``, moves them to the rows a reader sees and records the epoch as committed --
in one transaction (``outsider-<store>``) or, the bug this module exists for, in two
(``outsider-<store>-marker-apart``): a crash between the two publishes an epoch that a new
instance, finding no record of it, publishes again. Each store commits in a way no name list
would know:

- ``sqlite-sql``: ``sqlite3`` in autocommit mode, the transaction opened and committed by SQL
  statements run through ``execute`` (``BEGIN`` / ``COMMIT``);
- ``sqlite-thread``: the same, every statement run on a writer thread the sink starts;
- ``duckdb``: an embedded analytical database (a pybind11 binding);
- ``lmdb``: an embedded key-value store, committed when its ``with`` block ends;
- ``psycopg``: PostgreSQL through psycopg 3 (Cython), on the kit's server;
- ``journal``: a C library built for this test and called through ``ctypes``, whose commit
  is ``tj_seal`` (it writes and fsyncs what was appended since the last seal).

No sink marks a crash point, and no context states anything: the kit must find the points
by itself. Used with ``--plugin outsider_stores``; the PostgreSQL context uses the kit's
``postgres_service`` as an author's tests would.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import functools
import hashlib
import os
import queue
import shutil
import sqlite3
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import lmdb
import psycopg
import pyarrow as pa

from laminar_sdk import (
    ConfigKeySpec,
    ConfigurationError,
    ConnectorConfig,
    ConnectorRegistry,
    SchemaMismatch,
    SinkConnector,
    SinkConnectorCapabilities,
    WriteResult,
    hookimpl,
)

SCHEMA = pa.schema([("id", pa.int64())])


class StoreSink(SinkConnector):
    """The epoch logic every store shares; a store supplies its storage calls."""

    marker_apart = False
    """Whether ``commit_epoch`` commits the rows and the epoch's record apart (the bug)."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        self.target = ""

    async def open(self, config: ConnectorConfig) -> None:
        target = config.properties.get("target")
        if not target:
            raise ConfigurationError("set `target` to the store", key="target")
        self.target = target
        self.connect()

    def schema(self) -> pa.Schema:
        return SCHEMA

    def capabilities(self) -> SinkConnectorCapabilities:
        return SinkConnectorCapabilities().with_exactly_once().with_two_phase_commit()

    async def begin_epoch(self, epoch: int) -> None:
        self.pending = []

    async def write_batch(self, batch: pa.RecordBatch) -> WriteResult:
        if not batch.schema.equals(SCHEMA):
            raise SchemaMismatch(f"expected {SCHEMA}, got {batch.schema}")
        self.pending += batch.column("id").to_pylist()
        return WriteResult(batch.num_rows, batch.nbytes)

    async def pre_commit(self, epoch: int) -> None:
        self.stage(epoch, self.pending)

    async def commit_epoch(self, epoch: int) -> None:
        if self.committed(epoch):
            return
        if self.marker_apart:
            self.publish(epoch)
            self.record(epoch)
        else:
            self.publish_and_record(epoch)

    async def rollback_epoch(self, epoch: int) -> None:
        self.pending = []
        self.unstage(epoch)

    async def last_committed_epoch(self) -> int:
        return self.last_committed()

    async def close(self) -> None:
        self.disconnect()

    # What a store supplies.
    def connect(self) -> None:
        raise NotImplementedError

    def disconnect(self) -> None:
        raise NotImplementedError

    def stage(self, epoch: int, ids: list[int]) -> None:
        raise NotImplementedError

    def unstage(self, epoch: int) -> None:
        raise NotImplementedError

    def committed(self, epoch: int) -> bool:
        raise NotImplementedError

    def last_committed(self) -> int:
        raise NotImplementedError

    def publish(self, epoch: int) -> None:
        raise NotImplementedError

    def record(self, epoch: int) -> None:
        raise NotImplementedError

    def publish_and_record(self, epoch: int) -> None:
        raise NotImplementedError


# SQL stores: the same statements, each store's way of running a transaction -----------------

_SQL_TABLES = (
    "CREATE TABLE IF NOT EXISTS {p}rows (id BIGINT)",
    "CREATE TABLE IF NOT EXISTS {p}staged (epoch BIGINT, id BIGINT)",
    "CREATE TABLE IF NOT EXISTS {p}epochs (epoch BIGINT PRIMARY KEY)",
)


class SqlStoreSink(StoreSink):
    """Staging, rows and epochs tables; a store supplies ``transaction`` and ``run``."""

    prefix = ""

    def transaction(self) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    def run(self, statement: str, *params: object) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def create_tables(self) -> None:
        with self.transaction():
            for statement in _SQL_TABLES:
                self.run(statement.format(p=self.prefix))

    def stage(self, epoch: int, ids: list[int]) -> None:
        with self.transaction():
            self.run(f"DELETE FROM {self.prefix}staged WHERE epoch = ?", epoch)
            for record in ids:
                self.run(f"INSERT INTO {self.prefix}staged VALUES (?, ?)", epoch, record)

    def unstage(self, epoch: int) -> None:
        with self.transaction():
            self.run(f"DELETE FROM {self.prefix}staged WHERE epoch = ?", epoch)

    def committed(self, epoch: int) -> bool:
        return bool(self.run(f"SELECT epoch FROM {self.prefix}epochs WHERE epoch = ?", epoch))

    def last_committed(self) -> int:
        return int(self.run(f"SELECT coalesce(max(epoch), -1) FROM {self.prefix}epochs")[0][0])

    def _publish(self, epoch: int) -> None:
        self.run(
            f"INSERT INTO {self.prefix}rows SELECT id FROM {self.prefix}staged WHERE epoch = ?",
            epoch,
        )

    def _record(self, epoch: int) -> None:
        self.run(f"INSERT INTO {self.prefix}epochs VALUES (?)", epoch)
        self.run(f"DELETE FROM {self.prefix}staged WHERE epoch = ?", epoch)

    def publish(self, epoch: int) -> None:
        with self.transaction():
            self._publish(epoch)

    def record(self, epoch: int) -> None:
        with self.transaction():
            self._record(epoch)

    def publish_and_record(self, epoch: int) -> None:
        with self.transaction():
            self._publish(epoch)
            self._record(epoch)


class SqliteSqlSink(SqlStoreSink):
    """``sqlite3`` in autocommit mode; ``BEGIN`` and ``COMMIT`` are statements it executes."""

    db: sqlite3.Connection | None = None

    def connect(self) -> None:
        self.db = sqlite3.connect(self.target, isolation_level=None, check_same_thread=False)
        self.create_tables()

    def disconnect(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None

    @contextlib.contextmanager
    def transaction(self) -> Any:
        self.run("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.run("ROLLBACK")
            raise
        self.run("COMMIT")

    def run(self, statement: str, *params: object) -> list[tuple[Any, ...]]:
        assert self.db is not None
        return self.db.execute(statement, params).fetchall()


class WriterThreadSink(SqliteSqlSink):
    """The same statements, each run on a writer thread the sink starts when it opens."""

    def connect(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Any, concurrent.futures.Future[Any]] | None]
        self.jobs = queue.SimpleQueue()
        self.writer = threading.Thread(target=self.work, name="outsider-writer", daemon=True)
        self.writer.start()
        super().connect()

    def disconnect(self) -> None:
        super().disconnect()
        self.jobs.put(None)
        self.writer.join()

    def work(self) -> None:
        while (job := self.jobs.get()) is not None:
            statement, done = job
            try:
                done.set_result(statement())
            except BaseException as error:  # handed to the caller, who raises it
                done.set_exception(error)

    def run(self, statement: str, *params: object) -> list[tuple[Any, ...]]:
        done: concurrent.futures.Future[list[tuple[Any, ...]]] = concurrent.futures.Future()
        self.jobs.put((functools.partial(super().run, statement, *params), done))
        return done.result()


class DuckdbSink(SqlStoreSink):
    """DuckDB, a file database: ``begin()`` / ``commit()`` on its connection."""

    con: duckdb.DuckDBPyConnection | None = None

    def connect(self) -> None:
        self.con = duckdb.connect(self.target)
        self.create_tables()

    def disconnect(self) -> None:
        if self.con is not None:
            self.con.close()
            self.con = None

    @contextlib.contextmanager
    def transaction(self) -> Any:
        assert self.con is not None
        self.con.begin()
        try:
            yield
        except BaseException:
            self.con.rollback()
            raise
        self.con.commit()

    def run(self, statement: str, *params: object) -> list[tuple[Any, ...]]:
        assert self.con is not None
        return self.con.execute(statement, list(params)).fetchall()


class PsycopgSink(SqlStoreSink):
    """PostgreSQL through psycopg 3: ``with conn.transaction()``; the target is the dsn."""

    conn: psycopg.Connection[Any] | None = None

    def connect(self) -> None:
        dsn, _, self.prefix = self.target.partition("#")
        self.conn = psycopg_connect(dsn)
        self.create_tables()

    def disconnect(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def transaction(self) -> contextlib.AbstractContextManager[None]:
        assert self.conn is not None
        return self.conn.transaction()  # type: ignore[return-value]

    def run(self, statement: str, *params: object) -> list[tuple[Any, ...]]:
        assert self.conn is not None
        cursor = self.conn.execute(statement.replace("?", "%s"), params)
        return cursor.fetchall() if cursor.description else []


# LMDB: a key-value store; a write transaction commits when its block ends ------------------


class LmdbSink(StoreSink):
    """Three named databases: rows by number, staged ids by ``epoch/index``, epochs."""

    env: Any = None

    def connect(self) -> None:
        self.env = lmdb.open(self.target, max_dbs=3, subdir=True, map_size=1 << 24)
        self.rows = self.env.open_db(b"rows")
        self.staged = self.env.open_db(b"staged")
        self.epochs = self.env.open_db(b"epochs")

    def disconnect(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None

    @staticmethod
    def key(*parts: int) -> bytes:
        return b"".join(part.to_bytes(8, "big") for part in parts)

    def stage(self, epoch: int, ids: list[int]) -> None:
        with self.env.begin(write=True, db=self.staged) as txn:
            self._unstage(txn, epoch)
            for index, record in enumerate(ids):
                txn.put(self.key(epoch, index), record.to_bytes(8, "big", signed=True))

    def _unstage(self, txn: Any, epoch: int) -> None:
        cursor = txn.cursor(db=self.staged)
        if cursor.set_range(self.key(epoch)):
            while cursor.key()[:8] == self.key(epoch) and cursor.delete():
                pass

    def unstage(self, epoch: int) -> None:
        with self.env.begin(write=True, db=self.staged) as txn:
            self._unstage(txn, epoch)

    def committed(self, epoch: int) -> bool:
        with self.env.begin(db=self.epochs) as txn:
            return txn.get(self.key(epoch)) is not None

    def last_committed(self) -> int:
        with self.env.begin(db=self.epochs) as txn:
            cursor = txn.cursor()
            return int.from_bytes(cursor.key(), "big") if cursor.last() else -1

    def _publish(self, txn: Any, epoch: int) -> None:
        staged = txn.cursor(db=self.staged)
        if staged.set_range(self.key(epoch)):
            for key, value in staged:
                if key[:8] != self.key(epoch):
                    break
                # Appended under the next free number, as a table's auto-increment would.
                txn.put(self.key(txn.stat(self.rows)["entries"]), value, db=self.rows)

    def _record(self, txn: Any, epoch: int) -> None:
        txn.put(self.key(epoch), b"", db=self.epochs)
        self._unstage(txn, epoch)

    def publish(self, epoch: int) -> None:
        with self.env.begin(write=True) as txn:
            self._publish(txn, epoch)

    def record(self, epoch: int) -> None:
        with self.env.begin(write=True) as txn:
            self._record(txn, epoch)

    def publish_and_record(self, epoch: int) -> None:
        with self.env.begin(write=True) as txn:
            self._publish(txn, epoch)
            self._record(txn, epoch)


def lmdb_rows(path: str) -> list[int]:
    if not Path(path).exists():
        return []
    env = lmdb.open(path, max_dbs=3, subdir=True, map_size=1 << 24, readonly=True, lock=False)
    try:
        rows = env.open_db(b"rows", create=False)
        with env.begin(db=rows) as txn:
            return [int.from_bytes(value, "big", signed=True) for _, value in txn.cursor()]
    except lmdb.NotFoundError:
        return []
    finally:
        env.close()


# A C library through ctypes: a journal of records, made durable by ``tj_seal`` -------------

_JOURNAL_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>

typedef struct { int fd; char *buffer; size_t used, size; } journal;

journal *tj_open(const char *path) {
    journal *j = calloc(1, sizeof(journal));
    j->fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (j->fd < 0) { free(j); return NULL; }
    return j;
}

/* Appends one record to the journal's buffer: nothing reaches the file before tj_seal. */
void tj_note(journal *j, char kind, long long epoch, long long id) {
    char line[64];
    int length = snprintf(line, sizeof line, "%c %lld %lld\n", kind, epoch, id);
    if (j->used + length > j->size) {
        j->size = (j->used + length) * 2;
        j->buffer = realloc(j->buffer, j->size);
    }
    memcpy(j->buffer + j->used, line, length);
    j->used += length;
}

/* Writes what was noted since the last seal in one write, then fsyncs: the commit. */
int tj_seal(journal *j) {
    size_t done = 0;
    while (done < j->used) {
        ssize_t written = write(j->fd, j->buffer + done, j->used - done);
        if (written < 0) return -1;
        done += written;
    }
    j->used = 0;
    return fsync(j->fd);
}

void tj_close(journal *j) { close(j->fd); free(j->buffer); free(j); }
"""


@functools.cache
def journal_library() -> ctypes.CDLL:
    """The journal library, compiled with ``cc`` into the temporary directory once."""
    digest = hashlib.sha256(_JOURNAL_C.encode()).hexdigest()[:16]
    library = Path(tempfile.gettempdir()) / f"laminar-test-journal-{digest}.so"
    if not library.exists():
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            raise ConfigurationError("the journal sink's test library needs a C compiler (cc)")
        source = library.with_suffix(".c")
        source.write_text(_JOURNAL_C)
        partial = library.with_suffix(f".{uuid.uuid4().hex}.tmp")
        subprocess.run(
            [compiler, "-shared", "-fPIC", "-O1", "-o", str(partial), str(source)], check=True
        )
        partial.replace(library)
    found = ctypes.CDLL(str(library))
    found.tj_open.restype = ctypes.c_void_p
    found.tj_open.argtypes = [ctypes.c_char_p]
    found.tj_note.argtypes = [ctypes.c_void_p, ctypes.c_char, ctypes.c_longlong, ctypes.c_longlong]
    found.tj_seal.argtypes = [ctypes.c_void_p]
    found.tj_close.argtypes = [ctypes.c_void_p]
    return found


def read_journal(path: str) -> tuple[list[int], dict[int, list[int]], set[int]]:
    """The rows, the staged ids by epoch and the committed epochs a journal holds."""
    rows: list[int] = []
    staged: dict[int, list[int]] = {}
    committed: set[int] = set()
    lines = Path(path).read_text().splitlines() if Path(path).exists() else []
    for line in lines:
        kind, epoch, record = line.split()
        if kind == "S":
            staged.setdefault(int(epoch), []).append(int(record))
        elif kind == "X":
            staged.pop(int(epoch), None)
        elif kind == "R":
            rows.append(int(record))
        elif kind == "M":
            committed.add(int(epoch))
            staged.pop(int(epoch), None)
    return rows, staged, committed


class JournalSink(StoreSink):
    """Stages (``S``), publishes (``R``) and records (``M``) epochs in a sealed journal."""

    handle: int | None = None

    def connect(self) -> None:
        self.library = journal_library()
        self.handle = self.library.tj_open(self.target.encode())
        if not self.handle:
            raise ConfigurationError(f"cannot open the journal {self.target}", key="target")

    def disconnect(self) -> None:
        if self.handle:
            self.library.tj_close(self.handle)
            self.handle = None

    def stage(self, epoch: int, ids: list[int]) -> None:
        self.library.tj_note(self.handle, b"X", epoch, 0)
        for record in ids:
            self.library.tj_note(self.handle, b"S", epoch, record)
        self.library.tj_seal(self.handle)

    def unstage(self, epoch: int) -> None:
        self.library.tj_note(self.handle, b"X", epoch, 0)
        self.library.tj_seal(self.handle)

    def committed(self, epoch: int) -> bool:
        return epoch in read_journal(self.target)[2]

    def last_committed(self) -> int:
        return max(read_journal(self.target)[2], default=-1)

    def _publish(self, epoch: int) -> None:
        for record in read_journal(self.target)[1].get(epoch, []):
            self.library.tj_note(self.handle, b"R", epoch, record)

    def publish(self, epoch: int) -> None:
        self._publish(epoch)
        self.library.tj_seal(self.handle)

    def record(self, epoch: int) -> None:
        self.library.tj_note(self.handle, b"M", epoch, 0)
        self.library.tj_seal(self.handle)

    def publish_and_record(self, epoch: int) -> None:
        self._publish(epoch)
        self.library.tj_note(self.handle, b"M", epoch, 0)
        self.library.tj_seal(self.handle)


STORES: dict[str, type[StoreSink]] = {
    "sqlite-sql": SqliteSqlSink,
    "sqlite-thread": WriterThreadSink,
    "duckdb": DuckdbSink,
    "lmdb": LmdbSink,
    "psycopg": PsycopgSink,
    "journal": JournalSink,
}


def _marker_apart(store: type[StoreSink]) -> type[StoreSink]:
    return type(f"{store.__name__}MarkerApart", (store,), {"marker_apart": True})


SINKS = {
    **{f"outsider-{name}": store for name, store in STORES.items()},
    **{f"outsider-{name}-marker-apart": _marker_apart(store) for name, store in STORES.items()},
}


# Test contexts ------------------------------------------------------------------------------


@functools.cache
def postgres_dsn() -> str:
    """The kit's PostgreSQL server, started once for this process.

    Its password file (if any) is named in ``LAMINAR_TEST_PASSWORD_FILE``: a child process
    the kit starts inherits the variable, so its sink connects with it too.
    """
    import atexit  # noqa: PLC0415

    from laminar_conformance.services import postgres_service  # noqa: PLC0415

    stack = contextlib.ExitStack()
    service = stack.enter_context(postgres_service())
    atexit.register(stack.close)
    if service.password_file is not None:
        os.environ["LAMINAR_TEST_PASSWORD_FILE"] = str(service.password_file)
    return service.dsn


def psycopg_connect(dsn: str) -> psycopg.Connection[Any]:
    """An autocommit connection, with the test server's password when it has one."""
    password_file = os.environ.get("LAMINAR_TEST_PASSWORD_FILE")
    if password_file is None:
        return psycopg.connect(dsn, autocommit=True)
    password = Path(password_file).read_text().splitlines()[0]
    return psycopg.connect(dsn, autocommit=True, password=password)


def psycopg_rows(prefix: str) -> list[int]:
    with psycopg_connect(postgres_dsn()) as conn:
        found = conn.execute("SELECT to_regclass(%s)", (f"{prefix}rows",)).fetchone()
        if found is None or found[0] is None:
            return []
        return [row[0] for row in conn.execute(f"SELECT id FROM {prefix}rows")]


def duckdb_rows(path: str) -> list[int]:
    if not Path(path).exists():
        return []
    with contextlib.closing(duckdb.connect(path)) as con:
        return [row[0] for row in con.execute("SELECT id FROM rows").fetchall()]


def sqlite_rows(path: str) -> list[int]:
    if not Path(path).exists():
        return []
    with contextlib.closing(sqlite3.connect(path)) as db:
        return [row[0] for row in db.execute("SELECT id FROM rows")]


def journal_rows(path: str) -> list[int]:
    return read_journal(path)[0]


class StoreContext:
    """A fresh store per case, and the ids its ``rows`` hold."""

    def __init__(self, connector: str, workdir: Path) -> None:
        self.connector = connector
        self.store = connector.removeprefix("outsider-").removesuffix("-marker-apart")
        self.prefix = f"t{uuid.uuid4().hex[:12]}_"
        names = {
            "sqlite-sql": "sink.db",
            "sqlite-thread": "sink.db",
            "duckdb": "sink.duckdb",
            "journal": "journal.log",
        }
        self.path = str(workdir / names.get(self.store, "lmdb"))

    @property
    def target(self) -> str:
        return f"{postgres_dsn()}#{self.prefix}" if self.store == "psycopg" else self.path

    def config(self) -> ConnectorConfig:
        return ConnectorConfig(self.connector, {"target": self.target})

    def batch(self, ids: Sequence[int]) -> pa.RecordBatch:
        return pa.record_batch([pa.array(list(ids), pa.int64())], schema=SCHEMA)

    def committed_ids(self) -> list[int]:
        if self.store == "psycopg":
            return psycopg_rows(self.prefix)
        reader = {"lmdb": lmdb_rows, "journal": journal_rows, "duckdb": duckdb_rows}
        return reader.get(self.store, sqlite_rows)(self.path)

    def close(self) -> None:
        if self.store == "psycopg":
            with psycopg_connect(postgres_dsn()) as conn:
                for table in ("rows", "staged", "epochs"):
                    conn.execute(f"DROP TABLE IF EXISTS {self.prefix}{table}")


@hookimpl
def laminar_register_connectors(registry: ConnectorRegistry) -> None:
    for name, sink in SINKS.items():
        registry.add_sink(
            name, sink, config_keys=[ConfigKeySpec("target", required=True)], description=name
        )


@hookimpl
def laminar_conformance_context(connector: str, role: str, workdir: Path) -> StoreContext | None:
    if role == "sink" and connector in SINKS:
        return StoreContext(connector, workdir)
    return None
