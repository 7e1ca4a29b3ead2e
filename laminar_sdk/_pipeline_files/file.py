"""Pipeline files: what ``laminar run PIPELINE.toml`` reads.

A pipeline file names a source, an optional Spark SQL transform, a sink, and how to run them::

    [source]
    connector = "generator"
    rows = 1000                 # every other key is the connector's configuration

    [transform]                 # optional; the source is the temporary view `source`
    sql = "SELECT * FROM source WHERE id % 2 = 0"

    [sink]
    connector = "memory"
    path = "out"                # a path key: relative to this file's directory

    [pipeline]
    delivery = "exactly-once"         # or "at-least-once" (the default)
    checkpoint_location = "checkpoint"
    checkpoint_store = "file"         # optional: inferred from the location
    master = "local[2]"               # or spark://host:7077
    trigger = "available-now"         # or "continuous" (one micro-batch every `interval_s`)
    interval_s = 1.0
    max_bytes_per_batch = "256m"      # optional: most bytes one micro-batch reads (default 256m)
    max_records_per_batch = 100000    # optional: most records, besides (default: no cap)
    epoch_writer = true               # optional: a one-instance sink written while tasks run

Relative paths resolve against the pipeline file's directory, so a pipeline runs the same
from any working directory. That holds for `checkpoint_location` and for every connector key
its connector declares as a path (`laminar plugins show NAME` marks those [path, ...]); the
connector receives the absolute path. A path key marked "must exist" that names nothing is
an error naming the key and the resolved path, before Spark starts. URIs (s3://...) are
passed unchanged, as are the values of keys that are not paths.

Connector keys with dots in their names are written as TOML dotted keys (``sink.id = "run1"``,
``bootstrap.servers = "..."``) or as a sub-table (``[sink.table]`` then ``create = true``); the
connector receives the key as spelt (``sink.id``, ``table.create``). TOML cannot hold both a key
and a dotted key that starts with it (``table`` and ``table.create``): quote the longer one
(``"table.create" = true``).

`laminar run --check PIPELINE.toml` checks the file without starting Spark: the plugins are
found, every option is declared and of its type, required ones are given, path keys resolve,
and the connectors can keep the delivery guarantee. `laminar run` makes the same checks first.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from laminar_sdk._contract.config import PathKind
from laminar_sdk._contract.errors import ConfigurationError
from laminar_sdk._contract.types import DeliveryGuarantee
from laminar_sdk._plugins.loading import load_connector_registry
from laminar_sdk._plugins.registry import ConnectorRegistry, ConnectorRole, ConnectorSpec
from laminar_sdk._spark.options import (
    CHECKPOINT_STORE,
    CONNECTOR_OPTION,
    DELIVERY,
    EPOCH_WRITER,
    MAX_BYTES_PER_BATCH,
    MAX_RECORDS_PER_BATCH,
    SDK_OPTIONS,
    SPARK_CHECKPOINT_LOCATION,
    decode_byte_size,
    decode_delivery,
    decode_record_cap,
    decode_switch,
)

TRIGGERS = ("available-now", "continuous")

_SECTIONS = {"source", "transform", "sink", "pipeline"}
_PIPELINE_KEYS = {
    "delivery",
    "checkpoint_location",
    "checkpoint_store",
    "master",
    "trigger",
    "interval_s",
    "max_bytes_per_batch",
    "max_records_per_batch",
    "epoch_writer",
}


@dataclass(frozen=True, slots=True)
class PipelineFile:
    """A parsed pipeline file; see the module documentation for the format.

    Connector options and ``checkpoint_location`` hold resolved paths (absolute, unless a URI).
    """

    path: Path
    source: str
    source_options: Mapping[str, str]
    sink: str
    sink_options: Mapping[str, str]
    transform_sql: str | None
    delivery: DeliveryGuarantee
    checkpoint_location: str
    checkpoint_store: str | None
    master: str
    trigger: str
    interval_s: float
    max_bytes_per_batch: int | None
    max_records_per_batch: int | None
    epoch_writer: bool | None = None

    def spark_options(self, role: ConnectorRole) -> dict[str, str]:
        """The options of ``format("laminar")`` for the ``role`` side of this pipeline."""
        source = role is ConnectorRole.SOURCE
        options = {
            CONNECTOR_OPTION: self.source if source else self.sink,
            **(self.source_options if source else self.sink_options),
            DELIVERY: str(self.delivery),
            # Both sides keep what must survive a crash under it (a polled source: its read log).
            SPARK_CHECKPOINT_LOCATION: self.checkpoint_location,
        }
        if source and self.max_bytes_per_batch is not None:
            options[MAX_BYTES_PER_BATCH] = str(self.max_bytes_per_batch)
        if source and self.max_records_per_batch is not None:
            options[MAX_RECORDS_PER_BATCH] = str(self.max_records_per_batch)
        if not source and self.epoch_writer is not None:
            options[EPOCH_WRITER] = str(self.epoch_writer).lower()
        if self.checkpoint_store is not None:
            options[CHECKPOINT_STORE] = self.checkpoint_store
        return options


T = TypeVar("T")


def _fail(path: Path, key: str, message: str) -> ConfigurationError:
    return ConfigurationError(f"{path}: {key}: {message}", key=key)


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def local_path(directory: Path, value: str) -> Path | None:
    """The local file or directory ``value`` names, relative ones under ``directory``.

    ``~`` is expanded; ``file://`` URIs are local. ``None`` for another URI (``s3://...``),
    which names no local path.
    """
    scheme, separator, rest = value.partition("://")
    if separator:
        return Path(rest) if scheme.lower() == "file" else None
    named = Path(value).expanduser()
    return named if named.is_absolute() else (directory / named).resolve()


def _resolved(path: Path, key: str, value: str, kind: PathKind) -> str:
    """``value`` of path key ``key``, a relative path resolved; URIs unchanged.

    :raises ConfigurationError: when ``kind`` is :attr:`PathKind.MUST_EXIST` and the path
        names nothing.
    """
    found = local_path(path.parent, value)
    if found is None:
        return value
    if kind is PathKind.MUST_EXIST and not found.exists():
        raise _fail(
            path,
            key,
            f"{found} does not exist, and the connector needs it before the pipeline starts "
            f"(relative paths resolve against the pipeline file's directory, "
            f"{path.parent.resolve()}); create it, or change {key}",
        )
    return value if "://" in value else str(found)


def _connector(
    path: Path,
    document: Mapping[str, Any],
    section: str,
    role: ConnectorRole,
    registry: ConnectorRegistry,
) -> tuple[str, dict[str, str]]:
    table = document.get(section)
    if not isinstance(table, dict):
        raise _fail(path, section, f"missing [{section}] table with a `connector` key")
    options = dict(table)
    connector = options.pop("connector", None)
    if not isinstance(connector, str) or not connector:
        raise _fail(path, f"{section}.connector", "missing: name the connector to use")
    try:
        spec = registry.get(connector, role)
    except ConfigurationError as error:
        raise _fail(path, f"{section}.connector", str(error)) from None
    path_keys = _path_keys(spec)
    converted: dict[str, str] = {}
    for key, value in _dotted(options):
        if isinstance(value, list):
            raise _fail(path, f"{section}.{key}", "must be a string, number or boolean")
        text = _text(value)
        kind = path_keys.get(key.lower())
        if kind is not None and text.strip():
            text = _resolved(path, f"{section}.{key}", text, kind)
        converted[key] = text
    return connector, converted


def _dotted(table: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """The keys of a section as the user spelt them, with their values.

    TOML reads ``sink.id = ...`` (unquoted) and ``[sink.table]`` as nested tables: their keys
    are the connector keys ``sink.id`` and ``table.KEY``.
    """
    for key, value in table.items():
        if isinstance(value, dict):
            yield from _dotted(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _path_keys(spec: ConnectorSpec) -> dict[str, PathKind]:
    # Spark's options are case-insensitive: a key's spelling in the file may differ.
    return {key.name.lower(): key.path for key in spec.config_keys if key.path is not None}


def load_pipeline_file(path: Path, *, registry: ConnectorRegistry | None = None) -> PipelineFile:
    """Read and check a pipeline file, resolving its paths (see the module documentation).

    :param registry: where the connectors are looked up (default: the installed plugins).
    :raises ConfigurationError: naming the file and the key that is missing, unknown or of
        the wrong type, the connector that is not installed, or the path key whose file or
        directory must exist and does not.
    """
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigurationError(f"{path}: no such pipeline file", key="pipeline") from None
    except tomllib.TOMLDecodeError as error:
        hint = (
            "; a key that is also the start of a dotted key (`table` and `table.create`) must "
            'be quoted: "table.create" = ...'
            if "Cannot overwrite a value" in str(error)
            else ""
        )
        raise ConfigurationError(
            f"{path}: not valid TOML: {error}{hint}", key="pipeline"
        ) from error
    for section in document:
        if section not in _SECTIONS:
            raise _fail(path, section, f"unknown section; use {', '.join(sorted(_SECTIONS))}")
    registry = load_connector_registry() if registry is None else registry
    source, source_options = _connector(path, document, "source", ConnectorRole.SOURCE, registry)
    sink, sink_options = _connector(path, document, "sink", ConnectorRole.SINK, registry)
    transform = document.get("transform", {})
    sql = transform.get("sql") if isinstance(transform, dict) else None
    if transform and (not isinstance(sql, str) or set(transform) != {"sql"}):
        raise _fail(path, "transform", "must hold exactly one key, `sql`, a SQL query text")
    settings = document.get("pipeline", {})
    unknown = set(settings) - _PIPELINE_KEYS
    if unknown:
        raise _fail(
            path, f"pipeline.{sorted(unknown)[0]}", f"unknown; use {sorted(_PIPELINE_KEYS)}"
        )
    location = settings.get("checkpoint_location")
    if not isinstance(location, str) or not location:
        raise _fail(
            path, "pipeline.checkpoint_location", "missing: where the pipeline keeps its progress"
        )
    trigger = settings.get("trigger", "available-now")
    if trigger not in TRIGGERS:
        raise _fail(path, "pipeline.trigger", f"{trigger!r}; use one of {', '.join(TRIGGERS)}")
    interval = settings.get("interval_s", 1.0)
    if not isinstance(interval, int | float) or interval <= 0:
        raise _fail(path, "pipeline.interval_s", "must be a positive number of seconds")
    # The SDK's options, decoded as the Spark bridge decodes them.
    max_records = _sdk_setting(path, settings, MAX_RECORDS_PER_BATCH, decode_record_cap, None)
    max_bytes = _sdk_setting(path, settings, MAX_BYTES_PER_BATCH, decode_byte_size, None)
    delivery = _sdk_setting(
        path, settings, DELIVERY, decode_delivery, DeliveryGuarantee.AT_LEAST_ONCE
    )
    epoch_writer = _sdk_setting(path, settings, EPOCH_WRITER, decode_switch, None)
    store = settings.get("checkpoint_store")
    return PipelineFile(
        path=path,
        source=source,
        source_options=source_options,
        sink=sink,
        sink_options=sink_options,
        transform_sql=sql,
        delivery=delivery,
        checkpoint_location=_resolved(
            path, "pipeline.checkpoint_location", location, PathKind.MAY_CREATE
        ),
        checkpoint_store=None if store is None else _text(store),
        master=_text(settings.get("master", "local[2]")),
        trigger=trigger,
        interval_s=float(interval),
        max_bytes_per_batch=max_bytes,
        max_records_per_batch=max_records,
        epoch_writer=epoch_writer,
    )


def _sdk_setting(
    path: Path,
    settings: Mapping[str, object],
    option_name: str,
    decode: Callable[[str], T],
    default: T,
) -> T:
    """The ``[pipeline]`` key that sets SDK option ``option_name``, decoded as the bridge does.

    :raises ConfigurationError: naming the file, the key, what it must be and what was given.
    """
    option = next(option for option in SDK_OPTIONS if option.name == option_name)
    value = settings.get(option.pipeline_key)
    if value is None:
        return default
    try:
        return decode(_text(value))
    except ValueError as error:
        raise _fail(path, f"pipeline.{option.pipeline_key}", f"{error}; got {value!r}") from None


def pipeline_file_help() -> str:
    """The pipeline file format, for ``laminar run --help``."""
    return __doc__ or ""
