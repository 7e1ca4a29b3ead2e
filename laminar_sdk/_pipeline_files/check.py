"""Checking a pipeline file without Spark: what ``laminar run --check`` does.

Every check that needs no running system: the plugins are found, every connector option is
declared, of its type and given when required (as the Spark bridge checks them, with the same
function), the SDK's options and the checkpoint store are valid, path keys resolve (done when
the file is loaded), the checkpoint location and the paths connectors may create can be
written (tried, and undone), and the connectors can keep the delivery guarantee. Connectors
are built but never opened, so nothing is contacted: what only an open connector or Spark can
tell (a server that cannot be reached, the SQL transform) is checked when the pipeline
starts — or, with ``laminar run --check --connect``, by :func:`connect_pipeline`, which opens
each connector as the run does.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from laminar_sdk._checkpointing.recovery import search_latest_valid
from laminar_sdk._contract.config import PathKind
from laminar_sdk._contract.errors import (
    CheckpointError,
    ConfigurationError,
    PluginError,
    SchemaMismatch,
)
from laminar_sdk._contract.schema import sink_described
from laminar_sdk._contract.types import DeliveryGuarantee
from laminar_sdk._pipeline_files.file import PipelineFile, local_path
from laminar_sdk._plugins.registry import ConnectorRegistry, ConnectorRole, ConnectorSpec
from laminar_sdk._runtime.coordinator import destination_ahead
from laminar_sdk._runtime.delivery import DeliveryGuaranteeWarning, validate_delivery_guarantee
from laminar_sdk._spark.options import (
    CONNECTOR_OPTION,
    SDK_OPTIONS,
    BridgeOptions,
    checkpointer_of,
    parse_options,
)

# Where the options the bridge checks come from in a pipeline file.
_PIPELINE_KEYS = {
    CONNECTOR_OPTION: "connector",
    **{option.name: f"pipeline.{option.pipeline_key}" for option in SDK_OPTIONS},
}


@dataclass(frozen=True, slots=True)
class CheckedItem:
    """One thing a check looked at, and what it found."""

    what: str
    finding: str


def check_pipeline(
    pipeline: PipelineFile, registry: ConnectorRegistry, *, connect: bool = False
) -> list[CheckedItem]:
    """Check everything about ``pipeline`` that can be checked without Spark.

    :param pipeline: a loaded pipeline file (its paths resolved and checked already).
    :param registry: the installed connectors, as loaded for the file.
    :param connect: also open and close each connector (:func:`connect_pipeline`).
    :returns: what was checked, in order; warnings (a delivery weaker than it may look)
        among them, and last what was not checked.
    :raises ConfigurationError: naming the file and the key at fault (``sink.rows_per_file``,
        ``pipeline.delivery``, ...) and what to do.
    """
    checked: list[CheckedItem] = []
    sides: dict[ConnectorRole, tuple[ConnectorSpec, BridgeOptions]] = {}
    for role in ConnectorRole:
        options = _bridge_options(pipeline, role, registry)
        spec = registry.get(options.connector, role)
        sides[role] = (spec, options)
        checked.append(CheckedItem(str(role), _describe(spec, options)))
        checked += _paths(pipeline, role, spec, options)
    checked.append(CheckedItem("checkpoints", _checkpoints(pipeline, sides[ConnectorRole.SINK][1])))
    checked += _delivery(pipeline, registry)
    if connect:
        checked += connect_pipeline(pipeline, registry)
    unchecked = []
    if pipeline.transform_sql is not None:
        unchecked.append("the SQL transform (it needs Spark)")
    if not connect:
        unchecked.append("connections to external systems (--connect opens the connectors)")
    if unchecked:
        found = f"{' and '.join(unchecked)}: checked when the pipeline starts"
        checked.append(CheckedItem("not checked", found))
    return checked


def connect_pipeline(pipeline: PipelineFile, registry: ConnectorRegistry) -> list[CheckedItem]:
    """Open each connector of ``pipeline`` as the run does, and close it (``--connect``).

    The source is opened and asked its schema; the sink is opened (which checks its table,
    topic or directory, as each sink does) and asked its schema and the newest epoch its
    destination records. Without a transform, the sink must take the source's columns as they
    come out of Spark. A sink whose destination records epochs while the checkpoint location
    holds none is refused as the run would refuse it (a query started over).

    :returns: what was found, in order.
    :raises LaminarError: what opening a connector raised (a server that cannot be reached, a
        missing table, …), the sink's :class:`SchemaMismatch`, or the start-over refusal.
    """
    from laminar_sdk._spark.arrow import (  # noqa: PLC0415 - imports pyspark
        schema_differences,
        spark_round_trip_schema,
    )
    from laminar_sdk._spark.connectors import (  # noqa: PLC0415 - beside the one above
        opened_sink,
        opened_source,
        run,
    )

    source_options = _bridge_options(pipeline, ConnectorRole.SOURCE, registry)
    sink_options = _bridge_options(pipeline, ConnectorRole.SINK, registry)

    async def opened() -> tuple[pa.Schema, pa.Schema, int | None]:
        async with opened_source(source_options) as source:
            source_schema = source.schema()
        async with opened_sink(sink_options) as sink:
            return source_schema, sink.schema(), await sink.last_committed_epoch()

    source_schema, sink_schema, committed = run(opened())
    checked = [
        CheckedItem("source", f"{pipeline.source} opened and closed: {_columns(source_schema)}"),
        CheckedItem("sink", f"{pipeline.sink} opened and closed: {_columns(sink_schema)}"),
    ]
    if pipeline.transform_sql is None:
        stream = spark_round_trip_schema(source_schema, pipeline.source)
        problems = schema_differences(sink_schema, stream)
        if problems:
            raise SchemaMismatch(
                f"{pipeline.path}: {sink_described(pipeline.sink, sink_schema)} cannot take "
                "the source's stream: "
                f"{'; '.join(problems)}. Select or cast the columns in a [transform]"
            )
        checked.append(CheckedItem("columns", "the sink takes the source's columns"))
    store = checkpointer_of(sink_options)
    search = run(search_latest_valid(store, on_skip=lambda _: None))
    fresh = search.recovered is None and not search.skipped
    if committed is not None and committed >= 0 and fresh:
        raise destination_ahead(store.location, pipeline.sink, committed)
    if committed is None:
        destination = "keeps no record of committed epochs"
    elif committed < 0:
        destination = "no epoch committed yet"
    else:
        destination = f"epochs up to {committed} committed; the query resumes from its checkpoints"
    checked.append(CheckedItem("destination", destination))
    return checked


def _columns(schema: pa.Schema) -> str:
    return f"columns ({', '.join(schema.names)})"


def _bridge_options(
    pipeline: PipelineFile, role: ConnectorRole, registry: ConnectorRegistry
) -> BridgeOptions:
    section = str(role)
    try:
        return parse_options(pipeline.spark_options(role), role, registry)
    except ConfigurationError as error:
        given = error.key or ""
        key = _PIPELINE_KEYS.get(given, f"{section}.{given}")
        if key == "connector":
            key = f"{section}.connector"
        raise ConfigurationError(f"{pipeline.path}: {key}: {error}", key=key) from error


def _describe(spec: ConnectorSpec, options: BridgeOptions) -> str:
    config = spec.configure(options.properties)
    given = ", ".join(
        f"{key}={value}" for key, value in config.redacted().items() if key in options.properties
    )
    origin = f"{spec.distribution} {spec.version}".strip()
    return f"{spec.name} ({origin}): options valid" + (f": {given}" if given else "")


def _paths(
    pipeline: PipelineFile, role: ConnectorRole, spec: ConnectorSpec, options: BridgeOptions
) -> list[CheckedItem]:
    found = []
    for key in spec.config_keys:
        value = options.properties.get(key.name)
        if key.path is None or value is None:
            continue
        local = local_path(pipeline.path.parent, value)
        state = (
            "a URI: checked when the connector opens"
            if local is None
            else "exists"
            if local.exists()
            else "does not exist yet; may be created"
        )
        if local is not None and key.path is PathKind.MAY_CREATE:
            _require_writable(pipeline, f"{role}.{key.name}", local)
            state += "; writable"
        found.append(CheckedItem(f"{role}.{key.name}", f"{value} ({state})"))
    return found


def _require_writable(pipeline: PipelineFile, key: str, path: Path) -> None:
    """Refuse ``path`` (``key``'s) unless what it names can be written.

    That is: a file can be written in it if it is a directory, else in the directory that
    holds it (or will), made if need be. Tried for real, and undone: the directories made on
    the way and the probe file are removed, so a check leaves nothing behind.

    :raises ConfigurationError: naming the key, the path and what stopped it.
    """
    directory = path if path.is_dir() else path.parent
    missing: list[Path] = []
    existing = directory
    while not existing.exists():
        missing.append(existing)
        existing = existing.parent
    if not existing.is_dir():
        raise _unwritable(pipeline, key, path, f"{existing} is a file, not a directory")
    made: list[Path] = []
    try:
        for step in reversed(missing):
            step.mkdir()
            made.append(step)
        descriptor, probe = tempfile.mkstemp(prefix=".laminar-check-", dir=directory)
        os.close(descriptor)
        os.unlink(probe)
    except OSError as error:
        problem = f"{error.strerror or error} ({error.filename or directory})"
        raise _unwritable(pipeline, key, path, problem) from None
    finally:
        for step in reversed(made):
            step.rmdir()


def _unwritable(pipeline: PipelineFile, key: str, path: Path, problem: str) -> ConfigurationError:
    return ConfigurationError(
        f"{pipeline.path}: {key}: {path} cannot be written: {problem}", key=key
    )


def _checkpoints(pipeline: PipelineFile, options: BridgeOptions) -> str:
    location = options.checkpoint_location
    assert location is not None, "parse_options gives a sink one, or refuses"
    store = options.checkpoint_store
    try:
        checkpointer_of(options)  # builds the store's client: nothing is read or written yet
    except (CheckpointError, PluginError) as error:
        key = (
            "pipeline.checkpoint_store"
            if pipeline.checkpoint_store is not None
            else "pipeline.checkpoint_location"
        )
        raise ConfigurationError(f"{pipeline.path}: {key}: {error}", key=key) from error
    for kept in dict.fromkeys([pipeline.checkpoint_location, location]):  # Spark's first
        local = local_path(pipeline.path.parent, kept)
        if local is not None:
            _require_writable(pipeline, "pipeline.checkpoint_location", local)
    return (
        f"Spark's in {pipeline.checkpoint_location}, the SDK's in {location} (store {store!r}), "
        "writable"
    )


def _delivery(pipeline: PipelineFile, registry: ConnectorRegistry) -> list[CheckedItem]:
    source = registry.create_source(pipeline.source)
    sink = registry.create_sink(pipeline.sink)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeliveryGuaranteeWarning)
        try:
            validate_delivery_guarantee(
                pipeline.delivery,
                sources={pipeline.source: source},
                sinks={pipeline.sink: sink},
                checkpointing_enabled=True,
            )
        except ConfigurationError as error:
            raise ConfigurationError(
                f"{pipeline.path}: pipeline.delivery: {error}", key="pipeline.delivery"
            ) from error
    replay = "replays" if source.supports_replay() else "cannot replay"
    exactly_once = sink.capabilities().exactly_once
    declares = "declares exactly_once" if exactly_once else "does not declare exactly_once"
    finding = f"{pipeline.delivery}: source {pipeline.source!r} {replay}, sink {pipeline.sink!r} "
    finding += declares
    if pipeline.delivery is DeliveryGuarantee.EXACTLY_ONCE:
        # Unopened: a sink whose capabilities depend on its configuration says it again then.
        finding += " (asked again of the opened sink when the pipeline starts)"
    checked = [CheckedItem("delivery", finding)]
    checked += [
        CheckedItem("warning", str(warning.message))
        for warning in caught
        if issubclass(warning.category, DeliveryGuaranteeWarning)
    ]
    return checked
