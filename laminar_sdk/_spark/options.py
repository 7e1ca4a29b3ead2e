"""The options of ``format("laminar")``: which belong to the SDK, which to the connector.

Spark hands a data source its options in a case-insensitive map whose keys arrive in lower
case. The bridge splits them into:

- ``connector`` — the registered connector name (required);
- ``laminar.*`` — the SDK's own settings (:data:`SDK_OPTIONS`; an unknown one is an error);
- Spark's own ``checkpointLocation`` (read on either side, for the default of
  ``laminar.checkpoint.location``) and ``path`` (connector config when the connector declares
  a ``path`` key, an error otherwise);
- everything else — the connector's configuration, validated against the keys it declares,
  whose spelling (case) is restored from the declaration.
"""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from laminar_sdk._checkpointing.checkpointer import Checkpointer
from laminar_sdk._checkpointing.registry import (
    CHECKPOINTER_ENTRY_POINT_GROUP,
    open_checkpointer,
    store_for_location,
)
from laminar_sdk._contract.config import parse_byte_size
from laminar_sdk._contract.errors import CheckpointError, ConfigurationError
from laminar_sdk._contract.types import DeliveryGuarantee
from laminar_sdk._plugins.loading import (
    PLUGIN_ENTRY_POINT_GROUP,
    FoundEntryPoint,
    find_entry_point,
    load_connector_registry,
)
from laminar_sdk._plugins.registry import ConnectorRegistry, ConnectorRole, ConnectorSpec
from laminar_sdk._spark.read_log import READ_LOG_DIRECTORY

CONNECTOR_OPTION = "connector"
"""The option naming the connector: ``.option("connector", "kafka")``."""

SDK_PREFIX = "laminar."
"""Options whose names start with this belong to the SDK, not to the connector."""

DELIVERY = "laminar.delivery"
MAX_RECORDS_PER_BATCH = "laminar.max.records.per.batch"
MAX_BYTES_PER_BATCH = "laminar.max.bytes.per.batch"
CHECKPOINT_LOCATION = "laminar.checkpoint.location"
CHECKPOINT_STORE = "laminar.checkpoint.store"
EPOCH_WRITER = "laminar.epoch.writer"
CHECKPOINT_STORE_OPTION_PREFIX = "laminar.checkpoint.option."
"""``laminar.checkpoint.option.endpoint=...`` passes ``endpoint`` to the checkpoint store."""

SPARK_CHECKPOINT_LOCATION = "checkpointlocation"
SPARK_PATH = "path"

LAMINAR_CHECKPOINT_DIRECTORY = "laminar"
"""The directory under Spark's ``checkpointLocation`` that holds the SDK's epoch manifests."""

DEFAULT_MAX_BYTES_PER_BATCH = 256 * 1024 * 1024
"""A micro-batch reads everything available, up to this many bytes of Arrow data.

Big enough that Spark's fixed cost per micro-batch (offset and commit logs, planning, Python
workers: 0.3 to 0.5 s on 2 cores) stays a few percent of a micro-batch (256 MiB of the
three-column rows of the benchmarks are 13M rows, seconds of work); small enough that a
backlog is read in steps whose read-log entry, and whose re-run after a crash, stay modest.
Memory does not depend on it: every stage streams (see ``BridgeOptions``)."""


@dataclass(frozen=True, slots=True)
class SdkOption:
    """One ``laminar.*`` option: its name, the roles it applies to, its default and meaning.

    ``pipeline_key`` is the key of a pipeline file's ``[pipeline]`` table that sets it.
    """

    name: str
    roles: frozenset[ConnectorRole]
    default: str
    description: str
    pipeline_key: str


def decode_delivery(text: str) -> DeliveryGuarantee:
    """``laminar.delivery``'s value. :raises ValueError: saying what it must be."""
    try:
        return DeliveryGuarantee.parse(text)
    except ConfigurationError as error:
        raise ValueError(str(error)) from None


def decode_record_cap(text: str) -> int | None:
    """``laminar.max.records.per.batch``'s value. :raises ValueError: saying what it must be."""
    if text.strip().lower() == "none":
        return None
    return _positive(text, int, "must be a positive integer, or none (no cap)")


def decode_byte_size(text: str) -> int:
    """``laminar.max.bytes.per.batch``'s value. :raises ValueError: saying what it must be."""
    requirement = 'must be a positive number of bytes, or a size like "64m" or "1g"'
    return _positive(text, parse_byte_size, requirement)


def decode_switch(text: str) -> bool:
    """``laminar.epoch.writer``'s value. :raises ValueError: saying what it must be."""
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise ValueError("must be true or false")
    return value == "true"


def _positive(text: str, parse: Callable[[str], int], requirement: str) -> int:
    try:
        value = parse(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(requirement)
    return value


_BOTH = frozenset(ConnectorRole)

SDK_OPTIONS: tuple[SdkOption, ...] = (
    SdkOption(
        DELIVERY,
        _BOTH,
        str(DeliveryGuarantee.default()),
        "at-least-once or exactly-once; exactly-once needs a replayable source and a sink "
        "declaring exactly_once",
        "delivery",
    ),
    SdkOption(
        MAX_BYTES_PER_BATCH,
        frozenset({ConnectorRole.SOURCE}),
        f"{DEFAULT_MAX_BYTES_PER_BATCH >> 20}m",
        "most bytes of records (Arrow data) one micro-batch reads from the source, as a byte "
        "count or with a binary unit: 64m, 1g; a micro-batch reads everything available up to "
        "it. A polled source stops being polled there (the last batch may cross it); a "
        "range-readable one is asked for the records that fit, estimated from its schema, or "
        "for variable-width columns from a sample of its records",
        "max_bytes_per_batch",
    ),
    SdkOption(
        MAX_RECORDS_PER_BATCH,
        frozenset({ConnectorRole.SOURCE}),
        "none",
        "most records one micro-batch reads from the source, besides the byte budget; none: no cap",
        "max_records_per_batch",
    ),
    SdkOption(
        CHECKPOINT_LOCATION,
        _BOTH,
        f"<checkpointLocation>/{LAMINAR_CHECKPOINT_DIRECTORY}",
        "where the SDK keeps what must survive a crash: a sink's epoch manifests, and a polled "
        f"source's read log (under {READ_LOG_DIRECTORY}/); required for a sink, and for a source "
        "that is not range-readable, when Spark's checkpointLocation is not given as an option "
        "on that side",
        "checkpoint_location",
    ),
    SdkOption(
        CHECKPOINT_STORE,
        _BOTH,
        "<chosen by the location's scheme>",
        "the checkpoint store (file, object, or one installed by a plugin)",
        "checkpoint_store",
    ),
    SdkOption(
        EPOCH_WRITER,
        frozenset({ConnectorRole.SINK}),
        "true",
        "for a sink written by one instance (not a distributed-commit sink): write each "
        "micro-batch to it while its write tasks still run, in a process on the driver's machine "
        "that keeps the sink open across micro-batches; false: the commit writes the whole "
        "micro-batch once its tasks have ended",
        "epoch_writer",
    ),
)
"""Every ``laminar.*`` option, with its documented default. Besides these, keys starting with
``laminar.checkpoint.option.`` are passed (without the prefix) to the checkpoint store."""

_SDK_OPTION_NAMES = {option.name: option for option in SDK_OPTIONS}

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BridgeOptions:
    """The options of one side of a ``format("laminar")`` query, split and validated.

    Plain, picklable data: Spark ships it to its Python workers inside readers and writers.

    :param connector: the registered connector name.
    :param role: whether the connector is read from or written to.
    :param properties: the connector's configuration, with the declared spelling of its keys.
    :param delivery: the delivery guarantee asked for.
    :param max_records_per_batch: most records read per micro-batch (sources); ``None``: no
        cap but the byte budget.
    :param max_bytes_per_batch: most bytes of Arrow data read per micro-batch (sources).
    :param checkpoint_location: the laminar checkpoint location: where a sink's epoch manifests
        and a source's read log are kept; ``None`` for a source given none.
    :param checkpoint_store: the checkpoint store's name: the one given, else the one the
        location's scheme chooses; ``None`` with no location, or to infer it from the location.
    :param checkpoint_options: settings passed to the checkpoint store.
    :param plugin: the entry-point name of the plugin providing the connector, found when the
        options were parsed: the processes the options are shipped to import that plugin
        alone (every installed one when it is empty, or no longer provides the connector).
    :param entry_points: the entry points of that plugin and of the checkpoint store, as the
        scan that parsed the options first found them: the processes the options are shipped
        to load both from these, without a scan of their own.
    :param epoch_writer: whether a one-instance sink is written by the epoch writer while the
        tasks run (:mod:`~laminar_sdk._spark.epoch_writer`), or by the commit alone.
    """

    connector: str
    role: ConnectorRole
    properties: Mapping[str, str] = field(repr=False)  # may hold secrets
    delivery: DeliveryGuarantee = DeliveryGuarantee.AT_LEAST_ONCE
    max_records_per_batch: int | None = None
    max_bytes_per_batch: int = DEFAULT_MAX_BYTES_PER_BATCH
    checkpoint_location: str | None = None
    checkpoint_store: str | None = None
    checkpoint_options: Mapping[str, str] = field(default_factory=dict, repr=False)
    plugin: str = ""
    entry_points: tuple[FoundEntryPoint, ...] = ()
    epoch_writer: bool = True

    def spec(self) -> ConnectorSpec:
        """The registered connector these options name."""
        return self.registry().get(self.connector, self.role)

    def registry(self) -> ConnectorRegistry:
        """A registry holding the connector: its plugin's alone when the plugin is known."""
        plugin = _found(self.entry_points, PLUGIN_ENTRY_POINT_GROUP, self.plugin)
        return registry_providing(self.connector, self.role, self.plugin, plugin)


def registry_providing(
    connector: str, role: ConnectorRole, plugin: str, found: FoundEntryPoint | None = None
) -> ConnectorRegistry:
    """The connectors of ``plugin`` when it provides ``connector``, else every installed one.

    Spark starts new Python processes for every query (the source's planner, the tasks'
    workers); importing every installed plugin in each cost a quarter of a second per
    process with the first-party plugins installed, so a process that knows
    which plugin provides its connector (the options found when they were first parsed)
    imports that plugin alone. Every installed plugin is loaded when the plugin is unknown
    or no longer provides the connector, so that a missing connector is reported with the
    installed ones.

    :param found: ``plugin``'s entry point, found before: loaded without a scan.
    """
    if plugin:
        scoped = connector_registry(plugin, found)
        if any(spec.name == connector and spec.role is role for spec in scoped):
            return scoped
    return connector_registry()


@functools.cache
def connector_registry(
    plugin: str | None = None, found: FoundEntryPoint | None = None
) -> ConnectorRegistry:
    """The installed connectors (``plugin``'s alone when given), loaded once per process.

    Loaded on first use, never at import; ``plugin`` from ``found``, its entry point, when
    given.
    """
    return load_connector_registry(plugin=plugin, entry_points=None if found is None else [found])


def checkpointer_of(options: BridgeOptions, directory: str | None = None) -> Checkpointer:
    """The checkpoint store at the options' laminar checkpoint location, opened once and kept.

    Spark asks the bridge for a writer and commits each micro-batch in Python workers it
    reuses; finding the store among the installed ones (an entry-point scan) each time was a
    good part of a micro-batch's fixed cost. A new location (every query has its own) opens
    its store anew, from the entry point :func:`parse_options` found
    (:attr:`BridgeOptions.entry_points`): no process the options are shipped to scans.

    :param directory: a directory under the location to open the store at instead.
    :raises CheckpointError: for an unknown store or a location it refuses.
    """
    location = options.checkpoint_location
    assert location is not None, "parse_options sets it for sinks; sources check it first"
    if directory is not None:
        location = _child_location(location, directory)
    store = options.checkpoint_store or store_for_location(location)
    return _open_checkpointer(
        location,
        store,
        tuple(sorted(options.checkpoint_options.items())),
        _found(options.entry_points, CHECKPOINTER_ENTRY_POINT_GROUP, store),
    )


@functools.cache
def _open_checkpointer(
    location: str,
    store: str,
    store_options: tuple[tuple[str, str], ...],
    found: FoundEntryPoint | None,
) -> Checkpointer:
    """The store ``store`` at ``location``, opened once per process.

    :param found: the store's entry point, found before: opened without a scan.
    """
    return open_checkpointer(
        location,
        store=store,
        options=dict(store_options),
        entry_points=None if found is None else [found],
    )


def parse_options(
    options: Mapping[str, str],
    role: ConnectorRole,
    registry: ConnectorRegistry | None = None,
    known: Sequence[FoundEntryPoint] = (),
) -> BridgeOptions:
    """Split Spark's ``options`` for a ``role`` connector and validate every part.

    Nothing is opened: the connector's keys are checked against its declaration only.

    :param registry: where the connector is looked up (default: the installed plugins).
    :param known: the entry points an earlier parse of these options found
        (:attr:`BridgeOptions.entry_points`): the plugin among them is the only one loaded to
        look the connector up (see :func:`registry_providing`), and neither it nor the
        checkpoint store is looked for again.
    :raises ConfigurationError: naming the option at fault — a missing or unknown connector,
        an unknown or malformed ``laminar.*`` option, an undeclared connector key.
    """
    lowered = {key.lower(): value for key, value in options.items()}
    name = lowered.get(CONNECTOR_OPTION)
    if not name:
        raise ConfigurationError(
            f"format('laminar') needs the connector to {role.value}: add "
            f'.option("connector", NAME); `laminar plugins list` shows the installed ones',
            key=CONNECTOR_OPTION,
        )
    plugin = next((ep for ep in known if ep.group == PLUGIN_ENTRY_POINT_GROUP), None)
    spec = (
        registry or registry_providing(name, role, "" if plugin is None else plugin.name, plugin)
    ).get(name, role)
    sdk = _sdk_options(lowered, role)
    properties = _connector_properties(lowered, spec)
    spec.configure(properties)
    location, store = _checkpoint_place(sdk, lowered, role)
    return BridgeOptions(
        connector=name,
        role=role,
        properties=properties,
        delivery=_decoded(sdk, DELIVERY, decode_delivery, DeliveryGuarantee.default()),
        max_records_per_batch=_decoded(sdk, MAX_RECORDS_PER_BATCH, decode_record_cap, None),
        max_bytes_per_batch=_decoded(
            sdk, MAX_BYTES_PER_BATCH, decode_byte_size, DEFAULT_MAX_BYTES_PER_BATCH
        ),
        checkpoint_location=location,
        checkpoint_store=store,
        checkpoint_options={
            key.removeprefix(CHECKPOINT_STORE_OPTION_PREFIX): value
            for key, value in sdk.items()
            if key.startswith(CHECKPOINT_STORE_OPTION_PREFIX)
        },
        plugin=spec.plugin,
        entry_points=_entry_points(spec.plugin, store, known),
        epoch_writer=_decoded(sdk, EPOCH_WRITER, decode_switch, True),
    )


def _entry_points(
    plugin: str, store: str | None, known: Sequence[FoundEntryPoint]
) -> tuple[FoundEntryPoint, ...]:
    """The entry points of ``plugin`` and ``store``: from ``known``, else from a scan."""
    wanted = [(PLUGIN_ENTRY_POINT_GROUP, plugin), (CHECKPOINTER_ENTRY_POINT_GROUP, store)]
    found = (
        _found(known, group, name) or _installed_entry_point(group, name)
        for group, name in wanted
        if name
    )
    return tuple(entry_point for entry_point in found if entry_point is not None)


_INSTALLED: dict[tuple[str, str], FoundEntryPoint] = {}


def _installed_entry_point(group: str, name: str) -> FoundEntryPoint | None:
    """:func:`find_entry_point`, its answer kept for the process once there is one.

    Spark's commit runner parses a sink's options again for every micro-batch it commits,
    from a data source that never parsed them (nothing ``known``).
    """
    found = _INSTALLED.get((group, name))
    if found is None:
        found = find_entry_point(group, name)
        if found is not None:
            _INSTALLED[group, name] = found
    return found


def _found(
    entry_points: Sequence[FoundEntryPoint], group: str, name: str | None
) -> FoundEntryPoint | None:
    """The entry point ``name`` of ``group`` among ``entry_points``."""
    return next((e for e in entry_points if e.group == group and e.name == name), None)


def _sdk_options(lowered: Mapping[str, str], role: ConnectorRole) -> dict[str, str]:
    given = {key: value for key, value in lowered.items() if key.startswith(SDK_PREFIX)}
    for key in given:
        if key.startswith(CHECKPOINT_STORE_OPTION_PREFIX):
            continue
        option = _SDK_OPTION_NAMES.get(key)
        if option is None:
            known = ", ".join(o.name for o in SDK_OPTIONS if role in o.roles)
            raise ConfigurationError(
                f"unknown SDK option {key!r} for a {role} (options starting with "
                f"{SDK_PREFIX!r} belong to the SDK); known: {known}",
                key=key,
            )
        if role not in option.roles:
            other = next(iter(option.roles))
            raise ConfigurationError(
                f"option {key!r} applies to the {other} side only: set it on "
                f"{'writeStream' if other is ConnectorRole.SINK else 'readStream'}",
                key=key,
            )
    return given


def _connector_properties(lowered: Mapping[str, str], spec: ConnectorSpec) -> dict[str, str]:
    declared = {key.name.lower(): key.name for key in spec.config_keys}
    properties = {}
    for key, value in lowered.items():
        if key in (CONNECTOR_OPTION, SPARK_CHECKPOINT_LOCATION) or key.startswith(SDK_PREFIX):
            continue
        if key == SPARK_PATH and SPARK_PATH not in declared:
            raise ConfigurationError(
                f"{spec.role} connector {spec.name!r} takes no path: pass its settings with "
                ".option(KEY, VALUE) instead of load(path) / start(path)",
                key=SPARK_PATH,
            )
        properties[declared.get(key, key)] = value
    return properties


def _decoded(sdk: Mapping[str, str], key: str, decode: Callable[[str], T], default: T) -> T:
    """Option ``key``'s value, decoded; ``default`` when it is not given.

    :raises ConfigurationError: naming the option, what it must be and what was given.
    """
    text = sdk.get(key)
    if text is None:
        return default
    try:
        return decode(text)
    except ValueError as error:
        raise ConfigurationError(f"option {key!r}: {error}; got {text!r}", key=key) from None


def _checkpoint_place(
    sdk: Mapping[str, str], lowered: Mapping[str, str], role: ConnectorRole
) -> tuple[str | None, str | None]:
    """The laminar checkpoint location and the store that keeps it (``None``, ``None``: none)."""
    location = sdk.get(CHECKPOINT_LOCATION)
    if location is None:
        spark_location = lowered.get(SPARK_CHECKPOINT_LOCATION)
        if spark_location:
            location = _child_location(spark_location, LAMINAR_CHECKPOINT_DIRECTORY)
        elif role is ConnectorRole.SOURCE:
            return None, None  # for polled sources only: the data source checks (read_log_needed)
        else:
            raise ConfigurationError(
                f"a laminar sink keeps its epoch manifests in {CHECKPOINT_LOCATION!r}, which "
                "defaults to a 'laminar' directory under Spark's checkpointLocation option; "
                "neither is set: add .option('checkpointLocation', DIR)",
                key=CHECKPOINT_LOCATION,
            )
    store = sdk.get(CHECKPOINT_STORE)
    try:
        chosen = store or store_for_location(location)
    except CheckpointError as error:
        raise ConfigurationError(
            f"option {CHECKPOINT_LOCATION!r}: {error}; or set {CHECKPOINT_STORE!r}",
            key=CHECKPOINT_LOCATION,
        ) from error
    if chosen == "memory":
        raise ConfigurationError(
            f"the memory checkpoint store lives in one process, and Spark runs each "
            f"micro-batch in others: set {CHECKPOINT_LOCATION!r} to a directory or an "
            "object-store URL",
            key=CHECKPOINT_STORE if store else CHECKPOINT_LOCATION,
        )
    return location, chosen


def _child_location(location: str, child: str) -> str:
    """``location/child``; Spark's ``file:`` URIs become plain paths (the file store's form)."""
    if location.startswith("file:"):
        location = "/" + location.removeprefix("file:").lstrip("/")
    return posixpath.join(location.rstrip("/"), child)
