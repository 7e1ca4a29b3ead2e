"""Test contexts for the conformance kit: a fresh table (and slot) per context, on one server.

The server comes from ``laminar_conformance.services.postgres_service()`` — the one named by
``LAMINAR_POSTGRES_DSN`` (with ``LAMINAR_POSTGRES_PASSWORD_FILE``), a container, or a local
cluster — started once per process on first use; the kit is imported only then, so the plugin
loads without it. Every record carries its id in a ``bigint`` column ``id``.

Imported only by the plugin's ``laminar_conformance_context`` hook, when the conformance kit asks
for a context: never when a pipeline runs.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import psycopg
import pyarrow as pa
from laminar_sdk import ConnectorConfig
from psycopg import sql

from laminar_plugin_postgres._tables import gid_prefix

SINK_SCHEMA = pa.schema([pa.field("id", pa.int64())])
"""The schema of the sink contexts' tables (one ``bigint`` column)."""

_PREFIX = "laminar_conformance_"
NETWORK_TIMEOUT_S = 5
"""``network.timeout.s`` and ``connect.timeout.s`` of a connector the kit puts a proxy before."""


@dataclass(frozen=True, slots=True)
class Server:
    """Where the contexts' server is: its connection string and password file (if any)."""

    dsn: str
    password_file: Path | None

    def properties(self) -> dict[str, str]:
        """The connection keys of a connector configuration for this server."""
        found = {"dsn": self.dsn}
        if self.password_file is not None:
            found["password.file"] = str(self.password_file)
        return found

    def endpoint(self) -> str | None:
        """The server's ``host:port``, or ``None`` when the dsn names a Unix socket."""
        parts = psycopg.conninfo.conninfo_to_dict(self.dsn)
        host = str(parts.get("host") or "")
        if not host or host.startswith("/"):
            return None
        return f"{host}:{parts.get('port') or 5432}"

    def connect(self) -> psycopg.Connection[Any]:
        """An autocommit connection (for the contexts' own statements)."""
        if self.password_file is None:
            return psycopg.connect(self.dsn, autocommit=True)
        password = self.password_file.read_text().splitlines()[0]
        return psycopg.connect(self.dsn, autocommit=True, password=password)


@functools.cache
def shared_server() -> Server:
    """The server every context of this process uses, found or started on first use.

    ``laminar_conformance.services.postgres_service()`` decides; a server it starts is stopped
    when the process exits.
    """
    from laminar_conformance.services import postgres_service  # noqa: PLC0415 - kit optional

    stack = contextlib.ExitStack()
    service = stack.enter_context(postgres_service())
    atexit.register(stack.close)
    return Server(service.dsn, service.password_file)


@functools.cache
def _admin() -> psycopg.Connection[Any]:
    """One connection per process for the contexts' setup and reads."""
    connection = shared_server().connect()
    atexit.register(connection.close)
    return connection


def _execute(statement: sql.Composable | str, params: Sequence[object] = ()) -> list[Any]:
    with _admin().cursor() as cursor:
        cursor.execute(statement, params)  # type: ignore[arg-type]
        return cursor.fetchall() if cursor.description is not None else []


def _drop_table(name: str) -> None:
    """Drop table ``name`` after ending the sessions that still hold it.

    A sink or source instance that a check abandoned as if its process were killed, but which
    Python has not collected yet, may still hold an open transaction on the table: its process
    would be gone, so its session goes now.
    """
    _execute(
        "SELECT pg_terminate_backend(pid) FROM pg_locks "
        "WHERE relation = to_regclass(%s) AND pid <> pg_backend_pid()",
        (f'public."{name}"',),
    )
    _execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))


def _fresh_name() -> str:
    return f"{_PREFIX}{uuid.uuid4().hex[:16]}"


class _ThroughAProxy:
    """What the kit's network-fault checks need of a context.

    The server's address, and the context's configuration connecting elsewhere.
    """

    _server: Server

    def config(self) -> ConnectorConfig:
        """The connector's configuration (each context's own)."""
        raise NotImplementedError

    @property
    def network_endpoint(self) -> str | None:
        """The server's ``host:port`` (``None`` for a Unix socket: no proxy fits there)."""
        return self._server.endpoint()

    def config_through(self, address: str) -> ConnectorConfig:
        """:meth:`config`, connecting to ``address`` (``host:port``), with short timeouts.

        The kit's network-fault checks put a proxy at ``address``; the timeouts keep a call
        on a silent connection to seconds (the defaults are 30 s and 10 s).
        """
        config = self.config()
        host, _, port = address.rpartition(":")
        dsn = psycopg.conninfo.make_conninfo(config.properties["dsn"], host=host, port=port)
        return ConnectorConfig(
            config.connector_type,
            {
                **config.properties,
                "dsn": dsn,
                "network.timeout.s": str(NETWORK_TIMEOUT_S),
                "connect.timeout.s": str(NETWORK_TIMEOUT_S),
            },
        )


class PostgresSinkContext(_ThroughAProxy):
    """A sink of the plugin writing a fresh table ``(id bigint)``.

    :param workdir: where the ``postgres`` sink stages pre-committed epochs.
    :param mode: ``append`` (the ``postgres`` sink), ``two-phase`` (``postgres-2pc``) or
        ``upsert`` (``postgres-upsert``; the table then has a primary key).
    """

    def __init__(self, workdir: Path, mode: str = "append") -> None:
        self._server = shared_server()
        self._mode = mode
        self._table = _fresh_name()
        key = " PRIMARY KEY" if mode == "upsert" else ""
        _execute(sql.SQL(f"CREATE TABLE {{}} (id bigint{key})").format(sql.Identifier(self._table)))
        self._staging = workdir / "staging"

    @property
    def table(self) -> str:
        """The table written (in schema ``public``)."""
        return self._table

    def config(self) -> ConnectorConfig:
        """The sink writing this context's table."""
        properties = {**self._server.properties(), "table": self._table}
        if self._mode == "upsert":
            return ConnectorConfig("postgres-upsert", {**properties, "key": "id"})
        if self._mode == "two-phase":
            return ConnectorConfig("postgres-2pc", properties)
        return ConnectorConfig("postgres", {**properties, "staging.location": str(self._staging)})

    def batch(self, ids: Sequence[int]) -> pa.RecordBatch:
        """One row per id."""
        return pa.RecordBatch.from_arrays([pa.array(list(ids), pa.int64())], schema=SINK_SCHEMA)

    def committed_ids(self) -> list[int]:
        """The ids a reader of the table sees (committed transactions only)."""
        rows = _execute(sql.SQL("SELECT id FROM {}").format(sql.Identifier(self._table)))
        return [int(row[0]) for row in rows]

    def close(self) -> None:
        """Roll back the sink's prepared transactions; drop the table and its markers."""
        sink_id = f"public.{self._table}"
        prefix = gid_prefix(sink_id)
        for (gid,) in _execute(
            "SELECT gid FROM pg_prepared_xacts WHERE left(gid, length(%s)) = %s", (prefix, prefix)
        ):
            with contextlib.suppress(psycopg.Error):  # committed or rolled back meanwhile
                _execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
        _drop_table(self._table)
        with contextlib.suppress(psycopg.errors.UndefinedTable):
            _execute("DELETE FROM laminar_sink_epochs WHERE sink_id = %s", (sink_id,))


class PostgresSourceContext(_ThroughAProxy):
    """The ``postgres`` (keyset) source reading a fresh table in three range partitions.

    The table is ``(part int, id bigint primary key)``; partition ``p`` holds the rows whose
    ``part`` is ``p`` (``partition.bounds = 1, 2`` on ``part``), read in ``id`` order.
    """

    partitions = 3
    live_appends = True
    """Rows inserted while a source runs are read by its next poll."""
    skip_checks: ClassVar[Mapping[str, str]] = {
        "partition-removal": (
            "the partitions are ranges of the partition column set by partition.bounds; "
            "they do not come and go with the table's rows"
        )
    }

    def __init__(self) -> None:
        self._server = shared_server()
        self._table = _fresh_name()
        _execute(
            sql.SQL("CREATE TABLE {} (part int NOT NULL, id bigint PRIMARY KEY)").format(
                sql.Identifier(self._table)
            )
        )

    def config(self) -> ConnectorConfig:
        """The source reading this context's table from its start."""
        return ConnectorConfig(
            "postgres",
            {
                **self._server.properties(),
                "table": self._table,
                "key": "id",
                "partition.column": "part",
                "partition.bounds": "1, 2",
            },
        )

    def append(self, ids: Sequence[int], partition: int | None = None) -> None:
        """Insert one row per id into ``partition`` (0, 1 or 2), committed.

        :raises ValueError: for another partition.
        """
        part = partition or 0
        if not 0 <= part < self.partitions:
            raise ValueError(f"the table has partitions 0 to {self.partitions - 1}, not {part}")
        _insert(self._table, ["part", "id"], [(part, record) for record in ids])

    @staticmethod
    def ids(records: pa.RecordBatch) -> list[int]:
        """The ``id`` column.

        Static: the kit ships it to Spark's executors, which cannot take connections.
        """
        return [int(value) for value in records.column("id").to_pylist()]

    def close(self) -> None:
        """Drop the table."""
        _drop_table(self._table)


def _insert(table: str, columns: list[str], rows: list[tuple[int, ...]]) -> None:
    if not rows:
        return
    statement = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        sql.Identifier(table),
        sql.SQL(", ").join(map(sql.Identifier, columns)),
        sql.SQL(", ").join(sql.Placeholder() * len(columns)),
    )
    connection = _admin()
    with connection.transaction(), connection.cursor() as cursor:
        cursor.executemany(statement, rows)


class PostgresCdcContext:
    """The ``postgres-cdc`` source on a fresh table ``(id bigint primary key)`` and its slot.

    The slot is created here, before the kit appends anything (``slot.create`` would create it
    when the source opens, after the first appends, which it would then not see). The source
    runs with ``slot.advance=manual``: the kit restores checkpoints *older* than ones it
    restored before (to prove any checkpoint replays), which a slot advanced at each restore —
    the default, right for a runtime, which restores only durable checkpoints — can no longer
    return. The plugin's own tests check the default on Spark.
    """

    partitions = 1
    live_appends = True
    """Rows committed while a source runs are decoded by its next poll."""
    skip_checks: ClassVar[Mapping[str, str]] = {
        "multi-partition": "a replication slot is one stream of transactions in commit order"
    }

    def __init__(self) -> None:
        self._server = shared_server()
        self._table = _fresh_name()
        table = sql.Identifier(self._table)
        _execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY)").format(table))
        _execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(table, table))
        _execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (self._table,))

    def config(self) -> ConnectorConfig:
        """The source reading the table's changes from the slot, never advancing it."""
        return ConnectorConfig(
            "postgres-cdc",
            {
                **self._server.properties(),
                "table": self._table,
                "slot": self._table,
                "publication": self._table,
                "slot.advance": "manual",
            },
        )

    def append(self, ids: Sequence[int], partition: int | None = None) -> None:
        """Insert one row per id, in one committed transaction.

        :raises ValueError: for a partition other than 0 (a slot is one stream).
        """
        if partition:
            raise ValueError("a replication slot is one stream: partition 0 only")
        _insert(self._table, ["id"], [(record,) for record in ids])

    @staticmethod
    def ids(records: pa.RecordBatch) -> list[int]:
        """The ``id`` of each change's new row (the kit only inserts).

        Static: the kit ships it to Spark's executors, which cannot take connections.
        """
        return [int(row["id"]) for row in records.column("after").to_pylist()]

    def close(self) -> None:
        """Drop the slot, the publication and the table."""
        with contextlib.suppress(psycopg.errors.UndefinedObject):
            _execute("SELECT pg_drop_replication_slot(%s)", (self._table,))
        table = sql.Identifier(self._table)
        _execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(table))
        _drop_table(self._table)
