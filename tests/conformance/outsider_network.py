"""A PostgreSQL sink an outside author writes with pg8000, with and without a network timeout.

pg8000 is a pure-Python driver, synchronous: the author calls it straight from the sink's
coroutines, as its documentation shows. ``outsider-pg8000`` connects with ``timeout=`` (pg8000's
socket timeout) and turns the driver's network errors into ``ConnectionFailed`` naming the
server's ``host:port``; it stages an epoch's ids at ``pre_commit`` and publishes them with the
epoch's record in one transaction. ``outsider-pg8000-without-a-timeout`` leaves pg8000's default,
no timeout: when its connection goes silent (a partition, a dead router) a call waits forever,
and blocks the event loop, so the runtime's own call timeout cannot end it either.

The test context names the server's address (``network_endpoint``) and gives a configuration
pointed at another (``config_through``), so that the kit's network-fault checks put a proxy in
between; the server is the kit's ``postgres_service``, as in ``outsider_stores``.

``outsider-http`` is a source an author writes for an HTTP event API with the standard library:
``urllib.request.urlopen`` with a ``timeout``, called straight from ``poll_batch``, its errors
turned into ``ReadError`` naming the URL; ``outsider-http-without-a-timeout`` leaves urllib's
default, none: a poll on a connection that goes silent never returns. The API is a small
``http.server`` the context runs. Used with ``--plugin outsider_network``.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pg8000.native
import psycopg
import pyarrow as pa
from outsider_stores import SCHEMA, postgres_dsn, psycopg_connect, psycopg_rows

from laminar_sdk import (
    ConfigKeySpec,
    ConnectionFailed,
    ConnectorConfig,
    ConnectorRegistry,
    PartitionInfo,
    ReadError,
    SchemaMismatch,
    SinkConnector,
    SinkConnectorCapabilities,
    SourceBatch,
    SourceCheckpoint,
    SourceConnector,
    WriteError,
    WriteResult,
    hookimpl,
)

KEYS = ("host", "port", "database", "user", "prefix")
ROLE, PASSWORD = "pg8000_outsider", "outsider-password"


class Pg8000Sink(SinkConnector):
    """Exactly once: ids staged at ``pre_commit``, published with the epoch's record at once."""

    TIMEOUT_S: float | None = 3.0
    """pg8000's socket timeout (``None``: wait forever)."""

    def __init__(self) -> None:
        self.con: pg8000.native.Connection | None = None
        self.settings: dict[str, str] = {}
        self.pending: list[int] = []

    async def open(self, config: ConnectorConfig) -> None:
        self.settings = {key: config.require(key) for key in (*KEYS, "password")}
        self.run(
            f"CREATE TABLE IF NOT EXISTS {self.table('rows')} (id bigint);"
            f"CREATE TABLE IF NOT EXISTS {self.table('staged')} (epoch int, id bigint);"
            f"CREATE TABLE IF NOT EXISTS {self.table('epochs')} (epoch int PRIMARY KEY)"
        )

    def table(self, name: str) -> str:
        return f"{self.settings['prefix']}{name}"

    def run(self, statement: str, **params: Any) -> list[list[Any]]:
        host, port = self.settings["host"], self.settings["port"]
        try:
            if self.con is None:
                self.con = pg8000.native.Connection(
                    self.settings["user"],
                    host=host,
                    port=int(port),
                    database=self.settings["database"],
                    password=self.settings["password"],
                    timeout=self.TIMEOUT_S,
                )
            return self.con.run(statement, **params) or []
        except (pg8000.native.InterfaceError, OSError) as error:
            self.drop_connection()
            raise ConnectionFailed(f"pg8000 sink: the server at {host}:{port}: {error}") from None
        except pg8000.native.DatabaseError as error:
            self.drop_connection()
            raise WriteError(f"pg8000 sink: {error}") from None

    def drop_connection(self) -> None:
        con, self.con = self.con, None
        if con is not None:
            with contextlib.suppress(pg8000.native.InterfaceError, OSError):
                con.close()  # a broken connection cannot say goodbye

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
        staged = self.table("staged")
        self.run("START TRANSACTION")
        self.run(f"DELETE FROM {staged} WHERE epoch = :epoch", epoch=epoch)
        self.run(
            f"INSERT INTO {staged} SELECT :epoch, unnest(CAST(:ids AS bigint[]))",
            epoch=epoch,
            ids=self.pending,
        )
        self.run("COMMIT")

    async def last_committed_epoch(self) -> int:
        return int(self.run(f"SELECT coalesce(max(epoch), -1) FROM {self.table('epochs')}")[0][0])

    async def commit_epoch(self, epoch: int) -> None:
        rows, staged, epochs = self.table("rows"), self.table("staged"), self.table("epochs")
        self.run("START TRANSACTION")
        if self.run(f"SELECT 1 FROM {epochs} WHERE epoch = :epoch", epoch=epoch):
            self.run("ROLLBACK")
            return
        self.run(f"INSERT INTO {rows} SELECT id FROM {staged} WHERE epoch = :epoch", epoch=epoch)
        self.run(f"INSERT INTO {epochs} VALUES (:epoch)", epoch=epoch)
        self.run(f"DELETE FROM {staged} WHERE epoch = :epoch", epoch=epoch)
        self.run("COMMIT")

    async def rollback_epoch(self, epoch: int) -> None:
        self.pending = []
        self.run(f"DELETE FROM {self.table('staged')} WHERE epoch = :epoch", epoch=epoch)

    async def close(self) -> None:
        self.drop_connection()


class Pg8000SinkWithoutATimeout(Pg8000Sink):
    """pg8000's default: no socket timeout."""

    TIMEOUT_S = None


SINKS = {
    "outsider-pg8000": Pg8000Sink,
    "outsider-pg8000-without-a-timeout": Pg8000SinkWithoutATimeout,
}


@functools.cache
def sink_role() -> None:
    """A role for the sink, its password hashed as the server does by default.

    The kit's server keeps its own user's password hashed with few rounds, for speed; pg8000's
    SCRAM library refuses a server that asks for fewer than 4096.
    """
    with psycopg_connect(postgres_dsn()) as conn:
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (ROLE,)).fetchone():
            conn.execute(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{PASSWORD}'")
            conn.execute(f"GRANT CREATE ON SCHEMA public TO {ROLE}")


class Pg8000Context:
    """Three fresh tables on the kit's server; the ids a reader of the rows table sees."""

    def __init__(self, connector: str) -> None:
        self.connector = connector
        self.prefix = f"pg8000_{uuid.uuid4().hex[:12]}_"
        self.server = psycopg.conninfo.conninfo_to_dict(postgres_dsn())
        sink_role()

    @property
    def network_endpoint(self) -> str:
        return f"{self.server['host']}:{self.server['port']}"

    def config(self) -> ConnectorConfig:
        return self.config_through(self.network_endpoint)

    def config_through(self, address: str) -> ConnectorConfig:
        host, _, port = address.rpartition(":")
        properties = {"host": host, "port": port, "prefix": self.prefix}
        properties |= {"database": str(self.server["dbname"]), "user": ROLE, "password": PASSWORD}
        return ConnectorConfig(self.connector, properties)

    def batch(self, ids: Sequence[int]) -> pa.RecordBatch:
        return pa.record_batch([pa.array(list(ids), pa.int64())], schema=SCHEMA)

    def committed_ids(self) -> list[int]:
        return psycopg_rows(self.prefix)

    def close(self) -> None:
        with psycopg_connect(postgres_dsn()) as conn:
            for name in ("rows", "staged", "epochs"):
                conn.execute(f"DROP TABLE IF EXISTS {self.prefix}{name}")


# An HTTP event API, read with urllib ---------------------------------------------------------


class HttpSource(SourceConnector):
    """Reads ``GET /events?after=N&limit=K`` of an event API; the offset is the events read."""

    TIMEOUT_S: float | None = 3.0
    """urllib's socket timeout (``None``: wait forever)."""

    def __init__(self) -> None:
        self.url = ""
        self.after = 0

    async def open(self, config: ConnectorConfig) -> None:
        self.url = config.require("url").rstrip("/")

    def schema(self) -> pa.Schema:
        return SCHEMA

    async def poll_batch(self, max_records: int) -> SourceBatch | None:
        query = urllib.parse.urlencode({"after": self.after, "limit": max_records})
        try:
            if self.TIMEOUT_S is None:
                answer = urllib.request.urlopen(f"{self.url}/events?{query}")
            else:
                answer = urllib.request.urlopen(
                    f"{self.url}/events?{query}", timeout=self.TIMEOUT_S
                )
            with answer:
                ids = json.loads(answer.read())
        except (urllib.error.URLError, OSError) as error:
            raise ReadError(f"http source: GET {self.url}/events failed: {error}") from None
        if not ids:
            return None
        self.after += len(ids)
        records = pa.record_batch([pa.array(ids, pa.int64())], schema=SCHEMA)
        return SourceBatch(records, PartitionInfo("events", str(self.after)))

    def checkpoint(self) -> SourceCheckpoint:
        return SourceCheckpoint({"events": str(self.after)})

    async def restore(self, checkpoint: SourceCheckpoint) -> None:
        self.after = int(checkpoint.offsets.get("events", "0"))

    def supports_replay(self) -> bool:
        return True

    async def close(self) -> None:
        pass


class HttpSourceWithoutATimeout(HttpSource):
    """urllib's default: no socket timeout."""

    TIMEOUT_S = None


SOURCES = {
    "outsider-http": HttpSource,
    "outsider-http-without-a-timeout": HttpSourceWithoutATimeout,
}


class _EventApi(http.server.BaseHTTPRequestHandler):
    events: list[int]

    def do_GET(self) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        after, limit = int(query["after"][0]), int(query["limit"][0])
        body = json.dumps(self.events[after : after + limit]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class HttpContext:
    """An event API on a loopback port of its own; appended ids are its next events."""

    def __init__(self, connector: str) -> None:
        self.connector = connector
        handler = type("Handler", (_EventApi,), {"events": []})
        self.events: list[int] = handler.events
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def network_endpoint(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def config(self) -> ConnectorConfig:
        return self.config_through(self.network_endpoint)

    def config_through(self, address: str) -> ConnectorConfig:
        return ConnectorConfig(self.connector, {"url": f"http://{address}"})

    def append(self, ids: Sequence[int], partition: int | None = None) -> None:
        if partition not in (None, 0):
            raise ValueError(f"the event API has one stream, not partition {partition}")
        self.events.extend(ids)

    def ids(self, records: pa.RecordBatch) -> list[int]:
        return [int(value) for value in records.column("id").to_pylist()]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@hookimpl
def laminar_register_connectors(registry: ConnectorRegistry) -> None:
    for name, source in SOURCES.items():
        keys = [ConfigKeySpec("url", required=True)]
        registry.add_source(name, source, config_keys=keys, description=name)
    for name, sink in SINKS.items():
        keys = [ConfigKeySpec(key, required=True) for key in KEYS]
        keys.append(ConfigKeySpec("password", required=True, secret=True))
        registry.add_sink(name, sink, config_keys=keys, description=name)


@hookimpl
def laminar_conformance_context(
    connector: str, role: str, workdir: Path
) -> Pg8000Context | HttpContext | None:
    del workdir
    if role == "source" and connector in SOURCES:
        return HttpContext(connector)
    return Pg8000Context(connector) if role == "sink" and connector in SINKS else None
