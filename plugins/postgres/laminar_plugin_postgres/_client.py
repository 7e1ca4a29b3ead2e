"""Connections, and psycopg's errors turned into the SDK's, without secrets.

Every connection of the connectors is a :class:`Session`. A session that is dropped without
being closed — a connector instance abandoned by a crash, as the conformance kit simulates one
— closes its connection at once, as the operating system would for a killed process: the
server then aborts its open transaction and releases its locks (a prepared transaction stays,
as it must).

A connector call whose connections carry nothing either way for ``network.timeout.s``
(:func:`bounded_by_network_timeout`) has its sessions' sockets shut down, which ends whatever
waits on them — psycopg's own waits and the COPY reader's thread alike — and fails with a
retriable :class:`~laminar_sdk.ConnectionFailed` naming the server. A connection
that went silent (a dead router, a partition, a blackholing firewall) otherwise blocks a call
forever: TCP keeps a connection whose peer stopped answering open for hours.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import select
import socket
import struct
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import psycopg
from laminar_sdk import ConnectionFailed, ConnectorError, TransactionError, WriteError
from psycopg import pq, sql

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

    def cut(self) -> None:
        """Shut the socket down: every wait on it ends at once, as when the peer closed it.

        The descriptor stays open (psycopg still watches it); the connection is broken.
        """
        with contextlib.suppress(psycopg.Error, OSError):
            duplicate = socket.socket(fileno=os.dup(self.connection.pgconn.socket))
            with duplicate:
                duplicate.shutdown(socket.SHUT_RDWR)


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
        raise ConnectionFailed(
            f"{settings.connector}: cannot connect with dsn {settings.dsn!r}: "
            f"{settings.scrub(_first_line(error))}; check dsn, the password (password.env, "
            "password.file, or libpq's PGPASSWORD and passfile) and that the server runs"
        ) from None
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


def silent_for_s(session: Session) -> float | None:
    """How long the session's TCP connection has sent and received nothing, by the kernel.

    ``None`` when it cannot tell: not TCP (a Unix socket), no ``TCP_INFO`` (not Linux), or a
    closed connection.
    """
    try:
        with socket.socket(fileno=os.dup(session.connection.pgconn.socket)) as duplicate:
            info = duplicate.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
    except (psycopg.Error, OSError, AttributeError):
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
    if isinstance(error, psycopg.OperationalError) and state in (None, "57P01", "57P02", "57P03"):
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


_WAIT_S = 1.0  # how long one wait for the server's next bytes lasts before checking again


async def copy_out(session: Session, query: sql.Composable) -> bytes:
    """The whole output of ``COPY (...) TO STDOUT``, read straight from libpq in a thread.

    psycopg hands COPY output over one row per call, each through its asyncio machinery
    (5 to 9 µs a row here: a million rows took 9 s); this reads libpq's buffer in a tight
    loop instead, with the connection locked for psycopg meanwhile.

    :raises psycopg.Error: as psycopg would (the server's error, or a lost connection).
    """
    statement = query.as_bytes(session.connection)
    async with session.connection.lock:
        return await asyncio.to_thread(_copy_out, session.connection.pgconn, statement)


def _copy_out(pgconn: pq.abc.PGconn, statement: bytes) -> bytes:
    pgconn.send_query(statement)
    while True:
        pgconn.consume_input()
        if not pgconn.is_busy():
            break
        select.select([pgconn.socket], [], [], _WAIT_S)
    result = pgconn.get_result()
    if result is None or result.status != pq.ExecStatus.COPY_OUT:
        _finish(pgconn)
        raise _result_error(result)
    parts: list[bytes] = []
    while True:
        size, data = pgconn.get_copy_data(1)
        if size > 0:
            parts.append(bytes(data))
        elif size == 0:
            select.select([pgconn.socket], [], [], _WAIT_S)
            pgconn.consume_input()
        else:
            break
    final = _finish(pgconn)
    if final is not None and final.status != pq.ExecStatus.COMMAND_OK:
        raise _result_error(final)
    return b"".join(parts)


def _finish(pgconn: pq.abc.PGconn) -> pq.abc.PGresult | None:
    """Read the results left, returning the first (libpq needs them all read)."""
    first = pgconn.get_result()
    while pgconn.get_result() is not None:
        pass
    return first


def _result_error(result: pq.abc.PGresult | None) -> psycopg.Error:
    if result is None:
        return psycopg.OperationalError("the server returned no result")
    state = result.error_field(pq.DiagnosticField.SQLSTATE)
    message = (result.error_message or b"").decode(errors="replace").strip()
    kind = psycopg.errors.lookup(state.decode()) if state else psycopg.OperationalError
    return kind(message)
