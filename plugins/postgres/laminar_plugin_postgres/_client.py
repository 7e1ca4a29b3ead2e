"""Connections, and psycopg's errors turned into the SDK's, without secrets.

Every connection of the connectors is a :class:`Session` (psycopg), or an :class:`ArrowSession`
(ADBC), which the keyset source reads rows with: binary ``COPY`` straight into Arrow. A session
that is dropped without
being closed — a connector instance abandoned by a crash, as the conformance kit simulates one
— closes its connection at once, as the operating system would for a killed process: the
server then aborts its open transaction and releases its locks (a prepared transaction stays,
as it must).

A connector call whose connections carry nothing either way for ``network.timeout.s``
(:func:`bounded_by_network_timeout`) has its sessions' sockets shut down, which ends whatever
waits on them — psycopg's own waits and ADBC's reading threads alike — and fails with a
retriable :class:`~laminar_sdk.ConnectionFailed` naming the server. A connection
that went silent (a dead router, a partition, a blackholing firewall) otherwise blocks a call
forever: TCP keeps a connection whose peer stopped answering open for hours.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import struct
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import adbc_driver_manager as adbc
import adbc_driver_postgresql
import psycopg
import pyarrow as pa
from laminar_sdk import ConnectionFailed, ConnectorError, TransactionError, WriteError
from psycopg import sql

from laminar_plugin_postgres._config import ConnectionSettings, TableName

_SESSION_SETTINGS = "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; SET bytea_output = 'hex'"
"""What every session sets first: the text form of values the connectors parse."""


class Session:
    """One open connection, closed when dropped.

    :param connection: the connection.
    :param settings: how it was made, for messages.
    """

    def __init__(
        self, connection: psycopg.AsyncConnection[Any], settings: ConnectionSettings
    ) -> None:
        self.connection = connection
        self.settings = settings
        # Only the libpq handle is kept by the finalizer: the connection may be collected.
        weakref.finalize(self, connection.pgconn.finish)

    @property
    def broken(self) -> bool:
        """Whether the connection is closed or lost."""
        return self.connection.closed or self.connection.broken

    async def execute(self, query: sql.Composable | str, params: Any = None) -> list[Any]:  # noqa: ANN401
        """Run ``query``; its rows (none for a statement without a result)."""
        async with self.connection.cursor() as cursor:
            await cursor.execute(query, params)  # type: ignore[arg-type]
            return await cursor.fetchall() if cursor.description is not None else []

    async def close(self) -> None:
        """Close the connection (an open transaction is rolled back by the server)."""
        await self.connection.close()

    def fileno(self) -> int:
        """The connection's socket.

        :raises psycopg.Error: when the connection is closed.
        """
        return self.connection.pgconn.socket

    def cut(self) -> None:
        """Shut the socket down: every wait on it ends at once, as when the peer closed it.

        The descriptor stays open (psycopg still watches it); the connection is broken.
        """
        _shut_down(self)


async def connect(settings: ConnectionSettings, *, autocommit: bool = False) -> Session:
    """A new session, in UTC and ISO date style.

    :raises ConnectionFailed: when the server cannot be reached or refuses the login, with
        libpq's reason and never the password.
    :raises ConfigurationError: when the password's variable or file cannot be read.
    """
    password = settings.password()
    extra: dict[str, Any] = {"connect_timeout": settings.connect_timeout_s}
    if password is not None:
        extra["password"] = password
    try:
        connection = await psycopg.AsyncConnection.connect(
            settings.dsn, autocommit=autocommit, **extra
        )
    except psycopg.Error as error:
        raise _cannot_connect(settings, error) from None
    session = Session(connection, settings)
    settings.sessions.add(session)
    try:
        await session.execute(_SESSION_SETTINGS)
        if not autocommit:
            await connection.commit()
    except psycopg.Error as error:
        await connection.close()
        raise failure(settings, "set up the session", error) from None
    return session


def _cannot_connect(settings: ConnectionSettings, error: Exception) -> ConnectionFailed:
    return ConnectionFailed(
        f"{settings.connector}: cannot connect with dsn {settings.dsn!r}: "
        f"{settings.scrub(_first_line(error).removeprefix('IO: [libpq] '))}; check dsn, the "
        "password (password.env, password.file, or libpq's PGPASSWORD and passfile) and that "
        "the server runs"
    )


@contextlib.asynccontextmanager
async def answered_within(settings: ConnectionSettings, action: str) -> AsyncIterator[None]:
    """Bound the silence of the block's connections to ``settings.network_timeout_s``.

    Once no byte has gone either way on any open session made with ``settings`` for that
    long (the kernel's count, :func:`silent_for_s`; a long ``COPY`` keeps sending, so it is
    never silent), every one is cut (:meth:`Session.cut`), and whatever the block then raises
    becomes a :class:`ConnectionFailed` naming the server and ``action``. Where the kernel
    cannot tell (a Unix socket), the block's whole time is bounded instead.
    """
    timeout = settings.network_timeout_s
    loop = asyncio.get_running_loop()
    started = loop.time()
    expired = False
    timer: asyncio.TimerHandle

    def check() -> None:
        nonlocal expired, timer
        silences = [silent_for_s(session) for session in list(settings.sessions)]
        known = [silence for silence in silences if silence is not None]
        silence = min(known, default=loop.time() - started)
        if silence < timeout:
            timer = loop.call_later(timeout - silence, check)
            return
        expired = True
        for session in list(settings.sessions):
            session.cut()

    timer = loop.call_later(timeout, check)
    try:
        yield
    except Exception as error:
        if not expired:
            raise
        raise ConnectionFailed(
            f"{settings.connector}: the server at {settings.endpoint} sent and took nothing for "
            f"{timeout}s (network.timeout.s) while trying to {action}; its connections were "
            "closed and nothing of the unfinished transaction was committed; the runtime "
            "retries (check the network path to the server)"
        ) from error
    finally:
        timer.cancel()


_TCP_INFO_SIZE = 104
_LAST_DATA_SENT, _LAST_DATA_RECEIVED = 44, 52  # offsets of two u32 of Linux's struct tcp_info


class _Watched(Protocol):
    def fileno(self) -> int: ...


def _shut_down(session: _Watched) -> None:
    """Shut ``session``'s socket down (through a duplicate: the owner keeps its descriptor)."""
    with (
        contextlib.suppress(psycopg.Error, adbc.Error, OSError),
        socket.socket(fileno=os.dup(session.fileno())) as duplicate,
    ):
        duplicate.shutdown(socket.SHUT_RDWR)


def silent_for_s(session: _Watched) -> float | None:
    """How long the session's TCP connection has sent and received nothing, by the kernel.

    ``None`` when it cannot tell: not TCP (a Unix socket), no ``TCP_INFO`` (not Linux), or a
    closed connection.
    """
    try:
        with socket.socket(fileno=os.dup(session.fileno())) as duplicate:
            info = duplicate.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
    except (psycopg.Error, adbc.Error, OSError, AttributeError):
        return None
    if len(info) < _LAST_DATA_RECEIVED + 4:
        return None
    sent: int = struct.unpack_from("I", info, _LAST_DATA_SENT)[0]
    received: int = struct.unpack_from("I", info, _LAST_DATA_RECEIVED)[0]
    return min(sent, received) / 1000


class _Connected(Protocol):
    @property
    def connection_settings(self) -> ConnectionSettings | None: ...


_Self = TypeVar("_Self", bound=_Connected)
_P = ParamSpec("_P")
_R = TypeVar("_R")


def bounded_by_network_timeout(
    method: Callable[Concatenate[_Self, _P], Coroutine[Any, Any, _R]],
) -> Callable[Concatenate[_Self, _P], Coroutine[Any, Any, _R]]:
    """Run a connector's call :func:`answered_within` its ``network.timeout.s``.

    A connector that is not open (``connection_settings`` is ``None``) runs the call as it is,
    which raises its own error.
    """

    @functools.wraps(method)
    async def bounded(self: _Self, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        settings = self.connection_settings
        if settings is None:
            return await method(self, *args, **kwargs)
        shown = ", ".join(repr(argument) for argument in args if isinstance(argument, int))
        async with answered_within(settings, f"{method.__name__}({shown})"):
            return await method(self, *args, **kwargs)

    return bounded


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


_SERVER_GONE = ("57P01", "57P02", "57P03")
"""SQLSTATEs of a server that shut down or restarts (admin, crash, immediate shutdown)."""


def failure(
    settings: ConnectionSettings,
    action: str,
    error: psycopg.Error,
    kind: Callable[[str], ConnectorError] = WriteError,
) -> ConnectorError:
    """The SDK error for ``error`` raised while doing ``action``.

    A lost connection (the server stopped, the network failed) is a transient
    :class:`ConnectionFailed`; anything else is ``kind``, with the server's message and its
    SQLSTATE. The password never appears.
    """
    message = settings.scrub(_first_line(error))
    state = getattr(error, "sqlstate", None)
    detail = f"{message} (SQLSTATE {state})" if state else message
    if isinstance(error, psycopg.OperationalError) and (state is None or state in _SERVER_GONE):
        return ConnectionFailed(
            f"{settings.connector}: the connection to {settings.endpoint} was lost while trying "
            f"to {action}: {detail}; "
            "nothing of the unfinished transaction was committed; the runtime retries"
        )
    return kind(f"{settings.connector}: cannot {action}: {detail}")


def transaction_failure(
    settings: ConnectionSettings, action: str, error: psycopg.Error
) -> ConnectorError:
    """:func:`failure` for a transaction-control statement (``PREPARE``, ``COMMIT PREPARED``)."""
    return failure(settings, action, error, TransactionError)


def qualified(table: TableName) -> sql.Composed:
    """``"schema"."name"``, quoted."""
    return sql.SQL("{}.{}").format(sql.Identifier(table.schema), sql.Identifier(table.name))


class ArrowSession:
    """A connection that reads query results as Arrow batches (ADBC's PostgreSQL driver).

    The driver sends a query without parameters as ``COPY (query) TO STDOUT (FORMAT binary)``
    and decodes the rows straight into Arrow, in C; values are bound into the query as
    literals (psycopg's :class:`~psycopg.sql.Literal`, quoted for ``quoting``'s connection).
    Its socket is found among the process's (:meth:`watch_socket`), so that
    :func:`answered_within` watches it and can cut it like a :class:`Session`'s. Open with
    :func:`connect_arrow`.
    """

    def __init__(
        self,
        database: adbc.AdbcDatabase,
        connection: adbc.AdbcConnection,
        settings: ConnectionSettings,
        quoting: psycopg.AsyncConnection[Any],
    ) -> None:
        self.settings = settings
        self._database = database
        self._connection = connection
        self._quoting = quoting
        self._socket: int | None = None
        weakref.finalize(self, _close_adbc, connection, database)

    def fileno(self) -> int:
        """The connection's socket.

        :raises OSError: when it is unknown (a Unix socket) or the session is closed.
        """
        if self._socket is None:
            raise OSError("the socket of this ADBC connection is not known")
        return self._socket

    def cut(self) -> None:
        """Shut the socket down: a read waiting on it fails at once."""
        _shut_down(self)

    @contextlib.contextmanager
    def batches(self, query: sql.Composable) -> Iterator[pa.RecordBatchReader]:
        """Start ``query`` (blocks); its rows as they arrive, readable until the block ends.

        Read the reader in a thread: it blocks too.

        :raises adbc.Error: when the server refuses the query or the connection is lost.
        """
        statement = adbc.AdbcStatement(self._connection)
        try:
            statement.set_sql_query(query.as_string(self._quoting))
            stream, _ = statement.execute_query()
            reader: pa.RecordBatchReader = pa.RecordBatchReader._import_from_c(stream.address)
            with reader:
                yield reader
        finally:
            statement.close()

    def read_all(self, query: sql.Composable) -> pa.Table:
        """All rows of ``query`` (blocks).

        :raises adbc.Error: when the server refuses the query or the connection is lost.
        :raises pyarrow.ArrowException: when it is lost while the rows arrive.
        """
        with self.batches(query) as reader:
            return reader.read_all()

    def execute(self, statement_text: str) -> None:
        """Run a statement without a result (``SET``), blocking."""
        statement = adbc.AdbcStatement(self._connection)
        try:
            statement.set_sql_query(statement_text)
            statement.execute_update()
        finally:
            statement.close()

    async def close(self) -> None:
        """Close the connection."""
        self._socket = None
        await asyncio.to_thread(_close_adbc, self._connection, self._database)

    def watch_socket(self, before: set[int]) -> None:
        """Find the connection's TCP socket: opened since ``before``, to the dsn's port.

        :param before: this process's socket descriptors before the connection was made.
        """
        port = int(psycopg.conninfo.conninfo_to_dict(self.settings.dsn).get("port") or 5432)
        for descriptor in _sockets() - before:
            with (
                contextlib.suppress(OSError, ValueError, IndexError),
                socket.socket(fileno=os.dup(descriptor)) as candidate,
            ):
                tcp = candidate.family in (socket.AF_INET, socket.AF_INET6)
                if tcp and candidate.getpeername()[1] == port:
                    self._socket = descriptor
                    return


def _sockets() -> set[int]:
    """This process's socket descriptors (none where ``/proc`` does not tell)."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                    found.add(int(name))
    return found


def _close_adbc(connection: adbc.AdbcConnection, database: adbc.AdbcDatabase) -> None:
    # A statement left open (an abandoned read) keeps them: they close when it is collected.
    with contextlib.suppress(adbc.Error, RuntimeError):
        connection.close()
        database.close()


async def connect_arrow(settings: ConnectionSettings, quoting: Session) -> ArrowSession:
    """A new :class:`ArrowSession`, in UTC and ISO date style, made like :func:`connect`'s.

    TCP keepalives end a read from a server that went away within about
    ``network.timeout.s``, also where no call watches the connection.

    :param quoting: the psycopg session whose quoting renders the queries' literals.
    :raises ConnectionFailed: when the server cannot be reached or refuses the login, with
        libpq's reason and never the password.
    """
    password = settings.password()
    idle = max(1, settings.network_timeout_s // 3)
    options: dict[str, Any] = {
        "connect_timeout": settings.connect_timeout_s,
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": idle,
        "keepalives_count": 2,
    }
    if password is not None:
        options["password"] = password
    conninfo = psycopg.conninfo.make_conninfo(settings.dsn, **options)

    def opened() -> ArrowSession:
        before = _sockets()
        database = adbc_driver_postgresql.connect(conninfo)
        try:
            connection = adbc.AdbcConnection(database)
        except BaseException:
            database.close()
            raise
        session = ArrowSession(database, connection, settings, quoting.connection)
        session.execute(_SESSION_SETTINGS)
        session.watch_socket(before)
        return session

    try:
        session = await asyncio.to_thread(opened)
    except adbc.Error as error:
        raise _cannot_connect(settings, error) from None
    settings.sessions.add(session)
    return session


def arrow_failure(
    settings: ConnectionSettings,
    action: str,
    error: adbc.Error | pa.ArrowException,
    kind: Callable[[str], ConnectorError],
) -> ConnectorError:
    """:func:`failure` for an error of an :class:`ArrowSession`'s query or of its rows.

    The driver's first line only: the rest repeats the query.
    """
    text = _first_line(error)
    for prefix in ("IO: ", "INVALID_ARGUMENT: ", "NOT_FOUND: ", "UNKNOWN: ", "INTERNAL: "):
        text = text.removeprefix(prefix)
    message = settings.scrub(text.split(". SQLSTATE: ")[0])
    stated = str(error).rpartition("SQLSTATE: ")[2][:5] if "SQLSTATE: " in str(error) else None
    state = getattr(error, "sqlstate", None) or stated
    if state is None or state.startswith("08") or state in _SERVER_GONE:
        return ConnectionFailed(
            f"{settings.connector}: the connection to {settings.endpoint} was lost while trying "
            f"to {action}: {message}; the runtime retries"
        )
    return kind(f"{settings.connector}: cannot {action}: {message} (SQLSTATE {state})")
