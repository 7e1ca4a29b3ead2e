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
between; the server is the kit's ``postgres_service``, as in ``outsider_stores``. Used with
``--plugin outsider_network``.
"""

from __future__ import annotations

import contextlib
import functools
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
    SchemaMismatch,
    SinkConnector,
    SinkConnectorCapabilities,
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


@hookimpl
def laminar_register_connectors(registry: ConnectorRegistry) -> None:
    for name, sink in SINKS.items():
        keys = [ConfigKeySpec(key, required=True) for key in KEYS]
        keys.append(ConfigKeySpec("password", required=True, secret=True))
        registry.add_sink(name, sink, config_keys=keys, description=name)


@hookimpl
def laminar_conformance_context(connector: str, role: str, workdir: Path) -> Pg8000Context | None:
    del workdir
    return Pg8000Context(connector) if role == "sink" and connector in SINKS else None
