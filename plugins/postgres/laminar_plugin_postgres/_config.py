"""The configuration of the PostgreSQL connectors: declared keys, and the settings built from them.

Every connector connects with ``dsn`` — a libpq connection string (``host=db port=5432
dbname=app user=loader``) or URI — which must not hold a password: the password comes from
the environment (``password.env`` names a variable), a file (``password.file``), or libpq's
own ``PGPASSWORD`` / passfile. It is never shown in a message, a log line or a ``repr``.
"""

from __future__ import annotations

import os
import re
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from laminar_sdk import (
    REDACTED,
    ConfigKeySpec,
    ConfigurationError,
    ConnectorConfig,
    redact_secrets,
)

SINK_NAME = "postgres sink"
SOURCE_NAME = "postgres source"
CDC_NAME = "postgres-cdc source"

_REFUSED_DSN = (
    "it holds a password, which would be shown wherever the dsn is; remove it and set "
    "password.env (a variable holding it) or password.file"
)


def _dsn_problem(dsn: str) -> str | None:
    """What is wrong with ``dsn`` as the ``dsn`` key's value, or ``None``.

    It must parse as libpq parses it, and hold no password in any form (a keyword, a URI's
    user information or query, any case): the SDK's :func:`~laminar_sdk.redact_secrets`
    finds them, and so does libpq's own parse.
    """
    if redact_secrets(dsn) != dsn:
        return _REFUSED_DSN
    try:
        parsed = psycopg.conninfo.conninfo_to_dict(dsn.strip())
    except psycopg.ProgrammingError as error:
        return f"not a libpq connection string or URI: {redact_secrets(str(error))}"
    return _REFUSED_DSN if "password" in parsed else None


CONNECTION_KEYS = (
    ConfigKeySpec(
        "dsn",
        required=True,
        description="libpq connection string or URI, without a password "
        "('host=db port=5432 dbname=app user=loader')",
        check=_dsn_problem,
    ),
    ConfigKeySpec(
        "password.env",
        secret=True,
        description="the environment variable holding the password",
    ),
    ConfigKeySpec(
        "password.file",
        secret=True,
        description="a file holding the password (only its first line is read)",
    ),
    ConfigKeySpec(
        "connect.timeout.s",
        default="10",
        value_type=int,
        description="how long connecting may take, in seconds",
    ),
    ConfigKeySpec(
        "network.timeout.s",
        default="30",
        value_type=int,
        description=(
            "how long a call's connections may carry nothing either way, in seconds; then "
            "they are closed and the call fails with a retriable error"
        ),
    ),
)
"""The keys every connector of the plugin connects with."""

_TABLE = ConfigKeySpec(
    "table", required=True, description="the table: 'name' or 'schema.name' (default schema public)"
)

_SINK_ID_KEY = ConfigKeySpec(
    "sink.id",
    description="names this sink's epoch markers and prepared transactions; unique per "
    "pipeline writing to the table, the same across its restarts (default: the table)",
)
_SCHEMA = ConfigKeySpec(
    "schema",
    description="the batches' columns as 'name type, ...' (Arrow types: 'id int64, "
    "name string'); default: the table's columns",
)
_CREATE = ConfigKeySpec(
    "table.create",
    default="false",
    value_type=bool,
    description="create the table from schema when it does not exist",
)

TWO_PHASE_KEYS: tuple[ConfigKeySpec, ...] = (
    *CONNECTION_KEYS,
    _TABLE,
    _SCHEMA,
    _CREATE,
    _SINK_ID_KEY,
    ConfigKeySpec(
        "marker.table",
        default="laminar_sink_epochs",
        description="the table (in the table's schema) recording committed epochs; created "
        "when missing",
    ),
)
"""The keys the ``postgres-2pc`` sink declares."""

SINK_KEYS: tuple[ConfigKeySpec, ...] = (
    *TWO_PHASE_KEYS,
    ConfigKeySpec(
        "staging.location",
        description="where pre-committed epochs are kept until committed (a directory or "
        "object-store URI); default: the laminar checkpoint location",
    ),
)
"""The keys the ``postgres`` sink declares."""

UPSERT_KEYS: tuple[ConfigKeySpec, ...] = (
    *CONNECTION_KEYS,
    _TABLE,
    ConfigKeySpec(
        "key",
        required=True,
        description="the conflict columns: the table's primary key or a unique index, e.g. 'id'",
    ),
    _SCHEMA,
    _CREATE,
)
"""The keys the ``postgres-upsert`` sink declares."""

SOURCE_KEYS: tuple[ConfigKeySpec, ...] = (
    *CONNECTION_KEYS,
    _TABLE,
    ConfigKeySpec(
        "key",
        required=True,
        description="the monotonic column(s) rows are read in order of: 'id', or 'updated_at, id'",
    ),
    ConfigKeySpec("columns", description="the columns to read (default: all)"),
    ConfigKeySpec(
        "partitions",
        value_type=int,
        description="hash partitioning: how many partitions, read in parallel on Spark "
        "(default 1; with partition.bounds, one more than the bounds)",
    ),
    ConfigKeySpec(
        "partition.column",
        description="the column partitions are made of (default: the first key column)",
    ),
    ConfigKeySpec(
        "partition.bounds",
        description="range partitioning instead of hash: ascending values of partition.column "
        "splitting the table, e.g. '1000000, 2000000' (three partitions)",
    ),
    ConfigKeySpec(
        "batch.size",
        default="100000",
        value_type=int,
        description="the most rows one query returns",
    ),
)
"""The keys the ``postgres`` (keyset) source declares."""

CDC_KEYS: tuple[ConfigKeySpec, ...] = (
    *CONNECTION_KEYS,
    _TABLE,
    ConfigKeySpec("slot", required=True, description="the logical replication slot (pgoutput)"),
    ConfigKeySpec(
        "publication", required=True, description="the publication that includes the table"
    ),
    ConfigKeySpec(
        "slot.create",
        default="false",
        value_type=bool,
        description="create the slot (pgoutput) when it does not exist; else it must exist",
    ),
    ConfigKeySpec(
        "slot.advance",
        default="on-restore",
        description="'on-restore': advance the slot to each checkpoint the runtime restores "
        "(durable then); 'manual': never (advance it yourself)",
    ),
    ConfigKeySpec(
        "max.retained.bytes",
        default=str(1 << 30),
        value_type=int,
        description="health turns degraded when the slot retains more WAL than this",
    ),
)
"""The keys the ``postgres-cdc`` source declares."""


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_SINK_ID = re.compile(r"[A-Za-z0-9._-]{1,100}")


@dataclass(frozen=True, slots=True)
class TableName:
    """A table, schema-qualified.

    :param schema: the schema (``public`` by default).
    :param name: the table's name.
    """

    schema: str
    name: str

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}"

    def sibling(self, name: str) -> TableName:
        """Another table in the same schema."""
        return TableName(self.schema, name)


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    """How to connect: never shown whole (the password is read only when connecting).

    :param connector: the connector, for messages (``postgres sink``).
    :param dsn: the libpq connection string (no password).
    :param password_env: the variable holding the password, if configured.
    :param password_file: the file holding the password, if configured.
    :param connect_timeout_s: the bound on connecting.
    :param network_timeout_s: the bound on the silence of a connector call's connections.
    :param sessions: the open sessions made with these settings, which a call that waited
        too long closes (:func:`~laminar_plugin_postgres._client.answered_within`).
    """

    connector: str
    dsn: str
    password_env: str | None = field(default=None, repr=False)
    password_file: Path | None = field(default=None, repr=False)
    connect_timeout_s: int = 10
    network_timeout_s: int = 30
    sessions: weakref.WeakSet[Any] = field(
        default_factory=weakref.WeakSet, repr=False, compare=False, hash=False
    )

    @property
    def endpoint(self) -> str:
        """The server's address as the dsn gives it: ``host:port`` (libpq's defaults filled)."""
        try:
            parts = psycopg.conninfo.conninfo_to_dict(self.dsn)
        except psycopg.Error:
            return "the server of dsn"
        return f"{parts.get('host') or 'localhost'}:{parts.get('port') or 5432}"

    def password(self) -> str | None:
        """The password from ``password.env`` or ``password.file``; ``None``: libpq's own.

        :raises ConfigurationError: when the variable is unset or the file unreadable (the
            value never appears).
        """
        if self.password_env is not None:
            value = os.environ.get(self.password_env)
            if value is None:
                raise ConfigurationError(
                    f"{self.connector}: the environment variable named by password.env is not "
                    "set in this process; set it (on Spark, in the executors' environment too)",
                    key="password.env",
                )
            return value
        if self.password_file is not None:
            try:
                text = self.password_file.read_text()
            except OSError as error:
                raise ConfigurationError(
                    f"{self.connector}: cannot read the file named by password.file "
                    f"({error.strerror}); check that it exists and this user may read it",
                    key="password.file",
                ) from None
            return text.splitlines()[0] if text else ""
        return None

    def scrub(self, text: str) -> str:
        """``text`` with the password replaced by ``***`` (should a message echo it)."""
        try:
            password = self.password()
        except ConfigurationError:
            return text
        return text.replace(password, REDACTED) if password else text


def parse_table(config: ConnectorConfig, connector: str, key: str = "table") -> TableName:
    """The table of ``key``: ``name`` or ``schema.name`` (plain identifiers, any case).

    :raises ConfigurationError: naming ``key`` for anything else.
    """
    text = config.require(key).strip()
    parts = text.split(".")
    if len(parts) > 2 or not all(_NAME.fullmatch(part) for part in parts):
        raise ConfigurationError(
            f"{connector}: {key} {text!r} is not 'name' or 'schema.name' of letters, digits, "
            "'_' and '$' (quoted identifiers are not supported)",
            key=key,
        )
    return TableName(parts[0], parts[1]) if len(parts) == 2 else TableName("public", parts[0])


def parse_columns(text: str, key: str, connector: str) -> tuple[str, ...]:
    """Column names separated by commas.

    :raises ConfigurationError: naming ``key`` for an empty list, a bad or a repeated name.
    """
    names = tuple(part.strip() for part in text.split(","))
    if not names or not all(_NAME.fullmatch(name) for name in names):
        raise ConfigurationError(
            f"{connector}: {key} must list column names separated by commas, got {text!r}",
            key=key,
        )
    if len(set(names)) != len(names):
        raise ConfigurationError(f"{connector}: {key} repeats a column: {text!r}", key=key)
    return names


def connection_settings(config: ConnectorConfig, connector: str) -> ConnectionSettings:
    """The ``dsn`` and password keys of ``config``, which is validated (the dsn's check ran).

    :raises ConfigurationError: naming the key at fault.
    """
    dsn = config.require("dsn").strip()
    password_env = config.get("password.env") or None
    password_file = config.get("password.file") or None
    if password_env and password_file:
        raise ConfigurationError(
            f"{connector}: set one of password.env and password.file, not both",
            key="password.file",
        )
    timeouts = {}
    for key, default in (("connect.timeout.s", 10), ("network.timeout.s", 30)):
        timeouts[key] = config.get_parsed(key, int, default)
        if timeouts[key] < 1:
            raise ConfigurationError(f"{connector}: {key} must be at least 1", key=key)
    return ConnectionSettings(
        connector,
        dsn,
        password_env,
        Path(password_file).expanduser() if password_file else None,
        timeouts["connect.timeout.s"],
        timeouts["network.timeout.s"],
    )


def choice(config: ConnectorConfig, key: str, choices: tuple[str, ...]) -> str:
    """The value of ``key``, one of ``choices`` (any case).

    :raises ConfigurationError: naming ``key`` and the accepted values otherwise.
    """
    value = config.require(key).strip().lower()
    if value not in choices:
        raise ConfigurationError(
            f"{config.connector_type}: {key} must be one of {', '.join(choices)}; got "
            f"{config.get(key)!r}",
            key=key,
        )
    return value


def positive(config: ConnectorConfig, key: str) -> int:
    """The integer value of ``key``, at least 1.

    :raises ConfigurationError: naming ``key`` otherwise.
    """
    value = config.get_parsed(key, int)
    if value is None or value < 1:
        raise ConfigurationError(
            f"{config.connector_type}: {key} must be a positive integer, got {config.get(key)!r}",
            key=key,
        )
    return value


def sink_id(config: ConnectorConfig, table: TableName) -> str:
    """``sink.id``, or the table's qualified name when it is not set.

    :raises ConfigurationError: for a value outside letters, digits, ``.``, ``_``, ``-``.
    """
    given = config.get("sink.id")
    value = given if given else str(table)
    if not _SINK_ID.fullmatch(value):
        raise ConfigurationError(
            f"{SINK_NAME}: sink.id {value!r} may hold only letters, digits, '.', '_' and '-' "
            "(1 to 100 of them)" + ("" if given else "; set sink.id"),
            key="sink.id",
        )
    return value


def identifier(text: str, key: str, connector: str) -> str:
    """A plain SQL identifier (slot, publication, table names).

    :raises ConfigurationError: naming ``key`` otherwise.
    """
    value = text.strip()
    if not _NAME.fullmatch(value) or len(value) > 63:
        raise ConfigurationError(
            f"{connector}: {key} {value!r} must be a plain identifier (letters, digits, '_', "
            "at most 63)",
            key=key,
        )
    return value
