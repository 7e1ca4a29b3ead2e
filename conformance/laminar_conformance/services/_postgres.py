"""A real PostgreSQL server for tests: an existing server, a container, or a local cluster.

The local launcher runs the operating system's own PostgreSQL server binaries (Debian's
``postgresql`` package: ``initdb``, ``pg_ctl`` and ``postgres`` under
``/usr/lib/postgresql/VERSION/bin``, else on ``PATH``). It makes a throw-away cluster in a
temporary directory and starts it on a free loopback port with what the Laminar connectors
need: ``wal_level=logical`` (change data capture), ``max_prepared_transactions`` (two-phase
commit) and replication slots. It is made for tests: ``fsync`` is off, so an operating-system
crash could lose data; a server crash (``pg_ctl stop -m immediate``, :meth:`LocalPostgres.stop`)
loses nothing committed, which is what the crash tests exercise.

``initdb`` refuses to run as root. As root (CI), the cluster belongs to the unprivileged
``postgres`` system user and every server command runs as that user through ``runuser -u
postgres --``; nothing else about the server is weakened. The server dies with the process that
started it, even one killed with SIGKILL (see :mod:`laminar_conformance.services._process`):
as root, ``runuser`` forks, so the server is started through ``setpriv --pdeathsig KILL`` and
dies with the ``runuser`` that dies with this process.

The cluster's superuser password is random, kept in a file only this user can read
(:attr:`PostgresService.password_file`), and never printed: connection strings carry no
password, and a :class:`PostgresService` shows none. Clients authenticate with SCRAM-SHA-256, as
against a production server, but the server keeps the password hashed with
:data:`SCRAM_ITERATIONS` rounds instead of PostgreSQL's 4096: those cost client and server
~7 ms of every connection (12 ms in all, measured with psycopg), which a conformance run that
opens hundreds of connectors pays hundreds of times; the cluster lives on loopback for one run.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import pwd
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from laminar_conformance.services._kafka import (
    ServiceProvider,
    choose_provider,
    docker_engine_available,
    temporary_workdir,
)
from laminar_conformance.services._process import ServiceError, free_port, require_success, spawn

POSTGRES_DSN_VARIABLE = "LAMINAR_POSTGRES_DSN"
"""Set to a libpq connection string (``host=... port=... dbname=... user=...``) to test against
an existing server instead. It must hold no password: give that in ``PGPASSWORD`` or a passfile
(``PGPASSFILE``), as libpq reads them."""

POSTGRES_PASSWORD_FILE_VARIABLE = "LAMINAR_POSTGRES_PASSWORD_FILE"  # noqa: S105 - a name
"""With ``LAMINAR_POSTGRES_DSN``: a file holding the password (its first line), which the
Laminar connectors get as ``password.file``."""

POSTGRES_USER = "laminar"
"""The superuser of a cluster the local launcher makes."""

SERVER_SETTINGS: Mapping[str, str] = {
    "wal_level": "logical",
    "max_prepared_transactions": "64",
    "max_replication_slots": "32",
    "max_wal_senders": "8",
    "max_connections": "200",
    # A test cluster: a server crash loses nothing committed, an operating-system crash may.
    "fsync": "off",
    "full_page_writes": "off",
    "log_min_messages": "warning",
    "log_min_error_statement": "panic",  # no statements (and no values in them) in the log
}
"""The settings every server the kit starts runs with (a container's too)."""

_WORKDIR_PREFIX = "laminar-postgres-"
_DEBIAN_BINARIES = Path("/usr/lib/postgresql")
_PROGRAMS = ("initdb", "pg_ctl", "postgres")
_PASSWORD_IN_DSN = re.compile(r"(^|\s)password\s*=|://[^/@\s]*:[^/@\s]*@", re.IGNORECASE)


@dataclass(frozen=True)
class PostgresService:
    """A running PostgreSQL server: where to connect, and where it came from.

    :param dsn: a libpq connection string without a password.
    :param provider: where the server came from.
    :param password_file: a file holding the password (only this user can read it), or
        ``None`` when libpq finds it itself (``PGPASSWORD``, ``PGPASSFILE``).
    :param local: the cluster when this package started it (``LOCAL``), else ``None``.
    """

    dsn: str
    provider: ServiceProvider
    password_file: Path | None = None
    local: LocalPostgres | None = field(default=None, repr=False)

    @property
    def restartable(self) -> bool:
        """Whether :meth:`stop` and :meth:`start` work (only a server this package started)."""
        return self.local is not None

    def stop(self, *, immediate: bool = True) -> None:
        """Stop the server: ``pg_ctl stop -m immediate`` (a crash) or ``-m fast``.

        :raises ServiceError: for a server this package did not start.
        """
        self._local("stop").stop(immediate=immediate)

    def start(self) -> None:
        """Start the server again on the same port and data (crash recovery runs).

        :raises ServiceError: for a server this package did not start.
        """
        self._local("start").start()

    def restart(self, *, immediate: bool = True) -> None:
        """:meth:`stop`, then :meth:`start`: a server crash and its recovery."""
        self.stop(immediate=immediate)
        self.start()

    def _local(self, action: str) -> LocalPostgres:
        if self.local is None:
            raise ServiceError(
                f"cannot {action} the PostgreSQL from {self.provider.value}: only a server the "
                f"local launcher started can be stopped and started (unset {POSTGRES_DSN_VARIABLE})"
            )
        return self.local


def choose_postgres_provider(
    environ: Mapping[str, str], docker_available: Callable[[], bool]
) -> ServiceProvider:
    """Decide where the PostgreSQL of a test run comes from.

    ``LAMINAR_POSTGRES_DSN`` names an existing server and wins; else a testcontainers
    ``PostgresContainer`` when a Docker engine answers; else the local launcher.
    """
    return choose_provider(POSTGRES_DSN_VARIABLE, environ, docker_available)


def external_dsn(environ: Mapping[str, str]) -> str:
    """The connection string of ``LAMINAR_POSTGRES_DSN``, checked to hold no password.

    :raises ServiceError: when it holds one (the value is not shown).
    """
    dsn = environ[POSTGRES_DSN_VARIABLE].strip()
    if _PASSWORD_IN_DSN.search(dsn):
        raise ServiceError(
            f"{POSTGRES_DSN_VARIABLE} holds a password, which would end up in logs: remove it "
            "and give the password in PGPASSWORD or a passfile (PGPASSFILE) instead"
        )
    return dsn


@contextlib.contextmanager
def postgres_service(environ: Mapping[str, str] | None = None) -> Iterator[PostgresService]:
    """Provide a PostgreSQL server for the duration of the block, and clean up after it.

    A server started here (``provider`` ``LOCAL``) can be stopped and started again through
    :meth:`PostgresService.stop` / :meth:`PostgresService.start`.

    :raises ServiceError: when no server can be had, saying what to install or set.
    """
    env = os.environ if environ is None else environ
    provider = choose_postgres_provider(env, docker_engine_available)
    if provider is ServiceProvider.EXTERNAL:
        password_file = env.get(POSTGRES_PASSWORD_FILE_VARIABLE, "").strip()
        yield PostgresService(
            external_dsn(env), provider, Path(password_file) if password_file else None
        )
    elif provider is ServiceProvider.CONTAINER:
        with _container_service() as service:
            yield service
    else:
        with LocalPostgres() as cluster:
            yield PostgresService(cluster.dsn, provider, cluster.password_file, cluster)


@contextlib.contextmanager
def _container_service() -> Iterator[PostgresService]:
    from testcontainers.postgres import PostgresContainer  # noqa: PLC0415 - optional

    password = secrets.token_urlsafe(24)
    settings = " ".join(f"-c {name}={value}" for name, value in SERVER_SETTINGS.items())
    container = PostgresContainer(
        "postgres:16", username=POSTGRES_USER, password=password, dbname="postgres"
    ).with_command(f"postgres {settings}")
    with container, tempfile.TemporaryDirectory(prefix=_WORKDIR_PREFIX) as directory:
        password_file = Path(directory, "password")
        _write_private(password_file, password)
        host = container.get_container_host_ip()
        port = container.get_exposed_port(5432)
        yield PostgresService(
            f"host={host} port={port} dbname=postgres user={POSTGRES_USER}",
            ServiceProvider.CONTAINER,
            password_file,
        )


def find_postgres_binaries() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``.

    The newest ``/usr/lib/postgresql/VERSION/bin`` (Debian's layout) that has all three, else
    the directory of ``initdb`` on ``PATH``.

    :raises ServiceError: when none is found, saying what to install.
    """
    candidates: list[Path] = []
    if _DEBIAN_BINARIES.is_dir():
        versions = [p for p in _DEBIAN_BINARIES.iterdir() if p.name.split(".")[0].isdigit()]
        versions.sort(key=lambda p: [int(part) for part in p.name.split(".") if part.isdigit()])
        candidates += [version / "bin" for version in reversed(versions)]
    on_path = shutil.which("initdb")
    if on_path is not None:
        candidates.append(Path(on_path).resolve().parent)
    for directory in candidates:
        if all((directory / program).is_file() for program in _PROGRAMS):
            return directory
    raise ServiceError(
        "cannot start PostgreSQL: no server binaries (initdb, pg_ctl, postgres) under "
        f"{_DEBIAN_BINARIES}/*/bin or on PATH; install them (Debian: apt-get install "
        f"postgresql), or point {POSTGRES_DSN_VARIABLE} at an existing server"
    )


SCRAM_ITERATIONS = 16
"""The PBKDF2 rounds of the local cluster's stored password (PostgreSQL's default: 4096)."""


def scram_secret(password: str, *, iterations: int = SCRAM_ITERATIONS) -> str:
    """``password`` as PostgreSQL stores a SCRAM-SHA-256 secret (RFC 5802, RFC 7677).

    Given to ``initdb --pwfile`` (or ``ALTER ROLE ... PASSWORD``), a secret already in this form
    is stored as it is, and clients log in with ``password``. ``password`` must be ASCII
    without control characters, which SASLprep leaves unchanged.
    """
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    server_key = hmac.digest(salted, b"Server Key", "sha256")

    def text(data: bytes) -> str:
        return base64.b64encode(data).decode()

    stored_key = hashlib.sha256(client_key).digest()
    return f"SCRAM-SHA-256${iterations}:{text(salt)}${text(stored_key)}:{text(server_key)}"


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to a new file only its owner can read."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)


_SERVER_USER = "postgres"


class LocalPostgres:
    """A throw-away PostgreSQL cluster on a free loopback port, started from the OS's binaries.

    Use as a context manager, or call :meth:`start` / :meth:`close`. :meth:`stop` with
    ``immediate=True`` is a server crash (``pg_ctl stop -m immediate``: no checkpoint, crash
    recovery at the next :meth:`start`); the port and data stay.

    :param start_timeout_s: how long :meth:`start` waits for the server to accept clients.
    """

    def __init__(self, *, start_timeout_s: float = 60.0) -> None:
        self._binaries = find_postgres_binaries()
        self._workdir, lock = temporary_workdir(_WORKDIR_PREFIX)
        self._workdir_lock: int | None = lock
        self._as_root = os.geteuid() == 0
        self._timeout = start_timeout_s
        self._port = free_port()
        self._process: subprocess.Popen[bytes] | None = None
        self._initialized = False
        self.password_file = self._workdir / "password"
        """A file holding the superuser's password; only this user can read it."""

    def __repr__(self) -> str:
        return f"LocalPostgres(dsn={self.dsn!r}, workdir={str(self._workdir)!r})"

    @property
    def dsn(self) -> str:
        """The libpq connection string of the superuser's ``postgres`` database (no password)."""
        return f"host=127.0.0.1 port={self._port} dbname=postgres user={POSTGRES_USER}"

    @property
    def port(self) -> int:
        """The loopback port the server listens on."""
        return self._port

    @property
    def data_directory(self) -> Path:
        """The cluster's data directory."""
        return self._workdir / "data"

    @property
    def log_path(self) -> Path:
        """The server's log, for diagnosing a failure."""
        return self._workdir / "server.log"

    def _command(self, program: str, *args: str) -> list[str]:
        """A command line running ``program`` of the server binaries, as the server's user."""
        command = [str(self._binaries / program), *args]
        return ["runuser", "-u", _SERVER_USER, "--", *command] if self._as_root else command

    def _run(self, program: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self._command(program, *args), capture_output=True, text=True, check=False
        )

    def _initialize(self) -> None:
        """``initdb`` a new cluster whose superuser has a random password."""
        password = secrets.token_urlsafe(24)
        _write_private(self.password_file, password)
        given = self._workdir / "initdb-password"
        _write_private(given, scram_secret(password))
        if self._as_root:
            try:
                account = pwd.getpwnam(_SERVER_USER)
            except KeyError:
                raise ServiceError(
                    f"cannot start PostgreSQL as root: initdb refuses root, and there is no "
                    f"{_SERVER_USER!r} system user to run it as (Debian's postgresql package "
                    f"makes one), or point {POSTGRES_DSN_VARIABLE} at an existing server"
                ) from None
            for path in (self._workdir, given):
                os.chown(path, account.pw_uid, account.pw_gid)
        try:
            result = self._run(
                "initdb",
                "-D",
                str(self.data_directory),
                "-U",
                POSTGRES_USER,
                "--auth=scram-sha-256",
                f"--pwfile={given}",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            )
        finally:
            given.unlink()
        require_success(result, "initdb failed")
        self._initialized = True

    def start(self) -> str:
        """Start the server and wait until it accepts clients; return its connection string.

        :raises ServiceError: when it does not start in time, with the end of its log.
        """
        if self._process is not None and self._process.poll() is None:
            return self.dsn
        if not self._initialized:
            self._initialize()
        settings = {
            **SERVER_SETTINGS,
            "listen_addresses": "127.0.0.1",
            "port": str(self._port),
            "unix_socket_directories": "",
        }
        arguments = ["-D", str(self.data_directory)]
        for name, value in settings.items():
            arguments += ["-c", f"{name}={value}"]
        command = self._command("postgres", *arguments)
        if self._as_root:
            # runuser forks: the server must die with runuser, which dies with this process.
            command[4:4] = ["setpriv", "--pdeathsig", "KILL", "--"]
        with self.log_path.open("ab") as log:
            started_from = log.tell()
            self._process = spawn(command, stdout=log, stderr=subprocess.STDOUT)
        self._wait_until_ready(started_from)
        return self.dsn

    def _wait_until_ready(self, log_offset: int) -> None:
        """Wait until ``postmaster.pid`` says ``ready`` (what ``pg_ctl start -w`` waits for)."""
        assert self._process is not None
        pid_file = self.data_directory / "postmaster.pid"
        deadline = time.monotonic() + self._timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self._process = None
                raise ServiceError(
                    f"PostgreSQL exited while starting; its log ends:\n{self._log_tail(log_offset)}"
                )
            with contextlib.suppress(OSError):
                lines = pid_file.read_text().splitlines()
                if len(lines) >= 8 and lines[7].strip() == "ready":
                    return
            time.sleep(0.05)
        self.stop(immediate=True)
        raise ServiceError(
            f"PostgreSQL did not start within {self._timeout:.0f}s; its log ends:\n"
            f"{self._log_tail(log_offset)}"
        )

    def _log_tail(self, offset: int = 0) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(offset)
                text = log.read().decode(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-20:])

    def stop(self, *, immediate: bool = True) -> None:
        """Stop the server with ``pg_ctl stop``: ``-m immediate`` (a crash) or ``-m fast``."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        mode = "immediate" if immediate else "fast"
        self._run("pg_ctl", "stop", "-D", str(self.data_directory), "-m", mode, "-w", "-t", "30")
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self, *, immediate: bool = True) -> None:
        """Stop and start the same cluster: same port, same data."""
        self.stop(immediate=immediate)
        self.start()

    def close(self) -> None:
        """Stop the server and remove its temporary directory."""
        self.stop(immediate=False)
        lock, self._workdir_lock = self._workdir_lock, None
        if lock is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            os.close(lock)

    def __enter__(self) -> LocalPostgres:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
