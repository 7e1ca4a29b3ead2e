"""Where a Delta table is, how delta-rs reaches it, and its schema as Arrow sees it.

A table is named by the ``path`` key — a local directory or an ``s3://bucket/prefix`` URI,
with the SDK's ``s3.*`` keys — which gives two clients of the same location: the pyarrow
filesystem the connectors write and read data files through
(:class:`~laminar_sdk.reference.StorageLocation`), and the storage options of delta-rs, which
reads and commits the table's log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from laminar_sdk import (
    ConfigKeySpec,
    ConfigurationError,
    ConnectionFailed,
    ConnectorConfig,
    ConnectorIOError,
    SchemaMismatch,
)
from laminar_sdk.reference import StorageLocation, storage_location

if TYPE_CHECKING:
    from deltalake import DeltaTable

TABLE_PATH_KEY = ConfigKeySpec(
    "path",
    required=True,
    description="the Delta table: a local directory, or s3://bucket/prefix on an S3 (or "
    "S3-compatible) store, with the s3.* keys",
)

# The s3.* keys, as delta-rs's storage options (object_store's AWS configuration keys).
_DELTA_S3_OPTIONS = {
    "s3.endpoint": "AWS_ENDPOINT_URL",
    "s3.region": "AWS_REGION",
    "s3.access_key": "AWS_ACCESS_KEY_ID",
    "s3.secret_key": "AWS_SECRET_ACCESS_KEY",
    "s3.session_token": "AWS_SESSION_TOKEN",
}


@dataclass(frozen=True, slots=True)
class TableLocation:
    """A Delta table's location, for pyarrow (data files) and for delta-rs (the log).

    :param files: the table's directory in a pyarrow filesystem.
    :param uri: the URI delta-rs opens (a local path, or ``s3://bucket/prefix``).
    :param storage_options: delta-rs's options for ``uri`` (credentials among them: never
        shown).
    """

    files: StorageLocation
    uri: str
    storage_options: dict[str, str]

    @property
    def shown(self) -> str:
        """The location as messages name it: without credentials."""
        return self.files.shown


def table_location(label: str, config: ConnectorConfig) -> TableLocation:
    """The table the validated ``config``'s ``path`` and ``s3.*`` keys name.

    :raises ConfigurationError: naming the key at fault (see
        :func:`~laminar_sdk.reference.storage_location`).
    """
    files = storage_location(label, config, TABLE_PATH_KEY.name)
    if not files.remote:
        return TableLocation(files, files.root, {})
    if not files.shown.startswith("s3://"):
        raise ConfigurationError(
            f"{label}: config key 'path' is {files.shown}; the delta connectors read and "
            "write tables on local disk and on S3 (s3://bucket/prefix)",
            key=TABLE_PATH_KEY.name,
        )
    options = {
        option: value
        for key, option in _DELTA_S3_OPTIONS.items()
        if (value := config.get(key)) is not None
    }
    if config.get_parsed("s3.allow_http", bool, False):
        options["AWS_ALLOW_HTTP"] = "true"
    timeout = config.get_parsed("s3.timeout_s", float, 5.0)
    options["timeout"] = f"{timeout}s"
    options["connect_timeout"] = f"{timeout}s"
    return TableLocation(files, files.shown, options)


def open_table(label: str, location: TableLocation) -> DeltaTable | None:
    """The table at ``location``, its newest version loaded; ``None`` when there is none.

    :raises ConnectionFailed: when the store cannot be reached or refuses the request.
    """
    from deltalake import DeltaTable  # noqa: PLC0415 - ~0.1 s, for the processes that use it
    from deltalake.exceptions import TableNotFoundError  # noqa: PLC0415

    try:
        return DeltaTable(location.uri, storage_options=location.storage_options or None)
    except TableNotFoundError:
        return None
    except OSError as error:
        raise unreachable(label, location, "open the table", error) from error


def unreachable(
    label: str, location: TableLocation, what: str, error: BaseException
) -> ConnectionFailed | ConnectorIOError:
    """The error for a request to the table's storage that failed.

    On an object store: :class:`~laminar_sdk.ConnectionFailed` naming the endpoint (the
    network, or the store refusing). On local disk: :class:`~laminar_sdk.ConnectorIOError`
    naming the table (a full disk, a permission). Both are transient: the runtime retries.
    """
    if not location.files.remote:
        return ConnectorIOError(
            f"{label}: cannot {what} at {location.shown} (config key 'path'): "
            f"{_first_line(error)}; check that the directory may be read and written and that "
            "its disk has room"
        )
    endpoint = location.storage_options.get("AWS_ENDPOINT_URL")
    through = f" through {endpoint} (s3.endpoint)" if endpoint else ""
    failed = ConnectionFailed(
        f"{label}: cannot {what} at {location.shown}{through}: {_first_line(error)}; check that "
        "the store is reachable (s3.endpoint, s3.region) and that the credentials may read and "
        "write under the prefix"
    )
    failed.transient = True
    return failed


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def arrow_schema(table: DeltaTable) -> pa.Schema:
    """The table's columns as Arrow types (partition columns included, in the table's order)."""
    return pa.schema(table.schema().to_arrow())


def check_schema(label: str, table_schema: pa.Schema, declared: pa.Schema, shown: str) -> None:
    """Refuse a declared ``schema`` that is not the table's.

    :raises SchemaMismatch: naming the first column missing, extra or of another type.
    """
    for field in declared:
        if field.name not in table_schema.names:
            raise SchemaMismatch(
                f"{label}: column {field.name!r} of config key 'schema' is not a column of the "
                f"table at {shown} (its columns: {', '.join(table_schema.names)}); the sink "
                "appends rows of the table's own schema"
            )
        expected = table_schema.field(field.name).type
        if not _same_type(expected, field.type):
            raise SchemaMismatch(
                f"{label}: column {field.name!r} is {field.type} in config key 'schema' and "
                f"{expected} in the table at {shown}; declare it as the table has it"
            )
    missing = [name for name in table_schema.names if name not in declared.names]
    if missing:
        raise SchemaMismatch(
            f"{label}: config key 'schema' lacks column(s) {', '.join(missing)} of the table at "
            f"{shown}; declare every column of the table (or leave 'schema' unset to take the "
            "table's)"
        )


def _same_type(expected: pa.DataType, given: pa.DataType) -> bool:
    """Whether ``given`` is ``expected``, list element names aside (Delta's is ``element``)."""
    if pa.types.is_list(expected) and pa.types.is_list(given):
        return _same_type(expected.value_type, given.value_type)
    return bool(expected == given)
