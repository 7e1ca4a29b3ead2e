"""Configuration shared by the files source and sink: the directory, the format, the schema."""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
from laminar_sdk import ConfigKeySpec, ConfigurationError, ConnectorConfig, PathKind
from laminar_sdk.reference import SCHEMAS, TYPE_EXAMPLES, arrow_type

PATH_KEY = ConfigKeySpec(
    "path",
    required=True,
    description="the directory of the files: a local (or mounted) path or file:///...; "
    "object-store URIs are refused (publishing needs an atomic directory rename)",
    path=PathKind.MAY_CREATE,
)

SCHEMA_KEY = ConfigKeySpec(
    "schema",
    default="ids",
    description="the row layout: ids or wide (the SDK's reference schemas), or a JSON list of "
    'fields such as [{"name": "id", "type": "int64", "nullable": false}]',
)

_FIELD_KEYS = frozenset({"name", "type", "nullable"})
_SCHEMA_EXAMPLE = '[{"name": "id", "type": "int64", "nullable": false}, {"name": "note", ...}]'


class FileFormat(enum.Enum):
    """The file formats the connectors read or write, by their ``format`` config value."""

    PARQUET = "parquet"
    CSV = "csv"
    JSONL = "jsonl"

    @property
    def extension(self) -> str:
        """The file name extension, with its dot (``.parquet``)."""
        return f".{self.value}"


def format_key(accepted: Sequence[FileFormat]) -> ConfigKeySpec:
    """The ``format`` key of a connector that handles the ``accepted`` formats."""
    return ConfigKeySpec(
        "format",
        default=FileFormat.PARQUET.value,
        description=" or ".join(member.value for member in accepted),
    )


def configured_format(
    label: str, config: ConnectorConfig, accepted: Sequence[FileFormat]
) -> FileFormat:
    """The ``format`` the validated ``config`` names.

    :raises ConfigurationError: naming the key when the format is not one of ``accepted``.
    """
    text = config.require("format").strip().lower()
    for member in accepted:
        if member.value == text:
            return member
    raise ConfigurationError(
        f"{label}: config key 'format' must be one of "
        f"{', '.join(member.value for member in accepted)}, got {config.require('format')!r}",
        key="format",
    )


def local_directory(label: str, config: ConnectorConfig, remote_refusal: str) -> Path:
    """The directory ``path`` names, made absolute; ``file://`` URIs are accepted.

    :param remote_refusal: why the connector refuses object-store URIs, and what to do.
    :raises ConfigurationError: naming ``path`` for an object-store URI or an empty path.
    """
    text = config.require(PATH_KEY.name)
    scheme, separator, rest = text.partition("://")
    if separator:
        if scheme.lower() != "file":
            # Only the scheme is shown: a URI may carry credentials before its host.
            raise ConfigurationError(
                f"{label}: config key 'path' is an object-store URI ({scheme}://...); "
                f"{remote_refusal}",
                key=PATH_KEY.name,
            )
        text = rest
    if not text.strip():
        raise ConfigurationError(
            f"{label}: config key 'path' is empty; give the directory of the files",
            key=PATH_KEY.name,
        )
    return Path(text).expanduser().absolute()


def configured_schema(label: str, config: ConnectorConfig) -> pa.Schema:
    """The schema the validated ``config`` declares with its ``schema`` key.

    The value is the name of one of the SDK's reference schemas (``ids``, ``wide``) or a JSON
    list of fields, each ``{"name": ..., "type": ..., "nullable": true|false}`` (``nullable``
    defaults to true). A type is written as Arrow prints it: ``int64``, ``double``,
    ``string``, ``bool``, ``date32``, ``timestamp[us]``, ``timestamp[us, tz=UTC]``,
    ``decimal128(10, 2)``, ...

    :raises ConfigurationError: naming the key, saying what is wrong with the value.
    """
    text = config.require(SCHEMA_KEY.name).strip()
    if not text.startswith("["):
        try:
            return SCHEMAS[text]
        except KeyError:
            raise _schema_error(
                label,
                f"must be one of {', '.join(SCHEMAS)} or a JSON list of fields such as "
                f"{_SCHEMA_EXAMPLE}, got {text!r}",
            ) from None
    try:
        fields = json.loads(text)
    except ValueError as error:
        raise _schema_error(label, f"is not valid JSON ({error})") from error
    if not isinstance(fields, list) or not fields:
        raise _schema_error(label, f"must be a non-empty JSON list of fields: {_SCHEMA_EXAMPLE}")
    schema = pa.schema([_field(label, position, item) for position, item in enumerate(fields)])
    duplicated = sorted({name for name in schema.names if schema.names.count(name) > 1})
    if duplicated:
        raise _schema_error(label, f"names column(s) {', '.join(duplicated)} more than once")
    return schema


def _field(label: str, position: int, item: object) -> pa.Field:
    where = f"field {position}"
    if not isinstance(item, dict):
        raise _schema_error(label, f"{where} must be an object such as {_SCHEMA_EXAMPLE}")
    unknown = sorted(set(item) - _FIELD_KEYS)
    if unknown:
        raise _schema_error(
            label, f"{where} has unknown key(s) {', '.join(unknown)}; use name, type, nullable"
        )
    name, type_text, nullable = item.get("name"), item.get("type"), item.get("nullable", True)
    if not isinstance(name, str) or not name:
        raise _schema_error(label, f"{where} needs a non-empty string 'name'")
    if not isinstance(type_text, str):
        raise _schema_error(label, f"column {name!r} needs a string 'type' such as \"int64\"")
    if not isinstance(nullable, bool):
        raise _schema_error(label, f"column {name!r}: 'nullable' must be true or false")
    return pa.field(name, _arrow_type(label, name, type_text), nullable=nullable)


def _arrow_type(label: str, column: str, text: str) -> pa.DataType:
    """The Arrow type written ``text`` (as Arrow prints it)."""
    try:
        return arrow_type(text)
    except ValueError as error:
        raise _schema_error(
            label,
            f"column {column!r} has type {text.strip()!r}, which is not an Arrow type this "
            f"connector knows; write it as Arrow prints it: {TYPE_EXAMPLES}",
        ) from error


def _schema_error(label: str, problem: str) -> ConfigurationError:
    return ConfigurationError(f"{label}: config key 'schema' {problem}", key=SCHEMA_KEY.name)
